"""comm/fp8.py's CUDA kernels keep float32 subnormals as the host does, although CuPy compiles
them with -ftz=true; and the fp8 codec multiplies in float32 on both paths for float64 nets.

Without a GPU the kernel text is compiled as C on the host with the intrinsics flushing
subnormals as -ftz=true makes them (inputs and results): a tiny q (inv_scale below 2**-126)
must decode as comm.kernels' C code and NumPy's float32 arithmetic decode it, not to zeros."""
import numpy
import pytest

from caffe8.comm import fp8, kernels
from caffe8.comm.codecs import Tensor, create_codec
from caffe8.comm.config import parse_comm
from caffe8.engine import backend
from tests.comm.test_fp8 import compile_host_kernels

# -ftz=true on the host: every f32 intrinsic flushes subnormal operands and results to +-0
_FTZ_SHIM = r"""
#include <math.h>
#include <stddef.h>
#include <string.h>
#define __device__ static
#define __forceinline__ inline
static unsigned int __float_as_uint(float f) { unsigned int u; memcpy(&u, &f, 4); return u; }
static float __uint_as_float(unsigned int u) { float f; memcpy(&f, &u, 4); return f; }
static long long __double_as_longlong(double d) { long long u; memcpy(&u, &d, 8); return u; }
static double __longlong_as_double(long long u) { double d; memcpy(&d, &u, 8); return d; }
static float ftz(float x) { return fabsf(x) < 1.17549435e-38f ? copysignf(0.0f, x) : x; }
static float __fadd_rn(float a, float b) { return ftz(ftz(a) + ftz(b)); }
static float __fmul_rn(float a, float b) { return ftz(ftz(a) * ftz(b)); }
static float __fdiv_rn(float a, float b) { return ftz(ftz(a) / ftz(b)); }
"""
@pytest.fixture(scope="module")
def ftz_kernels(tmp_path_factory):
    """``call(name, *arrays)``: the named CUDA kernel of comm.fp8, compiled as C under -ftz."""
    return compile_host_kernels(tmp_path_factory.mktemp("ftz"), _FTZ_SHIM)


def _tiny_case(seed=3):
    rng = numpy.random.default_rng(seed)
    codes = rng.integers(0, 256, 20000).astype(numpy.uint8)
    codes = codes[(codes & 0x7F) < 0x7C]                       # finite codes
    w = (rng.standard_normal(codes.size) * 0.05).astype(numpy.float32)
    return codes, w


@pytest.mark.parametrize("q", [1e-36, 6e-34, 3e-40])
def test_tiny_q_decodes_as_the_host_despite_ftz(ftz_kernels, q):
    codes, w = _tiny_case()
    inv = numpy.float32(q / kernels.FP8_MAX)                      # as the codec rounds it
    assert 0 < inv < numpy.finfo(numpy.float32).tiny               # a subnormal inv_scale
    host = fp8.decode_ratio(codes, w, 1e-5, inv)                   # NumPy float32, no flush
    assert numpy.count_nonzero(host) > codes.size // 10
    assert numpy.array_equal(ftz_kernels("decode_ratio", codes, w, numpy.float32(1e-5), inv),
                             host)
    plain = fp8.decode(codes) * inv
    assert numpy.array_equal(ftz_kernels("decode_scaled", codes, inv), plain)
    assert numpy.array_equal(fp8.decode_scaled(codes, inv), plain)
    # the codec's decode (comm.kernels' C code, or its NumPy fallback) gives the same bits
    for relative, ref in (("true", host), ("false", plain)):
        codec = create_codec("fp8", parse_comm(f"relative: {relative}"))
        out = numpy.empty(codes.size, numpy.float32)
        codec.decode(codes.copy(), codec_ctx(q, w), out)
        assert numpy.array_equal(out, ref)


def codec_ctx(q, w):
    from caffe8.comm.codecs import _Fp8Context
    return _Fp8Context(q, 1, w)


def test_subnormal_ratio_and_scale_encode_as_the_host_despite_ftz(ftz_kernels):
    rng = numpy.random.default_rng(4)
    n = 50000
    g = (rng.standard_normal(n) * 1e-39).astype(numpy.float32)     # subnormal gradients
    w = (rng.standard_normal(n) * 1e-39).astype(numpy.float32)     # subnormal weights
    eps = numpy.float32(1e-44)                                      # subnormal epsilon
    for rounding in ("nearest", "truncate"):
        for scale in (numpy.float32(3e4), numpy.float32(1e38)):
            with numpy.errstate(over="ignore"):              # huge ratios saturate
                host = fp8.encode_ratio(g, w, eps, scale, rounding)
            assert numpy.count_nonzero(host & 0x7F) > n // 4
            got = ftz_kernels(f"encode_ratio_{rounding}", g, w, eps, scale)
            assert numpy.array_equal(got, host)
            scaled = fp8.encode_scaled(g, scale, rounding)
            assert numpy.array_equal(ftz_kernels(f"encode_scaled_{rounding}", g, scale), scaled)


