"""Auto Precision Scaling (comm/aps.py) against closed forms, ml_dtypes and float64 sums."""
import math
from fractions import Fraction

import ml_dtypes
import numpy
import pytest

from comm.aps import (NO_EXPONENT, APSCodec, kahan_sum, local_exponent, pack_nibbles,
                      plain_sum, scale_exponent, unpack_nibbles)
from comm.formats import get_format

FORMATS = ("E5M2", "E4M3", "E3M0")


@pytest.mark.parametrize("value,expected", [(1.0, 0), (0.75, -1), (1.5 * 2 ** -20, -20),
                                            (1000.0, 9), (2.0 ** 100, 100), (-3.0, 1)])
def test_local_exponent(value, expected):
    x = numpy.array([0.0, value, value / 4], numpy.float32)
    assert local_exponent(x) == expected == math.floor(math.log2(abs(value)))


def test_local_exponent_without_a_finite_peak():
    assert local_exponent(numpy.zeros(4, numpy.float32)) == NO_EXPONENT
    assert local_exponent(numpy.array([1.0, numpy.inf], numpy.float32)) == NO_EXPONENT
    assert scale_exponent(NO_EXPONENT, get_format("E5M2"), 4) == 0


def brute_force_k(exponent, fmax, processes):
    """Largest k with P * 2**(E+1+k) <= fmax, by exact rational search."""
    fits = [k for k in range(-400, 400)
            if processes * Fraction(2) ** (exponent + 1 + k) <= Fraction(fmax)]
    return max(fits)


@pytest.mark.parametrize("name", FORMATS)
def test_scale_exponent_closed_form(name):
    fmt = get_format(name)
    for processes in (1, 2, 3, 4, 7, 8, 9, 16, 100, 1024):
        for exponent in (-40, -7, 0, 3, 20):
            assert scale_exponent(exponent, fmt, processes) == \
                brute_force_k(exponent, fmt.max, processes), (processes, exponent)
    # e.g. E5M2 (max 57344 = 1.75 * 2**15), P = 4, max|g| in [1, 2): 4 * 2 * 2**k <= 57344
    assert scale_exponent(0, get_format("E5M2"), 4) == 12


def simulated_ranks(rng, processes, n=300):
    """float32 gradients whose magnitudes span many binades, largest near a power of two."""
    out = []
    for _ in range(processes):
        g = numpy.clip(rng.standard_normal(n), -3, 3) * 2.0 ** rng.integers(-12, 0, n)
        g[0] = 3.99                       # just below 2**(E+1), E = 1: the worst case
        out.append(g.astype(numpy.float32))
    return out


@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize("processes", [2, 3, 5, 8])
def test_no_overflow_after_summing_processes(name, processes):
    fmt = get_format(name)
    codec = APSCodec(fmt)
    gs = simulated_ranks(numpy.random.default_rng(processes), processes)
    e = max(local_exponent(g) for g in gs)
    assert e == 1
    parts = [codec.compress(g, e, processes) for g in gs]
    k = parts[0][1][0]
    # scaled = what went on the wire (decompress undoes 2**k exactly; ldexp redoes it)
    scaled = [numpy.ldexp(codec.decompress(*p).astype(numpy.float64), k) for p in parts]
    total = numpy.abs(numpy.sum(scaled, axis=0))
    assert total.max() <= fmt.max
    # every partial sum, rounded into the format again, stays finite and below saturation
    partial = numpy.zeros_like(scaled[0])
    for s in scaled:
        partial = fmt.decode(fmt.encode(partial + s)).astype(numpy.float64)
        assert numpy.all(numpy.abs(partial) <= fmt.max) and numpy.all(numpy.isfinite(partial))
    # maximality: one more power of two would overflow the same-sign worst case
    assert processes * 3.99 * 2.0 ** (k + 1) > fmt.max


@pytest.mark.parametrize("name,dtype", [("E5M2", ml_dtypes.float8_e5m2),
                                        ("E4M3", ml_dtypes.float8_e4m3fn)])
