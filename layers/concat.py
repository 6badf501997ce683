"""Concat (Caffe's concat_layer.cpp): join bottoms along ``axis`` (legacy ``concat_dim``).

All other dimensions must match. Backward hands each bottom its slice of top's diff.
"""
from caffe8.engine import backend
from caffe8.engine.layer import Layer, register_layer
from caffe8.layers.axes import canonical_axis


def concat_axis(layer, param, num_axes, legacy_name):
    """``axis`` (may be negative) or the legacy non-negative field ``legacy_name``; not both."""
    if param.has("axis") and param.has(legacy_name):
        raise layer.error(f"either axis or {legacy_name} should be specified; not both")
    if param.has(legacy_name):
        legacy = int(getattr(param, legacy_name))
        if not 0 <= legacy < num_axes:
            raise layer.error(f"{legacy_name} {legacy} out of range for a {num_axes}-D blob")
        return legacy
    return canonical_axis(layer, param.axis, num_axes)


@register_layer("Concat")
class ConcatLayer(Layer):
    min_bottom = 1
    exact_num_top = 1

    def reshape(self, bottom, top):
        first = bottom[0].shape
        self.axis = concat_axis(self, self.layer_param.concat_param, len(first), "concat_dim")
        total = 0
        for i, b in enumerate(bottom):
            other = b.shape
            same = len(other) == len(first) and all(
                other[j] == first[j] for j in range(len(first)) if j != self.axis)
            if not same:
                raise self.error(f"all inputs must have the same shape except at concat axis "
                                 f"{self.axis}: bottom[0] {first}, bottom[{i}] {other}")
            total += other[self.axis]
        shape = list(first)
        shape[self.axis] = total
        top[0].reshape(shape)
        self.bounds = _bounds([b.shape[self.axis] for b in bottom])

    def forward(self, bottom, top):
        xp = backend.get_array_module(bottom[0].data)
        xs, y = [b.data for b in bottom], top[0].data
        if any(xp.may_share_memory(x, y) for x in xs):
            y[...] = xp.concatenate(xs, axis=self.axis)
        else:                                    # straight into the top: one pass, no temporary
            xp.concatenate(xs, axis=self.axis, out=y)

    def backward(self, top, propagate_down, bottom):
        for i, (lo, hi) in enumerate(self.bounds):
            if propagate_down[i]:
                bottom[i].diff[...] = _take(top[0].diff, self.axis, lo, hi)


def _bounds(sizes):
    """[(start, stop)] along the axis for consecutive pieces of ``sizes``."""
    out, start = [], 0
    for s in sizes:
        out.append((start, start + s))
        start += s
    return out


def _take(array, axis, lo, hi):
    """array[..., lo:hi, ...] with the slice on ``axis`` (a view)."""
    index = [slice(None)] * array.ndim
    index[axis] = slice(lo, hi)
    return array[tuple(index)]
