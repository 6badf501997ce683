"""engine/backend.py's device paths without hidden costs: device random numbers from one
counter-based kernel (its text run as C on the CPU against NumPy's Philox, and on a GPU),
and ``out += a @ b`` as one GEMM with beta = 1."""
import ctypes
import shutil
import subprocess

import numpy
import pytest

from caffe8.engine import backend


_HOST_SHIM = r"""
#include <stddef.h>
static unsigned long long __umul64hi(unsigned long long a, unsigned long long b) {
    return (unsigned long long)(((unsigned __int128)a * b) >> 64);
}
"""


def _host_uniform(tmp_path, dtype):
    """``call(key, n)``: backend's device uniform kernel text compiled as C for ``dtype``."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    inp, out, body = backend.UNIFORM_KERNEL_SPEC
    assert (inp, out) == ("uint64 key", "T y")
    ctype = {numpy.float32: "float", numpy.float64: "double"}[dtype]
    src = (_HOST_SHIM + f"typedef {ctype} T;\n"
           f"void k(unsigned long long key, T *y_, ptrdiff_t n) {{\n"
           f"  for (ptrdiff_t i = 0; i < n; i++) {{ T y; {body}; y_[i] = y; }}\n}}\n")
    (tmp_path / "u.c").write_text(src)
    subprocess.run([cc, "-O2", "-std=gnu99", "-fPIC", "-shared", str(tmp_path / "u.c"), "-o",
                    str(tmp_path / "u.so")], check=True, capture_output=True)
    lib = ctypes.CDLL(str(tmp_path / "u.so"))

    def call(key, n):
        y = numpy.empty(n, dtype)
        lib.k(ctypes.c_ulonglong(key), y.ctypes.data_as(ctypes.c_void_p), ctypes.c_ssize_t(n))
        return y
    return call


def _philox_uniform(key, n, dtype):
    """The reference: NumPy's own Philox4x64-10 stream for ``key``, words to [0, 1) floats."""
    raw = numpy.random.Philox(key=key).random_raw(n)
    if dtype == numpy.float32:
        return ((raw >> numpy.uint64(40)).astype(numpy.float64) * 2.0 ** -24).astype(numpy.float32)
    return (raw >> numpy.uint64(11)).astype(numpy.float64) * 2.0 ** -53


@pytest.mark.parametrize("dtype", [numpy.float32, numpy.float64])
def test_device_uniform_kernel_is_numpys_philox_stream(tmp_path, dtype):
    """The device generator's text, run as C: element i is word i of NumPy's Philox stream for
    the key (Random123's counter-based generator), so a GPU draw is reproducible from the host
    generator's state alone (resume) and needs no device state."""
    call = _host_uniform(tmp_path, dtype)
    for key in (0, 1, 0x123456789ABCDEF0, 2**63 - 2):
        got, ref = call(key, 1001), _philox_uniform(key, 1001, dtype)
        assert numpy.array_equal(got, ref)
        assert got.min() >= 0 and got.max() < 1
    assert not numpy.array_equal(call(1, 64), call(2, 64))
    u = call(7, 200_000)
    assert abs(u.mean() - 0.5) < 0.005 and abs(u.var() - 1 / 12) < 0.002


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [numpy.float32, numpy.float64])
@pytest.mark.parametrize("order", ["C", "F"])
def test_accumulating_matmul_is_one_gemm_into_out(dtype, order, monkeypatch):
    cp = backend.cupy
    rng = numpy.random.default_rng(1)
    a, b = rng.standard_normal((33, 17)).astype(dtype), rng.standard_normal((17, 9)).astype(dtype)
    c = numpy.asarray(rng.standard_normal((33, 9)), dtype=dtype, order=order)
    backend.use_gpu()
    try:
        out = cp.asarray(c, order=order)
        ptr = out.data.ptr
        matmuls = []
        monkeypatch.setattr(cp, "matmul", lambda *args, **kw: matmuls.append(args))
        got = backend.matmul(cp.asarray(a), cp.asarray(b), out, accumulate=True)
        assert got is out and out.data.ptr == ptr and matmuls == []     # cuBLAS, beta = 1
        tol = 1e-5 if dtype == numpy.float32 else 1e-12
        numpy.testing.assert_allclose(cp.asnumpy(out), c + a.astype(numpy.float64) @ b,
                                      rtol=tol, atol=tol)
    finally:
        backend.use_cpu()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [numpy.float32, numpy.float64])
def test_device_draws_are_the_philox_stream_of_the_host_generators_keys(dtype):
    cp = backend.cupy
    backend.use_gpu()
    try:
        backend.seed(9)
        first = [cp.asnumpy(backend.random_uniform((10, 100), dtype, cp)) for _ in range(2)]
        backend.seed(9)
        keys = [int(backend.rng().integers(0, 2**63 - 1)) for _ in range(2)]
        for got, key in zip(first, keys):
            assert got.dtype == dtype and got.shape == (10, 100)
            assert numpy.array_equal(got.reshape(-1), _philox_uniform(key, 1000, dtype))
        assert not numpy.array_equal(first[0], first[1])
    finally:
        backend.use_cpu()
