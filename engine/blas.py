"""caffe8's CPU GEMM: an OpenBLAS of its own, from the ``scipy-openblas32`` wheel, via ctypes.

Every matrix product of the layers (convolution, inner product, the recurrent layers) on host
arrays goes through :func:`matmul`, which calls ``cblas_sgemm`` / ``cblas_dgemm`` of this library
once per 2-D product (per image and group for batched operands); anything it cannot hand to
BLAS as it is (other dtypes, 1-D operands, negative or odd strides, an output that overlaps an
input) goes to ``numpy.matmul``, which gives the same result.

Why a second OpenBLAS rather than the one NumPy links: OpenBLAS picks its kernels for the CPU
when the library loads, unless ``OPENBLAS_CORETYPE`` names a core. Shared machines set that
variable to keep NumPy's results the same across a fleet of mixed CPUs; on an AVX-512 CPU
pinned to ``Haswell`` NumPy's SGEMM then runs at half the hardware's rate (2 Zen 5 cores:
210 against 380 GFLOP/s on a 2048³ product, 200 against 310 on CaffeNet's conv2 shape), and
CaffeNet's forward+backward is ~95 % GEMM. caffe8's instance chooses its kernels for the CPU it
runs on, as PyTorch does; ``CAFFE8_OPENBLAS_CORETYPE`` pins it (same names as OpenBLAS's
variable), and ``CAFFE8_BLAS=numpy`` makes every product use NumPy's BLAS instead. The thread
count follows ``OPENBLAS_NUM_THREADS`` like NumPy's (the CLI sets it once per process from the
MPI-local rank count and the cores the process may use), as an upper bound: between iterations
:func:`adapt_threads` lowers it while other processes keep cores busy (``engine.cpu_share``;
``CAFFE8_ADAPT_THREADS=0`` keeps it fixed). The two libraries each keep a pool of threads that spin for a while
after a call, so the layers route *all* their products here: mixing the two in one loop costs
40 % (measured: alternating 2048³ products ran at 150 instead of 380 GFLOP/s).

The library's GEMM numerics are OpenBLAS's: float32 products accumulate in float32, as Caffe's
``caffe_cpu_gemm`` does on its OpenBLAS build; results differ from NumPy's by float32 rounding.

**The bits do not depend on the thread count.** OpenBLAS's own threading splits a product by
the thread count, and its edge kernels round differently (a 50 x 500 x 4096 product differs
between 1 and 2 threads), so a run whose count adapted to a busy neighbour would not resume bit
for bit. caffe8 therefore runs OpenBLAS on one thread and splits each product itself into
blocks chosen from the shapes and the run's *partition* (:func:`_blocks`: per image of a batched
product, else along the output's longer side in aligned pieces), a count fixed when the run
starts — its thread limit — and recorded in its snapshots, so that a resumed run splits alike
(:func:`set_partition`). ``threads()`` workers, which follow the free cores between iterations,
take the blocks from a shared counter: threads of a C pool, the whole product one ctypes call
(``engine.gemm_pool``; Python threads where that library is missing): any worker count gives
the same bits. Few, large blocks: OpenBLAS packs each block's operands again, so 16 blocks of LeNet's
conv2 cost 33 % more than one product.
"""
import contextlib
import ctypes
import functools
import importlib.util
import os
import threading

import numpy

from caffe8.engine import cpu_share, gemm_pool
from caffe8.engine.native import address

BLAS_ENV = "CAFFE8_BLAS"                   # "openblas" (default) or "numpy"
CORETYPE_ENV = "CAFFE8_OPENBLAS_CORETYPE"  # pins caffe8's OpenBLAS (e.g. Haswell, SkylakeX)

