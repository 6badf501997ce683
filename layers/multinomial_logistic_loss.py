"""MultinomialLogisticLoss (Caffe's multinomial_logistic_loss_layer.cpp).

bottom[0] holds probabilities (N×K…, K = count / N), bottom[1] one integer label per item:

    loss = −Σ_i log(max(p_i,label_i, 1e-20)) / N,   dp_i,label_i = −w / (N · max(p, 1e-20))

and 0 elsewhere (w = top[0].diff). The 1e-20 floor is Caffe's kLOG_THRESHOLD.
"""
from caffe8.engine import backend
from caffe8.engine.layer import register_layer
from caffe8.layers.loss_common import ItemLabelLoss, check_label_range, one_hot

LOG_THRESHOLD = 1e-20


@register_layer("MultinomialLogisticLoss")
class MultinomialLogisticLossLayer(ItemLabelLoss):
    def forward(self, bottom, top):
        x = bottom[0].data
        xp = backend.get_array_module(x)
        n = x.shape[0]
        probs = x.reshape(n, -1)
        labels = bottom[1].data.reshape(n, 1).astype("int64")
        check_label_range(self, xp, labels, None, probs.shape[1])
        self.hot = one_hot(xp, labels, probs.shape[1])[:, :, 0]
        zero = xp.zeros((), dtype=x.dtype)
        self.p_true = xp.maximum(xp.where(self.hot, probs, zero).sum(axis=1),
                                 x.dtype.type(LOG_THRESHOLD))
        self.num = max(n, 1)
        top[0].data[...] = -xp.log(self.p_true).sum() / x.dtype.type(self.num)

    def backward(self, top, propagate_down, bottom):
        if propagate_down[1]:
            raise self.error("cannot backpropagate to label inputs (bottom[1])")
        if not propagate_down[0]:
            return
        scale = -top[0].diff / self.num
        g = self.hot * (scale / self.p_true)[:, None]
        bottom[0].diff[...] = g.reshape(bottom[0].shape)
