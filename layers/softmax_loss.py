"""SoftmaxWithLoss (Caffe's softmax_loss_layer.cpp + loss_layer.cpp).

loss = -Σ log(max(p[label], FLT_MIN)) / max(1, normalizer) over non-ignored positions, with the
softmax over ``softmax_param.axis``. Normalizer: VALID (non-ignored count, the default), FULL
(outer·inner), BATCH_SIZE (outer), NONE (1); legacy ``normalize: false`` with no
``normalization`` means BATCH_SIZE. top[0] is a 0-axis scalar; an optional top[1] is the softmax.
Backward: dx = (p - onehot) · top[0].diff / normalizer, 0 at ignored positions; labels never
take a gradient.
"""
from caffe8.engine import backend
from caffe8.engine.layer import Layer, from_shapes, register_layer
from caffe8.layers.axes import canonical_axis
from caffe8.layers.loss_common import (check_label_range, class_geometry, int_labels, one_hot,
                                       valid_positions)
from caffe8.layers.softmax import softmax

# Caffe clamps with FLT_MIN for float and double alike.
FLT_MIN = 1.17549435082228750797e-38


def normalization_mode(loss_param):
    """Caffe's rule: ``normalization`` if set, else legacy ``normalize`` (false → BATCH_SIZE)."""
    if not loss_param.has("normalization") and loss_param.has("normalize"):
        return "VALID" if loss_param.normalize else "BATCH_SIZE"
    return loss_param.normalization


def normalizer(xp, mode, outer, inner, valid, dtype):
    """max(1, divisor) for ``mode``; stays on the device (no sync) for VALID (``valid``: the
    counted positions, None for all of them)."""
    if mode == "FULL":
        return float(max(1, outer * inner))
    if mode == "BATCH_SIZE":
        return float(max(1, outer))
    if mode == "NONE":
        return 1.0
    if valid is None:
        return dtype.type(max(1, outer * inner))
    return xp.maximum(valid.sum(), 1).astype(dtype)


def setup_loss_param(layer):
    """``layer.ignore_label`` (None: none) and ``layer.mode`` from its ``loss_param``."""
    lp = layer.layer_param.loss_param
    layer.ignore_label = lp.ignore_label if lp.has("ignore_label") else None
    layer.mode = normalization_mode(lp)


def reshape_class_loss(layer, bottom, top, axis):
    """The reshape of the softmax-based losses: data and labels agree on the first axis;
    ``layer.axis`` (the class axis, ``axis`` made canonical) and ``layer.geom``; top[0] a
    scalar, top[1] (optional) the softmax, shaped as bottom[0]."""
    if bottom[0].shape[:1] != bottom[1].shape[:1]:
        raise layer.error(f"the data and label should have the same first dimension: "
                          f"bottom[0] {bottom[0].shape}, bottom[1] {bottom[1].shape}")
    layer.axis = canonical_axis(layer, axis, bottom[0].num_axes)
    layer.geom = class_geometry(layer, bottom[0].shape, layer.axis, bottom[1].count)
    top[0].reshape(())
    if len(top) > 1:
        top[1].reshape(bottom[0].shape)


def labelled_softmax(layer, bottom, xp):
    """Softmax of bottom[0] along ``layer.axis`` (kept in ``layer.prob``) and the labels, for the
    softmax-based losses: ``(p as outer×K×inner, int labels outer×inner, valid mask)`` with
    ``layer.geom`` = (outer, K, inner); labels are range-checked where valid (positions equal
    to ``layer.ignore_label`` are not). The mask is None without an ignore_label."""
    outer, classes, inner = layer.geom
    layer.prob = softmax(bottom[0].data, layer.axis, xp)
    labels = int_labels(bottom[1].data, outer, inner)
    valid = valid_positions(labels, layer.ignore_label)
    check_label_range(layer, xp, labels, valid, classes)
    return layer.prob.reshape(outer, classes, inner), labels, valid


@register_layer("SoftmaxWithLoss")
class SoftmaxWithLossLayer(Layer):
    exact_num_bottom = 2
    min_top = 1
    max_top = 2
    default_loss_weight = 1.0

    def layer_setup(self, bottom, top):
        setup_loss_param(self)
        self.class_axis = self.layer_param.softmax_param.axis

    def allow_force_backward(self, bottom_index):
        return bottom_index != 1

    @from_shapes
    def reshape(self, bottom, top):
        reshape_class_loss(self, bottom, top, self.class_axis)

    def forward(self, bottom, top):
        x = bottom[0].data
        xp = backend.get_array_module(x)
        outer, classes, inner = self.geom
        p, labels, valid = labelled_softmax(self, bottom, xp)
        self.hot = one_hot(xp, labels, classes)
        if valid is not None:
            self.hot &= valid[:, None, :]
        zero = xp.zeros((), dtype=x.dtype)  # a 0-d array, not a scalar, for cupy.where
        p_true = xp.where(self.hot, p, zero).sum(axis=1)
        logs = xp.log(xp.maximum(p_true, x.dtype.type(FLT_MIN)))
        self.norm = normalizer(xp, self.mode, outer, inner, valid, x.dtype)
        if valid is not None:
            logs = xp.where(valid, logs, zero)
        top[0].data[...] = -logs.sum() / self.norm
        self.valid = valid
        if len(top) > 1:
            top[1].data[...] = self.prob

    def backward(self, top, propagate_down, bottom):
        if propagate_down[1]:
            raise self.error("cannot backpropagate to label inputs (bottom[1])")
        if not propagate_down[0]:
            return
        outer, classes, inner = self.geom
        xp = backend.get_array_module(self.prob)
        scale = top[0].diff / self.norm
        p = self.prob.reshape(outer, classes, inner)
        diff = bottom[0].diff
        if self.valid is None and diff.flags.c_contiguous:   # (p - onehot) * scale, in place
            g = diff.reshape(outer, classes, inner)
            xp.subtract(p, self.hot, out=g)
            xp.multiply(g, scale, out=g)
            return
        g = p - self.hot
        if self.valid is not None:
            g = g * self.valid[:, None, :]
        diff[...] = (g * scale).reshape(bottom[0].shape)
