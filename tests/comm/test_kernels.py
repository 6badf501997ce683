"""comm.kernels on every CPU path this machine has, against NumPy + ml_dtypes references.

References never use comm code: fp8 values are decoded by ml_dtypes, added in float64 (exact for
two fp8 or two halves), clipped to the largest finite value and cast back by ml_dtypes / numpy
(nearest even).
"""
import ctypes
import glob
import os
import subprocess
import sys

import ml_dtypes
import numpy
import pytest

from caffe8.comm import kernels

E5M2 = ml_dtypes.float8_e5m2
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))



def ref_fp8_sum(a, b):
    with numpy.errstate(invalid="ignore"):                     # inf + -inf inputs
        s = a.view(E5M2).astype(numpy.float64) + b.view(E5M2).astype(numpy.float64)
        return numpy.clip(s, -57344, 57344).astype(E5M2).view(numpy.uint8)


def ref_half_sum(a, b):
    with numpy.errstate(invalid="ignore"):
        s = (a.view(numpy.float16).astype(numpy.float64)
             + b.view(numpy.float16).astype(numpy.float64))
        return numpy.clip(s, -65504, 65504).astype(numpy.float16).view(numpy.uint16)


def fp8_is_finite(c):
    return (c & 0x7C) != 0x7C


def half_is_finite(h):
    return (h & 0x7C00) != 0x7C00


def test_paths_listing():
    names = kernels.paths()
    assert names[-1] == "numpy" and kernels.current_path() in names
    assert set(names) <= {"avx512", "avx2", "portable", "numpy"}
    with pytest.raises(ValueError, match="numpy"):
        kernels.use_path("sse9")


def test_fp8_sum_all_65536_pairs(path):
    a = numpy.repeat(numpy.arange(256, dtype=numpy.uint8), 256)
    b = numpy.tile(numpy.arange(256, dtype=numpy.uint8), 256)
    dst = b.copy()
    assert kernels.fp8_sum(a, dst) is dst
    finite = fp8_is_finite(a) & fp8_is_finite(b)
    ref = ref_fp8_sum(a, b)
    assert numpy.array_equal(dst[finite], ref[finite])
    assert numpy.all(fp8_is_finite(dst[finite])), "finite inputs gave Inf or NaN"
    assert numpy.all(dst[finite & (ref == 0x7B)] == 0x7B)       # saturation reached
    nan_in = ((a & 0x7F) > 0x7C) | ((b & 0x7F) > 0x7C)
    assert numpy.all((dst[nan_in] & 0x7F) > 0x7C), "NaN inputs must stay NaN"


@pytest.mark.parametrize("n", [1, 15, 16, 17, 31, 33, 63, 64, 65, 127, 1000, 4099])
def test_fp8_sum_lengths_and_misaligned(path, n):
    rng = numpy.random.default_rng(n)
    buf_a = rng.integers(0, 256, n + 1, dtype=numpy.uint8)
    buf_b = rng.integers(0, 256, n + 3, dtype=numpy.uint8)
    buf_a[(buf_a & 0x7C) == 0x7C] = 0x7B                      # keep inputs finite
    buf_b[(buf_b & 0x7C) == 0x7C] = 0xFA
    a, b = buf_a[1:], buf_b[2:2 + n]                          # odd addresses
    before = buf_b.copy()
    kernels.fp8_sum(a, b)
    assert numpy.array_equal(b, ref_fp8_sum(a, before[2:2 + n]))
    assert buf_b[0] == before[0] and buf_b[1] == before[1] and buf_b[-1] == before[-1]


def test_fp8_sum_ptr_on_raw_addresses(path):
    a = numpy.full(100, 0x7B, numpy.uint8)                     # 57344 + 57344 saturates
    b = numpy.full(100, 0x7B, numpy.uint8)
    kernels.fp8_sum_ptr(a.ctypes.data, b.ctypes.data, 100)
    assert numpy.all(b == 0x7B)
    kernels.fp8_sum_ptr(a.ctypes.data, b.ctypes.data, 0)        # no-op


