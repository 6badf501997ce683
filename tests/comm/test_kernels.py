"""comm.kernels on every CPU path this machine has, against NumPy + ml_dtypes references.

References never use comm code: fp8 values are decoded by ml_dtypes, added in float64 (exact for
two fp8 or two halves), clipped to the largest finite value and cast back by ml_dtypes / numpy
(nearest even).
"""
import ctypes
import os
import subprocess
import sys

import ml_dtypes
import numpy
import pytest

from comm import kernels

E5M2 = ml_dtypes.float8_e5m2
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(params=kernels.paths())
def path(request):
    before = kernels.current_path()
    kernels.use_path(request.param)
    yield request.param
    kernels.use_path(before)


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
    code = "from comm import kernels; print(kernels._compile_into_cache())"
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
            "    warnings.simplefilter('always')\n    from comm import kernels\n"
            "print(kernels.library_file(), kernels.paths(), len(w))\n"
            "print([str(x.message) for x in w])\n"
            "import numpy; d = numpy.full(3, 0x3C, numpy.uint8)\n"
            "kernels.fp8_sum(numpy.full(3, 0x3C, numpy.uint8), d); print(d.tolist())")
    env = {"CAFFE8_CACHE_DIR": str(tmp_path), "CC": "/nonexistent/cc"}
    out, err = run_python(code, env).communicate(timeout=120)
    if kernels.library_file() and not kernels.library_file().startswith(kernels._cache_dir()):
        pytest.skip("a library is installed next to the package; the fallback is not reachable")
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
    code = "from comm import kernels; print(kernels.current_path())"
    out, _ = run_python(code, {"CAFFE8_KERNEL_PATH": "numpy"}).communicate(timeout=120)
    assert out.strip() == "numpy"
    out, err = run_python(code, {"CAFFE8_KERNEL_PATH": "vax"}).communicate(timeout=120)
    assert out.strip() == kernels.paths()[0] and "not available" in err