_ROW_MAJOR, _NO_TRANS, _TRANS = 101, 111, 112
#: a product whose output has at most this many elements is one block: split over the output,
#: a small output over a long inner dimension (a convolution's weight gradient summed over the
#: batch: LeNet's conv1, 20 x 25 over 36,864 positions) gives pieces that each do too little
SINGLE_THREAD_OUTPUT = 1024
#: multiply-adds per block at least (~0.015 ms on one core): smaller products are one block
BLOCK_WORK = 1 << 18
#: block edges along the split side are multiples of this (whole micro-kernel tiles)
BLOCK_ALIGN = 16
_lock = threading.Lock()
_state = None     # (library, {dtype: gemm function}) once loaded; (None, reason) when not


@contextlib.contextmanager
def _coretype_for_load():
    """OPENBLAS_CORETYPE as caffe8's library should see it while its constructor runs: unset
    (OpenBLAS detects the CPU) unless CAFFE8_OPENBLAS_CORETYPE asks for a core."""
    saved = os.environ.get("OPENBLAS_CORETYPE")
    wanted = os.environ.get(CORETYPE_ENV)
    if wanted:
        os.environ["OPENBLAS_CORETYPE"] = wanted
    else:
        os.environ.pop("OPENBLAS_CORETYPE", None)
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("OPENBLAS_CORETYPE", None)
        else:
            os.environ["OPENBLAS_CORETYPE"] = saved


def _library_path():
    """Path of the wheel's shared library, found without importing the package (its
    ``__init__`` loads the library itself, under whatever OPENBLAS_CORETYPE is set)."""
    spec = importlib.util.find_spec("scipy_openblas32")
    if spec is None or not spec.origin:
        return None
    libdir = os.path.join(os.path.dirname(spec.origin), "lib")
    try:
        names = sorted(f for f in os.listdir(libdir) if f.startswith("libscipy_openblas")
                       and (f.endswith(".so") or ".so." in f or f.endswith(".dylib")))
    except OSError:
        return None
    return os.path.join(libdir, names[0]) if names else None


def _bind(lib):
    c_int, vp = ctypes.c_int, ctypes.c_void_p
    funcs = {}
    for dtype, name, scalar in ((numpy.float32, "scipy_cblas_sgemm", ctypes.c_float),
                                (numpy.float64, "scipy_cblas_dgemm", ctypes.c_double)):
        f = getattr(lib, name)
        f.argtypes = [c_int, c_int, c_int, c_int, c_int, c_int, scalar, vp, c_int, vp, c_int,
                      scalar, vp, c_int]
        f.restype = None
        funcs[numpy.dtype(dtype)] = f
    lib.scipy_openblas_get_corename.restype = ctypes.c_char_p
    lib.scipy_openblas_get_config.restype = ctypes.c_char_p
    return funcs


def _load():
    global _state
    if _state is not None:          # every product asks: no lock once loaded
        return _state
    with _lock:
        if _state is not None:
            return _state
        if os.environ.get(BLAS_ENV, "openblas").strip().lower() == "numpy":
            _state = (None, f"{BLAS_ENV}=numpy")
            return _state
        path = _library_path()
        if path is None:
            _state = (None, "the scipy-openblas32 package is not installed")
            return _state
        try:
            with _coretype_for_load():
                lib = ctypes.CDLL(path)
            _state = (lib, _bind(lib))
        except (OSError, AttributeError) as exc:
            _state = (None, f"{os.path.basename(path)} did not load ({exc})")
        return _state


def available():
    """True when caffe8's OpenBLAS is loaded (else every product goes to numpy.matmul)."""
    return _load()[0] is not None


def describe():
    """One line for the log: which GEMM the layers use on the host, its core and threads."""
    lib, info = _load()
    if lib is None:
        return f"host GEMM: NumPy's BLAS ({info})"
    core = lib.scipy_openblas_get_corename().decode()
    version = lib.scipy_openblas_get_config().decode().split()[1]
    threads = _thread_limit()
    plural = "s" if threads != 1 else ""
    adapt = ", fewer while other processes keep cores busy" if cpu_share.adaptive() else ""
    return (f"host GEMM: caffe8's OpenBLAS {version} ({core} kernels, up to {threads} "
            f"thread{plural}{adapt})")


