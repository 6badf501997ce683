"""comm.fp8 against ml_dtypes.float8_e5m2 (an independent implementation) and numpy.float16."""
import ctypes
import shutil
import subprocess

import ml_dtypes
import numpy
import pytest

from caffe8.comm import fp8, kernels
from caffe8.engine import backend
from tests.device_standin.kernels import HOST_SHIM as _HOST_SHIM

E5M2 = ml_dtypes.float8_e5m2
ALL_CODES = numpy.arange(256, dtype=numpy.uint8)
ALL_HALVES = numpy.arange(65536, dtype=numpy.uint16).view(numpy.float16).astype(numpy.float32)


def ref_nearest(x):
    """ml_dtypes' cast (nearest even) with our saturation: |x| > 57344 and ±inf -> ±57344."""
    x = numpy.asarray(x, numpy.float32)
    with numpy.errstate(invalid="ignore"):
        clipped = numpy.where(numpy.isnan(x), x, numpy.clip(x, -57344.0, 57344.0))
        return clipped.astype(E5M2).view(numpy.uint8)


def ref_truncate(x):
    """Oyama et al.'s conversion computed with numpy: float -> float16 (nearest even), keep the upper
    byte; float16 overflow to inf (|x| >= 65520, or inf) saturates to the largest finite code."""
    with numpy.errstate(over="ignore"):
        hi = (numpy.asarray(x, numpy.float32).astype(numpy.float16).view(numpy.uint16) >> 8)
    hi = hi.astype(numpy.uint8)
    inf = (hi & 0x7F) == 0x7C
    hi[inf] = (hi[inf] & 0x80) | 0x7B
    return hi


def same_codes_nan_aware(got, ref):
    """Codes equal, except that any NaN code matches any NaN code."""
    g = got.view(E5M2).astype(numpy.float32)
    r = ref.view(E5M2).astype(numpy.float32)
    both_nan = numpy.isnan(g) & numpy.isnan(r)
    return numpy.all((got == ref) | both_nan)


def random_float32(n, seed):
    """Half log-uniform magnitudes over 2**-26 .. 57344 (subnormals and underflow to 0 included),
    half uniform on [-57344, 57344]; random signs."""
    rng = numpy.random.default_rng(seed)
    h = n // 2
    mag = numpy.exp2(rng.uniform(-26.0, numpy.log2(57344.0), h))
    log_part = numpy.where(rng.random(h) < 0.5, -mag, mag)
    uni_part = rng.uniform(-57344.0, 57344.0, n - h)
    x = numpy.concatenate([log_part, uni_part]).astype(numpy.float32)
    return numpy.clip(x, -57344.0, 57344.0)


@pytest.fixture(params=["public", "numpy"])
def encoder(request):
    """fp8.encode (C kernel when built) and the pure NumPy fallback of comm.kernels."""
    if request.param == "public":
        return fp8.encode
    return kernels.encode_numpy


def test_decode_all_codes_matches_ml_dtypes():
    got = fp8.decode(ALL_CODES)
    ref = ALL_CODES.view(E5M2).astype(numpy.float32)
    assert got.dtype == numpy.float32
    finite = numpy.isfinite(ref)
    assert numpy.array_equal(got[finite].view(numpy.uint32), ref[finite].view(numpy.uint32))
    assert numpy.array_equal(numpy.isnan(got), numpy.isnan(ref))
    assert numpy.array_equal(numpy.isinf(got), numpy.isinf(ref))
    assert got[0x7B] == 57344.0 and got[0x01] == 2.0 ** -16 and got[0x04] == 2.0 ** -14


def test_encode_nearest_every_float16_value(encoder):
    got = encoder(ALL_HALVES, "nearest")
    assert got.dtype == numpy.uint8 and got.shape == ALL_HALVES.shape
    assert same_codes_nan_aware(got, ref_nearest(ALL_HALVES))


def test_encode_nearest_ten_million_random_on_every_path():
    before = kernels.current_path()
    try:
        for seed in range(5):                   # 5 x 2 M = 10 M values
            x = random_float32(2_000_000, seed)
            ref = ref_nearest(x)
            assert numpy.array_equal(kernels.encode_numpy(x), ref), f"numpy, seed {seed}"
            for path in kernels.paths():
                kernels.use_path(path)
                assert numpy.array_equal(fp8.encode(x), ref), f"{path}, seed {seed}"
    finally:
        kernels.use_path(before)


