"""Convolution (Caffe's ``conv_layer.cpp`` / ``base_conv_layer.cpp``): im2col + one GEMM per group.

Shapes: bottom ``(N, C, *spatial)``, weight ``(O, C/group, *kernel)``, bias ``(O,)``, top
``(N, O, *out)`` with ``out = (in + 2*pad - (dilation*(k-1)+1)) // stride + 1`` per axis
(cross-correlation, no kernel flip). Several bottoms map to as many tops with the same weights.
The batch is processed in chunks so the column buffer stays under ``MAX_COL_ELEMENTS``.

The arithmetic lives in ``ConvGeometry`` (forward, backward-data, weight gradient on plain arrays)
so that Deconvolution (also here), whose forward is convolution's backward-data, runs the same
code.
"""
import numpy

from caffe8.engine import backend
from caffe8.engine.layer import Layer, from_shapes, register_layer
from caffe8.layers import cudnn_conv, native
from caffe8.layers.im2col import col2im, conv_out_size, im2col

#: upper bound on im2col buffer elements per chunk (64 MiB of float32)
MAX_COL_ELEMENTS = 1 << 24
#: output positions per image from which one GEMM per image beats one GEMM per batch chunk: below
#: it the per-image products are too small to keep BLAS's threads busy (LeNet's conv2, P = 64:
#: 12.6 vs 2.5 ms at b64; GoogLeNet's 7x7 and 14x14 inception layers), above it the batch
#: GEMM's operands outgrow the cache and need a transposing copy of the output
PER_IMAGE_MIN_POSITIONS = 512


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