_limit = None     # the most workers: OPENBLAS_NUM_THREADS as loaded, within the usable cores
_partition = None  # blocks a product is split into: the limit when the run started, or restored
_threads = None   # workers for the next products (adapt_threads / set_num_threads)
_budget = None    # cpu_share.ThreadBudget once adapt_threads() first runs; False: fixed count


def _thread_limit():
    """Workers at most: the threads caffe8's OpenBLAS loaded with (the user's or the CLI's
    OPENBLAS_NUM_THREADS, else one per core) and the cores this process may use. OpenBLAS
    itself is set to one thread (the blocks are caffe8's)."""
    global _limit, _threads
    if _limit is None:
        lib = _load()[0]
        loaded = lib.scipy_openblas_get_num_threads() if lib is not None else 1
        _limit = max(1, min(loaded, cpu_share.usable_cores()))
        if lib is not None:
            lib.scipy_openblas_set_num_threads(1)
        if _threads is None:
            _threads = _limit
    return _limit


def threads():
    """Workers the next products run on."""
    _thread_limit()
    return _threads


def partition():
    """How many pieces a product is split into (with the shapes, what decides the bits): the
    thread limit when first asked, unless a resumed run set it (:func:`set_partition`)."""
    global _partition
    if _partition is None:
        _partition = _thread_limit()
    return _partition


def set_partition(n):
    """Split products as a run whose snapshot recorded ``n`` did (its bits, whatever the cores)."""
    global _partition
    _partition = max(1, int(n))


def set_num_threads(n):
    """Workers for the host products (at least 1); they change the speed, never the bits."""
    global _threads, _limit
    _thread_limit()
    _threads = max(1, int(n))
    _limit = max(_limit, _threads)


def adapt_threads():
    """Between iterations: size the workers to the cores free now (engine.cpu_share), so that
    a busy neighbour costs its share of the cores, not a stalled product. Cheap when called
    every iteration (it re-measures twice a second)."""
    global _budget, _threads
    if _load()[0] is None:
        return
    if _budget is None:
        limit = _thread_limit()
        _budget = cpu_share.ThreadBudget(limit) if cpu_share.adaptive() else False
    if _budget:
        _threads = _budget.poll()


