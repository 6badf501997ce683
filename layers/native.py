"""C kernels of the spatial layers (layers/csrc/layer_kernels.c) through ctypes, for NumPy arrays.

Each wrapper returns True when it ran and False when the caller must take its NumPy (or CuPy)
path: no compiled library, a CuPy array, a dtype other than float32/float64, or
``CAFFE8_LAYER_KERNELS=numpy`` in the environment (``use_native(False)`` does the same at run
time, e.g. to test both paths). ctypes releases the GIL for each call. The library is found,
built and bound by ``engine.native.Kernels``: setup.py's ``layers._layer_kernels``, else a build
cached under ~/.cache/caffe8.
"""
import ctypes
import os

import numpy

from caffe8.engine import blas
from caffe8.engine.native import Kernels

_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "csrc", "layer_kernels.c")
_ABI_VERSION = 3                          # must equal C8L_ABI_VERSION in layer_kernels.c
#: as in setup.py: no -march (one build for every x86-64), no FMA contraction (NumPy's rounding)
CFLAGS = ["-O3", "-std=c99", "-fno-trapping-math", "-ffp-contract=off", "-pthread"]
_P = ctypes.c_void_p
_I = ctypes.c_ssize_t


def _signatures(real):
    """(restype, argtypes) of every kernel, with ``real`` the ctypes scalar of the dtype."""
    geometry = [_I] * 16
    pool = [_I] * 11
    return {name: (None, argtypes) for name, argtypes in {
        "im2col": [_P] + geometry + [_P],
        "col2im": [_P] + geometry + [_P],
        "maxpool_fwd": [_P] + pool + [_P, _P],
        "maxpool_bwd": [_P, _P, _I, _I, _I, _I, _I, _P],
        "avepool_fwd": [_P] + pool + [_P],
        "avepool_bwd": [_P] + pool + [_P],
        "lrn_scale": [_P, _I, _I, _I, _I, real, real, _P, _P],
        "lrn_bwd": [_P, _P, _P, _P, _P, _I, _I, _I, _I, real, _P, _P],
        "relu_fwd": [_P, _I, real, _P],
        "relu_bwd": [_P, _P, _I, real, _P],
        "dropout_fwd": [_P, _P, _I, real, real, _P, _P],
        "dwconv_fwd": [_P, _P] + geometry[:14] + [_P, _I],
        "dwconv_bwd": [_P, _P] + geometry[:14] + [_P, _I],
        "dwconv_wgrad": [_P, _P] + geometry[:14] + [_P, _I],
    }.items()}


_KERNELS = Kernels("layers.native", _SOURCE, "_layer_kernels", ("c8l_abi_version", _ABI_VERSION),
                   "c8l_", _signatures, "CAFFE8_LAYER_KERNELS", [(CFLAGS, ["-pthread"])])
library_file = _KERNELS.library_file
use_native = _KERNELS.use_native
enabled_for = _KERNELS.enabled_for


def _int32_mask(mask):
    return mask.dtype == numpy.int32 and mask.flags.c_contiguous


# --- convolution -----------------------------------------------------------------------------------
def _col_strides(n, c, kernel, out_hw, per_image):
    """(row stride, image stride) of the column layouts, in elements."""
    plane = out_hw[0] * out_hw[1]
    if per_image:                                     # (N, C, KH, KW, OH, OW)
        return plane, c * kernel[0] * kernel[1] * plane
    return n * plane, plane                           # (C, KH, KW, N, OH, OW)


def im2col_2d(x, kernel, pad, stride, dilation, out_hw, cols, per_image=False):
    """Columns of x (N, C, H, W) into cols: (C, KH, KW, N, OH, OW), or with ``per_image``
    (N, C, KH, KW, OH, OW). False when the C path does not apply."""
    n, c, h, w = x.shape
    return _KERNELS.run("im2col", (x, cols), x, n, c, h, w, *kernel, *pad, *stride, *dilation,
                        *out_hw, *_col_strides(n, c, kernel, out_hw, per_image), cols)


def col2im_2d(cols, x_shape, kernel, pad, stride, dilation, out_hw, dx, per_image=False):
    """dx (N, C, H, W) = col2im of cols in either layout of ``im2col_2d`` (overwritten)."""
    n, c, h, w = x_shape
    return _KERNELS.run("col2im", (cols, dx), cols, n, c, h, w, *kernel, *pad, *stride,
                        *dilation, *out_hw, *_col_strides(n, c, kernel, out_hw, per_image), dx)


