"""Small floating-point formats (the APS paper's arbitrary exp/man formats).

A ``FloatFormat(exp_bits, man_bits)`` is a 1 + exp_bits + man_bits bit float stored in the low
bits of a uint8 (or uint16 for wider formats). Values are IEEE-like: exponent field 0 holds zero
and the subnormals, the others hold normal numbers ``(1 + m / 2**man_bits) * 2**(e - bias)``.
What the top exponent field means is the format's *special* style:

- ``"ieee"`` — the top exponent field is infinity (mantissa 0) and NaN (otherwise), as in IEEE
  half and in float8_e5m2. Used for E5M2 (Oyama et al.'s fp8: the upper byte of a half), E3M0
  and E4M3_APS (the APS paper's E4M3, max 240).
- ``"fn"`` — finite only (OCP FP8 E4M3, ml_dtypes ``float8_e4m3fn``): only the all-ones
  exponent-and-mantissa code is NaN, the rest of the top binade holds normal numbers, so E4M3
  reaches 448 = 1.75 * 2**8 rather than 240.
- ``"none"`` — every code is a finite number (OCP FP4/FP6, ml_dtypes ``float4_e2m1fn``); NaN has
  no code there and encodes to +0, overflow always saturates. (E3M0, "ieee" with no mantissa,
  has inf but no NaN code: NaN encodes to inf.)

Encoding rounds to nearest, ties to even, at the target precision, subnormals included (one
rounding from the input, no double rounding through float16). With ``saturate=True`` (the default,
and what the gradient exchange needs) anything beyond the largest finite value, infinity included,
becomes ±max; ``saturate=False`` gives ±inf for "ieee" formats and NaN for "fn" formats
(ml_dtypes' behaviour). NaN always encodes to a NaN code.

Arrays may be NumPy or CuPy (``xp = backend.get_array_module(x)``); everything is elementwise.
"""
import numpy

from caffe8.engine import backend

_ROUNDINGS = ("nearest", "truncate")
_SPECIALS = ("ieee", "fn", "none")


