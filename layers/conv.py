"""Convolution (Caffe's ``conv_layer.cpp`` / ``base_conv_layer.cpp``): im2col + one GEMM per group.

Shapes: bottom ``(N, C, *spatial)``, weight ``(O, C/group, *kernel)``, bias ``(O,)``, top
``(N, O, *out)`` with ``out = (in + 2*pad - (dilation*(k-1)+1)) // stride + 1`` per axis
(cross-correlation, no kernel flip). Several bottoms map to as many tops with the same weights.
The batch is processed in chunks so the column buffer stays under ``MAX_COL_ELEMENTS``.
"""
import numpy

from engine import backend
from engine.layer import Layer, register_layer
from layers import cudnn_conv
from layers.im2col import col2im, conv_out_size, im2col

#: upper bound on im2col buffer elements per chunk (256 MiB of float32)
MAX_COL_ELEMENTS = 1 << 26


def _per_axis(layer, param, name, h_name, w_name, num_spatial, default):
    """Per-spatial-axis values of a repeated field or its ``_h``/``_w`` pair (Caffe's rules)."""
    has_hw = param.has(h_name) or param.has(w_name)
    values = list(getattr(param, name))
    if has_hw:
        if num_spatial != 2:
            raise layer.error(f"{h_name}/{w_name} can only be used for 2-D convolution, "
                              f"input has {num_spatial} spatial axes")
        if values:
            raise layer.error(f"either {name} or {h_name}/{w_name} should be specified; not both")
        if name == "pad":  # pad_h / pad_w have defaults 0, the others must come as a pair
            return [param.pad_h, param.pad_w]
        if not (param.has(h_name) and param.has(w_name)):
            raise layer.error(f"{h_name} and {w_name} must be given together")
        return [getattr(param, h_name), getattr(param, w_name)]
    if not values:
        if default is None:
            raise layer.error(f"{name} (or {h_name}/{w_name}) is required")
        return [default] * num_spatial
    if len(values) == 1:
        return values * num_spatial
    if len(values) != num_spatial:
        raise layer.error(f"{name} must be specified once, or once per spatial dimension "
                          f"({name} given {len(values)} times for {num_spatial} spatial axes)")
    return values