def test_encode_nearest_every_midpoint_and_neighbours(encoder):
    # Midpoints between adjacent fp8 values are where ties-to-even matters.
    v = fp8.decode(numpy.arange(0x7C, dtype=numpy.uint8)).astype(numpy.float64)
    mid = ((v[:-1] + v[1:]) / 2).astype(numpy.float32)
    x = numpy.concatenate([mid, numpy.nextafter(mid, 0), numpy.nextafter(mid, numpy.inf)])
    x = numpy.concatenate([x, -x])
    assert numpy.array_equal(encoder(x, "nearest"), ref_nearest(x))


@pytest.mark.parametrize("rounding", ["nearest", "truncate"])
def test_overflow_saturates_never_inf(encoder, rounding):
    big = numpy.array([57344.0, 57345.0, 61439.0, 61440.0, 65504.0, 65519.0, 65520.0, 1e6,
                       3.4e38, numpy.inf], numpy.float32)
    x = numpy.concatenate([big, -big])
    got = encoder(x, rounding)
    assert numpy.all(got[: len(big)] == 0x7B) and numpy.all(got[len(big):] == 0xFB)
    nan = encoder(numpy.array([numpy.nan, -numpy.nan], numpy.float32), rounding)
    assert numpy.all(numpy.isnan(fp8.decode(nan)))


def test_truncate_matches_float16_upper_byte(encoder):
    x = numpy.concatenate([ALL_HALVES, random_float32(1_000_000, 7),
                           numpy.float32([61440, 65504, 65519, 65520, 1e9, -1e9])])
    x = x[~numpy.isnan(x)]
    assert numpy.array_equal(encoder(x, "truncate"), ref_truncate(x))


def test_truncate_differs_from_nearest_where_expected():
    # 1.1875 = 1.0011b: half keeps it exactly; the upper byte drops 0.0625 -> 1.0 (0x3C), while
    # nearest rounds up to 1.25 (0x3D).
    x = numpy.float32([1.1875])
    assert fp8.encode(x, "truncate")[0] == 0x3C and fp8.encode(x, "nearest")[0] == 0x3D


def test_shape_and_float64_rounding_once():
    x = numpy.linspace(-3, 3, 24, dtype=numpy.float32).reshape(2, 3, 4)
    assert fp8.encode(x).shape == (2, 3, 4) and fp8.decode(fp8.encode(x)).shape == (2, 3, 4)
    # 1.125 + 2**-30 is just above the 1.0/1.25 midpoint; via float32 it would become the
    # midpoint itself and round (to even) down.
    assert fp8.encode(numpy.array([1.125 + 2.0 ** -30]))[0] == 0x3D
    assert fp8.encode(numpy.array([1.125]))[0] == 0x3C


def test_ratio_encode_decode_match_float32_reference():
    rng = numpy.random.default_rng(3)
    g = (rng.standard_normal((64, 33)) * 1e-3).astype(numpy.float32)
    w = (rng.standard_normal((64, 33)) * 0.1).astype(numpy.float32)
    w[0, :5] = 0.0
    eps, scale = 1e-5, 57344.0 / 0.37
    d = g / (numpy.abs(w) + numpy.float32(eps)) * numpy.float32(scale)
    codes = fp8.encode_ratio(g, w, eps, scale)
    assert numpy.array_equal(codes, ref_nearest(d))
    back = fp8.decode_ratio(codes, w, eps, 1.0 / scale)
    ref = (codes.view(E5M2).astype(numpy.float32) * numpy.float32(1.0 / scale)
           * (numpy.abs(w) + numpy.float32(eps)))
    assert back.dtype == numpy.float32 and numpy.array_equal(back, ref)
    assert numpy.array_equal(fp8.encode_ratio(g, w, eps, scale, rounding="truncate"),
                             ref_truncate(d))


def test_bad_arguments():
    with pytest.raises(ValueError, match="rounding"):
        fp8.encode(numpy.zeros(3, numpy.float32), rounding="stochastic")
    with pytest.raises(TypeError, match="uint8"):
        fp8.decode(numpy.zeros(3, numpy.int32))
    with pytest.raises(ValueError, match="shape"):
        fp8.encode_ratio(numpy.zeros(3, numpy.float32), numpy.zeros(4, numpy.float32), 1e-5, 1.0)


