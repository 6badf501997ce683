"""caffe8's host GEMM (engine/blas.py) against a loop reference, its layouts, and its fallbacks."""
import os
import platform
import subprocess
import sys

import numpy
import pytest

from caffe8.engine import blas

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RNG = numpy.random.default_rng(7)
needs_lib = pytest.mark.skipif(not blas.available(), reason="scipy-openblas32 not loaded")


def reference(a, b):
    """float64 product by einsum's plain C loop (optimize=False never calls BLAS)."""
    return numpy.einsum("...ik,...kj->...ij", a.astype(numpy.float64), b.astype(numpy.float64),
                        optimize=False)


def tolerance(a, b, dtype):
    """Bound of the rounding error: eps * K * max|a| * max|b| (with margin)."""
    k = a.shape[-1]
    eps = numpy.finfo(dtype).eps
    return 4 * eps * k * numpy.abs(a).max() * numpy.abs(b).max()


def operand(shape, transposed, dtype):
    """A strided 2-D view: a sub-block of a wider array (leading dimension > columns), stored
    transposed when asked."""
    r, c = shape
    if transposed:
        big = RNG.standard_normal((c + 3, r + 5)).astype(dtype)
        return big[1:c + 1, 2:r + 2].T
    big = RNG.standard_normal((r + 3, c + 5)).astype(dtype)
    return big[1:r + 1, 2:c + 2]


@needs_lib
@pytest.mark.parametrize("dtype", [numpy.float32, numpy.float64])
@pytest.mark.parametrize("ta,tb", [(False, False), (True, False), (False, True), (True, True)])
@pytest.mark.parametrize("m,k,n", [(7, 13, 5), (1, 9, 4), (6, 1, 3), (4, 8, 1), (33, 70, 41)])
def test_layouts_match_loop_reference(dtype, ta, tb, m, k, n):
    a, b = operand((m, k), ta, dtype), operand((k, n), tb, dtype)
    out_big = numpy.full((m + 2, n + 4), numpy.nan, dtype)
    out = out_big[1:m + 1, 1:n + 1]                  # written through a strided view
    res = blas.matmul(a, b, out=out)
    assert res is out
    numpy.testing.assert_allclose(out, reference(a, b), rtol=0, atol=tolerance(a, b, dtype))
    assert numpy.isnan(out_big[0]).all() and numpy.isnan(out_big[:, 0]).all()  # nothing outside


@needs_lib
def test_goes_through_the_library(monkeypatch):
    """Eligible operands never reach NumPy's matmul (the fallback is made to fail)."""
    def refuse(*args):
        raise AssertionError("fell back to numpy.matmul")
    monkeypatch.setattr(blas, "_numpy_matmul", refuse)
    a = RNG.standard_normal((5, 6)).astype(numpy.float32)
    b = RNG.standard_normal((6, 4)).astype(numpy.float32)
    numpy.testing.assert_allclose(blas.matmul(a, b), reference(a, b), atol=1e-5)
    numpy.testing.assert_allclose(blas.matmul(a.T.copy().T, b.T.copy().T), reference(a, b),
                                  atol=1e-5)


@needs_lib
@pytest.mark.parametrize("dtype", [numpy.float32, numpy.float64])
def test_batched_broadcast_as_convolution_uses_it(dtype):
    """(group, O/g, K) @ (n, group, K, P) -> (n, group, O/g, P), the per-image conv product,
    and a transposed batch operand as the weight gradient uses it."""
    w = RNG.standard_normal((2, 3, 10)).astype(dtype)
    cols = RNG.standard_normal((4, 2, 10, 12)).astype(dtype)
    out = numpy.empty((4, 2, 3, 12), dtype)
    blas.matmul(w, cols, out=out)
    numpy.testing.assert_allclose(out, reference(numpy.broadcast_to(w, (4, 2, 3, 10)), cols),
                                  atol=tolerance(w, cols, dtype))
    dy = RNG.standard_normal((2, 3, 40)).astype(dtype)
    c = RNG.standard_normal((2, 10, 40)).astype(dtype)
    dw = RNG.standard_normal((2, 3, 10)).astype(dtype)
    before = dw.copy()
    blas.matmul(dy, c.swapaxes(1, 2), out=dw, accumulate=True)
    numpy.testing.assert_allclose(dw, before + reference(dy, c.swapaxes(1, 2)),
                                  atol=tolerance(dy, c, dtype) + 1e-6)


@pytest.mark.parametrize("case", ["int", "float16", "mixed", "vector", "overlap", "k0",
                                  "negative stride"])
