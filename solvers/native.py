"""C kernels of the solvers (solvers/csrc/solver_kernels.c) through ctypes, for NumPy arrays.

Each wrapper returns True (or the answer) when it ran and None/False when the caller must take
its NumPy (or CuPy) path: no compiled library, a CuPy array, a dtype other than float32/float64,
a non-contiguous array, or ``CAFFE8_SOLVER_KERNELS=numpy`` in the environment
(``use_native(False)`` does the same at run time, e.g. to test both paths). The kernels do the
NumPy sequence's float operations in its order, so both paths give the same bits. The library
is found, built and bound by ``engine.native.Kernels``: setup.py's ``solvers._solver_kernels``,
else a build cached under ~/.cache/caffe8.
"""
import ctypes
import os

import numpy

from caffe8.engine.native import Kernels, address

_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "csrc", "solver_kernels.c")
_ABI_VERSION = 2                          # must equal C8S_ABI_VERSION in solver_kernels.c
CFLAGS = ["-O3", "-std=c99", "-fno-trapping-math", "-ffp-contract=off"]    # as in setup.py


def _signatures(real):
    """(restype, argtypes) of every kernel, with ``real`` the ctypes scalar of the dtype."""
    vp = ctypes.c_void_p
    return {"sgd_momentum": (None, [vp] * 3 + [ctypes.c_ssize_t, real, real]),
            "sgd_update": (None, [vp] * 7 + [ctypes.c_ssize_t, ctypes.c_int, real, real]),
            "all_finite": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_ssize_t])}


_KERNELS = Kernels("solvers.native", _SOURCE, "_solver_kernels",
                   ("c8s_abi_version", _ABI_VERSION), "c8s_", _signatures,
                   "CAFFE8_SOLVER_KERNELS", [(CFLAGS, [])])
use_native = _KERNELS.use_native


def sgd_momentum(w, g, h, rate, momentum):
    """h = momentum*h + rate*g; g = h; w -= g, in place, in one pass. False: not run."""
    return w.shape == g.shape == h.shape and \
        _KERNELS.run("sgd_momentum", (w, g, h), w, g, h, w.size, rate, momentum)


def sgd_update(w, g, h, starts, counts, rates, decays, inv_size, momentum):
    """Plain momentum SGD's whole update of several params in one pass each (the C kernel's
    comment): ``w``, ``g``, ``h`` the flat data, diff and history buffers, param j being
    ``starts[j]`` .. + ``counts[j]`` (int64 arrays), with rate ``rates[j]`` and L2 decay
    ``decays[j]`` (arrays of the dtype; 0: none); ``inv_size``: 1/iter_size in the dtype, or
    None when iter_size is 1. False: not run (the caller takes its per-param path)."""
    fn = _KERNELS.kernel("sgd_update", w, g, h, rates, decays)
    if fn is None or starts.dtype != numpy.int64 or counts.dtype != numpy.int64:
        return False
    fn(address(w), address(g), address(h), address(starts), address(counts), address(rates),
       address(decays), len(starts), inv_size is not None,
       1 if inv_size is None else inv_size, momentum)
    return True


def all_finite(x):
    """True/False: every element finite; None when the C path does not apply."""
    fn = _KERNELS.kernel("all_finite", x)
    return None if fn is None else bool(fn(address(x), x.size))
