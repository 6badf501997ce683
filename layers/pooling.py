"""Pooling (Caffe's ``pooling_layer.cpp``): MAX, AVE and STOCHASTIC over 2-D windows.

Shapes: bottom ``(N, C, H, W)``, top ``(N, C, PH, PW)`` with
``PH = ceil|floor((H + 2*pad - k) / stride) + 1``, minus one when ``pad > 0`` and the last window
would start at or past ``H + pad`` (Caffe's clip rule). An optional 2nd top (MAX only) holds the
argmax as a flat ``h*W + w`` index (float; -1 for an empty window).

On NumPy float arrays MAX and AVE run in C (``layers.native``: Caffe's own window loops, with
the flat argmax mask); on CuPy MAX runs Caffe's GPU kernels (one launch each way) and AVE
goes to cuDNN where its output size is Caffe's; otherwise the loops run over kernel offsets
only: each step reads one strided slice of the whole batch from a padded buffer large enough to
hold the ceil-mode overhang.
"""
import itertools
import math

import numpy

from caffe8.engine import backend
from caffe8.engine.layer import Layer, from_shapes, register_layer
from caffe8.layers import cudnn_pooling, native

FLT_MAX = float(numpy.finfo(numpy.float32).max)
FLT_MIN = float(numpy.finfo(numpy.float32).tiny)

#: Caffe's MaxPoolForward / MaxPoolBackward (pooling_layer.cu) as CuPy kernels, one thread per
#: output (forward) or per input (backward): the window scan in row-major order with a strict
#: '>' from -FLT_MAX, and the backward's sum over the outputs whose window holds the input, in
#: row-major output order, which is the order of the host kernel's scatter (the same bits).
_GEOMETRY = "int32 h, int32 w, int32 kh, int32 kw, int32 sh, int32 sw, int32 ph, int32 pw, " \
            "int32 oh, int32 ow"
_DEVICE_SPECS = {
    "maxpool_fwd": (
        "raw T x, " + _GEOMETRY, "T y, int32 mask", """
        const int px = i % ow, py = (i / ow) % oh;
        const long long plane = i / ((long long)ow * oh);
        int y0 = py * sh - ph, x0 = px * sw - pw;
        const int y1 = min(y0 + kh, h), x1 = min(x0 + kw, w);
        y0 = max(y0, 0);
        x0 = max(x0, 0);
        T best = (T)(-3.4028234663852886e+38);
        int arg = -1;
        for (int r = y0; r < y1; ++r)
            for (int c = x0; c < x1; ++c) {
                const T v = x[plane * h * w + r * w + c];
                if (v > best) { best = v; arg = r * w + c; }
            }
        y = best;
        mask = arg;"""),
    "maxpool_bwd": (
        "raw T dy, raw int32 mask, " + _GEOMETRY, "T dx", """
        const int c = i % w, r = (i / w) % h;
        const long long base = (i / ((long long)w * h)) * oh * ow;
        const int a0 = (r + ph < kh) ? 0 : (r + ph - kh) / sh + 1;
        const int a1 = min((r + ph) / sh + 1, oh);
        const int b0 = (c + pw < kw) ? 0 : (c + pw - kw) / sw + 1;
        const int b1 = min((c + pw) / sw + 1, ow);
        const int me = r * w + c;
        T g = 0;
        for (int a = a0; a < a1; ++a)
            for (int b = b0; b < b1; ++b)
                if (mask[base + a * ow + b] == me) g += dy[base + a * ow + b];
        dx = g;"""),
}


def _device_kernel(name):
    """The named CuPy kernel of ``_DEVICE_SPECS`` (made once: ``backend.elementwise_kernel``)."""
    return backend.elementwise_kernel(*_DEVICE_SPECS[name], "caffe8_" + name)


def pooled_size(size, kernel, pad, stride, ceil_mode):
    """Caffe's pooled length, including the clip rule that applies only when ``pad > 0``."""
    ratio = (size + 2 * pad - kernel) / stride
    out = (math.ceil(ratio) if ceil_mode else math.floor(ratio)) + 1
    if pad > 0 and (out - 1) * stride >= size + pad:
        out -= 1
    return out


