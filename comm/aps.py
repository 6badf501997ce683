"""Auto Precision Scaling (Han, Demmel, You, "Auto-Precision Scaling for distributed deep learning"): per-tensor power-of-two scale into a small float.

For one tensor g on P ranks:

1. each rank takes E_r = floor(log2(max |g_r|)), the float exponent of its largest |gradient|
   (one small integer, not a float, goes on the wire);
2. E = MAX-allreduce of E_r, so every max |g_r| < 2**(E+1);
3. the scale is 2**k with k the LARGEST integer such that P * 2**(E+1) * 2**k <= U, U = the
   format's largest finite value (the APS paper's relaxed no-overflow condition, Eq. 2-4): the exact
   sum of the P scaled values can then never exceed U (a rounded partial sum can, in a format
   with few mantissa bits, e.g. E3M0's 3 * 2**j rounding up to 4 * 2**j: the format saturates). A power of two is exact to apply and undo, so
   scaling adds no rounding of its own;
4. every rank sends its g * 2**k rounded to nearest even in the format (comm.formats.FloatFormat:
   E5M2, E4M3, E3M0, ... any ``FloatFormat``). Rounding cannot push an element past
   2**(E+1+k) (a power of two, hence representable), so the bound of step 3 survives rounding;
5. every rank gathers every rank's codes and sums them in rank order 0..P-1 *in the small
   format*, as the paper's emulator (CPD, "Customized-Precision Deep Learning") does with a
   low-precision accumulator: see :func:`small_format_sum`; then * 2**-k / P in float32.
   All ranks run the same additions on the same codes, so they get the same bits.

Hybrid precision (the paper's "last layer in FP32" and "FP32 for the first epochs"):
``fp32_layers`` = N sends the last N parameter tensors of the net (in the net's parameter
order: the classification layer's weight and bias are the last 2) as float32 every iteration,
and ``fp32_iters`` = K sends every tensor as float32 for iterations < K. Those tensors are
summed in rank order in float32 (the paper's FP32 baseline has no low-precision accumulator),
then divided by P; ``kahan`` does not apply to them.

Formats of 4 bits or fewer (E3M0, E2M1) go two codes to a byte (``pack_nibbles``); wider ones
up to 8 bits one per byte, up to 16 bits as uint16.
A tensor of zeros (or one whose max |value| is not finite) has no exponent: it gets k = 0, so
NaN/Inf reach the format's NaN code / saturation instead of being scaled.
"""
import numpy

from caffe8.engine import backend
from caffe8.comm import kernels
from caffe8.comm.formats import FP8_E5M2, FloatFormat, get_format

NO_EXPONENT = -(1 << 40)     # "no finite nonzero element": loses every MAX, means k = 0


def local_exponent(x):
    """floor(log2(max |x|)) as a Python int; NO_EXPONENT when max |x| is 0 or not finite."""
    return peak_exponent(float(local_peak(x)))


def local_peak(x):
    """max |x| (0 for an empty x), left where x lives: read it with :func:`peak_exponent` where
    a wait for the device costs nothing (the exchange's communication thread)."""
    xp = backend.get_array_module(x)
    return xp.max(xp.abs(x)) if x.size else 0.0


def peak_exponent(peak):
    """floor(log2(peak)) of a host float; NO_EXPONENT when it is 0 or not finite."""
    if peak == 0.0 or not numpy.isfinite(peak):
        return NO_EXPONENT
    return int(numpy.frexp(peak)[1]) - 1          # peak = f * 2**e, f in [0.5, 1)


def scale_exponent(exponent, fmt, processes):
    """k: the largest integer with ``processes * 2**(exponent + 1 + k) <= fmt.max`` (0 for
    NO_EXPONENT). Exact: Python floats hold P * 2**j exactly for the ranges involved."""
    if exponent == NO_EXPONENT:
        return 0
    j = int(numpy.frexp(fmt.max)[1])            # 2**j > fmt.max: walk down to the first fit
    while processes * 2.0 ** j > fmt.max:
        j -= 1
    return j - exponent - 1