def test_round_trip_matches_ml_dtypes(name, dtype):
    rng = numpy.random.default_rng(4)
    x = (rng.standard_normal(500) * 2.0 ** rng.integers(-20, 5, 500)).astype(numpy.float32)
    codec = APSCodec(name)
    codes, ctx = codec.compress(x, processes=3)
    k = ctx[0]
    ref = numpy.ldexp(numpy.ldexp(x.astype(numpy.float64), k).astype(dtype).astype(numpy.float64),
                      -k)
    numpy.testing.assert_array_equal(codec.decompress(codes, ctx), ref)


def test_nibble_packing_hand_computed():
    packed = pack_nibbles(numpy.array([1, 2, 15, 0, 7], numpy.uint8))
    assert packed.tolist() == [0x21, 0x0F, 0x07]
    assert unpack_nibbles(packed, 5).tolist() == [1, 2, 15, 0, 7]


def test_e3m0_round_trip_packed_equals_table_nearest():
    """E3M0 through the codec (packed) vs the nearest of its values {0, 2**-2 .. 2**3} found by
    a loop, on the wire scale; the tie rule does not matter off the exact midpoints used here."""
    rng = numpy.random.default_rng(7)
    x = rng.uniform(-1.9, 1.9, 101).astype(numpy.float32)
    codec = APSCodec("E3M0")
    payload, ctx = codec.compress(x)
    assert payload.size == 51
    k = ctx[0]
    table = [0.0] + [2.0 ** e for e in range(-2, 4)]
    want = [math.copysign(min(table, key=lambda t: abs(abs(v) * 2.0 ** k - t)), v) for v in x]
    got = numpy.ldexp(codec.decompress(payload, ctx).astype(numpy.float64), k)
    numpy.testing.assert_array_equal(got, want)


def test_kahan_beats_plain_float32_on_adversarial_sum():
    # one large addend then many that are each a quarter ulp of it: plain float32 drops them all
    rows = [numpy.full(4, 2.0 ** 14, numpy.float32)]
    rows += [numpy.full(4, 2.0 ** -11, numpy.float32)] * 999
    exact = 2.0 ** 14 + 999 * 2.0 ** -11
    plain = plain_sum(rows, numpy)
    kahan = kahan_sum(rows, numpy)
    assert plain.dtype == kahan.dtype == numpy.float32
    assert numpy.all(plain == 2.0 ** 14)
    assert numpy.all(numpy.abs(kahan - exact) <= 2.0 ** -10)            # half an ulp
    assert numpy.all(kahan == numpy.float32(exact))


def test_kahan_on_random_decoded_contributions():
    """64 same-sign E5M2 contributions over 28 binades: Kahan stays within one float32 ulp of
    the float64 sum (its bound is 2u|S| for same-sign addends), plain summation does not."""
    rng = numpy.random.default_rng(5)
    fmt = get_format("E5M2")
    rows = [fmt.decode(fmt.encode(numpy.abs(rng.standard_normal(2000))
                                  * 2.0 ** rng.integers(-16, 12, 2000))) for _ in range(64)]
    exact = numpy.sum(numpy.array(rows, numpy.float64), axis=0)
    ulp = numpy.spacing(exact.astype(numpy.float32)).astype(numpy.float64)
    err_plain = numpy.abs(plain_sum(rows, numpy) - exact) / ulp
    err_kahan = numpy.abs(kahan_sum(rows, numpy) - exact) / ulp
    assert err_kahan.max() <= 1.0 and err_plain.max() > 2.0
    assert err_kahan.mean() < err_plain.mean() / 2


def test_hybrid_precision():
    x = numpy.random.default_rng(6).standard_normal((5, 8)).astype(numpy.float32)
    codec = APSCodec("E3M0", fp32_iters=10, fp32_layers=("fc8",))
    round_trip = lambda **kw: codec.decompress(*codec.compress(x, **kw))  # noqa: E731
    numpy.testing.assert_array_equal(round_trip(iteration=9), x)
    numpy.testing.assert_array_equal(round_trip(iteration=10, name="fc8"), x)
    low = round_trip(iteration=10, name="conv1")
    assert not numpy.array_equal(low, x)
    assert len(numpy.unique(numpy.abs(low[low != 0]))) <= 7           # E3M0: 0.25 .. 8 binades
    codes, ctx = codec.compress(x, iteration=10)
    assert codes.dtype == numpy.uint8 and codes.size == 20 and ctx[0] is not None  # 4-bit: packed


def test_unknown_format():
    with pytest.raises(ValueError, match="E5M2"):
        APSCodec("E9M9")