def read_geometry(layer, p):
    """Caffe's reading of ``convolution_param`` (BaseConvolutionLayer::LayerSetUp, which
    Im2colLayer copies): sets ``layer.kernel``, ``stride``, ``pad`` and ``dilation``, one value
    per spatial axis of ``layer.num_spatial``."""
    n = layer.num_spatial
    layer.kernel = _per_axis(layer, p, "kernel_size", "kernel_h", "kernel_w", n, None)
    layer.stride = _per_axis(layer, p, "stride", "stride_h", "stride_w", n, 1)
    layer.pad = _per_axis(layer, p, "pad", "pad_h", "pad_w", n, 0)
    layer.dilation = list(p.dilation) or [1] * n
    if len(layer.dilation) == 1:
        layer.dilation *= n
    if len(layer.dilation) != n:
        raise layer.error(f"dilation must be specified once, or once per spatial dimension "
                          f"(given {len(layer.dilation)} times for {n} spatial axes)")
    for name in ("kernel", "stride", "dilation"):
        if any(v <= 0 for v in getattr(layer, name)):
            raise layer.error(f"{name} dimensions must be > 0, got {getattr(layer, name)}")


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
        read_geometry(self, p)
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

    def _weight_shape(self):
        return (self.num_output, self.channels // self.group) + tuple(self.kernel)

    def _make_params(self, p):
        self.make_param(self._weight_shape(), p.weight_filler)
        if p.bias_term:
            self.make_param((self.num_output,), p.bias_filler)

    def _out_spatial(self, spatial):
        out = [conv_out_size(*a) for a in zip(spatial, self.kernel, self.pad, self.stride,
                                               self.dilation)]
        if any(o < 1 for o in out):
            raise self.error(f"kernel {self.kernel} (dilation {self.dilation}) is larger than the "
                             f"padded input {[s + 2 * q for s, q in zip(spatial, self.pad)]}")
        return tuple(out)

    @from_shapes
    def reshape(self, bottom, top):
        shape = bottom[0].shape
        for b in bottom[1:]:
            if b.shape != shape:
                raise self.error(f"all bottoms must have the same shape; got {shape} and {b.shape}")
        if len(shape) != self.num_spatial + 2 or shape[1] != self.channels:
            raise self.error(f"input shape {shape} is incompatible with the {self.type} kernel "
                             f"(expects {self.channels} channels and {self.num_spatial} spatial axes)")
        self.out_spatial = self._out_spatial(shape[2:])
        for t in top:
            t.reshape((shape[0], self.num_output) + self.out_spatial)

    # --- forward / backward ------------------------------------------------------------------------
    #: False: this convolution; True: its adjoint (Deconvolution), on the same ConvGeometry
    adjoint = False

    def _conv_shape(self, shape):
        """(input shape, output channels) of the convolution ``ConvGeometry`` computes."""
        return tuple(shape), self.num_output

    def _geometry_for(self, shape):
        """The ConvGeometry of input ``shape``, cached with its buffers while the shape holds."""
        conv_in, out_channels = self._conv_shape(shape)
        geo = getattr(self, "_geo", None)
        if geo is None or geo.in_shape != conv_in:
            geo = ConvGeometry(conv_in, out_channels, self.group, self.kernel, self.pad,
                               self.stride, self.dilation)
            self._geo = geo
        return geo

    def forward(self, bottom, top):
        if not self.adjoint and cudnn_conv.wants(self, bottom[0].data):  # CUDNN/DEFAULT on CuPy
            return cudnn_conv.forward(self, bottom, top)
        geo = self._geometry_for(bottom[0].shape)
        bias = self.blobs[1].data if len(self.blobs) > 1 else None
        # per bottom: (its version now, the token of the columns forward left in the buffer)
        self._columns_made = []
        for b, t in zip(bottom, top):
            if self.adjoint:
                geo.backward_data(b.data, self.blobs[0].data, t.data)
                token = None
            else:
                token = geo.forward(b.data, self.blobs[0].data, t.data)
            self._columns_made.append((b.version, token))
            if bias is not None:
                add_channel_bias(t.data, bias)

    def _kept_columns(self, i, blob):
        """The token of the columns this layer's forward made of bottom ``i`` when backward may
        use them as they are: the trainer vouches that nothing outside the Net wrote the bottoms
        (``forward_work_kept``) and the Net counted no write of this one since (its version);
        ``ConvGeometry`` then checks that the buffer still holds them. Else None: made again."""
        made = getattr(self, "_columns_made", ())
        if not self.forward_work_kept or i >= len(made):
            return None
        version, token = made[i]
        return token if version == blob.version else None

    def backward(self, top, propagate_down, bottom):
        if not self.adjoint and cudnn_conv.wants(self, top[0].diff):
            return cudnn_conv.backward(self, top, propagate_down, bottom)
        geo = self._geometry_for(bottom[0].shape)
        data_gradient = geo.forward if self.adjoint else geo.backward_data
        want_w = self.param_propagate_down[0]
        want_b = len(self.blobs) > 1 and self.param_propagate_down[1]
        for i, (t, b) in enumerate(zip(top, bottom)):
            if want_b:
                self.blobs[1].diff += channel_sum(t.diff)
            if want_w:       # the adjoint's input and output gradient trade places
                x, dy = (t.diff, b.data) if self.adjoint else (b.data, t.diff)
                kept = None if self.adjoint else self._kept_columns(i, b)
                geo.weight_gradient(x, dy, self.blobs[0].diff, kept=kept)
            if i < len(propagate_down) and propagate_down[i]:
                data_gradient(t.diff, self.blobs[0].data, b.diff)


def deconv_out_size(size, kernel, pad, stride, dilation):
    """Caffe's Deconvolution output length: ``stride*(size-1) + dilation*(kernel-1) + 1 - 2*pad``."""
    return stride * (size - 1) + dilation * (kernel - 1) + 1 - 2 * pad


@register_layer("Deconvolution")
class DeconvolutionLayer(ConvolutionLayer):
    """Transposed convolution (Caffe's ``deconv_layer.cpp``), same ``convolution_param``.

    Shapes: bottom ``(N, C, *spatial)``, weight ``(C, O/group, *kernel)``, bias ``(O,)``, top
    ``(N, O, *out)``, ``out = stride*(in-1) + dilation*(k-1) + 1 - 2*pad``. It is the adjoint
    of a convolution from ``(N, O, *out)`` to ``(N, C, *spatial)`` with the same weight: forward
    is that convolution's backward-data, backward-data its forward, and the weight gradient its
    weight gradient with the roles of input and output gradient swapped. ``ConvGeometry`` of
    that convolution does all three.
    """

    def _weight_shape(self):
        return (self.channels, self.num_output // self.group) + tuple(self.kernel)

    def _out_spatial(self, spatial):
        out = [deconv_out_size(*a) for a in zip(spatial, self.kernel, self.pad, self.stride,
                                                 self.dilation)]
        if any(o < 1 for o in out):
            raise self.error(f"output size {out} is not positive: pad {self.pad} is too large for "
                             f"input {list(spatial)}, kernel {self.kernel}, stride {self.stride}")
        return tuple(out)

    adjoint = True

    def _conv_shape(self, shape):
        """The adjoint convolution: ``(N, O, *out) -> (N, C, *spatial)``."""
        return (shape[0], self.num_output) + self.out_spatial, self.channels


def add_channel_bias(y, bias):
    """y (N, O, *spatial) += bias (O,) broadcast over batch and positions."""
    y.reshape(y.shape[0], y.shape[1], -1)[...] += bias.reshape(1, -1, 1)


_ONES = {}   # (positions, dtype, array module) -> a column of ones, as Caffe's bias_multiplier


def channel_sum(dy):
    """Sum of dy (N, O, *spatial) over everything but the channel axis: the bias gradient. As
    Caffe's (a GEMV with a column of ones per image): one product of the (N*O, P) rows with a
    column of ones, then the sum over the batch (3x NumPy's two-axis reduction on LeNet's conv1,
    which reads the array with a stride)."""
    n, o = dy.shape[0], dy.shape[1]
    p = int(numpy.prod(dy.shape[2:], dtype=numpy.int64))
    if p <= 1 or n == 0:
        return dy.reshape(n, o, p).sum(axis=(0, 2))
    rows = dy.reshape(n * o, p)
    xp = backend.get_array_module(dy)
    key = (p, dy.dtype.str, xp.__name__)
    ones = _ONES.get(key)
    if ones is None:
        ones = _ONES[key] = xp.ones((p, 1), dtype=dy.dtype)
    return backend.matmul(rows, ones).reshape(n, o).sum(axis=0)


class ConvGeometry:
    """One convolution's shapes and reused buffers; the three products on plain arrays.

    ``in_shape`` ``(N, C, *spatial)``, weight ``(O, C/group, *kernel)``, output
    ``(N, O, *out)``. On NumPy with two spatial axes and at least ``PER_IMAGE_MIN_POSITIONS``
    output positions the columns are laid out per image, ``(n, group, K, P)`` (K = C/group *
    prod(kernel), P = prod(out)), so one batched matmul (one BLAS call per image and group, no
    Python loop) writes each image's output in place; otherwise (small outputs, CuPy, other
    ranks) as ``im2col`` gives them, ``(group, K, n*P)``, one GEMM per chunk. The weight gradient always uses the latter: its sum over images is then the inner
    dimension of a single GEMM instead of a reduction over per-image products.
    """

    def __init__(self, in_shape, num_output, group, kernel, pad, stride, dilation):
        self.in_shape = tuple(in_shape)
        self.num_output, self.group = num_output, group
        self.kernel, self.pad = tuple(kernel), tuple(pad)
        self.stride, self.dilation = tuple(stride), tuple(dilation)
        self.channels = in_shape[1]
        self.out_spatial = tuple(conv_out_size(*a) for a in zip(in_shape[2:], kernel, pad,
                                                                 stride, dilation))
        self.positions = int(numpy.prod(self.out_spatial))
        self.k_group = self.channels // group * int(numpy.prod(kernel))
        self._buffers = {}
        # names the batch columns the "cols" buffer holds now; None once anything else took it
        self._cols_token = None

    @property
    def out_shape(self):
        return (self.in_shape[0], self.num_output) + self.out_spatial

    def _buffer(self, name, shape, like):
        """A scratch array reused across calls (allocated again only when ``shape`` grows)."""
        if name == "cols":
            self._cols_token = None   # whoever takes the buffer now writes it
        xp = backend.get_array_module(like)
        size = int(numpy.prod(shape))
        buf = self._buffers.get(name)
        if buf is None or buf.size < size or buf.dtype != like.dtype or \
                backend.get_array_module(buf) is not xp:
            buf = xp.empty(size, dtype=like.dtype)
            self._buffers[name] = buf
        return buf[:size].reshape(shape)

    def _chunks(self, batch):
        """Batch index ranges whose column buffer fits in ``MAX_COL_ELEMENTS``."""
        per_image = self.group * self.k_group * self.positions
        step = max(1, MAX_COL_ELEMENTS // max(per_image, 1))
        return [(i, min(i + step, batch)) for i in range(0, batch, step)]

    def _per_image(self, *arrays):
        """Per-image GEMMs (C im2col in that layout) rather than one GEMM per chunk?"""
        return len(self.kernel) == 2 and self.positions >= PER_IMAGE_MIN_POSITIONS and \
            native.enabled_for(*arrays)

    @property
    def depthwise(self):
        """Each channel convolved with its own 2-D filter (group = channels = outputs, MobileNet's
        3x3 layers): computed directly by the C kernels (``native.depthwise_*``), where im2col +
        GEMM made one 1 x K x P product per image and channel."""
        return self.group == self.channels == self.num_output and len(self.kernel) == 2

    def _direct(self, *arrays):
        """The direct depthwise kernels apply to these (host, contiguous) arrays?"""
        return self.depthwise and native.enabled_for(*arrays)

    @property
    def pointwise(self):
        """1x1, stride 1, no padding (GoogLeNet's reduce layers): a per-image layout is x itself."""
        return all(k == 1 for k in self.kernel) and all(s == 1 for s in self.stride) and \
            not any(self.pad)

    def _weight(self, w):
        """Weight as ``(group, O/group, K)``."""
        return w.reshape(self.group, self.num_output // self.group, self.k_group)

    def _geometry(self):
        return self.kernel, self.pad, self.stride, self.dilation

    def _cols_batch(self, x, kept=None):
        """``(columns of x (n, C, ...) as (group, K, n*P) in the reused buffer, their token)``.
        ``kept``: the token ``forward`` returned for this very ``x``, whose columns the caller
        knows to be still current; they are used as they are when the buffer still holds them
        (nothing took it since), else made again under a new token."""
        n = x.shape[0]
        still_there = kept is not None and kept is self._cols_token
        buf = self._buffer("cols", (self.group * self.k_group * n * self.positions,), x)
        if not still_there:
            im2col(x, *self._geometry(), out=buf)
        self._cols_token = kept if still_there else object()
        return buf.reshape(self.group, self.k_group, n * self.positions), self._cols_token

    def forward(self, x, w, y):
        """y (N, O, *out) = conv(x (N, C, ...), w); y is overwritten. Returns a token naming the
        columns of the whole ``x`` when it leaves them in the buffer (one chunk on the batch
        path), for ``weight_gradient(kept=...)``; else None."""
        if self._direct(x, w, y) and native.depthwise_forward(x, w, *self._geometry(),
                                                              self.out_spatial, y):
            return None
        wg = self._weight(w)
        og = self.num_output // self.group
        chunks = self._chunks(x.shape[0])
        token = None
        for lo, hi in chunks:
            n = hi - lo
            if self._per_image(x, y):
                shape = (n, self.group, self.k_group, self.positions)
                if self.pointwise:
                    cols = x[lo:hi].reshape(shape)
                else:
                    cols = self._buffer("cols", shape, x)
                    native.im2col_2d(x[lo:hi], *self._geometry(), self.out_spatial, cols,
                                     per_image=True)
                backend.matmul(wg, cols, out=y[lo:hi].reshape(n, self.group, og, self.positions))
                continue
            prod = self._buffer("prod", (self.group, og, n * self.positions), x)
            cols, token = self._cols_batch(x[lo:hi])
            backend.matmul(wg, cols, out=prod)
            y[lo:hi].reshape(n, self.num_output, self.positions)[...] = \
                prod.reshape(self.num_output, n, self.positions).swapaxes(0, 1)
        return token if len(chunks) == 1 else None

    def backward_data(self, dy, w, dx):
        """dx (N, C, ...) = the adjoint of ``forward`` applied to dy (N, O, *out); overwritten."""
        if self._direct(dy, w, dx) and native.depthwise_backward_data(
                dy, w, *self._geometry(), self.out_spatial, dx):
            return
        wt = self._weight(w).swapaxes(1, 2)                    # (group, K, O/group)
        og = self.num_output // self.group
        for lo, hi in self._chunks(dy.shape[0]):
            n = hi - lo
            if self._per_image(dy, dx):
                shape = (n, self.group, self.k_group, self.positions)
                dyg = dy[lo:hi].reshape(n, self.group, og, self.positions)
                if self.pointwise:
                    backend.matmul(wt, dyg, out=dx[lo:hi].reshape(shape))
                    continue
                dcols = self._buffer("cols", shape, dy)
                backend.matmul(wt, dyg, out=dcols)
                native.col2im_2d(dcols, dx[lo:hi].shape, *self._geometry(), self.out_spatial,
                                 dx[lo:hi], per_image=True)
                continue
            dcols = self._buffer("cols", (self.group, self.k_group, n * self.positions), dy)
            backend.matmul(wt, self._grouped_batch(dy[lo:hi]), out=dcols)
            dcols = dcols.reshape((self.channels,) + self.kernel + (n,) + self.out_spatial)
            col2im(dcols, dx[lo:hi].shape, *self._geometry(), out=dx[lo:hi])

    def _grouped_batch(self, dy):
        """dy (n, O, *out) as ``(group, O/group, n*P)`` in a reused buffer."""
        n = dy.shape[0]
        og = self.num_output // self.group
        buf = self._buffer("dy", (self.num_output, n, self.positions), dy)
        buf[...] = dy.reshape(n, self.num_output, self.positions).swapaxes(0, 1)
        return buf.reshape(self.group, og, n * self.positions)

    def weight_gradient(self, x, dy, dw, kept=None):
        """dw (O, C/group, *kernel) += the gradient of ``forward`` w.r.t. the weight. ``kept``:
        the token ``forward`` returned for this ``x``, when the caller knows that nothing wrote
        ``x`` since (see ``_cols_batch``)."""
        if self._direct(x, dy, dw) and native.depthwise_weight_gradient(
                x, dy, *self._geometry(), self.out_spatial, dw):
            return
        og = self.num_output // self.group
        dwg = dw.reshape(self.group, og, self.k_group)
        if self.pointwise and self._per_image(x, dy):
            # 1x1: x is its own columns; one product per image accumulated in image order, as
            # Caffe's weight_cpu_gemm loop, instead of copying x and dy into batch columns
            # (two passes over both, more than the products themselves at 56x56 and up)
            cg = self.channels // self.group
            for i in range(x.shape[0]):
                backend.matmul(dy[i].reshape(self.group, og, self.positions),
                               x[i].reshape(self.group, cg, self.positions).swapaxes(1, 2),
                               out=dwg, accumulate=True)
            return
        chunks = self._chunks(x.shape[0])
        for lo, hi in chunks:
            cols, _ = self._cols_batch(x[lo:hi], kept if len(chunks) == 1 else None)
            backend.matmul(self._grouped_batch(dy[lo:hi]), cols.swapaxes(1, 2), out=dwg,
                           accumulate=True)