def pack_nibbles(codes):
    """uint8 codes < 16 (flat, length n) → ceil(n / 2) bytes: code 2i in the low nibble of byte
    i, code 2i+1 in the high nibble (a zero nibble pads an odd length)."""
    xp = backend.get_array_module(codes)
    if codes.size % 2:
        codes = xp.concatenate([codes, xp.zeros(1, xp.uint8)])
    return (codes[0::2] | (codes[1::2] << 4)).astype(xp.uint8)


def unpack_nibbles(packed, n):
    """Inverse of :func:`pack_nibbles`: the first ``n`` 4-bit codes as uint8."""
    xp = backend.get_array_module(packed)
    codes = xp.empty(2 * packed.size, xp.uint8)
    codes[0::2] = packed & 0x0F
    codes[1::2] = packed >> 4
    return codes[:n]


def float32_sum(rows, xp):
    """Sum of the float32 arrays ``rows`` in their order (float32 adds): hybrid-precision tensors."""
    total = xp.zeros_like(rows[0], dtype=xp.float32)
    for r in rows:
        total += r
    return total


def small_format_sum(rows, fmt, kahan=False):
    """Elementwise sum of ``rows`` (arrays of values representable in ``fmt``) in list order, the
    running sum rounded back to ``fmt`` after every addition; a float32 array of ``fmt`` values.

    What is emulated: an adder whose inputs and output are ``fmt`` numbers. Each addition
    (and, with ``kahan``, each subtraction) is done exactly and then rounded once to ``fmt`` with
    :meth:`FloatFormat.encode` (nearest, ties to even, subnormals and the format's overflow
    behaviour included: the shared formats saturate to +-max, NaN stays NaN). The exact
    result is the float64 result for every shared format (a span of at most 2**-24 .. 2**16 needs
    fewer than 53 bits); where float64 would round (a format of 7 or 8 exponent bits), the two
    operands of at most 15 significant bits each are more than 37 binades apart, so the smaller
    is far under half an ulp of the larger in ``fmt`` and the one rounding to ``fmt`` gives the
    same result as from the exact sum.

    Plain: ``s = fl(s + x)`` for x in rows, s starting at 0.
    ``kahan``: Kahan's compensated summation with the compensation ``c`` kept in ``fmt`` as
    well, every operation rounded to ``fmt``::

        y = fl(x - c);  t = fl(s + y);  c = fl(fl(t - s) - y);  s = t

    The paper says only that its emulator offers Kahan summation with an arbitrary low-precision
    accumulator, not in which precision the compensation lives; we keep it in the small format,
    since a float32 compensation would be a float32 accumulator in disguise, and a small-format
    adder is all the emulated hardware has. Consequences a reader should expect: ``c`` can
    underflow to 0 (below the format's smallest subnormal), the compensation still unapplied
    after the last addend is dropped, and ``y`` itself is rounded, so Kahan reduces the error but
    does not make the sum exact.
    """
    xp = backend.get_array_module(rows[0])
    if fmt is FP8_E5M2 and not kahan and xp is numpy:
        return _e5m2_sum_host(rows)

    def fl(v):
        return fmt.decode(fmt.encode(v)).astype(xp.float64)

    s = xp.zeros(rows[0].shape, xp.float64)
    c = xp.zeros_like(s)
    with numpy.errstate(invalid="ignore", over="ignore"):     # inf - inf: NaN, as in hardware
        for x in rows:
            x = xp.asarray(x, xp.float64)
            if not kahan:
                s = fl(s + x)
                continue
            y = fl(x - c)
            t = fl(s + y)
            c = fl(fl(t - s) - y)
            s = t
    return s.astype(xp.float32)


def _e5m2_sum_host(rows):
    """``small_format_sum`` for E5M2 (APS's default, Oyama et al.'s fp8) on the host: the same
    sums through the exchange's C kernels, the MPI op's ``fp8_sum`` (a float32 addition, then
    one nearest-even rounding to fp8, saturating: the exact sum's rounding, since two fp8
    values that float32 cannot add exactly lie more than 21 binades apart, where the smaller is
    far under half an fp8 ulp of the larger). Four NumPy passes of the general encoder per
    row become two C passes."""
    shape, n = rows[0].shape, rows[0].size
    total, codes = numpy.zeros(n, numpy.uint8), numpy.empty(n, numpy.uint8)      # code 0: +0
    for x in rows:
        kernels.encode_fp8(numpy.ascontiguousarray(x, numpy.float32).reshape(-1), codes)
        kernels.fp8_sum(codes, total)
    return kernels.decode_fp8(total, numpy.empty(n, numpy.float32)).reshape(shape)


