"""More elementwise neurons: AbsVal, BNLL, Clip, ELU, Swish, Threshold (Caffe's NeuronLayer family).

One bottom, one top of the same shape. All but AbsVal may run in place; where backward needs the
input ``x`` and forward overwrites it, forward keeps a copy. Threshold has no gradient (Caffe
does not implement its backward): force_backward skips it, and a net that still asks for one
gets an error naming the layer.
"""
import abc

from caffe8.engine import backend
from caffe8.engine.layer import Layer, from_shapes, register_layer
from caffe8.layers.axes import is_in_place, reshape_like

#: Caffe's BNLL clamps the exponent of its gradient here so that exp() cannot overflow.
BNLL_THRESHOLD = 50.0


class _Elementwise(Layer):
    """``y = f(x)`` with ``dx = dy * g`` where ``g`` comes from x (saved when in place) or y."""
    exact_num_bottom = 1
    exact_num_top = 1
    needs_input = True
    in_place_ok = True

    @from_shapes
    def reshape(self, bottom, top):
        if not self.in_place_ok and is_in_place(bottom, top):
            raise self.error("does not allow in-place computation (top and bottom are the same blob)")
        reshape_like(bottom, top)

    def forward(self, bottom, top):
        x = bottom[0].data
        self._x = x.copy() if (self.needs_input and is_in_place(bottom, top)) else None
        top[0].data[...] = self.f(x, backend.get_array_module(x), x.dtype.type)

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        dy = top[0].diff
        x = bottom[0].data if self._x is None else self._x
        bottom[0].diff[...] = dy * self.grad(x, top[0].data, backend.get_array_module(dy),
                                             dy.dtype.type)

    @abc.abstractmethod
    def f(self, x, xp, dt):
        """y = f(x), elementwise, in dtype ``dt``."""

    @abc.abstractmethod
    def grad(self, x, y, xp, dt):
        """dy/dx, elementwise, from x and y."""


@register_layer("AbsVal")
class AbsValLayer(_Elementwise):
    """y = |x|; dy/dx = sign(x), 0 at x = 0. Caffe refuses in place here."""
    in_place_ok = False

    def f(self, x, xp, dt):
        return xp.abs(x)

    def grad(self, x, y, xp, dt):
        return xp.sign(x)


@register_layer("BNLL")
class BNLLLayer(_Elementwise):
    """Binomial normal log likelihood y = log(1 + exp(x)), written without overflow as
    x + log(1 + exp(-x)) for x > 0; dy/dx = e / (1 + e) with e = exp(min(x, 50))."""

    def f(self, x, xp, dt):
        return xp.where(x > 0, x + xp.log1p(xp.exp(-xp.abs(x))), xp.log1p(xp.exp(-xp.abs(x))))

    def grad(self, x, y, xp, dt):
        e = xp.exp(xp.minimum(x, dt(BNLL_THRESHOLD)))
        return e / (e + dt(1))


@register_layer("Clip")
class ClipLayer(_Elementwise):
    """y = max(min, min(x, max)); dy/dx = 1 where min <= x <= max (ends included), else 0."""

    def layer_setup(self, bottom, top):
        p = self.layer_param.clip_param
        missing = [f for f in ("min", "max") if not p.has(f)]
        if missing:
            raise self.error(f"clip_param.{' and clip_param.'.join(missing)} is required")
        self.lo, self.hi = float(p.min), float(p.max)
        if self.lo > self.hi:
            raise self.error(f"clip_param.min ({self.lo}) must not exceed clip_param.max ({self.hi})")

    def f(self, x, xp, dt):
        return xp.maximum(dt(self.lo), xp.minimum(x, dt(self.hi)))

    def grad(self, x, y, xp, dt):
        return ((x >= dt(self.lo)) & (x <= dt(self.hi))).astype(x.dtype)


@register_layer("ELU")
class ELULayer(_Elementwise):
    """Exponential linear unit (Fast and Accurate Deep Network Learning by Exponential Linear
    Units): y = x for x > 0 else alpha (exp(x) - 1); dy/dx = 1 for x > 0 else alpha + y."""

    def layer_setup(self, bottom, top):
        self.alpha = float(self.layer_param.elu_param.alpha)

    def f(self, x, xp, dt):
        return xp.where(x > 0, x, dt(self.alpha) * xp.expm1(xp.minimum(x, dt(0))))

    def grad(self, x, y, xp, dt):
        return xp.where(x > 0, dt(1), dt(self.alpha) + y)


@register_layer("Swish")
class SwishLayer(_Elementwise):
    """Swish (Searching for Activation Functions): y = x sigmoid(beta x);
    dy/dx = beta y + sigmoid(beta x) (1 - beta y). Forward keeps sigmoid(beta x), so in place
    needs no copy of x."""
    needs_input = False

    def layer_setup(self, bottom, top):
        self.beta = float(self.layer_param.swish_param.beta)

    def f(self, x, xp, dt):
        half = dt(0.5)
        self._sig = xp.tanh(x * dt(self.beta) * half) * half + half  # no overflow for large |x|
        return x * self._sig

    def grad(self, x, y, xp, dt):
        by = dt(self.beta) * y
        return by + self._sig * (dt(1) - by)


@register_layer("Threshold")
class ThresholdLayer(Layer):
    """y = 1 where x > threshold, else 0. Not differentiable: as in Caffe there is no backward,
    and a net that asks for one gets an error naming the layer."""
    exact_num_bottom = 1
    exact_num_top = 1

    def layer_setup(self, bottom, top):
        self.threshold = float(self.layer_param.threshold_param.threshold)

    @from_shapes
    def reshape(self, bottom, top):
        reshape_like(bottom, top)

    def forward(self, bottom, top):
        x = bottom[0].data
        top[0].data[...] = (x > x.dtype.type(self.threshold)).astype(x.dtype)

    def allow_force_backward(self, bottom_index):
        return False

    def backward(self, top, propagate_down, bottom):
        if any(propagate_down):
            raise self.error("Threshold has no gradient; stop backpropagation into it "
                             "(propagate_down: false on its bottom)")
