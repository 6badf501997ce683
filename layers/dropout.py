"""Dropout: inverted dropout (Caffe's dropout_layer.cpp).

TRAIN: keep each element with probability 1 - ratio and scale kept ones by 1 / (1 - ratio), so
TEST is the identity in forward and backward. The mask comes from ``engine.backend.random_uniform``
and is therefore reproducible with ``backend.seed``. In place is fine: backward uses only the mask.
On NumPy float arrays the mask and the product are one C pass (``layers.native``) that writes
the mask over the uniform draws.
"""
from caffe8.engine import backend
from caffe8.engine.layer import Layer, from_shapes, register_layer
from caffe8.layers import native
from caffe8.layers.axes import reshape_like


@register_layer("Dropout")
class DropoutLayer(Layer):
    exact_num_bottom = 1
    exact_num_top = 1

    def layer_setup(self, bottom, top):
        self.ratio = float(self.layer_param.dropout_param.dropout_ratio)
        if not 0.0 <= self.ratio < 1.0:
            raise self.error(f"dropout_param.dropout_ratio must be in [0, 1), got {self.ratio}")
        self.scale = 1.0 / (1.0 - self.ratio)
        self.mask = None

    @from_shapes
    def reshape(self, bottom, top):
        reshape_like(bottom, top)

    def forward(self, bottom, top):
        x = bottom[0].data
        if self.phase != "TRAIN":
            top[0].data[...] = x
            return
        xp = backend.get_array_module(x)
        # u >= ratio has probability 1 - ratio (Caffe's Bernoulli(1 - ratio)).
        u = backend.random_uniform(x.shape, x.dtype, xp)
        if native.dropout(x, u, self.ratio, self.scale, u, top[0].data):
            self.mask = u
            return
        self.mask = (u >= x.dtype.type(self.ratio)) * x.dtype.type(self.scale)
        top[0].data[...] = x * self.mask

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        if self.phase != "TRAIN":
            bottom[0].diff[...] = top[0].diff
            return
        xp = backend.get_array_module(top[0].diff)
        xp.multiply(top[0].diff, self.mask, out=bottom[0].diff)
