"""Elementwise neuron layers: ReLU, Sigmoid, TanH, Power, Exp, Log (Caffe's NeuronLayer family).

All take one bottom and one top of the same shape and may run in place (top[0] is bottom[0]).
In place, bottom data is overwritten by forward, so each backward uses only top data or state
saved in forward when it needs the input ``x``.
"""
import abc
import math

from caffe8.engine import backend
from caffe8.engine.layer import Layer, from_shapes, register_layer
from caffe8.layers import native
from caffe8.layers.axes import is_in_place, reshape_like


class NeuronLayer(Layer):
    """One bottom, one top of the same shape, in place allowed."""
    exact_num_bottom = 1
    exact_num_top = 1
    needs_input = False  # does backward need x itself (not only y)?

    @from_shapes
    def reshape(self, bottom, top):
        reshape_like(bottom, top)

    def _save_input(self, x, in_place):
        """Keep a copy of x only when backward needs it and forward is about to overwrite it."""
        self._x = x.copy() if (in_place and self.needs_input) else None

    def _input(self, bottom):
        return bottom[0].data if self._x is None else self._x


class ElementwiseNeuronLayer(NeuronLayer):
    """``y = f(x)`` and ``dx = dy · f'(x)`` from the two formulas a subclass gives."""

    def forward(self, bottom, top):
        x = bottom[0].data
        self._save_input(x, is_in_place(bottom, top))
        top[0].data[...] = self.f(x, backend.get_array_module(x))

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        xp = backend.get_array_module(top[0].data)
        bottom[0].diff[...] = top[0].diff * self.df(bottom, top, xp)

    @abc.abstractmethod
    def f(self, x, xp):
        """y = f(x), elementwise."""

    @abc.abstractmethod
    def df(self, bottom, top, xp):
        """dy/dx, shape of x."""


@register_layer("ReLU")
class ReLULayer(NeuronLayer):
    """y = max(x, 0) + slope * min(x, 0); dy/dx = 1 for x > 0 else slope (slope at exactly 0).

    Forward and backward write through ``out=`` (ReLU is on every conv/fc output, and these
    passes are memory-bound), which also makes in place free of temporaries when slope is 0.
    On NumPy float arrays backward, and forward with a slope, are one C pass
    (``layers.native``) instead of two or three NumPy passes with temporaries.
    """

    def layer_setup(self, bottom, top):
        self.slope = float(self.layer_param.relu_param.negative_slope)
        # With slope >= 0, y > 0 exactly when x > 0, so top data suffices (in place too).
        self.needs_input = self.slope < 0

    def forward(self, bottom, top):
        x, y = bottom[0].data, top[0].data
        xp = backend.get_array_module(x)
        self._save_input(x, is_in_place(bottom, top))
        if self.slope == 0:
            xp.maximum(x, 0, out=y)
            return
        if native.relu(x, self.slope, y):
            return
        neg = xp.minimum(x, 0)  # before y is written: in place, y is x
        neg *= x.dtype.type(self.slope)
        xp.maximum(x, 0, out=y)
        y += neg

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        xp = backend.get_array_module(top[0].diff)
        ref = self._input(bottom) if self.needs_input else top[0].data
        dy, dx = top[0].diff, bottom[0].diff
        if native.relu_backward(dy, ref, self.slope, dx):
            return
        positive = ref > 0
        if self.slope == 0:
            xp.multiply(dy, positive, out=dx)
            return
        # dx = dy * (slope + (1 - slope) * [x > 0])
        factor = positive.astype(dy.dtype)
        factor *= dy.dtype.type(1 - self.slope)
        factor += dy.dtype.type(self.slope)
        xp.multiply(dy, factor, out=dx)


@register_layer("Sigmoid")
class SigmoidLayer(ElementwiseNeuronLayer):
    """y = 1 / (1 + exp(-x)), computed as 0.5·tanh(x/2) + 0.5 (no overflow); dy/dx = y(1-y)."""

    def f(self, x, xp):
        half = x.dtype.type(0.5)
        return xp.tanh(x * half) * half + half

    def df(self, bottom, top, xp):
        y = top[0].data
        return y * (1 - y)


@register_layer("TanH")
class TanHLayer(ElementwiseNeuronLayer):
    """y = tanh(x); dy/dx = 1 - y²."""

    def f(self, x, xp):
        return xp.tanh(x)

    def df(self, bottom, top, xp):
        y = top[0].data
        return 1 - y * y


@register_layer("Power")
class PowerLayer(ElementwiseNeuronLayer):
    """y = (shift + scale·x)^power; dy/dx = power·scale·(shift + scale·x)^(power-1)."""

    def layer_setup(self, bottom, top):
        p = self.layer_param.power_param
        self.power, self.scale, self.shift = float(p.power), float(p.scale), float(p.shift)
        self.diff_scale = self.power * self.scale
        # The derivative is constant when power is 1 or the output does not depend on x.
        self.needs_input = not (self.diff_scale == 0 or self.power == 1)

    def f(self, x, xp):
        dt = x.dtype.type
        if self.diff_scale == 0:  # Caffe: y = 1 for power 0, else shift^power, for every x
            value = 1.0 if self.power == 0 else self.shift ** self.power
            return xp.full(x.shape, value, dtype=x.dtype)
        return (x * dt(self.scale) + dt(self.shift)) ** dt(self.power)

    def df(self, bottom, top, xp):
        x = self._input(bottom)
        dt = x.dtype.type
        if not self.needs_input:
            return xp.full(x.shape, self.diff_scale, dtype=x.dtype)
        base = x * dt(self.scale) + dt(self.shift)
        return dt(self.diff_scale) * base ** dt(self.power - 1)


@register_layer("Exp")
class ExpLayer(ElementwiseNeuronLayer):
    """y = base^(shift + scale·x) (base -1 means e); dy/dx = y·ln(base)·scale."""

    def layer_setup(self, bottom, top):
        p = self.layer_param.exp_param
        base = float(p.base)
        if base != -1 and base <= 0:
            raise self.error(f"exp_param.base must be strictly positive (or -1 for e), got {base}")
        log_base = 1.0 if base == -1 else math.log(base)
        self.inner_scale = log_base * float(p.scale)
        self.outer_scale = 1.0 if p.shift == 0 else math.exp(log_base * float(p.shift))

    def f(self, x, xp):
        dt = x.dtype.type
        return dt(self.outer_scale) * xp.exp(x * dt(self.inner_scale))

    def df(self, bottom, top, xp):
        return top[0].data * top[0].data.dtype.type(self.inner_scale)


@register_layer("Log")
class LogLayer(ElementwiseNeuronLayer):
    """y = log_base(shift + scale·x) (base -1 means e).

    dy/dx = scale / ((shift + scale·x)·ln base).
    """
    needs_input = True

    def layer_setup(self, bottom, top):
        p = self.layer_param.log_param
        base = float(p.base)
        if base != -1 and (base <= 0 or base == 1):
            raise self.error(f"log_param.base must be positive and not 1 (or -1 for e), got {base}")
        self.base_scale = 1.0 if base == -1 else 1.0 / math.log(base)
        self.scale, self.shift = float(p.scale), float(p.shift)

    def _arg(self, x):
        dt = x.dtype.type
        return x * dt(self.scale) + dt(self.shift)

    def f(self, x, xp):
        return xp.log(self._arg(x)) * x.dtype.type(self.base_scale)

    def df(self, bottom, top, xp):
        x = self._input(bottom)
        return x.dtype.type(self.scale * self.base_scale) / self._arg(x)
