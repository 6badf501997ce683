"""Auto Precision Scaling (comm/aps.py) against closed forms, ml_dtypes and an independent
per-addition simulation of the small-format sum (exact rationals, rounded by a table search)."""
import bisect
import math
from fractions import Fraction

import ml_dtypes
import numpy
import pytest

from caffe8.comm.aps import (NO_EXPONENT, ApsCompressor, local_exponent, pack_nibbles, scale_exponent,
                      small_format_sum, unpack_nibbles)
from caffe8.comm.codecs import Tensor, create_codec
from caffe8.comm.config import parse_comm
from caffe8.comm.formats import get_format

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
    codec = ApsCompressor(fmt)
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
    codec = ApsCompressor(name)
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
    codec = ApsCompressor("E3M0")
    payload, ctx = codec.compress(x)
    assert payload.size == 51
    k = ctx[0]
    table = [0.0] + [2.0 ** e for e in range(-2, 4)]
    want = [math.copysign(min(table, key=lambda t: abs(abs(v) * 2.0 ** k - t)), v) for v in x]
    got = numpy.ldexp(codec.decompress(payload, ctx).astype(numpy.float64), k)
    numpy.testing.assert_array_equal(got, want)


def test_hybrid_precision():
    x = numpy.random.default_rng(6).standard_normal((5, 8)).astype(numpy.float32)
    codec = ApsCompressor("E3M0", fp32_iters=10, fp32_layers=("fc8",))
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
        ApsCompressor("E9M9")


# --- the small-format sum, against a reference that shares no code with comm/ ------------------

ML = {"E5M2": ml_dtypes.float8_e5m2, "E4M3": ml_dtypes.float8_e4m3fn,
      "E4M3_APS": ml_dtypes.float8_e4m3, "E3M4": ml_dtypes.float8_e3m4}


class Rounder:
    """Round an exact rational to nearest, ties to the even code, saturating at +-max: the
    format's finite values come from ml_dtypes' bit patterns, the choice from a table search."""

    def __init__(self, dtype):
        codes = numpy.arange(128, dtype=numpy.uint8)
        values = codes.view(dtype).astype(numpy.float64)
        keep = numpy.isfinite(values)
        pairs = sorted(zip(values[keep].tolist(), codes[keep].tolist()))
        self.values = [Fraction(v) for v, _ in pairs]
        self.codes = [c for _, c in pairs]
        self.max = self.values[-1]

    def __call__(self, v):
        a = abs(v)
        if a >= self.max:
            r = self.max
        else:
            i = bisect.bisect_left(self.values, a)
            if self.values[i] == a:
                r = a
            else:
                lo, hi = self.values[i - 1], self.values[i]
                if a - lo != hi - a:
                    r = lo if a - lo < hi - a else hi
                else:
                    r = lo if self.codes[i - 1] % 2 == 0 else hi
        return -r if v < 0 else r


def simulate(columns, rounder, kahan):
    """Per element: the contributions in order, one rounded addition at a time (Kahan: y, t
    and the compensation rounded too), on exact rationals."""
    out = []
    for xs in columns:
        s, c = Fraction(0), Fraction(0)
        for x in map(Fraction, xs):
            if kahan:
                y = rounder(x - c)
                t = rounder(s + y)
                c = rounder(rounder(t - s) - y)
                s = t
            else:
                s = rounder(s + x)
        out.append(s)
    return out


def test_e4m3_aps_is_the_ieee_style_e4m3():
    fmt = get_format("E4M3_APS")
    assert fmt.max == 240.0 == float(ml_dtypes.finfo(ml_dtypes.float8_e4m3).max)
    codes = numpy.arange(256, dtype=numpy.uint8)
    numpy.testing.assert_array_equal(fmt.decode(codes),
                                     codes.view(ml_dtypes.float8_e4m3).astype(numpy.float32))
    # the ranks' scale leaves room for P contributions below 240, not 448
    assert scale_exponent(0, fmt, 4) == brute_force_k(0, 240.0, 4) == 4


