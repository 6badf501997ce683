"""Auto Precision Scaling (Han, Demmel, You, "Auto-Precision Scaling for distributed deep learning"): per-tensor power-of-two scale into a small float.

For one tensor g on P ranks:

1. each rank takes E_r = floor(log2(max |g_r|)), the float exponent of its largest |gradient|
   (one small integer, not a float, goes on the wire);
2. E = MAX-allreduce of E_r, so every max |g_r| < 2**(E+1);
3. the scale is 2**k with k the LARGEST integer such that P * 2**(E+1) * 2**k <= U, U = the
   format's largest finite value (the APS paper's relaxed no-overflow condition, Eq. 2-4): the sum of
   the P scaled values can then never exceed U. A power of two is exact to apply and undo, so
   scaling adds no rounding of its own (seed §3.3.1);
4. every rank sends its g * 2**k rounded to nearest even in the format (comm.formats.FloatFormat:
   E5M2, E4M3, E3M0, ... any ``FloatFormat``). Rounding cannot push an element past
   2**(E+1+k) (a power of two, hence representable), so the bound of step 3 survives rounding;
5. the sum over ranks is an explicit reduce in rank order 0..P-1 over the decoded float32 values
   (allgather of the codes, then a local sum), plain or Kahan-compensated (``kahan=True``), so
   every rank gets the same bits; then * 2**-k / P.

Hybrid precision (seed §4): ``fp32_iters`` = K sends float32 for iterations < K, and
``fp32_layers`` names tensors (e.g. the last layer) that always go as float32; both are codec
parameters, checked by ``full_precision(iteration, name)``.

Formats of 4 bits or fewer (E3M0, E2M1) go two codes to a byte (``pack_nibbles``); wider ones
up to 8 bits one per byte, up to 16 bits as uint16.
A tensor of zeros (or one whose max |value| is not finite) has no exponent: it gets k = 0, so
NaN/Inf reach the format's NaN code / saturation instead of being scaled.
"""
import numpy

from engine import backend
from comm.formats import FloatFormat, get_format

NO_EXPONENT = -(1 << 40)     # "no finite nonzero element": loses every MAX, means k = 0


def local_exponent(x):
    """floor(log2(max |x|)) as a Python int; NO_EXPONENT when max |x| is 0 or not finite."""
    xp = backend.get_array_module(x)
    peak = float(xp.max(xp.abs(x))) if x.size else 0.0
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


def plain_sum(rows, xp):
    """Sum of the float32 arrays ``rows`` in their order (float32 adds)."""
    total = xp.zeros_like(rows[0], dtype=xp.float32)
    for r in rows:
        total += r
    return total


def kahan_sum(rows, xp):
    """Kahan-compensated float32 sum of ``rows`` in their order, elementwise.

    Each step is a separate float32 array operation (no fused multiply-add, no wider
    intermediate), so the compensation is what it is on paper on NumPy and CuPy alike.
    """
    total = xp.zeros_like(rows[0], dtype=xp.float32)
    comp = xp.zeros_like(total)
    for r in rows:
        y = r - comp
        t = total + y
        comp = (t - total) - y      # what t lost of y: subtracted from the next addend
        total = t
    return total


class APSCodec:
    """APS codec (Horovod compressor shape plus the collective it needs).

    ``fmt``: a FloatFormat or a name known to comm.formats ("E5M2", "E4M3", "E3M0", ...).
    ``compress(tensor, exponent=None, processes=1, *, iteration=0, name=None) -> (payload, ctx)``
    (payload: flat codes, nibble-packed for <= 4-bit formats, or float32 under hybrid precision;
    ctx = (k or None, dtype, shape));
    ``exponent`` is the MAX-allreduced E (default: the tensor's own), ``processes`` the P the
    scale must allow for. ``decompress(payload, ctx)`` → the float values g * 2**k / 2**k (not yet
    divided by P). The exchange's codec (comm/codecs.py) agrees on E and sums the gathered
    ``values`` of every rank in rank order with :meth:`sum`.
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

    def sum(self, rows, xp):
        """The float32 sum of ``rows`` in their order, Kahan-compensated when configured."""
        return (kahan_sum if self.kahan else plain_sum)(rows, xp)
