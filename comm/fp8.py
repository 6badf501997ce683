"""Oyama et al.'s fp8 (E5M2, the upper byte of an IEEE half) on NumPy and CuPy arrays.

    from caffe8.comm import fp8
    b = fp8.encode(x)                      # float array -> uint8 codes, same shape
    y = fp8.decode(b)                      # uint8 codes -> float32
    b = fp8.encode_ratio(grad, w, eps, s)  # fp8(grad / (|w| + eps) * s), one pass
    g = fp8.decode_ratio(b, w, eps, 1/s)   # decode(b) * (1/s) * (|w| + eps), one pass

Rounding: ``"nearest"`` rounds once, to nearest with ties to even at fp8 precision (subnormals
included; identical to ml_dtypes' float32 -> float8_e5m2 cast below the overflow threshold);
``"truncate"`` is Oyama et al.'s conversion (CUDA's float -> half, nearest even, then keep the upper
byte). Both saturate: |x| beyond 57344 and ±inf give ±57344, never inf — including values that
float16 itself rounds to inf (|x| >= 65520) under ``"truncate"``. NaN gives a NaN code (0x7E).
``"oyama"`` is everything as Oyama, Nomura, Sato and Matsuoka did it: the ``"truncate"`` conversion
and, in :func:`add` and the MPI sum op, their Algorithm 2 (float32 sum, half with nearest even,
keep the upper byte, infinity -> largest finite).

    s = fp8.add(a, b, rounding="oyama")    # uint8 codes + uint8 codes -> uint8 codes (the op)

Implementations: each function is one call for either device. NumPy arrays go through
comm.kernels (the fused C kernels when they are built, else its vectorised NumPy fallback; the
choice is made there only); CuPy arrays use one fused ElementwiseKernel per direction. The
codec's calls (``encode_ratio``, ``encode_scaled``, ``decode_ratio``, ``decode_scaled``) take an
``out`` to write into, so the fp8 codec (comm/codecs.py) never asks which device it is on.
float64 inputs of ``encode`` go through the general exact encoder (comm.formats), since
rounding them to float32 first could round twice.
"""
import numpy

from caffe8.comm import formats, kernels
from caffe8.engine import backend

MAX = kernels.FP8_MAX


def _check_rounding(rounding):
    kernels.check_rounding(rounding, "comm.fp8: rounding")


def _conversion(rounding):
    """The conversion a rounding mode uses: Oyama et al.'s conversion is ``"truncate"``."""
    return "truncate" if rounding == "oyama" else rounding