def one_plus_eighths():
    """P = 8 contributions per element. Element 0: 1.0 then seven 0.125s; E5M2 has an ulp of
    0.25 on [1, 2), so every 1 + 0.125 is a tie that rounds back to the even 1.0."""
    cols = [[1.0] + [0.125] * 7, [0.125] * 8, [-1.0] + [0.125] * 7, [3.0, 0.5, -0.25, 0.75] * 2]
    return numpy.array(cols, numpy.float32).T.copy()          # rows = ranks


@pytest.mark.parametrize("kahan", [False, True])
def test_small_format_sum_equals_the_per_addition_simulation(kahan):
    rows = one_plus_eighths()
    got = small_format_sum(list(rows), get_format("E5M2"), kahan)
    want = simulate(rows.T.tolist(), Rounder(ml_dtypes.float8_e5m2), kahan)
    assert got.dtype == numpy.float32
    assert got.tolist() == [float(w) for w in want]


def test_rounding_in_the_sum_and_what_kahan_recovers():
    """Hand-derived: 1 + 7 * 0.125 = 1.875 exactly (and in float32). Plain E5M2 sum: each tie
    rounds to 1.0, error 0.875. Kahan: the lost 0.125 comes back as y = 0.25 on the next
    step, giving 1.25, 1.5, 1.5, 1.75, then 1.75 + 0.125 ties up to the even 2.0, error 0.125."""
    rows = one_plus_eighths()
    fmt = get_format("E5M2")
    plain = small_format_sum(list(rows), fmt)
    kahan = small_format_sum(list(rows), fmt, kahan=True)
    exact = rows.astype(numpy.float64).sum(axis=0)
    assert exact[0] == rows.sum(axis=0, dtype=numpy.float32)[0] == 1.875
    assert plain[0] == 1.0 and kahan[0] == 2.0
    assert abs(plain[0] - exact[0]) == 0.875 and abs(kahan[0] - exact[0]) == 0.125
    assert plain[1] == kahan[1] == 1.0          # 0.125 steps: every partial sum representable


def simulated_exchange(codec_text, grads, iteration=0, key=(0, 1), keys=None):
    """P ranks in one process: agree on E, encode each rank, decode the rank-order rows."""
    codec = create_codec("aps", parse_comm(codec_text))
    codec.bind(keys or [key])
    processes = len(grads)
    ts = [Tensor(key, numpy.ones_like(g), iteration, processes, (1, 1)) for g in grads]
    stats = [codec.local_stat(g, t) for g, t in zip(grads, ts)]
    if stats[0] is not None:                # float32 tensors: nothing to agree on
        codec.agree(ts[0], max(stats))
    payloads = [codec.encode(g, t) for g, t in zip(grads, ts)]
    out = numpy.empty_like(grads[0])
    codec.decode([p for p, _ in payloads], payloads[0][1], out)
    return out


@pytest.mark.parametrize("kahan", [False, True])
def test_codec_mean_equals_scaled_simulation_on_the_constructed_case(kahan):
    rows = one_plus_eighths() * numpy.float32(2.0 ** -7)         # any power of two: same rounding
    got = simulated_exchange(f"aps_format: 'E5M2' kahan: {str(kahan).lower()}", list(rows))
    k = brute_force_k(local_exponent(rows), 57344.0, 8)
    assert k == 17          # max |g| = 3 * 2**-7: E = -6, and 8 * 2**(E + 1 + k) <= 57344
    scaled = [[numpy.ldexp(float(v), k) for v in col] for col in rows.T]
    sums = simulate(scaled, Rounder(ml_dtypes.float8_e5m2), kahan)
    want = numpy.array([float(s) * 2.0 ** -k for s in sums], numpy.float32) / numpy.float32(8)
    numpy.testing.assert_array_equal(got, want)
    float32_mean = rows.sum(axis=0, dtype=numpy.float32) / numpy.float32(8)
    assert got[0] == (2.0 if kahan else 1.0) * 2.0 ** -10 != float32_mean[0]


