"""Axis and shape helpers shared by the layers (Caffe's CanonicalAxisIndex and count)."""
import math


def canonical_axis(layer, axis, num_axes):
    """Caffe's CanonicalAxisIndex: ``axis`` in [-num_axes, num_axes) → [0, num_axes)."""
    axis = int(axis)
    if not -num_axes <= axis < num_axes:
        raise layer.error(f"axis {axis} out of range for a {num_axes}-D blob "
                          f"(valid: {-num_axes} .. {num_axes - 1})")
    return axis + num_axes if axis < 0 else axis


def count(shape, start=0, end=None):
    """Product of ``shape[start:end]`` (1 for an empty range), as a Python int."""
    return int(math.prod(shape[start:end]))


def is_in_place(bottom, top):
    """True when top[0] is (or shares its data with) bottom[0], as for in-place ReLU."""
    return top[0] is bottom[0] or top[0].data is bottom[0].data


def reshape_like(bottom, top):
    """Give top[0] bottom[0]'s shape unless the layer runs in place."""
    if not is_in_place(bottom, top):
        top[0].reshape(bottom[0].shape)
