"""Softmax along an axis (Caffe's softmax_layer.cpp), numerically stable (max subtracted)."""
from caffe8.engine import backend
from caffe8.engine.layer import Layer, from_shapes, register_layer
from caffe8.layers.axes import canonical_axis, reshape_like


def softmax(x, axis, xp):
    """exp(x - max) / sum(exp(x - max)) along ``axis``; same shape as x."""
    e = xp.exp(x - x.max(axis=axis, keepdims=True))
    e /= e.sum(axis=axis, keepdims=True)
    return e


@register_layer("Softmax")
class SoftmaxLayer(Layer):
    exact_num_bottom = 1
    exact_num_top = 1

    @from_shapes
    def reshape(self, bottom, top):
        self.axis = canonical_axis(self, self.layer_param.softmax_param.axis, bottom[0].num_axes)
        reshape_like(bottom, top)

    def forward(self, bottom, top):
        x = bottom[0].data
        top[0].data[...] = softmax(x, self.axis, backend.get_array_module(x))

    def backward(self, top, propagate_down, bottom):
        # dx = y * (dy - sum(dy * y)) along the axis; uses top only, so in place is fine.
        if not propagate_down[0]:
            return
        y, dy = top[0].data, top[0].diff
        dot = (dy * y).sum(axis=self.axis, keepdims=True)
        bottom[0].diff[...] = (dy - dot) * y
