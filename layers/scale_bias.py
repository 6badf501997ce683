"""Scale and Bias (Caffe's scale_layer.cpp, bias_layer.cpp).

The factor (Scale) or offset (Bias) is bottom[1] or a learned parameter whose shape is
bottom[0].shape[axis : axis+num_axes] (num_axes -1: to the end); it is broadcast over the other
axes. Scale's optional ``bias_term`` adds a learned bias of the same shape. Parameter diffs
accumulate; bottom diffs are overwritten. In place is supported (Scale keeps a copy of x).
"""
from caffe8.engine import backend
from caffe8.engine.layer import Layer, register_layer
from caffe8.engine.prototxt import Message
from caffe8.layers.axes import canonical_axis, count, is_in_place, reshape_like


def _param_shape(layer, bottom_shape, axis_field, num_axes):
    """Shape of the learned operand: bottom_shape[axis : axis+num_axes]."""
    axis = canonical_axis(layer, axis_field, len(bottom_shape))
    if num_axes < -1:
        raise layer.error(f"num_axes must be non-negative, or -1 to extend to the end; "
                          f"got {num_axes}")
    end = len(bottom_shape) if num_axes == -1 else axis + num_axes
    if end > len(bottom_shape):
        raise layer.error(f"operand shape extends past bottom[0] {bottom_shape} when applied "
                          f"from axis {axis} with num_axes {num_axes}")
    return tuple(bottom_shape[axis:end])


def _default_filler(param, field, value):
    """``param.field`` if set, else a constant filler of ``value``."""
    if param.has(field):
        return getattr(param, field)
    f = Message("FillerParameter")
    f.value = value
    return f


class _Broadcast(Layer):
    """Shared geometry: x viewed as (outer, dim, inner), operand as (1, dim, 1)."""
    min_bottom = 1
    max_bottom = 2
    exact_num_top = 1

    def _geometry(self, bottom, operand_shape, axis_field):
        shape = bottom[0].shape
        # A scalar operand applies everywhere; Caffe then uses axis 0 (outer = 1).
        axis = 0 if len(operand_shape) == 0 else canonical_axis(self, axis_field, len(shape))
        k = len(operand_shape)
        if tuple(shape[axis:axis + k]) != tuple(operand_shape):
            raise self.error(f"operand shape {tuple(operand_shape)} does not match bottom[0] "
                             f"{shape} at axes {axis}..{axis + k - 1}")
        self.view = (count(shape, 0, axis), count(operand_shape), count(shape, axis + k))

    def _operand(self, bottom):
        return bottom[1] if len(bottom) > 1 else self.blobs[0]


@register_layer("Bias")
class BiasLayer(_Broadcast):
    """top = bottom[0] + bias."""

    def layer_setup(self, bottom, top):
        p = self.layer_param.bias_param
        if len(bottom) == 1:
            shape = _param_shape(self, bottom[0].shape, p.axis, p.num_axes)
            self.make_param(shape, _default_filler(p, "filler", 0.0))

    def reshape(self, bottom, top):
        self._geometry(bottom, self._operand(bottom).shape, self.layer_param.bias_param.axis)
        reshape_like(bottom, top)

    def forward(self, bottom, top):
        b = self._operand(bottom).data.reshape(1, self.view[1], 1)
        x = bottom[0].data.reshape(self.view)
        top[0].data[...] = (x + b).reshape(bottom[0].shape)

    def backward(self, top, propagate_down, bottom):
        dy = top[0].diff
        if propagate_down[0] and bottom[0] is not top[0]:
            bottom[0].diff[...] = dy
        db = dy.reshape(self.view).sum(axis=(0, 2))
        if len(bottom) > 1:
            if propagate_down[1]:
                bottom[1].diff[...] = db.reshape(bottom[1].shape)
        elif self.param_propagate_down[0]:
            self.blobs[0].diff += db.reshape(self.blobs[0].shape)


@register_layer("Scale")
class ScaleLayer(_Broadcast):
    """top = bottom[0] * scale (+ bias when ``bias_term``)."""

    def layer_setup(self, bottom, top):
        p = self.layer_param.scale_param
        if len(bottom) == 1:
            shape = _param_shape(self, bottom[0].shape, p.axis, p.num_axes)
            self.make_param(shape, _default_filler(p, "filler", 1.0))  # identity by default
        self.bias_index = None
        if p.bias_term:
            self.bias_index = len(self.blobs)
            shape = bottom[1].shape if len(bottom) > 1 else self.blobs[0].shape
            self.make_param(shape, _default_filler(p, "bias_filler", 0.0))

    def reshape(self, bottom, top):
        self._geometry(bottom, self._operand(bottom).shape, self.layer_param.scale_param.axis)
        reshape_like(bottom, top)

    def forward(self, bottom, top):
        x = bottom[0].data
        # In place, forward overwrites x, which the scale gradient needs.
        self._x = x.copy() if is_in_place(bottom, top) else None
        xp = backend.get_array_module(x)
        out = top[0].data.reshape(self.view)     # written in place: no temporaries to copy
        xp.multiply(x.reshape(self.view), self._operand(bottom).data.reshape(1, self.view[1], 1),
                    out=out)
        if self.bias_index is not None:
            xp.add(out, self.blobs[self.bias_index].data.reshape(1, self.view[1], 1), out=out)

    def backward(self, top, propagate_down, bottom):
        dy = top[0].diff.reshape(self.view)
        if self.bias_index is not None and self.param_propagate_down[self.bias_index]:
            b = self.blobs[self.bias_index]
            b.diff += dy.sum(axis=(0, 2)).reshape(b.shape)
        operand = self._operand(bottom)
        learned = len(bottom) == 1
        if (learned and self.param_propagate_down[0]) or (not learned and propagate_down[1]):
            x = (bottom[0].data if self._x is None else self._x).reshape(self.view)
            ds = (dy * x).sum(axis=(0, 2)).reshape(operand.shape)
            if learned:
                operand.diff += ds
            else:
                operand.diff[...] = ds
        if propagate_down[0]:                    # bottom diff may be dy (in place): read first
            xp = backend.get_array_module(dy)
            xp.multiply(dy, operand.data.reshape(1, self.view[1], 1),
                        out=bottom[0].diff.reshape(self.view))