def _pair(layer, p, name, default):
    """(h, w) of a scalar field or its ``_h``/``_w`` pair, with Caffe's either-or rule."""
    base = "kernel" if name == "kernel_size" else name
    h_name, w_name = base + "_h", base + "_w"
    if p.has(h_name) or p.has(w_name):
        if p.has(name):
            raise layer.error(f"{name} is {name} OR {h_name} and {w_name}; not both")
        if not (p.has(h_name) and p.has(w_name)):  # Caffe checks this for pad and stride too
            raise layer.error(f"for non-square {name}s both {h_name} and {w_name} are required")
        return getattr(p, h_name), getattr(p, w_name)
    if not p.has(name) and default is None:
        raise layer.error(f"{name} (or {h_name} and {w_name}) is required")
    v = getattr(p, name) if p.has(name) else default
    return v, v


@register_layer("Pooling")
class PoolingLayer(Layer):
    exact_num_bottom = 1
    min_top = 1
    max_top = 2

    def layer_setup(self, bottom, top):
        p = self.layer_param.pooling_param
        self.method = p.pool
        self.global_pooling = p.global_pooling
        if self.global_pooling:
            if p.has("kernel_size") or p.has("kernel_h") or p.has("kernel_w"):
                raise self.error("with global_pooling: true the kernel size cannot be specified")
            self.kernel = None
        else:
            self.kernel = _pair(self, p, "kernel_size", None)
            if min(self.kernel) <= 0:
                raise self.error(f"kernel dimensions must be > 0, got {self.kernel}")
        self.pad = _pair(self, p, "pad", 0)
        self.stride = _pair(self, p, "stride", 1)
        self.ceil_mode = p.round_mode == "CEIL"
        self.mask = None  # Caffe's flat argmax index of each MAX output (C path)
        self._check_setup(top)

    def _check_setup(self, top):
        if min(self.stride) <= 0:
            raise self.error(f"stride must be > 0, got {self.stride}")
        if self.global_pooling and (any(self.pad) or self.stride != (1, 1)):
            raise self.error("with global_pooling: true only pad = 0 and stride = 1 are allowed")
        if any(self.pad):
            if self.method not in ("MAX", "AVE"):
                raise self.error(f"padding is implemented only for MAX and AVE pooling, not {self.method}")
            if not self.global_pooling and (self.pad[0] >= self.kernel[0] or self.pad[1] >= self.kernel[1]):
                raise self.error(f"pad {self.pad} must be smaller than kernel {self.kernel}")
        if len(top) == 2 and self.method != "MAX":
            raise self.error(f"only MAX pooling can output the argmax mask as a 2nd top, not {self.method}")

    @from_shapes
    def reshape(self, bottom, top):
        shape = bottom[0].shape
        if len(shape) != 4:
            raise self.error(f"input must have 4 axes (N, C, H, W), got shape {shape}")
        hw = shape[2:]
        self.k = tuple(hw) if self.global_pooling else tuple(self.kernel)
        for size, k, q in zip(hw, self.k, self.pad):
            if k > size + 2 * q:
                raise self.error(f"kernel {self.k} is larger than the padded input "
                                 f"{tuple(s + 2 * r for s, r in zip(hw, self.pad))}")
        self.out = tuple(pooled_size(s, k, q, st, self.ceil_mode)
                         for s, k, q, st in zip(hw, self.k, self.pad, self.stride))
        for t in top:
            t.reshape(shape[:2] + self.out)

    # --- window access -------------------------------------------------------------------------
    def _offsets(self):
        """Kernel offsets (i, j) in Caffe's row-major scan order."""
        return list(itertools.product(range(self.k[0]), range(self.k[1])))

    def _window(self, i, j):
        """Slices of the padded buffer that kernel offset (i, j) reads for every output."""
        (sh, sw), (ph, pw) = self.stride, self.out
        return (Ellipsis, slice(i, i + sh * (ph - 1) + 1, sh), slice(j, j + sw * (pw - 1) + 1, sw))

    def _buffer(self, x, fill):
        """``x`` inside a buffer padded with ``fill``, large enough for every (overhanging) window."""
        xp = backend.get_array_module(x)
        buf = xp.full(self._buffer_shape(x.shape), fill, dtype=x.dtype)
        self._crop(buf, x.shape)[...] = x
        return buf

    def _buffer_shape(self, shape):
        (h, w), (ph, pw), (qh, qw) = shape[2:], self.out, self.pad
        return shape[:2] + (max(h + 2 * qh, (ph - 1) * self.stride[0] + self.k[0]),
                            max(w + 2 * qw, (pw - 1) * self.stride[1] + self.k[1]))

    def _crop(self, buf, shape):
        (h, w), (qh, qw) = shape[2:], self.pad
        return buf[..., qh:qh + h, qw:qw + w]

    def _ave_divisor(self, xp, dtype, hw):
        """Caffe's AVE pool sizes ``(PH, PW)``: padding counts, ceil overhang past H+pad does not."""
        sizes = []
        for n, st, q, k, s in zip(self.out, self.stride, self.pad, self.k, hw):
            start = numpy.arange(n) * st - q
            sizes.append(numpy.minimum(start + k, s + q) - start)
        return xp.asarray(numpy.outer(*sizes), dtype=dtype)

    # --- forward / backward ------------------------------------------------------------------------
    def _whole_image(self, hw):
        """True when the single window is the whole unpadded image (global pooling, pool5)."""
        return self.out == (1, 1) and not any(self.pad) and self.k == tuple(hw)

    def forward(self, bottom, top):
        if cudnn_pooling.wants(self, bottom[0].data, len(top)):  # AVE, engine CUDNN/DEFAULT
            return cudnn_pooling.forward(self, bottom, top)
        if self.method in ("MAX", "AVE") and self._whole_image(bottom[0].shape[2:]):
            self._forward_whole_image(bottom, top)
        elif self.method == "MAX":
            self._forward_max(bottom, top)
        elif self.method == "AVE":
            self._forward_ave(bottom, top)
        else:
            self._forward_stochastic(bottom, top)

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        if cudnn_pooling.wants(self, bottom[0].data, len(top)):
            return cudnn_pooling.backward(self, top, propagate_down, bottom)
        xp = backend.get_array_module(top[0].diff)
        dy = top[0].diff
        if self.method in ("MAX", "AVE") and self._whole_image(bottom[0].shape[2:]):
            self._backward_whole_image(xp, dy, bottom[0])
            return
        if self.method == "MAX" and self.mask is not None and xp is not numpy:
            _device_kernel("maxpool_bwd")(xp.ascontiguousarray(dy), self.mask,
                                          *self._geometry(bottom[0].shape), bottom[0].diff)
            return
        if self.method == "MAX" and self.mask is not None and \
                native.max_pool_backward(dy, self.mask, bottom[0].diff):
            return
        if self.method == "AVE" and native.ave_pool_backward(dy, self.k, self.pad, self.stride,
                                                             bottom[0].diff):
            return
        acc = xp.zeros(self._buffer_shape(bottom[0].shape), dtype=dy.dtype)
        if self.method == "AVE":
            g = dy / self._ave_divisor(xp, dy.dtype, bottom[0].shape[2:])
            for i, j in self._offsets():
                acc[self._window(i, j)] += g
        else:  # MAX and STOCHASTIC: the gradient goes to the chosen offset only
            if self.choice is None:
                raise self.error("STOCHASTIC pooling has no backward in the TEST phase")
            for o, (i, j) in enumerate(self._offsets()):
                acc[self._window(i, j)] += xp.where(self.choice == o, dy, 0)
        bottom[0].diff[...] = self._crop(acc, bottom[0].shape)

    def _forward_whole_image(self, bottom, top):
        """One window per channel: a reduction instead of H*W offset steps."""
        x = bottom[0].data
        xp = backend.get_array_module(x)
        flat = x.reshape(x.shape[:2] + (-1,))
        if self.method == "AVE":
            top[0].data[...] = (flat.sum(axis=2) / flat.shape[2]).reshape(top[0].shape)
            return
        peak = flat.max(axis=2)
        found = peak > -FLT_MAX  # Caffe starts at -FLT_MAX: nothing below it can win
        # argmax returns the first maximum in row-major order, as Caffe's strict '>' scan does
        self.choice = xp.where(found, flat.argmax(axis=2), -1).astype(numpy.int32).reshape(top[0].shape)
        top[0].data[...] = xp.where(found, peak, -FLT_MAX).reshape(top[0].shape)
        if len(top) == 2:
            top[1].data[...] = self._flat_argmax(xp, x.shape[3]).astype(top[1].data.dtype)

    def _backward_whole_image(self, xp, dy, bottom):
        n, c = dy.shape[:2]
        count = bottom.count // (n * c)
        if self.method == "AVE":
            grad = xp.broadcast_to(dy.reshape(n, c, 1) / count, (n, c, count))
        else:
            grad = (xp.arange(count) == self.choice.reshape(n, c, 1)) * dy.reshape(n, c, 1)
        bottom.diff[...] = grad.reshape(bottom.shape)

    def _geometry(self, x_shape):
        """The device kernels' scalar arguments (h, w, kernel, stride, pad, out) as int32."""
        return tuple(numpy.int32(v) for v in (*x_shape[2:], *self.k, *self.stride, *self.pad,
                                              *self.out))

    def _forward_max(self, bottom, top):
        x = bottom[0].data
        xp = backend.get_array_module(x)
        if xp is not numpy:                   # Caffe's GPU kernel: one launch for the batch
            if backend.get_array_module(self.mask) is numpy or self.mask.shape != top[0].shape:
                self.mask = xp.empty(top[0].shape, dtype=numpy.int32)
            _device_kernel("maxpool_fwd")(xp.ascontiguousarray(x), *self._geometry(x.shape),
                                          top[0].data, self.mask)
            if len(top) == 2:
                top[1].data[...] = self.mask
            return
        if native.enabled_for(x, top[0].data):
            if self.mask is None or self.mask.shape != top[0].shape:
                self.mask = numpy.empty(top[0].shape, dtype=numpy.int32)  # kept across iterations
            native.max_pool(x, self.k, self.pad, self.stride, top[0].data, self.mask)
            if len(top) == 2:
                top[1].data[...] = self.mask
            return
        self.mask = None  # the offset-loop path keeps self.choice instead
        buf = self._buffer(x, -numpy.inf)  # padding and overhang can never win a strict '>'
        best = xp.full(x.shape[:2] + self.out, -FLT_MAX, dtype=x.dtype)
        choice = xp.full(best.shape, -1, dtype=numpy.int32)
        better = xp.empty(best.shape, dtype=bool)
        for o, (i, j) in enumerate(self._offsets()):
            v = buf[self._window(i, j)]
            xp.greater(v, best, out=better)  # strict: the first maximum in row-major order wins ties
            xp.maximum(best, v, out=best)  # same values as a masked copy, but vectorised
            xp.copyto(choice, numpy.int32(o), where=better)
        self.choice = choice
        top[0].data[...] = best
        if len(top) == 2:
            top[1].data[...] = self._flat_argmax(xp, x.shape[3]).astype(top[1].data.dtype)

    def _flat_argmax(self, xp, width):
        """Argmax as Caffe's flat ``h*W + w`` index into the unpadded image (-1 if none)."""
        kw = self.k[1]
        i, j = self.choice // kw, self.choice % kw
        hs = xp.arange(self.out[0]).reshape(-1, 1) * self.stride[0] - self.pad[0]
        ws = xp.arange(self.out[1]).reshape(1, -1) * self.stride[1] - self.pad[1]
        return xp.where(self.choice >= 0, (hs + i) * width + (ws + j), -1)

    def _forward_ave(self, bottom, top):
        x = bottom[0].data
        if native.ave_pool(x, self.k, self.pad, self.stride, top[0].data):
            return
        xp = backend.get_array_module(x)
        buf = self._buffer(x, 0)
        total = xp.zeros(x.shape[:2] + self.out, dtype=x.dtype)
        for i, j in self._offsets():
            total += buf[self._window(i, j)]
        top[0].data[...] = total / self._ave_divisor(xp, x.dtype, x.shape[2:])

    def _forward_stochastic(self, bottom, top):
        """Caffe's GPU-only STOCHASTIC pooling, in ``xp`` (inputs are expected non-negative).

        TRAIN samples one position per window with probability proportional to its value
        (the first position whose running sum reaches ``u * sum``); TEST outputs
        ``sum(x^2) / (FLT_MIN + sum(x))``.
        """
        x = bottom[0].data
        xp = backend.get_array_module(x)
        buf = self._buffer(x, 0)
        windows = [buf[self._window(i, j)] for i, j in self._offsets()]
        total = sum(windows)
        if self.phase != "TRAIN":
            top[0].data[...] = sum(v * v for v in windows) / (FLT_MIN + total)
            self.choice = None
            return
        threshold = backend.random_uniform(total.shape, x.dtype, xp) * total
        running = xp.zeros_like(total)
        choice = xp.full(total.shape, -1, dtype=numpy.int32)
        picked = xp.zeros_like(total)
        for o, v in enumerate(windows):
            running = running + v
            take = (choice < 0) & (running >= threshold)
            choice = xp.where(take, numpy.int32(o), choice)
            picked = xp.where(take, v, picked)
        self.choice = choice
        top[0].data[...] = picked
