"""Helpers shared by the classification layers (SoftmaxWithLoss, Accuracy).

Scores of shape (..., C, ...) with the class axis at ``axis`` are viewed as (outer, C, inner) and
labels (any shape with outer·inner elements) as (outer, inner), as Caffe indexes them.
"""
import numpy

from caffe8.engine.layer import Layer
from caffe8.layers.axes import count


def class_geometry(layer, scores_shape, axis, label_count):
    """(outer, classes, inner) for scores, checking that there is one label per position."""
    outer, classes = count(scores_shape, 0, axis), scores_shape[axis]
    inner = count(scores_shape, axis + 1)
    if outer * inner != label_count:
        raise layer.error(
            f"number of labels must match number of predictions: scores {tuple(scores_shape)} with "
            f"class axis {axis} need {outer * inner} labels (outer {outer} × inner {inner}), "
            f"got {label_count}; labels are integers in 0 .. {classes - 1}")
    return outer, classes, inner


def int_labels(label_data, outer, inner):
    """Labels as int64 (outer, inner); truncation toward zero as Caffe's static_cast<int>."""
    return label_data.reshape(outer, inner).astype("int64")


def check_label_range(layer, xp, labels, valid, classes):
    """Raise when a non-ignored label is outside 0 .. classes-1 (``valid``: the non-ignored
    positions, None for all). On CuPy the verdict and the first bad label stay on the device
    until the Net reads its loss (``Layer.defer_check``): no synchronisation in the middle of
    the forward pass."""
    if xp is numpy and labels.size and labels.min() >= 0 and labels.max() < classes:
        return                       # the common case in two passes: every label in range
    bad = (labels < 0) | (labels >= classes)
    if valid is not None:
        bad &= valid
    bad = bad.reshape(-1)
    if bad.size == 0:
        return
    any_bad, first = bad.any(), labels.reshape(-1)[bad.argmax()]

    def verdict():
        if bool(any_bad):
            raise layer.error(f"label {int(first)} out of range: labels must be in "
                              f"0 .. {classes - 1} (or equal to ignore_label)")
    if xp is numpy:
        verdict()
    else:
        layer.defer_check(verdict)


def valid_positions(labels, ignore_label):
    """Boolean mask of the positions whose label is not ``ignore_label``; None when there is no
    ignore_label (every position counts: the layers then skip the masking, which would multiply
    by one and add zeros, and so leave every value as it is)."""
    return None if ignore_label is None else labels != ignore_label


def one_hot(xp, labels, classes):
    """Boolean (outer, classes, inner) mask, True at [n, labels[n, j], j]."""
    ks = xp.arange(classes).reshape(1, classes, 1)
    return labels[:, None, :] == ks


class ItemLabelLoss(Layer):
    """Base of the losses over N items with one integer label each (Caffe's HingeLoss and
    MultinomialLogisticLoss): two bottoms (scores or probabilities, labels), a scalar top
    weighted 1 by default; labels never take a gradient."""
    exact_num_bottom = 2
    exact_num_top = 1
    default_loss_weight = 1.0

    def allow_force_backward(self, bottom_index):
        return bottom_index != 1

    def reshape(self, bottom, top):
        shape = bottom[0].shape
        if not shape or shape[:1] != bottom[1].shape[:1] or bottom[1].count != shape[0]:
            raise self.error(f"the data and label should have the same first dimension and one "
                             f"label per item: bottom[0] {shape}, bottom[1] {bottom[1].shape}")
        top[0].reshape(())