def test_half_sum_every_half_against_a_set_of_values(path):
    special = numpy.float16([0.0, -0.0, 65504, -65504, 6e-8, -6e-8, 6.1e-5, 1.0, -1.0, 0.5,
                             32768, -32768, 3e4, 1e-3, 2049, -0.333]).view(numpy.uint16)
    rng = numpy.random.default_rng(0)
    others = rng.integers(0, 65536, 48, dtype=numpy.uint16)
    vals = numpy.concatenate([special, others])
    a = numpy.tile(numpy.arange(65536, dtype=numpy.uint16), len(vals))
    b = numpy.repeat(vals, 65536)
    finite = half_is_finite(a) & half_is_finite(b)
    dst = b.copy()
    kernels.half_sum(a, dst)
    ref = ref_half_sum(a, b)
    assert numpy.array_equal(dst[finite], ref[finite])
    assert numpy.all(half_is_finite(dst[finite])), "finite inputs gave Inf or NaN"


def test_half_sum_random_pairs_and_float16_arrays(path):
    rng = numpy.random.default_rng(1)
    n = 1_000_003
    a = rng.integers(0, 65536, n, dtype=numpy.uint16)
    b = rng.integers(0, 65536, n, dtype=numpy.uint16)
    finite = half_is_finite(a) & half_is_finite(b)
    a, b = a[finite], b[finite]
    dst = b.copy().view(numpy.float16)                         # float16 arrays work too
    kernels.half_sum(a.view(numpy.float16), dst)
    assert numpy.array_equal(dst.view(numpy.uint16), ref_half_sum(a, b))


@pytest.mark.parametrize("scale", [1.0, 0.37, 1024.0])
def test_encode_decode_with_scale(path, scale):
    rng = numpy.random.default_rng(2)
    x = (rng.standard_normal(100_017) * numpy.exp2(rng.uniform(-24, 18, 100_017)))
    x = numpy.concatenate([x, [numpy.inf, -numpy.inf, 7e4, -7e4, 0.0, -0.0]]).astype(numpy.float32)
    y = x * numpy.float32(scale)                                # the kernel scales in float32
    out = numpy.empty(x.size, numpy.uint8)
    kernels.encode_fp8(x, out, scale=scale)
    assert numpy.array_equal(out, numpy.clip(y, -57344, 57344).astype(E5M2).view(numpy.uint8))
    kernels.encode_fp8(x, out, scale=scale, rounding="truncate")
    with numpy.errstate(over="ignore"):
        hi = (y.astype(numpy.float16).view(numpy.uint16) >> 8).astype(numpy.uint8)
    hi[(hi & 0x7F) == 0x7C] -= 1                                # half inf saturates
    assert numpy.array_equal(out, hi)
    codes = numpy.arange(256, dtype=numpy.uint8).repeat(3)[1:]  # odd length
    dec = numpy.empty(codes.size, numpy.float32)
    kernels.decode_fp8(codes, dec, scale=scale)
    ref = codes.view(E5M2).astype(numpy.float32) * numpy.float32(scale)
    assert numpy.array_equal(dec, ref, equal_nan=True)


def test_argument_checks():
    a = numpy.zeros(8, numpy.uint8)
    with pytest.raises(ValueError, match="elements"):
        kernels.fp8_sum(a, numpy.zeros(9, numpy.uint8))
    with pytest.raises(ValueError, match="1-byte"):
        kernels.fp8_sum(a, numpy.zeros(8, numpy.uint16))
    with pytest.raises(ValueError, match="contiguous"):
        kernels.fp8_sum(numpy.zeros(16, numpy.uint8)[::2], a)
    ro = numpy.zeros(8, numpy.uint8)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="writeable"):
        kernels.fp8_sum(a, ro)
    with pytest.raises(TypeError, match="numpy"):
        kernels.half_sum([0] * 4, numpy.zeros(4, numpy.uint16))
    with pytest.raises(ValueError, match="float32"):
        kernels.encode_fp8(numpy.zeros(4, numpy.int32), numpy.zeros(4, numpy.uint8))
    with pytest.raises(ValueError, match="rounding"):
        kernels.encode_fp8(numpy.zeros(4, numpy.float32), numpy.zeros(4, numpy.uint8),
                           rounding="down")