@pytest.mark.parametrize("name", ["E5M2", "E4M3_APS", "E4M3"])
def test_random_case_simulation_and_kahan_error(name):
    """16 ranks of gradients over several binades: the codec equals the simulation with and
    without Kahan, and Kahan's error against the exact sum of the wire values is smaller."""
    rng = numpy.random.default_rng(11)
    processes, n = 16, 48
    grads = [(rng.standard_normal(n) * 2.0 ** rng.integers(-4, 1)).astype(numpy.float32)
             for _ in range(processes)]
    k = brute_force_k(max(local_exponent(g) for g in grads), get_format(name).max, processes)
    rounder = Rounder(ML[name])
    wire = [[rounder(Fraction(numpy.ldexp(float(g[j]), k))) for g in grads] for j in range(n)]
    exact = numpy.array([float(sum(col)) for col in wire])
    errors = {}
    for kahan in (False, True):
        got = simulated_exchange(f"aps_format: '{name}' kahan: {str(kahan).lower()}", grads)
        sums = simulate(wire, rounder, kahan)
        want = numpy.array([float(s) * 2.0 ** -k for s in sums], numpy.float32)
        numpy.testing.assert_array_equal(got, want / numpy.float32(processes))
        errors[kahan] = numpy.abs(numpy.array([float(s) for s in sums]) - exact).sum() \
            / numpy.abs(exact).sum()
    assert errors[True] < errors[False] / 2, errors


def test_hybrid_precision_in_the_codec_is_the_float32_mean():
    """fp32_iters and fp32_layers: float32 payloads, summed in rank order, / P; values chosen
    so the float32 mean is exact: (1 + 2 + 3 + 4) / 4 * g = 2.5 g."""
    g = (numpy.arange(-12, 12, dtype=numpy.float32) / 8).reshape(4, 6)
    grads = [g * numpy.float32(r + 1) for r in range(4)]
    closed = g * numpy.float32(2.5)
    keys = [(0, 24), (24, 48), (48, 72)]
    text = "aps_format: 'E3M0' fp32_iters: 3 fp32_layers: 2"
    for key in keys:                        # the first 3 iterations: every tensor
        numpy.testing.assert_array_equal(simulated_exchange(text, grads, 2, key, keys), closed)
    for key in keys[1:]:                    # the last 2 tensors: always
        numpy.testing.assert_array_equal(simulated_exchange(text, grads, 3, key, keys), closed)
    low = simulated_exchange(text, grads, 3, keys[0], keys)
    assert not numpy.array_equal(low, closed)
    codec = create_codec("aps", parse_comm(text))
    codec.bind(keys)
    grad = numpy.ones(24, numpy.float32)
    assert [codec.local_stat(grad, Tensor(key, grad, i, 4, (1, 1))) is None
            for i, key in ((2, keys[0]), (3, keys[0]), (3, keys[2]))] == [True, False, True]
    codec = create_codec("aps", parse_comm())
    assert codec.impl.fp32_iters == 0 and codec.fp32_layers == 0     # the schema's defaults


def test_small_format_sum_saturates_and_keeps_nan():
    """The shared formats saturate: 57344 + 57344 stays E5M2's max (not inf); E3M0's 8 + 4 = 12
    is the tie between 8 and 16, which is past the max 8, so 8; NaN stays NaN."""
    rows = [numpy.array([57344.0, 1.0, numpy.nan], numpy.float32)] * 2
    for kahan in (False, True):
        got = small_format_sum(rows, get_format("E5M2"), kahan)
        assert got[:2].tolist() == [57344.0, 2.0] and numpy.isnan(got[2])
    e3m0 = small_format_sum([numpy.float32([8.0]), numpy.float32([4.0])], get_format("E3M0"))
    assert e3m0.tolist() == [8.0]