class ApsCompressor:
    """APS codec (Horovod compressor shape plus the collective it needs).

    ``fmt``: a FloatFormat or a name known to comm.formats ("E5M2", "E4M3", "E3M0", ...).
    ``compress(tensor, exponent=None, processes=1, *, iteration=0, name=None) -> (payload, ctx)``
    (payload: flat codes, nibble-packed for <= 4-bit formats, or float32 under hybrid precision;
    ctx = (k or None, dtype, shape));
    ``exponent`` is the MAX-allreduced E (default: the tensor's own), ``processes`` the P the
    scale must allow for. ``decompress(payload, ctx)`` → the float values g * 2**k / 2**k (not yet
    divided by P). The exchange's codec (comm/codecs.py) agrees on E and sums the gathered
    ``values`` of every rank in rank order with :meth:`sum`.

    ``fp32_layers`` here is a set of tensor names (the exchange's codec maps its count of last
    tensors onto tensor keys); ``fp32_iters`` as in the module docstring.
    """

    def __init__(self, fmt, kahan=False, fp32_iters=0, fp32_layers=()):
        self.fmt = fmt if isinstance(fmt, FloatFormat) else get_format(fmt)
        self.kahan = bool(kahan)
        self.fp32_iters = int(fp32_iters)
        self.fp32_layers = frozenset(fp32_layers)

    def full_precision(self, iteration=0, name=None):
        """True when this tensor goes as float32 (hybrid precision)."""
        return iteration < self.fp32_iters or (name is not None and name in self.fp32_layers)

    def compress(self, tensor, exponent=None, processes=1, *, iteration=0, name=None):
        xp = backend.get_array_module(tensor)
        if self.full_precision(iteration, name):
            return xp.asarray(tensor, xp.float32).ravel().copy(), (None, tensor.dtype, tensor.shape)
        e = local_exponent(tensor) if exponent is None else exponent
        k = scale_exponent(e, self.fmt, processes)
        if self.fmt is FP8_E5M2 and xp is numpy and tensor.dtype == numpy.float32:
            # the host's E5M2 through the exchange's fp8 kernel: float32 ldexp is exact down to
            # 2**-126, far under E5M2's smallest subnormal (2**-16), so one rounding as below
            scaled = numpy.ldexp(numpy.ascontiguousarray(tensor).reshape(-1), k)
            return (kernels.encode_fp8(scaled, numpy.empty(scaled.size, numpy.uint8)),
                    (k, tensor.dtype, tensor.shape))
        # ldexp in float64 is exact; FloatFormat.encode rounds once, to nearest even.
        codes = self.fmt.encode(xp.ldexp(xp.asarray(tensor, xp.float64), k)).ravel()
        if self.fmt.bits <= 4:
            codes = pack_nibbles(codes)
        return codes, (k, tensor.dtype, tensor.shape)

    def decompress(self, payload, ctx):
        k, dtype, shape = ctx
        values = self.values(payload, k, int(numpy.prod(shape)))
        return self.unscale(values, k).reshape(shape).astype(dtype, copy=False)

    def values(self, payload, k, n):
        """float32 values on the wire scale (codes decoded, or the float32 payload itself)."""
        if k is None:
            return payload
        codes = unpack_nibbles(payload, n) if self.fmt.bits <= 4 else payload
        return self.fmt.decode(codes)

    def unscale(self, values, k):
        """values * 2**-k (exact: a power of two), or ``values`` under hybrid precision."""
        xp = backend.get_array_module(values)
        return values if k is None else xp.ldexp(values, -k)

    def sum(self, rows, k):
        """The rank-order sum of the wire values ``rows`` (scale 2**k): in the small format
        (:func:`small_format_sum`, Kahan-compensated when configured), or in float32 for a
        hybrid-precision tensor (``k`` None)."""
        if k is None:
            return float32_sum(rows, backend.get_array_module(rows[0]))
        return small_format_sum(rows, self.fmt, self.kahan)
