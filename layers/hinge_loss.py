"""HingeLoss (Caffe's hinge_loss_layer.cpp): one-versus-all hinge loss for N×K scores.

With t_ik = +1 for the true class k = label_i and −1 otherwise, e_ik = max(0, 1 − t_ik · x_ik):

    L1 (default): loss = Σ e_ik / N            dx = −t · sign(e) · w / N
    L2:           loss = Σ e_ik² / N           dx = −2 t · e · w / N

(w = top[0].diff; sign(0) = 0, so a margin exactly met takes no gradient.) Labels take no gradient.
"""
from caffe8.engine import backend
from caffe8.engine.layer import register_layer
from caffe8.layers.loss_common import ItemLabelLoss, check_label_range, one_hot


@register_layer("HingeLoss")
class HingeLossLayer(ItemLabelLoss):
    def layer_setup(self, bottom, top):
        self.norm = self.layer_param.hinge_loss_param.norm

    def forward(self, bottom, top):
        x = bottom[0].data
        xp = backend.get_array_module(x)
        n = x.shape[0]
        scores = x.reshape(n, -1)
        dim = scores.shape[1]
        labels = bottom[1].data.reshape(n, 1).astype("int64")
        check_label_range(self, xp, labels, None, dim)
        hot = one_hot(xp, labels, dim)[:, :, 0]
        self.sign = (1.0 - 2.0 * hot).astype(x.dtype)  # −t
        self.margin = xp.maximum(1.0 + self.sign * scores, 0.0).astype(x.dtype)
        self.num = max(n, 1)
        if self.norm == "L2":
            total = (self.margin * self.margin).sum()
        else:
            total = self.margin.sum()
        top[0].data[...] = total / x.dtype.type(self.num)

    def backward(self, top, propagate_down, bottom):
        if propagate_down[1]:
            raise self.error("cannot backpropagate to label inputs (bottom[1])")
        if not propagate_down[0]:
            return
        xp = backend.get_array_module(self.margin)
        if self.norm == "L2":
            g = 2.0 * self.margin * self.sign
        else:
            g = xp.sign(self.margin) * self.sign
        bottom[0].diff[...] = (g * (top[0].diff / self.num)).reshape(bottom[0].shape)
