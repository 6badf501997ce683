"""Accuracy (Caffe's accuracy_layer.cpp): top-k classification accuracy, ties count as misses.

A non-ignored position is correct iff the number of classes k with score_k >= score_true (the
true class included) is <= top_k. top[0] (0-axis) = correct / non-ignored positions, or 0 when
there are none; optional top[1] (C,) = per-class accuracy (0 for classes never seen).
"""
from caffe8.engine import backend
from caffe8.engine.layer import Layer, from_shapes, register_layer
from caffe8.layers.axes import canonical_axis
from caffe8.layers.loss_common import (check_label_range, class_geometry, int_labels, one_hot,
                                       valid_positions)


@register_layer("Accuracy")
class AccuracyLayer(Layer):
    exact_num_bottom = 2
    min_top = 1
    max_top = 2

    def layer_setup(self, bottom, top):
        ap = self.layer_param.accuracy_param
        self.top_k = int(ap.top_k)
        self.ignore_label = ap.ignore_label if ap.has("ignore_label") else None
        self.class_axis = ap.axis

    def allow_force_backward(self, bottom_index):
        return False

    @from_shapes
    def reshape(self, bottom, top):
        self.axis = canonical_axis(self, self.class_axis, bottom[0].num_axes)
        self.geom = class_geometry(self, bottom[0].shape, self.axis, bottom[1].count)
        if self.top_k > self.geom[1]:
            raise self.error(f"top_k ({self.top_k}) must be less than or equal to the number of "
                             f"classes ({self.geom[1]}) of bottom[0] {bottom[0].shape}")
        top[0].reshape(())
        if len(top) > 1:
            top[1].reshape((self.geom[1],))

    def forward(self, bottom, top):
        x = bottom[0].data
        xp = backend.get_array_module(x)
        outer, classes, inner = self.geom
        scores = x.reshape(outer, classes, inner)
        labels = int_labels(bottom[1].data, outer, inner)
        valid = valid_positions(labels, self.ignore_label)   # None: every position counts
        check_label_range(self, xp, labels, valid, classes)
        hot = one_hot(xp, labels, classes)
        zero = xp.zeros((), dtype=x.dtype)  # where, not a product: scores may be ±inf
        true_score = xp.where(hot, scores, zero).sum(axis=1, keepdims=True)
        at_least = (scores >= true_score).sum(axis=1)       # (outer, inner), counts itself
        correct = at_least <= self.top_k
        dt = x.dtype
        if valid is None:
            counted = dt.type(max(outer * inner, 1))
        else:
            correct &= valid
            counted = xp.maximum(valid.sum(), 1).astype(dt)
        top[0].data[...] = correct.sum().astype(dt) / counted
        if len(top) > 1:
            seen = (hot if valid is None else hot & valid[:, None, :]).sum(axis=(0, 2))
            hits = (hot & correct[:, None, :]).sum(axis=(0, 2))
            top[1].data[...] = hits.astype(dt) / xp.maximum(seen, 1).astype(dt)

    def backward(self, top, propagate_down, bottom):
        if any(propagate_down):
            raise self.error("Accuracy has no backward; it cannot propagate to its bottoms")