def test_fallbacks_equal_numpy(case):
    a = RNG.standard_normal((4, 5))
    b = RNG.standard_normal((5, 3))
    out = None
    if case == "int":
        a, b = (a * 10).astype(numpy.int64), (b * 10).astype(numpy.int64)
    elif case == "float16":
        a, b = a.astype(numpy.float16), b.astype(numpy.float16)
    elif case == "mixed":
        a = a.astype(numpy.float32)
    elif case == "vector":
        b = b[:, 0].copy()
    elif case == "k0":
        a, b = a[:, :0], b[:0]
        out = numpy.full((4, 3), 5.0)
    elif case == "negative stride":
        a = a[::-1]
    expected = numpy.matmul(a, b)
    if case == "overlap":
        buf = RNG.standard_normal((5, 5))
        a, b = buf[:4], buf            # out overlaps a: NumPy buffers it, so must we
        expected = numpy.matmul(a, b)
        out = buf[1:5]
    got = blas.matmul(a, b, out=out)
    assert got.dtype == expected.dtype
    numpy.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-12)


def test_accumulate_needs_out():
    with pytest.raises(ValueError):
        blas.matmul(numpy.ones((2, 2)), numpy.ones((2, 2)), accumulate=True)


def test_shape_mismatch_raises_numpy_error():
    with pytest.raises(ValueError):
        blas.matmul(numpy.ones((2, 3), numpy.float32), numpy.ones((4, 2), numpy.float32))


def run_python(code, **env):
    full = dict(os.environ, PYTHONPATH=ROOT, **env)
    for name, value in env.items():
        if value is None:
            full.pop(name)
    return subprocess.run([sys.executable, "-c", code], env=full, capture_output=True,
                          text=True, timeout=60, check=True).stdout.strip()


def test_numpy_mode_by_environment():
    line = run_python("from caffe8.engine import blas; print(blas.available(), blas.describe())",
                      CAFFE8_BLAS="numpy")
    assert line == "False host GEMM: NumPy's BLAS (CAFFE8_BLAS=numpy)"


@needs_lib
@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86 core names")
def test_numpys_pin_does_not_apply_but_caffe8s_does():
    """OPENBLAS_CORETYPE (NumPy's) is left as it was for everyone else; the library chooses its
    own kernels unless CAFFE8_OPENBLAS_CORETYPE names a core."""
    code = ("import os; from caffe8.engine import blas; print(blas.describe()); "
            "print(os.environ.get('OPENBLAS_CORETYPE'))")
    pinned = run_python(code, OPENBLAS_CORETYPE="Sandybridge", CAFFE8_OPENBLAS_CORETYPE=None)
    free = run_python(code, OPENBLAS_CORETYPE=None, CAFFE8_OPENBLAS_CORETYPE=None)
    assert pinned.splitlines()[1] == "Sandybridge"
    assert pinned.splitlines()[0] == free.splitlines()[0]     # detected core both times
    ours = run_python(code, OPENBLAS_CORETYPE=None, CAFFE8_OPENBLAS_CORETYPE="Sandybridge")
    assert "(Sandybridge kernels" in ours.splitlines()[0]
    assert ours.splitlines()[1] == "None"


@needs_lib
def test_adapt_threads_applies_the_budget_between_iterations():
    """adapt_threads sets the worker count to what the budget answers (a neighbour took a
    core: 1 worker; it left: back to the limit), and never above the limit the library loaded
    with (here OPENBLAS_NUM_THREADS=2)."""
    code = ("from caffe8.engine import blas, cpu_share\n"
            "answers = iter([1, 1, 2, 5])\n"
            "class Budget:\n"
            "    limit = 2\n"
            "    def poll(self):\n"
            "        return min(self.limit, next(answers))\n"
            "blas._budget = Budget()\n"
            "lib = blas._load()[0]\n"
            "seen = []\n"
            "for _ in range(4):\n"
            "    blas.adapt_threads()\n"
            "    seen.append(blas.threads())\n"
            "print(seen, lib.scipy_openblas_get_num_threads(), cpu_share.usable_cores() >= 1)\n")
    # the workers follow the budget; OpenBLAS itself stays on one thread (the blocks are ours)
    assert run_python(code, OPENBLAS_NUM_THREADS="2") == "[1, 1, 2, 2] 1 True"


