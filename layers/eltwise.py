"""Eltwise (Caffe's eltwise_layer.cpp): elementwise SUM (with coefficients), PROD or MAX.

All bottoms must have the same shape. MAX follows Caffe's tie rule exactly: between bottoms 0
and 1 a tie goes to 1, later bottoms win only when strictly greater; backward routes the diff
to the recorded argmax. PROD backward with ``stable_prod_grad`` multiplies the other inputs
(no division by a possibly-zero input); otherwise it uses top / bottom.
"""
from caffe8.engine import backend
from caffe8.engine.layer import Layer, register_layer


@register_layer("Eltwise")
class EltwiseLayer(Layer):
    min_bottom = 2
    exact_num_top = 1

    def layer_setup(self, bottom, top):
        p = self.layer_param.eltwise_param
        self.op = p.operation
        coeff = [float(c) for c in p.coeff]
        if coeff and len(coeff) != len(bottom):
            raise self.error(f"Eltwise takes one coefficient per bottom blob: {len(coeff)} "
                             f"coeff for {len(bottom)} bottoms")
        if coeff and self.op != "SUM":
            raise self.error(f"Eltwise only takes coefficients for SUM, not {self.op}")
        self.coeff = coeff or [1.0] * len(bottom)
        self.stable_prod_grad = bool(p.stable_prod_grad)

    def reshape(self, bottom, top):
        for i, b in enumerate(bottom[1:], 1):
            if b.shape != bottom[0].shape:
                raise self.error(f"all bottoms must have the same shape: bottom[0] "
                                 f"{bottom[0].shape}, bottom[{i}] {b.shape}")
        top[0].reshape(bottom[0].shape)

    def forward(self, bottom, top):
        xs = [b.data for b in bottom]
        xp = backend.get_array_module(xs[0])
        dt = xs[0].dtype.type
        if self.op == "SUM":
            # summed in the top's own buffer unless it is a bottom's; x * 1 is x exactly, so a
            # coefficient of 1 (the default, ResNet's shortcuts) skips its multiply and the bits
            # are those of the products
            if any(xp.may_share_memory(x, top[0].data) for x in xs):
                out = xs[0] * dt(self.coeff[0])
            else:
                out = top[0].data
                if self.coeff[0] == 1:
                    out[...] = xs[0]
                else:
                    xp.multiply(xs[0], dt(self.coeff[0]), out=out)
            for c, x in zip(self.coeff[1:], xs[1:]):
                out += x if c == 1 else x * dt(c)
            if out is not top[0].data:
                top[0].data[...] = out
            return
        elif self.op == "PROD":
            out = xs[0].copy()
            for x in xs[1:]:
                out *= x
        else:
            out, self.argmax = _caffe_max(xp, xs)
        top[0].data[...] = out

    def backward(self, top, propagate_down, bottom):
        dy = top[0].diff
        for i, b in enumerate(bottom):
            if not propagate_down[i]:
                continue
            if self.op == "SUM":             # dy * 1 is dy exactly
                if self.coeff[i] == 1:
                    if b.diff is not dy:         # in place: already dy
                        b.diff[...] = dy
                else:
                    b.diff[...] = dy * dy.dtype.type(self.coeff[i])
            elif self.op == "PROD":
                b.diff[...] = dy * self._prod_grad(bottom, top, i)
            else:
                b.diff[...] = dy * (self.argmax == i)

    def _prod_grad(self, bottom, top, i):
        """∂top/∂bottom[i]: product of the other inputs (stable) or top / bottom[i]."""
        if not self.stable_prod_grad:
            return top[0].data / bottom[i].data
        others = [b.data for j, b in enumerate(bottom) if j != i]
        g = others[0].copy()
        for x in others[1:]:
            g *= x
        return g


def _caffe_max(xp, xs):
    """(max, argmax) with Caffe's tie-breaking (see the module docstring)."""
    first = xs[0] > xs[1]
    out = xp.where(first, xs[0], xs[1])
    arg = xp.logical_not(first).astype(xp.int32)
    for k, x in enumerate(xs[2:], 2):
        better = x > out
        out = xp.where(better, x, out)
        arg[better] = k
    return out, arg