def run_python(code, env_extra, cwd=REPO):
    env = {k: v for k, v in os.environ.items() if k != "CAFFE8_KERNEL_PATH"}
    env.update(PYTHONPATH=REPO, **env_extra)
    return subprocess.Popen([sys.executable, "-W", "always", "-c", code], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.skipif(kernels.library_file() is None, reason="no C compiler on this machine")
def test_parallel_first_use_compiles_once_into_the_cache(tmp_path):
    code = "from caffe8.comm import kernels; print(kernels._compile_into_cache())"
    procs = [run_python(code, {"CAFFE8_CACHE_DIR": str(tmp_path)}) for _ in range(3)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    built = {out.strip().splitlines()[-1] for out, _ in outs}
    assert len(built) == 1
    files = sorted(os.listdir(tmp_path))
    assert [f for f in files if f.endswith(".so")] == [os.path.basename(built.pop())]
    assert not [f for f in files if f.startswith("tmp")], f"temporary files left: {files}"


def test_without_compiler_falls_back_to_numpy_with_one_warning(tmp_path):
    code = ("import warnings\nwith warnings.catch_warnings(record=True) as w:\n"
            "    warnings.simplefilter('always')\n    from caffe8.comm import kernels\n"
            "print(kernels.library_file(), kernels.paths(), len(w))\n"
            "print([str(x.message) for x in w])\n"
            "import numpy; d = numpy.full(3, 0x3C, numpy.uint8)\n"
            "kernels.fp8_sum(numpy.full(3, 0x3C, numpy.uint8), d); print(d.tolist())")
    env = {"CAFFE8_CACHE_DIR": str(tmp_path), "CC": "/nonexistent/cc"}
    out, err = run_python(code, env).communicate(timeout=120)
    if glob.glob(os.path.join(os.path.dirname(kernels.__file__), "_kernels*")):
        pytest.skip("a library is installed next to the package (a stale one is the last "
                    "resort before NumPy); the fallback is not reachable")
    lines = out.strip().splitlines()
    assert lines[0] == "None ['numpy'] 2", (out, err)          # compile failure + fallback
    assert "NumPy fallback" in lines[1]
    assert lines[2] == "[64, 64, 64]"                          # 1 + 1 = 2 (code 0x40)


@pytest.mark.skipif(not {"avx2", "avx512"} & set(kernels.paths()), reason="no SIMD path here")
def test_load_time_self_check_passes_and_catches_a_broken_path(monkeypatch):
    simd = [p for p in kernels.paths() if p in ("avx2", "avx512")]
    assert all(kernels.self_check(p) == [] for p in simd)
    name = simd[0]

    def off_by_one_code_somewhere(src, dst, n):         # sums right except one element
        kernels._lib.c8_fp8_sum_portable(src, dst, n)
        view = (ctypes.c_uint8 * n).from_address(dst)
        view[n // 3] ^= 1

    monkeypatch.setattr(kernels._lib, f"c8_fp8_sum_{name}", off_by_one_code_somewhere)
    assert kernels.self_check(name) == ["fp8_sum"]


def test_environment_forces_a_path_and_ignores_an_unavailable_one():
    code = "from caffe8.comm import kernels; print(kernels.current_path())"
    out, _ = run_python(code, {"CAFFE8_KERNEL_PATH": "numpy"}).communicate(timeout=120)
    assert out.strip() == "numpy"
    out, err = run_python(code, {"CAFFE8_KERNEL_PATH": "vax"}).communicate(timeout=120)
    assert out.strip() == kernels.paths()[0] and "not available" in err


# --- fused ratio kernels (the fp8 codec's relative encode/decode) -----------------------
def ratio_case(n, seed):
    """(g, w) float32 with zeros, w = 0, subnormals, huge ratios (saturation), Inf and NaN."""
    rng = numpy.random.default_rng(seed)
    g = rng.standard_normal(n) * numpy.exp2(rng.uniform(-40, 20, n))
    w = rng.standard_normal(n) * numpy.exp2(rng.uniform(-30, 10, n))
    special = [0.0, -0.0, 1e-45, -1e-45, 1e-40, 3e-39, 1.17e-38, 1e30, -1e30, 3.4e38,
               numpy.inf, -numpy.inf, numpy.nan, 1.0, -1.0, 6e4, 7e4]
    pick = rng.integers(0, n, n // 5)
    g[pick] = rng.choice(special, pick.size)
    pick = rng.integers(0, n, n // 5)
    w[pick] = rng.choice(special, pick.size)
    w[rng.integers(0, n, n // 10)] = 0.0
    return g.astype(numpy.float32), w.astype(numpy.float32)


def ref_ratio(g, w, eps, scale):
    """float32 g / (|w| + eps) * scale, each step rounded to float32, as NumPy does it."""
    with numpy.errstate(divide="ignore", over="ignore", invalid="ignore"):
        d = g / (numpy.abs(w) + numpy.float32(eps))
        return d * numpy.float32(scale)


def ref_encode(y, rounding):
    """ml_dtypes float8_e5m2 of float32 y, saturating at ±57344 (nearest); Oyama et al.'s truncate:
    half (nearest even), upper byte, Inf saturating."""
    with numpy.errstate(over="ignore", invalid="ignore"):
        if rounding == "nearest":
            return numpy.clip(y, -57344, 57344).astype(E5M2).view(numpy.uint8)
        hi = (y.astype(numpy.float16).view(numpy.uint16) >> 8).astype(numpy.uint8)
    hi[(hi & 0x7F) == 0x7C] -= 1
    return hi


def assert_same_codes(out, ref):
    """Bit-equal, except that any NaN code matches any NaN code (ml_dtypes picks its own)."""
    nan_ref, nan_out = (ref & 0x7F) > 0x7C, (out & 0x7F) > 0x7C
    assert numpy.array_equal(nan_out, nan_ref), "NaN positions differ"
    bad = numpy.flatnonzero(out[~nan_ref] != ref[~nan_ref])
    assert bad.size == 0, f"{bad.size} codes differ, first at {bad[:5]}"


@pytest.mark.parametrize("rounding", ["nearest", "truncate"])
@pytest.mark.parametrize("eps,scale", [(1e-5, 57344 / 3.7), (1e-5, 1.0), (0.0, 0.37),
                                       (1e-3, 2.0 ** -20)])
def test_encode_ratio_every_path(path, rounding, eps, scale):
    g, w = ratio_case(200_003, 5)                                   # odd length: SIMD tails
    scale = float(numpy.float32(scale))
    out = numpy.empty(g.size, numpy.uint8)
    assert kernels.encode_ratio_fp8(g, w, eps, scale, out, rounding) is out
    ref = ref_encode(ref_ratio(g, w, eps, scale), rounding)
    assert_same_codes(out, ref)
    finite = numpy.isfinite(g) & numpy.isfinite(w) & (numpy.abs(w) + numpy.float32(eps) > 0)
    assert numpy.all((out[finite] & 0x7C) != 0x7C), "finite ratios gave Inf or NaN"
    assert numpy.any(out == 0x7B) and numpy.any(out == 0x01) and numpy.any(out == 0)  # sat, sub
    # and the unfused sequence the codec used before (ratio in NumPy, then the encode kernel)
    with numpy.errstate(over="ignore"):                             # NumPy path's multiply
        before = kernels.encode_fp8(ref_ratio(g, w, eps, 1.0), numpy.empty_like(out), scale,
                                    rounding)
    assert_same_codes(out, before)


@pytest.mark.parametrize("n", [1, 7, 16, 31, 32, 33, 63, 65, 1000])
def test_encode_ratio_lengths_and_misaligned(path, n):
    g, w = ratio_case(n + 2, n)
    g, w = g[1:n + 1], w[2:]                                        # unaligned starts
    buf = numpy.full(n + 2, 0xAA, numpy.uint8)
    kernels.encode_ratio_fp8(g, w, 1e-5, 1000.0, buf[1:n + 1])
    assert_same_codes(buf[1:n + 1], ref_encode(ref_ratio(g, w, 1e-5, 1000.0), "nearest"))
    assert buf[0] == 0xAA and buf[-1] == 0xAA


@pytest.mark.parametrize("eps,inv_scale", [(1e-5, 3.7 / 57344), (0.0, 1.0), (1e-3, 2.0 ** 20)])
def test_decode_ratio_every_path(path, eps, inv_scale):
    rng = numpy.random.default_rng(6)
    n = 100_001
    codes = rng.integers(0, 256, n, dtype=numpy.uint8)
    codes[:256] = numpy.arange(256)                                  # every code, incl. Inf/NaN
    _, w = ratio_case(n, 7)
    inv_scale = float(numpy.float32(inv_scale))
    out = numpy.empty(n, numpy.float32)
    assert kernels.decode_ratio_fp8(codes, w, eps, inv_scale, out) is out
    with numpy.errstate(over="ignore", invalid="ignore"):
        ref = (codes.view(E5M2).astype(numpy.float32) * numpy.float32(inv_scale)) \
            * (numpy.abs(w) + numpy.float32(eps))
    nan = numpy.isnan(ref)
    assert numpy.array_equal(numpy.isnan(out), nan)
    assert numpy.array_equal(out[~nan].view(numpy.uint32), ref[~nan].view(numpy.uint32))
    for n_small in (1, 15, 17, 33):                                  # tails, unaligned
        small = numpy.empty(n_small + 1, numpy.float32)
        w_off = numpy.empty(n_small + 3, numpy.float32)[3:]
        w_off[:] = w[1:n_small + 1]
        kernels.decode_ratio_fp8(codes[1:n_small + 1], w_off, eps, inv_scale, small[1:])
        assert numpy.array_equal(small[1:], ref[1:n_small + 1], equal_nan=True)


def test_ratio_argument_checks():
    f, b = numpy.zeros(8, numpy.float32), numpy.zeros(8, numpy.uint8)
    with pytest.raises(ValueError, match="float32"):
        kernels.encode_ratio_fp8(f.astype(numpy.int32), f, 1e-5, 1.0, b)
    with pytest.raises(ValueError, match="elements"):
        kernels.encode_ratio_fp8(f, numpy.zeros(9, numpy.float32), 1e-5, 1.0, b)
    with pytest.raises(ValueError, match="rounding"):
        kernels.encode_ratio_fp8(f, f, 1e-5, 1.0, b, rounding="up")
    with pytest.raises(ValueError, match="float32"):
        kernels.decode_ratio_fp8(b, f, 1e-5, 1.0, numpy.zeros(8, numpy.int32))
    with pytest.raises(ValueError, match="contiguous"):
        kernels.decode_ratio_fp8(b, numpy.zeros(16, numpy.float32)[::2], 1e-5, 1.0, f)


@pytest.mark.parametrize("rounding", ["nearest", "truncate"])
def test_fp8_codec_relative_host_bits(path, rounding):
    """The fp8 codec on host arrays, through the fused kernels of every path, gives the bits of
    the NumPy float32 sequence: D = g / (|W| + eps), fp8(D * scale); (v * inv_scale) * (|W| + eps)."""
    from caffe8.comm.codecs import Tensor, create_codec
    from caffe8.comm.config import parse_comm
    rng = numpy.random.default_rng(8)
    shape = (37, 111)
    g = (rng.standard_normal(shape) * 1e-3).astype(numpy.float32)
    w = (rng.standard_normal(shape) * 0.1).astype(numpy.float32)
    w[0, :5] = 0.0
    codec = create_codec("fp8", parse_comm(f'rounding: "{rounding}" quantile_interval: 1'))
    t = Tensor("t", w, 0, 1, (1, 1), numpy.zeros(g.size, numpy.uint8))
    codec.agree(t, codec.local_stat(g, t))
    wire, ctx = codec.encode(g, t)
    q = codec.tracker.get("t")
    scale = numpy.float32(57344.0 / q)
    with numpy.errstate(over="ignore"):
        d = g.ravel() / (numpy.abs(w.ravel()) + numpy.float32(1e-5))
    ref = ref_encode(d * scale, rounding)
    assert numpy.array_equal(wire[:g.size], ref)
    out = numpy.empty(shape, numpy.float32)
    codec.decode(wire, ctx, out)
    inv = numpy.float32(q / 57344.0)
    expect = (ref.view(E5M2).astype(numpy.float32) * inv) \
        * (numpy.abs(w.ravel()) + numpy.float32(1e-5))
    assert numpy.array_equal(out.ravel().view(numpy.uint32), expect.view(numpy.uint32))
    out64 = numpy.empty(shape, numpy.float64)                       # through a temporary
    codec.decode(wire, ctx, out64)
    assert numpy.array_equal(out64.ravel(), expect.astype(numpy.float64))


@pytest.mark.skipif(not {"avx2", "avx512"} & set(kernels.paths()), reason="no SIMD path here")
def test_self_check_catches_a_broken_ratio_kernel(monkeypatch):
    name = [p for p in kernels.paths() if p in ("avx2", "avx512")][0]

    def ignores_truncate(g, w, eps, scale, out, n, truncate):
        kernels._lib.c8_encode_ratio_portable(g, w, eps, scale, out, n, 0)

    monkeypatch.setattr(kernels._lib, f"c8_encode_ratio_{name}", ignores_truncate)
    assert kernels.self_check(name) == ["encode_ratio_truncate"]


def test_half_conversions_equal_numpys_for_every_half_and_the_edges():
    """encode_half is NumPy's float32 -> float16 (nearest even, inf beyond the range) of x / d;
    decode_half is exact for all 65536 bit patterns."""
    codes = numpy.arange(65536, dtype=numpy.uint32).astype(numpy.uint16)
    out = numpy.empty(codes.size, numpy.float32)
    kernels.decode_half(codes, out)
    numpy.testing.assert_array_equal(out, codes.view(numpy.float16).astype(numpy.float32))
    rng = numpy.random.default_rng(7)
    x = numpy.concatenate([
        (rng.standard_normal(100_000) * 10.0 ** rng.integers(-9, 6, 100_000)).astype(numpy.float32),
        numpy.array([65504, 65519.99, 65520, -65520, 1e30, numpy.inf, -numpy.inf, 0.0, -0.0,
                     2.0 ** -24, 2.0 ** -25, 3 * 2.0 ** -26, 2.0 ** -14, 1 + 2.0 ** -11],
                    numpy.float32)])
    for divisor in (1.0, 3.0, 4.0):
        got = kernels.encode_half(x, numpy.empty(x.size, numpy.uint16), divisor)
        with numpy.errstate(over="ignore"):          # NumPy's own cast says what it does
            want = (x / numpy.float32(divisor)).astype(numpy.float16).view(numpy.uint16)
        numpy.testing.assert_array_equal(got, want)
    nan = kernels.encode_half(numpy.array([numpy.nan], numpy.float32), numpy.empty(1, numpy.uint16))
    assert numpy.isnan(nan.view(numpy.float16)[0])


def test_fp8_map_applies_the_table_in_place():
    rng = numpy.random.default_rng(3)
    table = rng.integers(0, 256, 256).astype(numpy.uint8)
    x = rng.integers(0, 256, 100_003).astype(numpy.uint8)
    want = table[x]
    assert kernels.fp8_map(table, x) is x
    numpy.testing.assert_array_equal(x, want)
    with pytest.raises(ValueError, match="256 entries"):
        kernels.fp8_map(table[:255], x)