# --- CuPy kernels -------------------------------------------------------------------------------
CUDA_PREAMBLE = r"""
__device__ __forceinline__ unsigned int c8_f2u(float f) { return __float_as_uint(f); }
__device__ __forceinline__ float c8_u2f(unsigned int u) { return __uint_as_float(u); }

// float -> fp8 (E5M2), nearest even at fp8 precision, saturating (see comm/csrc/kernels.c)
__device__ __forceinline__ unsigned char c8_fp8_rne(float f) {
    unsigned int u = c8_f2u(f), a = u & 0x7FFFFFFFu, c;
    if (a > 0x7F800000u) c = 0x7Eu;
    else if (a < 0x38800000u) c = c8_f2u(__fadd_rn(c8_u2f(a), 128.0f)) - 0x43000000u;
    else {
        a += 0xFFFFFu + ((a >> 21) & 1u);
        c = (a >> 21) - 448u;
        if (c > 0x7Bu) c = 0x7Bu;
    }
    return (unsigned char)(((u >> 24) & 0x80u) | c);
}

// float -> half bits, nearest even; |f| >= 65520 -> inf
__device__ __forceinline__ unsigned int c8_half_rne(float f) {
    unsigned int u = c8_f2u(f), a = u & 0x7FFFFFFFu, s = (u >> 16) & 0x8000u;
    if (a > 0x7F800000u) return s | 0x7E00u | ((a >> 13) & 0x3FFu);
    if (a >= 0x477FF000u) return s | 0x7C00u;
    if (a < 0x38800000u) return s | (c8_f2u(__fadd_rn(c8_u2f(a), 0.5f)) - 0x3F000000u);
    a += 0xFFFu + ((a >> 13) & 1u);
    return s | ((a >> 13) - (112u << 10));
}

// Oyama et al.'s conversion: half (nearest even), upper byte; half inf saturates
__device__ __forceinline__ unsigned char c8_fp8_trunc(float f) {
    unsigned int c = c8_half_rne(f) >> 8;
    if ((c & 0x7Fu) == 0x7Cu) c -= 1u;
    return (unsigned char)c;
}

// half bits -> float, exactly (a subnormal half is m * 2**-24, a normal float)
__device__ __forceinline__ float c8_half_to_float(unsigned int h) {
    unsigned int s = (h & 0x8000u) << 16, e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
    if (e == 0x1Fu) return c8_u2f(s | 0x7F800000u | (m << 13));
    if (e == 0u) { float v = (float)m * 5.9604644775390625e-8f; return s ? -v : v; }
    return c8_u2f(s | ((e + 112u) << 23) | (m << 13));
}

__device__ __forceinline__ float c8_fp8_to_float(unsigned char b) {
    return c8_half_to_float(((unsigned int)b) << 8);
}

// half + half as the host's half sum (comm/csrc/kernels.c, half_add_sat): float32 sum (both
// operands and any nonzero sum are multiples of 2**-24, normal floats, so -ftz changes nothing),
// nearest even to half, +-inf saturated to +-65504
__device__ __forceinline__ unsigned short c8_half_add_sat(unsigned short a, unsigned short b) {
    unsigned int s = c8_half_rne(__fadd_rn(c8_half_to_float(a), c8_half_to_float(b)));
    return (unsigned short)((s & 0x7FFFu) == 0x7C00u ? s - 1u : s);
}

// fp8 + fp8 as the MPI op does it: float32 sum, then one nearest-even rounding to fp8 (equal to
// the host's float32 -> half -> fp8, since float32 has more than 2 * 11 + 2 bits) ...
__device__ __forceinline__ unsigned char c8_fp8_add_nearest(unsigned char a, unsigned char b) {
    return c8_fp8_rne(__fadd_rn(c8_fp8_to_float(a), c8_fp8_to_float(b)));
}

// ... or as Oyama et al.'s Algorithm 2: float32 sum, half (nearest even), upper byte
__device__ __forceinline__ unsigned char c8_fp8_add_oyama(unsigned char a, unsigned char b) {
    return c8_fp8_trunc(__fadd_rn(c8_fp8_to_float(a), c8_fp8_to_float(b)));
}
// float32 arithmetic that keeps subnormals although CuPy compiles every kernel with -ftz=true
// (appended after any option of ours), which flushes them in each f32 instruction: the operands
// are widened bitwise, the operation runs exactly or rounded in float64 (untouched by -ftz), and
// the result is rounded once to float32 in integers, nearest even, subnormals included. Rounding
// twice is innocuous for + - * / since 53 >= 2 * 24 + 2 (Figueroa, "When is double rounding
// innocuous?"), so each c8_* below is the IEEE float32 operation the host computes.
__device__ __forceinline__ double c8_f2d(float f) {
    unsigned int u = c8_f2u(f), a = u & 0x7FFFFFFFu;
    double v;
    if (a >= 0x7F800000u)
        v = __longlong_as_double(0x7FF0000000000000LL | ((long long)(a & 0x7FFFFFu) << 29));
    else if (a < 0x00800000u)                       // subnormal: a * 2**-149, exactly
        v = (double)a * __longlong_as_double(0x36A0000000000000LL);
    else
        v = __longlong_as_double(((long long)a + (896LL << 23)) << 29);
    return (u >> 31) ? -v : v;
}

__device__ __forceinline__ float c8_d2f(double d) {
    unsigned long long u = (unsigned long long)__double_as_longlong(d);
    unsigned int s = (unsigned int)(u >> 32) & 0x80000000u, bits;
    unsigned long long m = u & 0xFFFFFFFFFFFFFULL, rem, half;
    int e = (int)((u >> 52) & 0x7FFu), shift;
    if (e == 0x7FF) return c8_u2f(s | 0x7F800000u | (m ? 0x400000u | (unsigned int)(m >> 29) : 0u));
    if (e == 0) return c8_u2f(s);                   // below 2**-1022: rounds to zero
    e -= 896;                                       // float32's biased exponent
    if (e >= 255) return c8_u2f(s | 0x7F800000u);
    m |= 1ULL << 52;
    shift = e >= 1 ? 29 : 30 - e;
    if (shift >= 54) return c8_u2f(s);              // under half the smallest subnormal
    bits = (unsigned int)(m >> shift) + (e >= 1 ? ((unsigned int)e - 1u) << 23 : 0u);
    rem = m & ((1ULL << shift) - 1ULL);
    half = 1ULL << (shift - 1);
    bits += (rem > half || (rem == half && (bits & 1u))) ? 1u : 0u;
    return c8_u2f(s | bits);
}

__device__ __forceinline__ float c8_add(float a, float b) { return c8_d2f(c8_f2d(a) + c8_f2d(b)); }
__device__ __forceinline__ float c8_mul(float a, float b) { return c8_d2f(c8_f2d(a) * c8_f2d(b)); }
__device__ __forceinline__ float c8_div(float a, float b) { return c8_d2f(c8_f2d(a) / c8_f2d(b)); }
__device__ __forceinline__ float c8_abs(float a) { return c8_u2f(c8_f2u(a) & 0x7FFFFFFFu); }
"""