def test_e5m2_host_sum_through_the_exchange_kernels_equals_the_general_path():
    """The host's E5M2 sum runs on comm.kernels' fp8 encode and MPI-op sum; the general
    per-addition rounding (an equal format that is not the shared E5M2 object) is the
    reference: values over the whole range (subnormals, saturating sums, cancellation to
    zero, ties, operands far apart, NaN), bit for bit."""
    from caffe8.comm.formats import FP8_E5M2, FloatFormat
    general = FloatFormat(5, 2, name="E5M2")
    assert general is not FP8_E5M2
    rng = numpy.random.default_rng(21)
    codes = rng.integers(0, 256, (7, 50_000)).astype(numpy.uint8)
    codes[codes & 0x7F >= 0x7C] &= 0x83                          # no inf/NaN codes ...
    rows = [FP8_E5M2.decode(c) for c in codes]
    rows[3][:100] = -rows[2][:100]                                # exact cancellations
    rows[0][100:110] = numpy.nan                                  # ... but some NaN
    fast = small_format_sum(rows, FP8_E5M2)
    slow = small_format_sum(rows, general)
    assert fast.dtype == slow.dtype == numpy.float32
    assert numpy.array_equal(fast.view(numpy.uint32)[110:], slow.view(numpy.uint32)[110:])
    assert numpy.isnan(fast[100:110]).all() and numpy.isnan(slow[100:110]).all()
    assert numpy.count_nonzero(numpy.abs(fast) == 57344.0) > 100          # saturated sums
    two = small_format_sum(rows[2:4], FP8_E5M2)                   # x + (-x): +0, as IEEE
    assert numpy.array_equal(two[:100].view(numpy.uint32), numpy.zeros(100, numpy.uint32))


def test_e5m2_host_compress_through_the_fp8_kernel_equals_the_general_encoder():
    """E5M2 float32 tensors on the host are scaled and encoded by comm.kernels' fp8 kernel; an
    equal format that is not the shared object takes the general float64 path: the same codes
    for every exponent (tiny, subnormal and huge tensors), NaN, inf, zeros of both signs."""
    from caffe8.comm.formats import FP8_E5M2, FloatFormat
    rng = numpy.random.default_rng(22)
    fast, slow = ApsCompressor(FP8_E5M2), ApsCompressor(FloatFormat(5, 2, name="E5M2"))
    for magnitude in (1e-44, 1e-39, 1e-20, 1e-3, 1.0, 3e4, 1e30, 3e38):
        x = (rng.standard_normal(4099) * magnitude).astype(numpy.float32)
        x[:4] = [0.0, -0.0, x[4] * 1e-9, -x[5] * 1e-9]
        for processes in (1, 4):
            got, (k, _, _) = fast.compress(x, processes=processes)
            want, ctx = slow.compress(x, processes=processes)
            assert (k, got.dtype) == (ctx[0], numpy.uint8) and numpy.array_equal(got, want)
    special = numpy.float32([numpy.nan, numpy.inf, -numpy.inf, 2.0, -0.0])
    for exponent in (None, 0, -5, 20):
        got, _ = fast.compress(special, exponent)
        want, _ = slow.compress(special, exponent)
        assert numpy.array_equal(got[1:], want[1:])        # inf saturates the same way
        assert all(numpy.isnan(FP8_E5M2.decode(c[:1]))[0] for c in (got, want))  # a NaN code each


@pytest.mark.gpu
def test_small_format_sum_on_cupy_gives_the_numpy_bits():
    from caffe8.engine import backend
    cp = backend.cupy
    rng = numpy.random.default_rng(12)
    fmt = get_format("E5M2")
    rows = [fmt.decode(fmt.encode(rng.standard_normal(4096) * 64)) for _ in range(9)]
    for kahan in (False, True):
        want = small_format_sum(rows, fmt, kahan)
        got = small_format_sum([cp.asarray(r) for r in rows], fmt, kahan)
        assert numpy.array_equal(cp.asnumpy(got), want)