@pytest.mark.parametrize("path", kernels.paths())
def test_public_encode_decode_on_every_host_path(path):
    before = kernels.current_path()
    kernels.use_path(path)
    try:
        x = random_float32(200_003, 9)            # odd length: SIMD tails too
        assert numpy.array_equal(fp8.encode(x), ref_nearest(x))
        assert numpy.array_equal(fp8.encode(x, "truncate"), ref_truncate(x))
        codes = numpy.tile(ALL_CODES, 3)[1:].reshape(767, 1)
        ref = codes.view(E5M2).astype(numpy.float32)
        assert numpy.array_equal(fp8.decode(codes), ref, equal_nan=True)
        assert numpy.array_equal(fp8.encode_ratio(x, x, 1e-5, 2.0),
                                 ref_nearest(x / (numpy.abs(x) + numpy.float32(1e-5)) * 2))
    finally:
        kernels.use_path(before)


# --- the CUDA kernel text, compiled as C on the host (checks its arithmetic without a GPU) ------
_C_TYPES = {"float32": ("float", numpy.float32), "float64": ("double", numpy.float64),
            "uint8": ("unsigned char", numpy.uint8), "uint16": ("unsigned short", numpy.uint16)}


def _params(text):
    return [(_C_TYPES[t][0], name, _C_TYPES[t][1])
            for t, name in (p.split() for p in text.split(","))]


def _host_kernel_source(shim=_HOST_SHIM):
    parts = [shim, fp8.CUDA_PREAMBLE]
    for name, (inp, out, body) in fp8.CUDA_KERNEL_SPECS.items():
        params = _params(inp) + _params(out)
        args = ", ".join(f"{ct} *{n}_" for ct, n, _ in params)
        loads = " ".join(f"{ct} {n} = {n}_[i];" for ct, n, _ in _params(inp))
        decls = " ".join(f"{ct} {n};" for ct, n, _ in _params(out))
        stores = " ".join(f"{n}_[i] = {n};" for _, n, _ in _params(out))
        parts.append(f"void k_{name}({args}, size_t n) {{ for (size_t i = 0; i < n; i++) "
                     f"{{ {loads} {decls} {body}; {stores} }} }}")
    return "\n".join(parts)


@pytest.fixture(scope="module")
def host_cuda_kernels(tmp_path_factory):
    return compile_host_kernels(tmp_path_factory.mktemp("cuda_on_host"))


