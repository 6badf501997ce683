"""InfogainLoss (Caffe's infogain_loss_layer.cpp, the BVLC master form with the softmax inside).

bottom[0]: unnormalised scores with the class axis at ``infogain_loss_param.axis`` (viewed as
outer×K×inner), bottom[1]: one integer label per outer·inner position, and the K×K infogain
matrix H either as bottom[2] or read from ``infogain_loss_param.source`` (a BlobProto
``.binaryproto``). With p = softmax(x) over the class axis,

    loss = −Σ_positions Σ_k H[label, k] · log(max(p_k, FLT_MIN)) / normalizer
    dx_l = (p_l · Σ_k H[label, k] − H[label, l]) · w / normalizer

at non-ignored positions (``loss_param.ignore_label``; normalizer from ``loss_param`` as in
SoftmaxWithLoss, VALID by default). H = identity gives the multinomial logistic loss of the
softmax. An optional top[1] is the softmax. Labels and H take no gradient.
"""
import os

from caffe8.engine import backend
from caffe8.engine.datum import decode_blob_proto
from caffe8.engine.errors import DataError, relative_to_cwd
from caffe8.engine.layer import Layer, register_layer
from caffe8.layers.softmax_loss import (FLT_MIN, labelled_softmax, normalizer, reshape_class_loss,
                                        setup_loss_param)


def read_infogain_matrix(path):
    """The matrix stored in a BlobProto file, as float32 of its stored shape."""
    if not os.path.isfile(path):
        raise DataError(f"infogain matrix file '{path}' does not exist"
                        f"{relative_to_cwd(path)}")
    with open(path, "rb") as f:
        return decode_blob_proto(f.read(), where=f"infogain matrix file '{path}'")


@register_layer("InfogainLoss")
class InfogainLossLayer(Layer):
    min_bottom = 2
    max_bottom = 3
    min_top = 1
    max_top = 2
    default_loss_weight = 1.0

    def layer_setup(self, bottom, top):
        setup_loss_param(self)
        self.stored_h = None
        if len(bottom) < 3:
            ip = self.layer_param.infogain_loss_param
            if not ip.has("source"):
                raise self.error("infogain matrix source must be specified "
                                 "(infogain_loss_param.source) when there is no third bottom")
            self.stored_h = read_infogain_matrix(ip.source)

    def allow_force_backward(self, bottom_index):
        return bottom_index == 0

    def reshape(self, bottom, top):
        reshape_class_loss(self, bottom, top, self.layer_param.infogain_loss_param.axis)
        k = self.geom[1]
        h_count = bottom[2].count if len(bottom) > 2 else self.stored_h.size
        if h_count != k * k:
            raise self.error(f"the infogain matrix must hold {k}×{k} = {k * k} values "
                             f"({k} classes on axis {self.axis}), got {h_count}")

    def _matrix(self, bottom, xp, dtype):
        if len(bottom) > 2:
            h = bottom[2].data
        else:
            h = backend.to_device(self.stored_h, like=bottom[0].data)
        k = self.geom[1]
        return h.reshape(k, k).astype(dtype, copy=False)

    def forward(self, bottom, top):
        x = bottom[0].data
        xp = backend.get_array_module(x)
        outer, classes, inner = self.geom
        p, labels, valid = labelled_softmax(self, bottom, xp)
        if valid is None:
            valid = xp.ones(labels.shape, dtype=bool)
        h = self._matrix(bottom, xp, x.dtype)
        safe = labels * valid  # ignored positions read row 0, then masked out
        # rows of H picked by each position's label, laid out as outer×K×inner like p
        self.h_rows = h[safe].transpose(0, 2, 1) * valid[:, None, :]
        logs = xp.log(xp.maximum(p, x.dtype.type(FLT_MIN)))
        self.norm = normalizer(xp, self.mode, outer, inner, valid, x.dtype)
        top[0].data[...] = -(self.h_rows * logs).sum() / self.norm
        if len(top) > 1:
            top[1].data[...] = self.prob

    def backward(self, top, propagate_down, bottom):
        if propagate_down[1]:
            raise self.error("cannot backpropagate to label inputs (bottom[1])")
        if len(propagate_down) > 2 and propagate_down[2]:
            raise self.error("cannot backpropagate to infogain inputs (bottom[2])")
        if not propagate_down[0]:
            return
        outer, classes, inner = self.geom
        p = self.prob.reshape(outer, classes, inner)
        g = p * self.h_rows.sum(axis=1, keepdims=True) - self.h_rows
        bottom[0].diff[...] = (g * (top[0].diff / self.norm)).reshape(bottom[0].shape)