def _split(length, pieces):
    """``pieces`` ranges covering ``range(length)``, edges on multiples of BLOCK_ALIGN."""
    step = -(-length // pieces)
    step = -(-step // BLOCK_ALIGN) * BLOCK_ALIGN
    return [(lo, min(lo + step, length)) for lo in range(0, length, step)]


@functools.lru_cache(maxsize=4096)
def _blocks(m, n, k, items=1, pieces_wanted=None):
    """The (rows, cols) output ranges each of ``items`` 2-D products is computed in: a function
    of the shape and the partition (``pieces_wanted``, :func:`partition` by default) only,
    never of the worker count. Batched products are
    split by item first; an item is split (along its output's longer side, in pieces aligned to
    BLOCK_ALIGN) only while there are fewer items than the partition and it holds work enough."""
    whole = (((0, m), (0, n)),)
    wanted = -(-(pieces_wanted or partition()) // items)
    pieces = min(wanted, (m * n * k) // BLOCK_WORK)
    if m * n <= SINGLE_THREAD_OUTPUT or pieces < 2:
        return whole
    if n >= m:
        return tuple(((0, m), cols) for cols in _split(n, pieces))
    return tuple((rows, (0, n)) for rows in _split(m, pieces))


def _operand(x):
    """(trans, leading dimension) for BLAS row-major, or None when ``x``'s layout cannot go
    to BLAS as it is. ``x`` is 2-D (r, c): row-major with unit column stride, or the transpose
    of a row-major (c, r) matrix (unit row stride)."""
    item = x.itemsize
    r, c = x.shape
    s0, s1 = x.strides
    if s0 % item or s1 % item:
        return None
    s0, s1 = s0 // item, s1 // item
    if (s1 == 1 or c == 1) and (r == 1 or s0 >= max(1, c)):
        return _NO_TRANS, (s0 if r > 1 else max(1, c))
    if (s0 == 1 or r == 1) and (c == 1 or s1 >= max(1, r)):
        return _TRANS, (s1 if c > 1 else max(1, r))
    return None


def _gemm_args(a, b, c):
    """The layout arguments of one 2-D product, or None if any operand needs a copy."""
    la, lb = _operand(a), _operand(b)
    m, n = c.shape
    if la is None or lb is None:
        return None
    s0, s1 = c.strides
    item = c.itemsize
    if s0 % item or s1 % item:
        return None
    s0, s1 = s0 // item, s1 // item
    if not ((s1 == 1 or n == 1) and (m == 1 or s0 >= n)):
        return None
    return la, lb, (s0 if m > 1 else max(1, n))


def matmul(a, b, out=None, accumulate=False):
    """``numpy.matmul(a, b, out=out)``; with ``accumulate``, ``out += a @ b`` (``out`` required).

    Host float32/float64 operands of at least two axes go to caffe8's OpenBLAS (broadcast
    batch axes: one GEMM per 2-D product; accumulation through BLAS's beta = 1, as Caffe
    accumulates weight gradients); everything else to NumPy. How a product of given shapes,
    strides and dtype runs (its layout arguments and blocks, :class:`_Plan`) is worked out once
    and kept: a small net's products cost little more than the GEMM call itself.
    """
    if accumulate and out is None:
        raise ValueError("matmul(accumulate=True) needs out")
    state = _state if _state is not None else _load()
    if out is None or state[0] is None or type(a) is not numpy.ndarray or \
            type(b) is not numpy.ndarray or type(out) is not numpy.ndarray:
        return _matmul_new_out(state, a, b, out, accumulate)
    key = (a.dtype, b.dtype, out.dtype, accumulate, partition(), a.shape, a.strides, b.shape,
           b.strides, out.shape, out.strides)
    plan = _plans.get(key, _UNPLANNED)
    if plan is _UNPLANNED:
        if len(_plans) >= _MAX_PLANS:       # shapes that keep changing: start again
            _plans.clear()
        plan = _plans[key] = _plan(state, a, b, out, accumulate)
    if plan is None or not out.flags.writeable or numpy.may_share_memory(out, a) or \
            numpy.may_share_memory(out, b):
        return _numpy_matmul(a, b, out, accumulate)
    plan.run(address(a), address(b), address(out))
    return out


def _matmul_new_out(state, a, b, out, accumulate):
    """matmul without a given ``out`` (or of arrays BLAS cannot take): the output made here."""
    if out is not None or not _eligible(state, a, b, out):
        return _numpy_matmul(a, b, out, accumulate)
    try:
        batch = numpy.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    except ValueError:
        return _numpy_matmul(a, b, out, accumulate)     # NumPy raises its own error
    out = numpy.empty(batch + (a.shape[-2], b.shape[-1]), a.dtype)
    return matmul(a, b, out, accumulate)


_UNPLANNED = object()
#: (dtypes, accumulate, partition, shapes and strides of a, b, out) -> _Plan, or None: NumPy's
_plans = {}
_MAX_PLANS = 4096


class _Plan:
    """One product's GEMM calls for operands of fixed shapes and strides: the layout arguments
    and each block's byte offsets from the three base pointers (``blocks``: rows, cols, offset
    in a, in b, in out), also as the int64 array the C pool reads (``engine.gemm_pool``)."""

    def __init__(self, gemm, layout, m, n, k, beta, blocks, dtype):
        self.gemm, self.m, self.n, self.k, self.beta = gemm, m, n, k, beta
        (self.ta, self.lda), (self.tb, self.ldb), self.ldc = layout
        self.blocks = blocks
        self.single = len(blocks) == 1 and blocks[0][2:] == (0, 0, 0)
        self.array = numpy.array([0 if dtype == numpy.float32 else 1, self.ta, self.tb, k,
                                  self.lda, self.ldb, self.ldc, int(beta), len(blocks)]
                                 + [v for block in blocks for v in block], dtype=numpy.int64)
        self.address = address(self.array)
        self.gemm_address = gemm_pool.function_address(gemm)

    def run(self, pa, pb, pc):
        pool = gemm_pool.call()
        if pool is not None:
            pool(self.gemm_address, self.address, pa, pb, pc,
                 1 if self.single else threads())
            return
        if self.single:                 # one call, as a plain product
            self.gemm(_ROW_MAJOR, self.ta, self.tb, self.m, self.n, self.k, 1.0, pa, self.lda,
                      pb, self.ldb, self.beta, pc, self.ldc)
            return
        args = (_ROW_MAJOR, self.ta, self.tb)
        gemm_pool.run_blocks(self.gemm, [args + (mi, ni, self.k, 1.0, pa + oa, self.lda,
                                                 pb + ob, self.ldb, self.beta, pc + oc,
                                                 self.ldc)
                                         for mi, ni, oa, ob, oc in self.blocks], threads())


def _plan(state, a, b, out, accumulate):
    """The :class:`_Plan` of ``out (+)= a @ b`` for these shapes and strides, or None when the
    product goes to NumPy (another dtype, a layout BLAS cannot take, a shape NumPy rejects)."""
    if not _eligible(state, a, b, out):
        return None
    m, k = a.shape[-2:]
    n = b.shape[-1]
    try:
        batch = numpy.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    except ValueError:
        return None
    if out.shape != batch + (m, n):
        return None
    if m == 0 or n == 0 or k == 0:      # NumPy's result (nothing, or zeros) is BLAS's
        return None
    a_b = numpy.broadcast_to(a, batch + (m, k))
    b_b = numpy.broadcast_to(b, batch + (k, n))
    first = (0,) * len(batch)
    # every 2-D slice of a batch operand has the same layout: check it once, then step the
    # data pointers by the batch strides (broadcast axes have stride 0)
    layout = _gemm_args(a_b[first], b_b[first], out[first])
    if layout is None:
        return None
    sa, sb, sc = (x.strides[-2:] for x in (a_b, b_b, out))
    steps = [x.strides[:-2] for x in (a_b, b_b, out)]
    items = 1
    for d in batch:
        items *= d
    blocks = []
    for i in numpy.ndindex(*batch):
        oa, ob, oc = (sum(j * st for j, st in zip(i, st_)) for st_ in steps)
        for (r0, r1), (c0, c1) in _blocks(m, n, k, items, partition()):
            # rows r0:r1 of a, columns c0:c1 of b, that block of the output
            blocks.append((r1 - r0, c1 - c0, oa + r0 * sa[0], ob + c0 * sb[1],
                           oc + r0 * sc[0] + c0 * sc[1]))
    return _Plan(state[1][a.dtype], layout, m, n, k, 1.0 if accumulate else 0.0, tuple(blocks),
                 a.dtype)


def _eligible(state, a, b, out):
    if state[0] is None:
        return False
    if type(a) is not numpy.ndarray or type(b) is not numpy.ndarray:
        return False
    if a.ndim < 2 or b.ndim < 2 or a.dtype != b.dtype or a.dtype not in state[1]:
        return False
    if a.shape[-1] != b.shape[-2]:
        return False
    if out is not None and (type(out) is not numpy.ndarray or out.dtype != a.dtype or
                            not out.flags.writeable):
        return False
    return True


def _numpy_matmul(a, b, out, accumulate):
    if accumulate:
        out += numpy.matmul(a, b)
        return out
    return numpy.matmul(a, b, out=out)
