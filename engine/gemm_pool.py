"""Where the host GEMM's blocks run: a pool of C threads (engine/csrc/gemm_pool.c), or Python
worker threads where that library is missing.

``engine.blas`` splits each product into blocks that depend on its shapes and the run's
partition only, and describes them once per shapes and strides in a *plan* (an int64 array, the
layout the C file's comment gives). :func:`run` hands the plan and the three base pointers to the
C pool in one ctypes call: the calling thread and ``workers`` - 1 pool threads take the blocks
from a shared counter, with no Python between blocks. Without the library (no C compiler at
install or first use, or ``use_pool(False)``), :func:`run_blocks` does the same with Python
threads, a ctypes call a block: the same GEMM calls on the same blocks, so the same bits (tests
compare the two over training steps). The library is found or built by ``engine.native``
(setup.py's ``caffe8.engine._gemm_pool``, else a build cached under ~/.cache/caffe8).
"""
import ctypes
import itertools
import os
import threading
import warnings

from caffe8.engine.native import load_library

_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "csrc", "gemm_pool.c")
_ABI_VERSION = 1                          # must equal C8B_ABI_VERSION in gemm_pool.c
CFLAGS = ["-O2", "-std=c99", "-pthread"]  # as in setup.py
LDFLAGS = ["-pthread"]
_state = {"loaded": False, "call": None, "enabled": True}


def _load():
    _state["loaded"] = True
    lib, where = load_library(_SOURCE, "_gemm_pool", "c8b_abi_version", _ABI_VERSION,
                              [(CFLAGS, LDFLAGS)])
    if lib is None:
        warnings.warn(f"engine.gemm_pool: no C thread pool ({where}); the host GEMM's blocks "
                      "run on Python threads", RuntimeWarning)
        return
    vp = ctypes.c_void_p
    lib.c8b_gemm.argtypes = [vp, vp, vp, vp, vp, ctypes.c_int]
    lib.c8b_gemm.restype = None
    lib.c8b_pool_threads.restype = ctypes.c_int
    _state["call"], _state["lib"] = lib.c8b_gemm, lib


def call():
    """The C pool's ``c8b_gemm(gemm, plan, a, b, c, workers)``, or None (Python workers)."""
    if not _state["loaded"]:
        _load()
    return _state["call"] if _state["enabled"] else None


def use_pool(flag):
    """Run blocks on the C pool (True, the default where it loads) or on Python threads (False,
    the reference path); returns the setting before."""
    before, _state["enabled"] = _state["enabled"], bool(flag)
    return before


def pool_threads():
    """Threads the C pool has started (0 without the library)."""
    call()
    lib = _state.get("lib")
    return lib.c8b_pool_threads() if lib is not None else 0


def function_address(fn):
    """The address of a ctypes function (what the pool calls)."""
    return ctypes.cast(fn, ctypes.c_void_p).value


class _Helper:
    """A Python GEMM worker thread: ``start(job)`` hands it a function, ``join()`` waits for
    it. Plain locks as the handoff (the cheapest wake-up CPython has; a Future costs ~0.1 ms a
    product)."""

    def __init__(self, index):
        self._go, self._done = threading.Lock(), threading.Lock()
        self._go.acquire()
        self._done.acquire()
        self._job = None
        threading.Thread(target=self._loop, name=f"caffe8-gemm-{index}", daemon=True).start()

    def _loop(self):
        while True:
            self._go.acquire()
            try:
                self._job()
            finally:
                self._done.release()

    def start(self, job):
        self._job = job
        self._go.release()

    def join(self):
        self._done.acquire()


_helpers = []


def run_blocks(gemm, blocks, workers):
    """Each block ``gemm(*args)`` once, on ``workers`` Python threads taking them in turn (the
    calling thread is one of them): the path without the C pool."""
    workers = min(workers, len(blocks))
    if workers <= 1:
        for args in blocks:
            gemm(*args)
        return
    while len(_helpers) < workers - 1:
        _helpers.append(_Helper(len(_helpers)))
    order = itertools.count()
    count = len(blocks)

    def work():
        i = next(order)
        while i < count:
            gemm(*blocks[i])
            i = next(order)
    for helper in _helpers[:workers - 1]:
        helper.start(work)
    work()
    for helper in _helpers[:workers - 1]:
        helper.join()