@register_layer("Convolution")
class ConvolutionLayer(Layer):
    min_bottom = 1
    min_top = 1

    def layer_setup(self, bottom, top):
        p = self.layer_param.convolution_param
        if len(bottom) != len(top):
            raise self.error(f"needs as many tops as bottoms, got {len(bottom)} bottoms and "
                             f"{len(top)} tops")
        ndim = len(bottom[0].shape)
        axis = p.axis + ndim if p.axis < 0 else p.axis
        if axis != 1:
            raise self.error(f"only the channel axis 1 is supported, got axis {p.axis} "
                             f"for a {ndim}-axis input")
        self.num_spatial = ndim - 2
        if self.num_spatial < 1:
            raise self.error(f"input must have at least one spatial axis, got shape {bottom[0].shape}")
        self._read_geometry(p)
        if not p.has("num_output") or p.num_output <= 0:
            raise self.error("convolution_param.num_output must be given and > 0")
        self.num_output = p.num_output
        self.group = p.group
        self.channels = bottom[0].shape[1]
        if self.group < 1 or self.channels % self.group:
            raise self.error(f"number of input channels ({self.channels}) must be a multiple of "
                             f"group ({self.group})")
        if self.num_output % self.group:
            raise self.error(f"num_output ({self.num_output}) must be a multiple of group ({self.group})")
        self._make_params(p)

    def _read_geometry(self, p):
        n = self.num_spatial
        self.kernel = _per_axis(self, p, "kernel_size", "kernel_h", "kernel_w", n, None)
        self.stride = _per_axis(self, p, "stride", "stride_h", "stride_w", n, 1)
        self.pad = _per_axis(self, p, "pad", "pad_h", "pad_w", n, 0)
        self.dilation = list(p.dilation) or [1] * n
        if len(self.dilation) == 1:
            self.dilation *= n
        if len(self.dilation) != n:
            raise self.error(f"dilation must be specified once, or once per spatial dimension "
                             f"(given {len(self.dilation)} times for {n} spatial axes)")
        for name in ("kernel", "stride", "dilation"):
            if any(v <= 0 for v in getattr(self, name)):
                raise self.error(f"{name} dimensions must be > 0, got {getattr(self, name)}")

    def _make_params(self, p):
        shape = (self.num_output, self.channels // self.group) + tuple(self.kernel)
        self.make_param(shape, p.weight_filler)
        if p.bias_term:
            self.make_param((self.num_output,), p.bias_filler)

    def reshape(self, bottom, top):
        shape = bottom[0].shape
        for b in bottom[1:]:
            if b.shape != shape:
                raise self.error(f"all bottoms must have the same shape; got {shape} and {b.shape}")
        if len(shape) != self.num_spatial + 2 or shape[1] != self.channels:
            raise self.error(f"input shape {shape} is incompatible with the convolution kernel "
                             f"(expects {self.channels} channels and {self.num_spatial} spatial axes)")
        out = [conv_out_size(*a) for a in zip(shape[2:], self.kernel, self.pad, self.stride,
                                               self.dilation)]
        if any(o < 1 for o in out):
            raise self.error(f"kernel {self.kernel} (dilation {self.dilation}) is larger than the "
                             f"padded input {[s + 2 * q for s, q in zip(shape[2:], self.pad)]}")
        self.out_spatial = tuple(out)
        for t in top:
            t.reshape((shape[0], self.num_output) + self.out_spatial)

    # --- helpers ---------------------------------------------------------------------------------
    def _geometry(self):
        return self.kernel, self.pad, self.stride, self.dilation

    def _chunks(self, batch):
        """Batch index ranges whose column buffer fits in ``MAX_COL_ELEMENTS``."""
        per_image = self.channels * int(numpy.prod(self.kernel)) * int(numpy.prod(self.out_spatial))
        step = max(1, MAX_COL_ELEMENTS // max(per_image, 1))
        return [(i, min(i + step, batch)) for i in range(0, batch, step)]

    def _grouped_weight(self):
        """Weight as ``(group, O/group, K)``, ``K = C/group * prod(kernel)``."""
        w = self.blobs[0].data
        return w.reshape(self.group, self.num_output // self.group, -1)

    def _cols(self, x):
        """im2col of ``x`` (n, C, *spatial) as ``(group, K, n * prod(out))``."""
        cols = im2col(x, *self._geometry())
        return cols.reshape(self.group, -1, x.shape[0] * int(numpy.prod(self.out_spatial)))

    # --- forward / backward ------------------------------------------------------------------------
    def forward(self, bottom, top):
        if cudnn_conv.wants(self, bottom[0].data):  # engine CUDNN/DEFAULT on CuPy arrays
            return cudnn_conv.forward(self, bottom, top)
        w = self._grouped_weight()
        for b, t in zip(bottom, top):
            x, y = b.data, t.data
            n_all = x.shape[0]
            y3 = y.reshape(n_all, self.num_output, -1)
            for lo, hi in self._chunks(n_all):
                prod = backend.get_array_module(x).matmul(w, self._cols(x[lo:hi]))
                y3[lo:hi] = prod.reshape(self.num_output, hi - lo, -1).swapaxes(0, 1)
            if len(self.blobs) > 1:
                y3 += self.blobs[1].data.reshape(1, -1, 1)

    def backward(self, top, propagate_down, bottom):
        if cudnn_conv.wants(self, top[0].diff):
            return cudnn_conv.backward(self, top, propagate_down, bottom)
        want_w = self.param_propagate_down[0]
        want_b = len(self.blobs) > 1 and self.param_propagate_down[1]
        for i, (t, b) in enumerate(zip(top, bottom)):
            dy = t.diff.reshape(t.diff.shape[0], self.num_output, -1)
            if want_b:
                self.blobs[1].diff += dy.sum(axis=(0, 2))
            want_x = bool(propagate_down[i]) if i < len(propagate_down) else False
            if want_w or want_x:
                self._backward_chunks(dy, b, want_w, want_x)

    def _backward_chunks(self, dy, b, want_w, want_x):
        """Weight gradient (accumulated) and bottom gradient (overwritten) of one bottom."""
        xp = backend.get_array_module(dy)
        w = self._grouped_weight()
        og = self.num_output // self.group
        for lo, hi in self._chunks(dy.shape[0]):
            # (n, O, P) -> (group, O/group, n*P): the layout the columns use
            dyg = xp.ascontiguousarray(dy[lo:hi].swapaxes(0, 1)).reshape(self.group, og, -1)
            if want_w:
                cols = self._cols(b.data[lo:hi])
                dw = xp.matmul(dyg, cols.swapaxes(1, 2))
                self.blobs[0].diff += dw.reshape(self.blobs[0].diff.shape)
            if want_x:
                dcols = xp.matmul(w.swapaxes(1, 2), dyg)
                dcols = dcols.reshape((self.channels,) + tuple(self.kernel) + (hi - lo,)
                                      + self.out_spatial)
                b.diff[lo:hi] = col2im(dcols, b.data[lo:hi].shape, *self._geometry())