def compile_host_kernels(d, shim=_HOST_SHIM):
    """``call(name, *arrays)``: comm.fp8's CUDA kernel ``name`` compiled as C (in folder ``d``)
    with ``shim`` standing in for CUDA's intrinsics."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    (d / "k.c").write_text(_host_kernel_source(shim))
    subprocess.run([cc, "-O2", "-std=c99", "-fPIC", "-shared", str(d / "k.c"), "-o",
                    str(d / "k.so"), "-lm"], check=True, capture_output=True)
    lib = ctypes.CDLL(str(d / "k.so"))

    def call(name, *arrays):
        inp, out, _ = fp8.CUDA_KERNEL_SPECS[name]
        n = arrays[0].size
        outs = [numpy.empty(n, dt) for _, _, dt in _params(out)]
        ins = [numpy.ascontiguousarray(numpy.broadcast_to(a, (n,)), dt)
               for a, (_, _, dt) in zip(arrays, _params(inp))]
        fn = getattr(lib, "k_" + name)
        fn.restype = None
        fn(*[a.ctypes.data_as(ctypes.c_void_p) for a in ins + outs], ctypes.c_size_t(n))
        return outs[0]
    return call


def test_cuda_kernel_text_on_the_host(host_cuda_kernels):
    k = host_cuda_kernels
    x = numpy.concatenate([ALL_HALVES, random_float32(1_000_000, 13),
                           numpy.float32([61439, 61440, 65519, 65520, 1e9, -numpy.inf])])
    x = x[~numpy.isnan(x)]
    assert numpy.array_equal(k("encode_nearest", x), ref_nearest(x))
    assert numpy.array_equal(k("encode_truncate", x), ref_truncate(x))
    assert numpy.array_equal(k("decode", ALL_CODES), fp8.decode(ALL_CODES), equal_nan=True)
    rng = numpy.random.default_rng(8)
    g = (rng.standard_normal(100_000) * 1e-3).astype(numpy.float32)
    w = (rng.standard_normal(100_000) * 0.05).astype(numpy.float32)
    eps, scale = numpy.float32(1e-5), numpy.float32(1234.5)
    codes = k("encode_ratio_nearest", g, w, eps, scale)
    assert numpy.array_equal(codes, fp8.encode_ratio(g, w, 1e-5, 1234.5))
    assert numpy.array_equal(k("encode_ratio_truncate", g, w, eps, scale),
                             fp8.encode_ratio(g, w, 1e-5, 1234.5, rounding="truncate"))
    back = k("decode_ratio", codes, w, eps, numpy.float32(1 / 1234.5))
    assert numpy.array_equal(back, fp8.decode_ratio(codes, w, 1e-5, 1 / 1234.5))


def test_device_sums_text_on_the_host(host_cuda_kernels):
    """The device twins of the host sums (comm.ipc.device_sum), as C: every pair of fp8 codes
    for both fp8 sums, halves (every half against random ones, saturating pairs) against
    comm.kernels.half_sum, float32 with subnormals, zeros and infinities against numpy.add —
    bit for bit, the non-NaN results (a NaN stays a NaN; its payload is the FPU's)."""
    k = host_cuda_kernels
    a, b = numpy.meshgrid(ALL_CODES, ALL_CODES)
    a, b = a.ravel(), b.ravel()
    for name, rounding in (("add_nearest", "nearest"), ("add_oyama", "oyama")):
        ref = b.copy()
        kernels.fp8_sum(a, ref, rounding)
        got = k(name, a, b)
        nan = numpy.isnan(fp8.decode(ref))
        assert numpy.array_equal(numpy.isnan(fp8.decode(got)), nan), name
        assert numpy.array_equal(got[~nan], ref[~nan]), name
    rng = numpy.random.default_rng(21)
    ha = numpy.concatenate([numpy.arange(65536), rng.integers(0, 65536, 400_000),
                            numpy.full(4, 0x7BFF)]).astype(numpy.uint16)
    hb = numpy.concatenate([rng.integers(0, 65536, 65536 + 400_000),
                            numpy.array([0x7BFF, 0x7BFE, 0xFBFF, 0x0001])]).astype(numpy.uint16)
    ref = hb.copy()
    kernels.half_sum(ha, ref)
    got = k("half_add", ha, hb)
    nan = numpy.isnan(ref.view(numpy.float16))
    assert numpy.array_equal(numpy.isnan(got.view(numpy.float16)), nan)
    assert numpy.array_equal(got[~nan], ref[~nan])
    assert got[-4] == 0x7BFF                            # 65504 + 65504 saturates
    tiny = numpy.float32([1e-45, -1e-45, 3e-39, -2.9e-39, 1.1754942e-38, 0.0, -0.0])
    fa = numpy.concatenate([random_float32(300_000, 22), tiny, tiny,
                            numpy.float32([numpy.inf, -numpy.inf, 3e38])])
    fb = numpy.concatenate([random_float32(300_000, 23), tiny[::-1], -tiny,
                            numpy.float32([1.0, 1.0, 3e38])])
    with numpy.errstate(over="ignore"):
        ref = fa + fb
    got = k("float_add", fa, fb)
    nan = numpy.isnan(ref)
    assert numpy.array_equal(numpy.isnan(got), nan)
    assert numpy.array_equal(got[~nan].view(numpy.uint32), ref[~nan].view(numpy.uint32))


@pytest.mark.gpu
@pytest.mark.parametrize("rounding", ["nearest", "truncate"])
def test_cupy_kernels_match_numpy(rounding):
    cp = backend.cupy
    x = numpy.concatenate([ALL_HALVES, random_float32(1_000_000, 11),
                           numpy.float32([65520, 1e9, numpy.inf, -numpy.inf])])
    x = x[~numpy.isnan(x)]
    got = cp.asnumpy(fp8.encode(cp.asarray(x), rounding))
    ref = ref_nearest(x) if rounding == "nearest" else ref_truncate(x)
    assert numpy.array_equal(got, ref)
    dec = cp.asnumpy(fp8.decode(cp.asarray(ALL_CODES)))
    assert numpy.array_equal(dec, fp8.decode(ALL_CODES), equal_nan=True)
    rng = numpy.random.default_rng(5)
    g = rng.standard_normal(4096).astype(numpy.float32)
    w = rng.standard_normal(4096).astype(numpy.float32)
    codes = fp8.encode_ratio(cp.asarray(g), cp.asarray(w), 1e-5, 300.0, rounding=rounding)
    assert numpy.array_equal(cp.asnumpy(codes),
                             fp8.encode_ratio(g, w, 1e-5, 300.0, rounding=rounding))
    back = fp8.decode_ratio(codes, cp.asarray(w), 1e-5, 1 / 300.0)
    assert numpy.array_equal(cp.asnumpy(back),
                             fp8.decode_ratio(cp.asnumpy(codes), w, 1e-5, 1 / 300.0))