class FloatFormat:
    """A sign + ``exp_bits`` + ``man_bits`` float format; see the module docstring.

    ``bias`` defaults to ``2**(exp_bits-1) - 1``. ``special`` is ``"ieee"``, ``"fn"`` or ``"none"``.
    """

    def __init__(self, exp_bits, man_bits, bias=None, saturate=True, special="ieee", name=None):
        if not 1 <= exp_bits <= 8 or man_bits < 0 or 1 + exp_bits + man_bits > 16:
            raise ValueError(f"FloatFormat: need 1 <= exp_bits <= 8, man_bits >= 0 and at most 16 "
                             f"bits in all, got exp_bits={exp_bits} man_bits={man_bits}")
        if special not in _SPECIALS:
            raise ValueError(f"FloatFormat: special must be one of {_SPECIALS}, got {special!r}")
        self.exp_bits, self.man_bits = int(exp_bits), int(man_bits)
        self.bias = (1 << (exp_bits - 1)) - 1 if bias is None else int(bias)
        self.saturate = bool(saturate)
        self.special = special
        self.bits = 1 + self.exp_bits + self.man_bits
        self.name = name or f"E{exp_bits}M{man_bits}"
        self.storage = numpy.uint8 if self.bits <= 8 else numpy.uint16
        self.sign_bit = 1 << (self.bits - 1)
        self._tables = {}
        self._lut = self._decode_table()
        self.max_code = self._largest_finite_code()
        self.max = float(self._lut[self.max_code])
        self.min_normal = 2.0 ** (1 - self.bias)
        self.min_subnormal = 2.0 ** (1 - self.bias - self.man_bits) if self.man_bits else None
        self.inf_code = ((1 << self.exp_bits) - 1) << self.man_bits if special == "ieee" else None
        self.nan_code = self._a_nan_code()

    def __repr__(self):
        return (f"FloatFormat({self.name}: exp_bits={self.exp_bits}, man_bits={self.man_bits}, "
                f"bias={self.bias}, max={self.max}, special={self.special!r}, "
                f"saturate={self.saturate})")

    # --- tables ----------------------------------------------------------------------------------
    def _code_value(self, code):
        """Exact value (Python float) of one code; NaN/inf for the special codes."""
        top = (1 << self.exp_bits) - 1
        neg = bool(code & self.sign_bit)
        e = (code >> self.man_bits) & top
        m = code & ((1 << self.man_bits) - 1)
        if self.special == "ieee" and e == top:
            v = float("inf") if m == 0 else float("nan")
        elif self.special == "fn" and e == top and m == (1 << self.man_bits) - 1:
            v = float("nan")
        elif e == 0:
            v = m * 2.0 ** (1 - self.bias - self.man_bits)
        else:
            v = (1.0 + m / (1 << self.man_bits)) * 2.0 ** (e - self.bias)
        return -v if neg else v

    def _decode_table(self):
        # float32 holds every value exactly: exp_bits <= 8 (checked in __init__) keeps the
        # exponent range inside float32's, and man_bits <= 14 inside its 23-bit mantissa.
        return numpy.array([self._code_value(c) for c in range(1 << self.bits)], numpy.float32)

    def _largest_finite_code(self):
        positive = self._lut[: self.sign_bit]
        finite = numpy.flatnonzero(numpy.isfinite(positive))
        return int(finite[numpy.argmax(positive[finite])])

    def _a_nan_code(self):
        nans = numpy.flatnonzero(numpy.isnan(self._lut[: self.sign_bit]))
        if len(nans):
            return int(nans[-1])
        # No NaN code (E3M0 has only inf at the top; "none" formats have neither): NaN becomes
        # inf where there is one, so it stays visible, else +0.
        return self.inf_code if self.inf_code is not None else 0

    def table(self, xp=numpy):
        """The 2**bits float32 decode table on module ``xp`` (cached per module)."""
        key = xp.__name__
        if key not in self._tables:
            table = xp.asarray(self._lut)
            if xp is not numpy:     # copied on this stream, read on every layer's: wait once
                xp.cuda.get_current_stream().synchronize()
            self._tables[key] = table
        return self._tables[key]

    # --- conversion ------------------------------------------------------------------------------
    def decode(self, codes):
        """Codes (any integer array, values < 2**bits) → float32 array of the same shape."""
        xp = backend.get_array_module(codes)
        return self.table(xp)[xp.asarray(codes).astype(xp.intp)]

    def encode(self, x, rounding="nearest"):
        """Float array → codes (uint8/uint16) of the same shape.

        ``"nearest"``: round to nearest, ties to even, at the target precision. ``"truncate"``
        (E5M2 only): Oyama et al.'s conversion — round to float16 (nearest even), keep the upper byte;
        a float16 overflow to infinity saturates like any other overflow.
        """
        if rounding not in _ROUNDINGS:
            raise ValueError(f"{self.name}.encode: rounding must be one of {_ROUNDINGS}, "
                             f"got {rounding!r}")
        xp = backend.get_array_module(x)
        x = xp.asarray(x)
        if rounding == "truncate":
            return self._encode_truncate(x, xp)
        return self._encode_nearest(x, xp)

    def _encode_nearest(self, x, xp):
        # float64 holds every float32/float16 input exactly; r = a / quantum (a power of two)
        # and frac = r - floor(r) are exact too, so the comparisons with 0.5 below decide the
        # rounding exactly: one rounding, no double rounding.
        a = xp.abs(x.astype(xp.float64))
        finite = xp.isfinite(a)
        a_safe = xp.where(finite, a, 0.0)
        _, e2 = xp.frexp(a_safe)              # a = f * 2**e2, f in [0.5, 1)
        emin = 1 - self.bias                  # subnormals share the quantum of the lowest binade
        e = xp.where(a_safe == 0, emin, xp.maximum(e2.astype(xp.int64) - 1, emin))
        quantum = xp.ldexp(xp.ones_like(a_safe), (e - self.man_bits).astype(xp.int32))
        r = a_safe / quantum
        q = xp.floor(r)
        # With q in [0, 2**(m+1)] one formula covers subnormals (e = emin), normals, and a
        # mantissa carry into the next binade (q = 2**(m+1)).
        code = ((e + self.bias) << self.man_bits) + q.astype(xp.int64) - (1 << self.man_bits)
        # Ties go to the even *code*: the even mantissa as in IEEE when man_bits > 0, and the
        # even exponent for exponent-only formats (E3M0), where "even mantissa" means nothing.
        frac = r - q
        code += (frac > 0.5) | ((frac == 0.5) & ((code & 1) == 1))
        over = (code > self.max_code) | ~finite
        code = xp.where(over, self._overflow_code(), code)
        code = xp.where(xp.isnan(a), self.nan_code, code)
        sign = xp.where(xp.signbit(x), self.sign_bit, 0)
        return (code | sign).astype(self.storage)

    def _overflow_code(self):
        if self.saturate or self.special == "none":
            return self.max_code
        return self.inf_code if self.special == "ieee" else self.nan_code

    def _encode_truncate(self, x, xp):
        if (self.exp_bits, self.man_bits, self.bias, self.special) != (5, 2, 15, "ieee"):
            raise ValueError(f"{self.name}.encode: rounding='truncate' (float16, keep the upper "
                             f"byte) exists only for E5M2")
        x32 = x.astype(xp.float32)
        with numpy.errstate(over="ignore", invalid="ignore"):     # inf is handled below
            h = x32.astype(xp.float16).view(xp.uint16)
        code = (h >> 8).astype(xp.uint8)
        mag = code & 0x7F
        # float16 rounds |x| >= 65520 to inf (0x7C00): that, and an inf input, overflow.
        overflow = mag == 0x7C
        sat = (code & 0x80) | (self.max_code if self.saturate else 0x7C)
        return xp.where(overflow, sat, code).astype(xp.uint8)


FP8_E5M2 = FloatFormat(5, 2, name="E5M2")          # Oyama et al.'s fp8: max 57344, min 2**-16
E4M3 = FloatFormat(4, 3, special="fn", name="E4M3")  # OCP FP8 E4M3 ("fn"): max 448, min 2**-9
# The APS paper's (4, 3) format: its emulator keeps IEEE's top exponent for Inf/NaN, so the
# largest finite value is 1.875 * 2**7 = 240 (ml_dtypes float8_e4m3), not OCP's 448.
E4M3_APS = FloatFormat(4, 3, special="ieee", name="E4M3_APS")
E3M0 = FloatFormat(3, 0, name="E3M0")              # the APS paper's 4-bit float: 0.25 .. 8, no subnormal
E3M4 = FloatFormat(3, 4, name="E3M4")              # ml_dtypes float8_e3m4 layout: max 15.5
E2M1 = FloatFormat(2, 1, special="none", name="E2M1")  # OCP FP4: all codes finite, max 6
FP16 = FloatFormat(5, 10, name="FP16")             # IEEE half, for checks against numpy.float16

FORMATS = {f.name: f for f in (FP8_E5M2, E4M3, E4M3_APS, E3M0, E3M4, E2M1, FP16)}


def get_format(name):
    """A named format (``"E5M2"``, ``"E4M3"``, ``"E3M0"``, ...); ValueError lists the names."""
    try:
        return FORMATS[name]
    except KeyError:
        raise ValueError(f"Unrecognized float format: {name!r}; valid: {sorted(FORMATS)}") from None