@needs_lib
def test_fixed_thread_count_when_adaptation_is_off():
    code = ("from caffe8.engine import blas\n"
            "blas.adapt_threads(); blas.adapt_threads(); print(blas._budget, blas.threads())\n")
    assert run_python(code, OPENBLAS_NUM_THREADS="2", CAFFE8_ADAPT_THREADS="0") == "False 2"


def test_blocks_follow_the_shape_and_the_runs_partition_only():
    """A small output over a long inner dimension (a weight gradient summed over the batch) is
    one block; a large product is split into the run's partition along its output's longer side
    in aligned pieces; a batch of at least that many items is split by item only."""
    assert blas._blocks(20, 25, 36864, 1, 2) == (((0, 20), (0, 25)),)
    assert blas._blocks(8, 8, 8, 1, 2) == (((0, 8), (0, 8)),)
    parts = blas._blocks(50, 4096, 500, 1, 4)
    assert len(parts) == 4 and all(rows == (0, 50) for rows, _ in parts)
    cols = [c for _, c in parts]
    assert cols[0][0] == 0 and cols[-1][1] == 4096
    assert all(a[1] == b[0] for a, b in zip(cols, cols[1:]))
    assert all(lo % blas.BLOCK_ALIGN == 0 for lo, _ in cols)
    tall = blas._blocks(4096, 50, 500, 1, 2)
    assert len(tall) == 2 and all(c == (0, 50) for _, c in tall) and tall[-1][0][1] == 4096
    assert blas._blocks(20, 576, 25, 64, 2) == (((0, 20), (0, 576)),)     # per image: whole


def test_the_partition_is_recorded_and_restored():
    saved = blas.partition()
    try:
        blas.set_partition(3)
        assert blas.partition() == 3
    finally:
        blas.set_partition(saved)


@needs_lib
@pytest.mark.parametrize("accumulate", [False, True])
@pytest.mark.parametrize("shape", [(50, 500, 4096), (4096, 500, 50), (64, 800, 500),
                                   (3, 20, 25, 576), (20, 4096, 25), (33, 70, 41)])
def test_bits_do_not_depend_on_the_thread_count(shape, accumulate):
    """The reason for caffe8's own blocks: OpenBLAS's threading gives other bits on 1 and 2
    threads (50 x 500 x 4096 on an AVX-512 core), which broke resume beside a busy process.
    Every worker count gives the same bits, within rounding of the float64 reference, for
    plain, transposed, batched and accumulating products."""
    rng = numpy.random.default_rng(11)
    *batch, m, k, n = shape
    a = rng.standard_normal((*batch, m, k)).astype(numpy.float32)
    b = rng.standard_normal((k, n)).astype(numpy.float32).T.copy().T   # a transposed layout
    start = rng.standard_normal((*batch, m, n)).astype(numpy.float32)
    results = []
    saved = blas.threads()
    try:
        for workers in (1, 2, 3):
            blas.set_num_threads(workers)
            out = start.copy()
            blas.matmul(a, b, out=out, accumulate=accumulate)
            results.append(out)
    finally:
        blas.set_num_threads(saved)
    assert all(numpy.array_equal(results[0], r) for r in results[1:])
    ref = reference(a, b) + (start if accumulate else 0)
    numpy.testing.assert_allclose(results[0], ref, rtol=0, atol=tolerance(a, b, numpy.float32) + 1e-5)


@needs_lib
@pytest.mark.parametrize("accumulate", [False, True])
@pytest.mark.parametrize("shape", [(10, 4, 40), (64, 800, 500), (3, 20, 25, 576), (2, 9, 7, 5)])
def test_a_kept_plan_gives_the_bits_of_a_fresh_one_on_new_arrays(shape, accumulate):
    """A product's plan (layout, blocks) is kept per shapes and strides and reused with other
    arrays of the same layout: each product over several changing inputs, in new arrays and
    in place, has the bits of the same product planned afresh."""
    rng = numpy.random.default_rng(len(shape))
    *batch, m, k, n = shape
    outs = numpy.zeros((2, *batch, m, n), numpy.float32)
    for step in range(4):
        a = rng.standard_normal((*batch, m, k)).astype(numpy.float32)
        b = rng.standard_normal((n, k)).astype(numpy.float32).T         # a transposed view
        start = rng.standard_normal((*batch, m, n)).astype(numpy.float32)
        results = []
        for fresh in (False, True):
            if fresh:
                blas._plans.clear()
            out = outs[int(fresh)]                   # the same output array every step
            out[...] = start
            blas.matmul(a, b, out=out, accumulate=accumulate)
            results.append(out.tobytes())
        assert results[0] == results[1]
        assert len(blas._plans) >= 1