# name -> (inputs, outputs, body) of each fused ElementwiseKernel. Kept as data so that
# tests/comm/test_fp8.py can also compile the same CUDA text as C on the host and check it.
CUDA_KERNEL_SPECS = {
    "encode_nearest": ("float32 x", "uint8 y", "y = c8_fp8_rne(x)"),
    "encode_truncate": ("float32 x", "uint8 y", "y = c8_fp8_trunc(x)"),
    "decode": ("uint8 b", "float32 y", "y = c8_fp8_to_float(b)"),
    "encode_ratio_nearest": (
        "float32 g, float32 w, float32 eps, float32 scale", "uint8 y",
        "y = c8_fp8_rne(c8_mul(c8_div(g, c8_add(c8_abs(w), eps)), scale))"),
    "encode_ratio_truncate": (
        "float32 g, float32 w, float32 eps, float32 scale", "uint8 y",
        "y = c8_fp8_trunc(c8_mul(c8_div(g, c8_add(c8_abs(w), eps)), scale))"),
    "encode_scaled_nearest": ("float32 x, float32 scale", "uint8 y",
                              "y = c8_fp8_rne(c8_mul(x, scale))"),
    "encode_scaled_truncate": ("float32 x, float32 scale", "uint8 y",
                               "y = c8_fp8_trunc(c8_mul(x, scale))"),
    "decode_scaled": ("uint8 b, float32 inv_scale", "float32 y",
                      "y = c8_mul(c8_fp8_to_float(b), inv_scale)"),
    "add_nearest": ("uint8 a, uint8 b", "uint8 y", "y = c8_fp8_add_nearest(a, b)"),
    "add_oyama": ("uint8 a, uint8 b", "uint8 y", "y = c8_fp8_add_oyama(a, b)"),
    # the other wire formats' sums, for the sums on the GPUs (comm.ipc): float16 bits as
    # comm.kernels.half_sum, float32 as numpy.add (IEEE, subnormals kept)
    "half_add": ("uint16 a, uint16 b", "uint16 y", "y = c8_half_add_sat(a, b)"),
    "float_add": ("float32 a, float32 b", "float32 y", "y = c8_add(a, b)"),
    "decode_ratio": (
        "uint8 b, float32 w, float32 eps, float32 inv_scale", "float32 y",
        "y = c8_mul(c8_mul(c8_fp8_to_float(b), inv_scale), c8_add(c8_abs(w), eps))"),
    # float64 <-> float32 as the host casts, subnormals kept: CuPy's astype runs under -ftz
    # and flushes float32 subnormals (the codec's float64 nets, in and out)
    "narrow": ("float64 x", "float32 y", "y = c8_d2f(x)"),
    "widen": ("float32 x", "float64 y", "y = c8_f2d(x)"),
}


def cuda_kernel(name):
    """The named fused CuPy kernel of ``CUDA_KERNEL_SPECS`` (made once:
    ``backend.elementwise_kernel``)."""
    inp, out, body = CUDA_KERNEL_SPECS[name]
    return backend.elementwise_kernel(inp, out, body, "caffe8_fp8_" + name, CUDA_PREAMBLE)


def _is_gpu(xp):
    return xp is not numpy and backend.gpu_available()


def _float32_on_device(x):
    """A float32 CuPy array of ``x``'s values, rounded as the host rounds (subnormals kept)."""
    cp = backend.cupy
    x = cp.asarray(x)
    return cuda_kernel("narrow")(x) if x.dtype == cp.float64 else x.astype(cp.float32, copy=False)