def _depthwise(name, a, b, out, x_shape, kernel, pad, stride, dilation, out_hw):
    """A depthwise kernel on the host GEMM's worker count (``blas.threads()``): each plane (or
    channel) is computed whole by one thread, so any count gives the same bits."""
    n, c, h, w = x_shape
    return _KERNELS.run(name, (a, b, out), a, b, n, c, h, w, *kernel, *pad, *stride, *dilation,
                        *out_hw, out, blas.threads())


def depthwise_forward(x, w, kernel, pad, stride, dilation, out_hw, y):
    """y (N, C, OH, OW) = the depthwise convolution of x (N, C, H, W) with w (C, 1, KH, KW)
    (group = channels = outputs), overwritten. False when the C path does not apply."""
    return _depthwise("dwconv_fwd", x, w, y, x.shape, kernel, pad, stride, dilation, out_hw)


def depthwise_backward_data(dy, w, kernel, pad, stride, dilation, out_hw, dx):
    """dx (N, C, H, W) = the adjoint of ``depthwise_forward`` applied to dy, overwritten."""
    return _depthwise("dwconv_bwd", dy, w, dx, dx.shape, kernel, pad, stride, dilation, out_hw)


def depthwise_weight_gradient(x, dy, kernel, pad, stride, dilation, out_hw, dw):
    """dw (C, 1, KH, KW) += the weight gradient of ``depthwise_forward`` (x, dy)."""
    return _depthwise("dwconv_wgrad", x, dy, dw, x.shape, kernel, pad, stride, dilation, out_hw)


# --- pooling ------------------------------------------------------------------------------------
def max_pool(x, kernel, pad, stride, y, mask):
    """Caffe's MAX pool of x (N, C, H, W) into y (N, C, OH, OW) and int32 flat-index mask."""
    n, c, h, w = x.shape
    return _int32_mask(mask) and _KERNELS.run("maxpool_fwd", (x, y), x, n * c, h, w, *kernel,
                                              *pad, *stride, *y.shape[2:], y, mask)


def max_pool_backward(dy, mask, dx):
    n, c, h, w = dx.shape
    return _int32_mask(mask) and _KERNELS.run("maxpool_bwd", (dy, dx), dy, mask, n * c, h, w,
                                              *dy.shape[2:], dx)


def ave_pool(x, kernel, pad, stride, y):
    n, c, h, w = x.shape
    return _KERNELS.run("avepool_fwd", (x, y), x, n * c, h, w, *kernel, *pad, *stride,
                        *y.shape[2:], y)


def ave_pool_backward(dy, kernel, pad, stride, dx):
    n, c, h, w = dx.shape
    return _KERNELS.run("avepool_bwd", (dy, dx), dy, n * c, h, w, *kernel, *pad, *stride,
                        *dy.shape[2:], dx)


# --- LRN across channels -----------------------------------------------------------------------
def _planes(x):
    """(N, C, H*W) of an (N, C, ...) array."""
    n, c = x.shape[:2]
    return n, c, x.size // max(n * c, 1)


def lrn_scale(x, size, alpha_over_n, k, scale, scratch):
    """scale = k + alpha_over_n * (sum of x^2 over ``size`` neighbouring channels).

    x, scale: (N, C, H, W); scratch: C*H*W elements."""
    return _KERNELS.run("lrn_scale", (x, scale, scratch), x, *_planes(x), size, alpha_over_n,
                        k, scale, scratch)


def lrn_across_backward(x, y, dy, scale, power, size, coeff, dx, scratch):
    """dx = dy * power - coeff * x * (window sum of dy * y / scale); scratch: C*H*W elements."""
    return _KERNELS.run("lrn_bwd", (x, y, dy, scale, power, dx, scratch), x, y, dy, scale,
                        power, *_planes(x), size, coeff, dx, scratch)


# --- elementwise -------------------------------------------------------------------------------
def relu(x, slope, y):
    return _KERNELS.run("relu_fwd", (x, y), x, x.size, slope, y)


def relu_backward(dy, ref, slope, dx):
    return _KERNELS.run("relu_bwd", (dy, ref, dx), dy, ref, dy.size, slope, dx)


def dropout(x, u, ratio, scale, mask, y):
    """mask = (u >= ratio) * scale and y = x * mask in one pass (u may be mask itself)."""
    return _KERNELS.run("dropout_fwd", (x, u, mask, y), x, u, x.size, ratio, scale, mask, y)
