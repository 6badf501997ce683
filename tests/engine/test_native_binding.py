"""engine/native.py by itself: ``address`` reads an array's data pointer; a library built at run
time finds the shared header (engine/csrc/c8_kernels.h) and its cache key follows the header, and
``Kernels`` binds a family of float32/float64 kernels, runs them on NumPy arrays and declines what
they cannot take."""
import ctypes
import os
import shutil

import numpy
import pytest

from caffe8.engine import native

SOURCE = r"""
#include "c8_kernels.h"

C8_ABI(c8t_abi_version, 3)

#define SCALE(NAME, T) KERNEL void NAME(T *x, idx n, T by) { for (idx i = 0; i < n; i++) x[i] *= by; }
SCALE(c8t_scale_f32, float)
SCALE(c8t_scale_f64, double)
"""

needs_cc = pytest.mark.skipif(shutil.which(os.environ.get("CC", "cc")) is None,
                              reason="no C compiler")


@pytest.fixture
def source(tmp_path, monkeypatch):
    monkeypatch.setenv("CAFFE8_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "pkg" / "csrc").mkdir(parents=True)
    path = tmp_path / "pkg" / "csrc" / "scale.c"
    path.write_text(SOURCE)
    return str(path)


def _kernels(source):
    return native.Kernels("test", source, "_scale", ("c8t_abi_version", 3), "c8t_",
                          lambda real: {"scale": (None, [ctypes.c_void_p, ctypes.c_ssize_t,
                                                         real])},
                          "CAFFE8_TEST_KERNELS", [(["-O2", "-std=c99"], [])])


@needs_cc
def test_a_kernel_family_runs_on_numpy_arrays_and_declines_the_rest(source):
    k = _kernels(source)
    assert k.library_file().startswith(native.cache_dir())
    for dtype in (numpy.float32, numpy.float64):
        x = numpy.arange(5, dtype=dtype)
        assert k.run("scale", (x,), x, x.size, 2.5) is True
        assert x.tolist() == [0.0, 2.5, 5.0, 7.5, 10.0]
    strided = numpy.arange(10, dtype=numpy.float32)[::2]
    ints = numpy.arange(3)
    assert not k.run("scale", (strided,), strided, strided.size, 2.0)
    assert not k.run("scale", (ints,), ints, ints.size, 2.0)
    assert strided.tolist() == [0, 2, 4, 6, 8] and ints.tolist() == [0, 1, 2]
    assert k.use_native(False) is True and not k.enabled_for(numpy.zeros(2))
    assert k.use_native(True) is False and k.enabled_for(numpy.zeros(2))


@needs_cc
def test_the_cache_key_follows_the_shared_header(source, tmp_path, monkeypatch):
    first = native.compile_cached(source, "_scale", ["-O2"], [])
    header = tmp_path / "c8_kernels.h"
    header.write_text(open(os.path.join(native.INCLUDE_DIR, "c8_kernels.h")).read()
                      + "\n/* edited */\n")
    monkeypatch.setattr(native, "_HEADERS", (str(header),))
    assert native.compile_cached(source, "_scale", ["-O2"], []) != first


def test_address_is_the_arrays_data_pointer():
    """native.address (read from NumPy's object layout where it is CPython's) gives what
    ``ctypes.data`` gives, for views of every kind and arrays that die and are made again."""
    from caffe8.engine.native import address
    base = numpy.arange(2 * 3 * 5 * 7, dtype=numpy.float64).reshape(2, 3, 5, 7)
    views = [base, base.T, base[:, 1:, ::2], base[..., ::-1], base[1, 2], base[0, 0, 0, 0:0],
             base.reshape(-1)[5:].view(numpy.float32), numpy.array(3.0), numpy.zeros(4, bool),
             numpy.asfortranarray(base)]
    for v in views:
        assert address(v) == v.ctypes.data
    for _ in range(50):   # new objects at recycled addresses read their own pointer
        a = numpy.empty(int(numpy.random.default_rng().integers(1, 1000)))
        assert address(a) == a.ctypes.data