def widen_into(y32, out):
    """``out[...] = y32`` for a float32 ``y32`` (NumPy or CuPy); on CuPy with a float64 ``out``
    through a kernel that keeps float32 subnormals, as the host's cast does."""
    xp = backend.get_array_module(out)
    if _is_gpu(xp) and out.dtype == xp.float64:
        cuda_kernel("widen")(y32.reshape(out.shape), out)
    else:
        out[...] = y32.reshape(out.shape)
    return out


# --- public API ---------------------------------------------------------------------------------
def encode(x, rounding="nearest"):
    """Float array (NumPy or CuPy) -> uint8 fp8 codes of the same shape; see the module doc."""
    _check_rounding(rounding)
    xp = backend.get_array_module(x)
    x = xp.asarray(x)
    if x.dtype == xp.float64:
        return formats.FP8_E5M2.encode(x, _conversion(rounding))
    x = x.astype(xp.float32, copy=False)
    if _is_gpu(xp):
        return cuda_kernel("encode_" + _conversion(rounding))(x)
    return _encode_host(x, rounding)


def _encode_host(x32, rounding, scale=1.0):
    flat = numpy.ascontiguousarray(x32).reshape(-1)
    out = numpy.empty(flat.shape, numpy.uint8)
    kernels.encode_fp8(flat, out, scale=scale, rounding=rounding)
    return out.reshape(x32.shape)


def decode(b):
    """uint8 fp8 codes (NumPy or CuPy) -> float32 of the same shape."""
    xp = backend.get_array_module(b)
    b = xp.asarray(b)
    if b.dtype != xp.uint8:
        raise TypeError(f"comm.fp8.decode: codes must be uint8, got {b.dtype}")
    if _is_gpu(xp):
        return cuda_kernel("decode")(b)
    return _decode_host(b)


def _decode_host(b):
    flat = numpy.ascontiguousarray(b).reshape(-1)
    out = numpy.empty(flat.shape, numpy.float32)
    kernels.decode_fp8(flat, out)
    return out.reshape(b.shape)


def add(a, b, rounding="nearest"):
    """fp8 sum ``sat(a + b)`` of two uint8 code arrays of one shape (NumPy or CuPy) -> uint8.

    ``rounding``: ``"nearest"`` (nearest even at fp8 precision) or ``"oyama"`` (Oyama et al.'s
    Algorithm 2: truncation after a nearest-even half). On the host this is the MPI sum op's own
    code (``comm.kernels.fp8_sum`` on the current kernel path); on CuPy a fused kernel with the
    same arithmetic.
    """
    if rounding not in kernels.SUM_ROUNDINGS:
        raise ValueError(f"comm.fp8.add: rounding must be one of {kernels.SUM_ROUNDINGS}, "
                         f"got {rounding!r}")
    xp = backend.get_array_module(a, b)
    a, b = xp.asarray(a), xp.asarray(b)
    if a.dtype != xp.uint8 or b.dtype != xp.uint8:
        raise TypeError(f"comm.fp8.add: codes must be uint8, got {a.dtype} and {b.dtype}")
    if a.shape != b.shape:
        raise ValueError(f"comm.fp8.add: shapes differ: {a.shape} and {b.shape}")
    if _is_gpu(xp):
        return cuda_kernel("add_" + rounding)(a, b)
    out = numpy.array(b, order="C")                  # the op sums into its inout buffer
    kernels.fp8_sum(numpy.ascontiguousarray(a).reshape(-1), out.reshape(-1), rounding)
    return out