def test_float64_casts_keep_float32_subnormals_despite_ftz(ftz_kernels):
    """The device codec's float64 <-> float32 conversions ("narrow", "widen") round as NumPy's
    casts do, subnormals and ties included, where CuPy's own astype (under -ftz) flushes."""
    rng = numpy.random.default_rng(11)
    tiny = numpy.finfo(numpy.float32).tiny
    x64 = numpy.concatenate([
        rng.standard_normal(20000) * tiny,                       # float32 subnormals
        rng.standard_normal(20000) * 1e-3, rng.standard_normal(2000) * 1e38,
        numpy.ldexp(numpy.arange(1, 200, dtype=numpy.float64) + 0.5, -149),   # subnormal ties
        numpy.array([2.0 ** -150, 2.0 ** -151, 3.5e38, -3.5e38, 0.0, -0.0, 1e-300, numpy.inf])])
    with numpy.errstate(over="ignore"):
        ref32 = x64.astype(numpy.float32)
    got32 = ftz_kernels("narrow", x64)
    assert numpy.array_equal(got32.view(numpy.uint32), ref32.view(numpy.uint32))
    assert numpy.count_nonzero(numpy.abs(ref32) < tiny) > 20000 // 2
    assert numpy.array_equal(ftz_kernels("widen", ref32).view(numpy.uint64),
                             ref32.astype(numpy.float64).view(numpy.uint64))


def test_the_kernels_float32_operations_equal_ieee_on_every_binade(ftz_kernels):
    """c8_mul through decode_scaled: every finite code times scales from 2**-149 to 2**127."""
    codes = numpy.arange(256, dtype=numpy.uint8)
    codes = codes[(codes & 0x7F) < 0x7C]
    for e in range(-149, 128, 3):
        for m in (1.0, 1.2345678, 1.9999999):
            inv = numpy.float32(numpy.ldexp(m, e))
            with numpy.errstate(over="ignore"):
                ref = fp8.decode(codes) * inv
            assert numpy.array_equal(ftz_kernels("decode_scaled", codes, inv), ref), (e, m)


def test_non_relative_fp8_on_float64_multiplies_in_float32():
    """The host codec casts a float64 gradient to float32 and scales in float32; the device
    path (encode_scaled, the same arithmetic) must too: a float64 product would round once
    from a different value."""
    rng = numpy.random.default_rng(6)
    # just under fp8 ties (1.375 between 1.25 and 1.5): float32 rounds them onto the tie, which
    # goes to even (1.5); the float64 value itself is below it (1.25)
    ties = numpy.array([1.375, -1.375, 0.6875, 2.75]) * (1 - 2.0 ** -30)
    g64 = numpy.concatenate([rng.standard_normal(4099), ties])
    codec = create_codec("fp8", parse_comm("relative: false"))
    wire = numpy.zeros(g64.size, numpy.uint8)
    t = Tensor((0, g64.size), numpy.ones_like(g64), 0, 1, (1, 1), wire)
    codec.agree(t, kernels.FP8_MAX)                           # q = 57344: scale 1
    payload, _ = codec.encode(g64, t)
    ref = fp8.encode(g64.astype(numpy.float32))
    assert payload is wire and numpy.array_equal(payload, ref)
    assert numpy.array_equal(fp8.encode_scaled(g64, 1.0), ref)
    assert numpy.array_equal(fp8.decode(ref[-4:]), [1.5, -1.5, 0.75, 3.0])
    # the float64 product (what the device path did) rounds the ties down
    assert numpy.array_equal(fp8.decode(fp8.encode(g64[-4:] * 1.0)), [1.25, -1.25, 0.625, 2.5])


@pytest.mark.gpu
@pytest.mark.parametrize("relative", ["true", "false"])
@pytest.mark.parametrize("dtype", [numpy.float32, numpy.float64])
def test_gpu_codec_equals_host_for_tiny_q_and_float64(relative, dtype):
    cp = backend.cupy
    rng = numpy.random.default_rng(7)
    g = (rng.standard_normal(3001) * 1e-3).astype(dtype)
    w = (rng.standard_normal(3001) * 0.05).astype(dtype)
    results = []
    for xp in (numpy, cp):
        codec = create_codec("fp8", parse_comm(f"relative: {relative}"))
        wire = xp.zeros(g.size, xp.uint8)
        t = Tensor((0, g.size), xp.asarray(w), 0, 1, (1, 1), wire)
        codec.agree(t, 1e-36)                            # tiny q: subnormal inv_scale
        payload, ctx = codec.encode(xp.asarray(g), t)
        out = xp.empty(g.size, dtype)
        codec.decode(payload, ctx, out)
        results.append((backend.to_numpy(payload), backend.to_numpy(out)))
    assert numpy.array_equal(results[0][0], results[1][0])
    assert numpy.array_equal(results[0][1], results[1][1])
    assert numpy.count_nonzero(results[1][1]) > 0


@pytest.mark.gpu
def test_gpu_decode_ratio_takes_host_codes_with_a_device_weight():
    cp = backend.cupy
    codes, w = _tiny_case(5)
    got = fp8.decode_ratio(codes, cp.asarray(w), 1e-5, 1 / 300.0)
    assert numpy.array_equal(cp.asnumpy(got), fp8.decode_ratio(codes, w, 1e-5, 1 / 300.0))