def encode_ratio(grad, weight, eps, scale, rounding="nearest", out=None):
    """fp8 codes of ``grad / (|weight| + eps) * scale``, computed in float32 in that order.

    grad, weight: float arrays of one shape (NumPy or CuPy; float64 is first rounded to
    float32); eps, scale: Python floats. One fused kernel on either device (comm.kernels'
    ``encode_ratio_fp8`` on the host), written into ``out`` (a uint8 array of grad's size)
    when given.
    """
    _check_rounding(rounding)
    xp = backend.get_array_module(grad, weight)
    gpu = _is_gpu(xp)
    if gpu:
        g, w = _float32_on_device(grad), _float32_on_device(weight)
    else:
        g, w = xp.asarray(grad, dtype=xp.float32), xp.asarray(weight, dtype=xp.float32)
    if g.shape != w.shape:
        raise ValueError(f"comm.fp8.encode_ratio: grad shape {g.shape} != weight shape {w.shape}")
    eps32, scale32 = numpy.float32(eps), numpy.float32(scale)
    if gpu:
        kernel = cuda_kernel("encode_ratio_" + _conversion(rounding))
        return kernel(g, w, eps32, scale32) if out is None else kernel(g, w, eps32, scale32, out)
    target = _host_target(out, g.shape, numpy.uint8)
    kernels.encode_ratio_fp8(numpy.ascontiguousarray(g).reshape(-1),
                             numpy.ascontiguousarray(w).reshape(-1), float(eps32),
                             float(scale32), target.reshape(-1), rounding)
    return _finish(target, out)


def _host_target(out, shape, dtype):
    """Where a host kernel writes: ``out`` itself when it is a C-contiguous array of ``dtype``
    (any shape of that size), else a new array of ``shape``."""
    if out is not None and isinstance(out, numpy.ndarray) and out.dtype == dtype and \
            out.flags.c_contiguous:
        return out
    return numpy.empty(shape, dtype)


def _finish(target, out):
    """``target`` copied into ``out`` when it is not ``out`` itself (another dtype, layout or
    shape of the same size); the result."""
    if out is None or target is out:
        return target if out is None else out
    out[...] = target.reshape(out.shape)
    return out


def encode_scaled(x, scale, rounding="nearest", out=None):
    """fp8 codes of ``float32(x) * float32(scale)`` (one float32 multiply, float64 ``x``
    included, as comm.kernels' host encode), into ``out`` (uint8, x's size) when given."""
    _check_rounding(rounding)
    xp = backend.get_array_module(x)
    if _is_gpu(xp):
        x32 = _float32_on_device(x)
        kernel = cuda_kernel("encode_scaled_" + _conversion(rounding))
        scale32 = numpy.float32(scale)
        return kernel(x32, scale32) if out is None else kernel(x32, scale32, out)
    x32 = numpy.ascontiguousarray(x, dtype=numpy.float32)
    target = _host_target(out, x32.shape, numpy.uint8)
    kernels.encode_fp8(x32.reshape(-1), target.reshape(-1), float(numpy.float32(scale)),
                       rounding)
    return _finish(target, out)


def decode_scaled(b, inv_scale, out=None):
    """``decode(b) * float32(inv_scale)`` in float32 (one fused kernel on either device), of
    b's shape; with ``out`` (any float array of b's size, e.g. a float64 gradient) written
    into it, widened as the host widens."""
    xp = backend.get_array_module(b)
    inv32 = numpy.float32(inv_scale)
    if _is_gpu(xp):
        y = cuda_kernel("decode_scaled")(xp.asarray(b, xp.uint8), inv32)
        return y if out is None else widen_into(y, out)
    b = numpy.ascontiguousarray(b)
    target = _host_target(out, b.shape, numpy.float32)
    kernels.decode_fp8(b.reshape(-1), target.reshape(-1), float(inv32))
    return _finish(target, out)


def decode_ratio(b, weight, eps, inv_scale, out=None):
    """``decode(b) * inv_scale * (|weight| + eps)`` in float32, left to right (one fused kernel
    on either device: comm.kernels' ``decode_ratio_fp8`` on the host); shape of b; with
    ``out`` (any float array of b's size) written into it, widened as the host widens."""
    xp = backend.get_array_module(b, weight)
    gpu = _is_gpu(xp)
    b = xp.asarray(b)                                              # codes on weight's device
    w = _float32_on_device(weight) if gpu else xp.asarray(weight, dtype=xp.float32)
    if b.shape != w.shape:
        raise ValueError(f"comm.fp8.decode_ratio: codes shape {b.shape} != weight shape {w.shape}")
    eps32, inv32 = numpy.float32(eps), numpy.float32(inv_scale)
    if gpu:
        y = cuda_kernel("decode_ratio")(b, w, eps32, inv32)
        return y if out is None else widen_into(y, out)
    target = _host_target(out, b.shape, numpy.float32)
    kernels.decode_ratio_fp8(numpy.ascontiguousarray(b).reshape(-1),
                             numpy.ascontiguousarray(w).reshape(-1), float(eps32), float(inv32),
                             target.reshape(-1))
    return _finish(target, out)
