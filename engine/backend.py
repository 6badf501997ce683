"""The array backend: ``xp`` is numpy or cupy.

This is the only module that imports cupy. Everything else calls ``get_array_module(x)`` or uses
``backend.xp`` (the module chosen by ``use_gpu``), so CPU and GPU share one body of array code.

TensorFloat-32: off unless asked for. Caffe's numerics are IEEE fp32 throughout, and TF32 keeps
only 10 mantissa bits in the products of GEMMs and convolutions, so it is an explicit opt-in:
``set_tf32(True)`` (the CLI's ``--tf32``) or the environment variable ``CAFFE8_TF32=1`` read at
import. It switches CuPy's float32 GEMMs (cuBLAS) to the TF32 compute type and the cuDNN
convolutions to tensor-op math; ``tf32_enabled()`` is what the cuDNN layer code reads. On the
CPU it changes nothing (NumPy has no TF32 path) and says so.
"""
import functools
import os

import numpy

from caffe8.engine import blas

try:  # CuPy is optional: CPU-only machines never need it.
    import cupy  # noqa: F401
    _cupy_ok = True
except Exception:  # ImportError, or a CUDA runtime that fails to load
    cupy = None
    _cupy_ok = False

xp = numpy
_device_id = None


def gpu_available():
    """True when CuPy imports and at least one CUDA device is visible."""
    if not _cupy_ok:
        return False
    try:
        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


def use_gpu(device_id=0):
    """Switch the default backend to CuPy on ``device_id``."""
    global xp, _device_id
    if not gpu_available():
        raise RuntimeError("GPU requested but CuPy or a CUDA device is not available")
    cupy.cuda.Device(device_id).use()
    xp = cupy
    _device_id = device_id
    _apply_tf32()


def use_cpu():
    """Switch the default backend back to NumPy."""
    global xp, _device_id
    xp = numpy
    _device_id = None


def on_gpu():
    return xp is not numpy


def get_array_module(*arrays):
    """numpy or cupy, whichever owns the arrays (numpy for plain Python values)."""
    if _cupy_ok:
        return cupy.get_array_module(*arrays)
    return numpy


def matmul(a, b, out=None, accumulate=False):
    """``a @ b`` into ``out`` (``out += a @ b`` with ``accumulate``) where the arrays live: on the
    host through caffe8's OpenBLAS (``engine.blas``), on a GPU through CuPy (cuBLAS)."""
    if _cupy_ok and isinstance(a, cupy.ndarray):
        if not accumulate:
            return cupy.matmul(a, b, out=out)
        if a.ndim == b.ndim == out.ndim == 2 and a.dtype == b.dtype == out.dtype and \
                a.dtype in (numpy.float32, numpy.float64) and \
                (out.flags.c_contiguous or out.flags.f_contiguous):
            return _gemm_accumulate(a, b, out)
        out += cupy.matmul(a, b)
        return out
    return blas.matmul(a, b, out, accumulate)


_CUBLAS_DEFAULT_MATH, _CUBLAS_TF32_TENSOR_OP_MATH = 0, 3     # cublasMath_t


def _gemm_accumulate(a, b, out):
    """``out += a @ b`` as one cuBLAS GEMM with beta = 1 (no temporary product), in the math
    ``set_tf32`` chose (the handle's math mode, restored after)."""
    import cupy.cublas        # a submodule that ``import cupy`` does not load
    from cupy_backends.cuda.libs import cublas as libcublas
    handle = cupy.cuda.device.get_cublas_handle()
    mode = libcublas.getMathMode(handle)
    tf32 = _tf32 and a.dtype == numpy.float32
    libcublas.setMathMode(handle, _CUBLAS_TF32_TENSOR_OP_MATH if tf32 else _CUBLAS_DEFAULT_MATH)
    try:
        return cupy.cublas.gemm("N", "N", a, b, out=out, alpha=1.0, beta=1.0)
    finally:
        libcublas.setMathMode(handle, mode)


def to_numpy(a):
    """Host copy (or the array itself when it already lives on the host)."""
    if _cupy_ok and isinstance(a, cupy.ndarray):
        return cupy.asnumpy(a)
    return numpy.asarray(a)


def to_device(a, like=None):
    """Move a host array to the module of ``like`` (or the current backend)."""
    mod = get_array_module(like) if like is not None else xp
    return mod.asarray(a)


# --- random numbers ---------------------------------------------------------------------------
# One generator per process, seeded by the solver (random_seed + rank, as Caffe does).
_rng = numpy.random.default_rng()


def seed(s):
    """Seed the host generator deterministically. It also keys the device's random numbers
    (``random_uniform``); CuPy's own generator (cuRAND) is never used, and never loaded."""
    global _rng
    _rng = numpy.random.default_rng(s)


def rng():
    """The process-wide host ``numpy.random.Generator``."""
    return _rng


def random_uniform(shape, dtype, module=None):
    """U[0,1) samples of ``shape`` on ``module`` (numpy by default), reproducible by ``seed``."""
    module = module or xp
    if module is numpy:
        return _rng.random(shape, dtype=numpy.float64).astype(dtype, copy=False)
    # Device samples keyed by the host generator: its saved state then also fixes the GPU
    # stream of random numbers, so a resumed run draws the same Dropout masks. A counter-based
    # generator (Philox4x64-10, NumPy's ``Philox`` stream for that key) in one kernel: no
    # generator state on the device to re-seed, and no host synchronisation (re-seeding
    # cuRAND's XORWOW per draw waited for the whole queue: 16 ms per Dropout in GoogLeNet).
    key = int(_rng.integers(0, 2**63 - 1))
    out = module.empty(shape, dtype=dtype)
    if out.dtype not in (numpy.float32, numpy.float64):
        raise TypeError(f"random_uniform: float32 or float64, not {out.dtype}")
    return elementwise_kernel(*UNIFORM_KERNEL_SPEC, "caffe8_uniform")(numpy.uint64(key), out)


#: (inputs, outputs, body) of the device uniform generator: element i is word i of NumPy's
#: ``Philox(key=key)`` stream (block i // 4 + 1, word i % 4; Salmon et al., "Parallel random
#: numbers: as easy as 1, 2, 3"), as float32 ``(word >> 40) * 2**-24`` or float64
#: ``(word >> 11) * 2**-53``. Kept as data: tests/engine compiles the same text as C.
UNIFORM_KERNEL_SPEC = ("uint64 key", "T y", """
    unsigned long long c0 = (unsigned long long)(i >> 2) + 1ull, c1 = 0ull, c2 = 0ull, c3 = 0ull;
    unsigned long long k0 = key, k1 = 0ull;
    for (int r = 0; r < 10; ++r) {
        const unsigned long long h0 = __umul64hi(0xD2E7470EE14C6C93ull, c0);
        const unsigned long long l0 = 0xD2E7470EE14C6C93ull * c0;
        const unsigned long long h1 = __umul64hi(0xCA5A826395121157ull, c2);
        const unsigned long long l1 = 0xCA5A826395121157ull * c2;
        c0 = h1 ^ c1 ^ k0;
        c1 = l1;
        c2 = h0 ^ c3 ^ k1;
        c3 = l0;
        k0 += 0x9E3779B97F4A7C15ull;
        k1 += 0xBB67AE8584CAA73Bull;
    }
    const int j = (int)(i & 3);
    const unsigned long long word = j == 0 ? c0 : j == 1 ? c1 : j == 2 ? c2 : c3;
    y = sizeof(y) == 4 ? (T)((double)(word >> 40) * 5.9604644775390625e-08)
                       : (T)((double)(word >> 11) * 1.1102230246251565e-16)""")


def bind_thread():
    """Make the calling thread use the process's GPU (CuPy's current device is per thread)."""
    if on_gpu():
        cupy.cuda.Device(_device_id).use()


def rng_state():
    """JSON-able state of the host generator (saved in solver snapshots for exact resume)."""
    return _rng.bit_generator.state


def set_rng_state(state):
    _rng.bit_generator.state = state


def host_buffer(n, dtype):
    """A zeroed host array of ``n`` elements: page-locked (pinned) when on the GPU, so device
    copies into it run at full speed and can be asynchronous; plain NumPy otherwise."""
    if on_gpu():
        itemsize = numpy.dtype(dtype).itemsize
        mem = cupy.cuda.alloc_pinned_memory(max(1, n * itemsize))
        out = numpy.frombuffer(mem, dtype, n)
        out[...] = 0
        return out
    return numpy.zeros(n, dtype)


def pin_host(array):
    """Page-lock an existing host array (e.g. a shared mapping) so asynchronous device copies
    into and out of it run as with ``host_buffer``'s pinned memory; returns the undo. A no-op
    on the CPU."""
    if not on_gpu() or array.nbytes == 0:
        return lambda: None
    ptr = array.__array_interface__["data"][0]
    cupy.cuda.runtime.hostRegister(ptr, array.nbytes, 0)
    return lambda: cupy.cuda.runtime.hostUnregister(ptr)


# --- one-time notes ---------------------------------------------------------------------------
# Layers have no logger of their own; a note (an engine fallback, a library that did not load)
# goes to the sink the CLI installs (its glog), else to stderr in glog format, once per text.
_note_sink = None
_notes_given = set()


def set_note_sink(fn):
    """Send one-time notes to ``fn(message)`` (e.g. the run's GLog); None restores stderr."""
    global _note_sink
    _note_sink = fn


def note_once(message):
    """Log ``message`` the first time it is given in this process; return True if it was logged."""
    if message in _notes_given:
        return False
    _notes_given.add(message)
    if _note_sink is not None:
        _note_sink(message)
    else:
        from caffe8.engine.glog import GLog
        GLog().info(message, _depth=3)
    return True


# --- TensorFloat-32 -----------------------------------------------------------------------------
TF32_ENV = "CAFFE8_TF32"
_tf32 = os.environ.get(TF32_ENV, "0").strip().lower() in ("1", "true", "yes", "on")

# CuPy's GEMM compute-type codes (``cupy._core._routines_linalg``): DEFAULT keeps fp32 math,
# TF32 selects CUBLAS_COMPUTE_32F_FAST_TF32 for float32 products.
_CUPY_COMPUTE_TYPE_DEFAULT = 1
_CUPY_COMPUTE_TYPE_TF32 = 7


def tf32_enabled():
    """True when TF32 math was asked for (by ``set_tf32`` or ``CAFFE8_TF32``)."""
    return _tf32


def set_tf32(enabled):
    """Allow (True) or forbid (False, the default) TF32 math for float32 GEMMs and convolutions.

    Returns the line to log. On the GPU the cuBLAS side applies at once (CuPy's float32 compute
    type); cuDNN convolutions read ``tf32_enabled()`` when they pick their math type, and the
    algorithm cache is keyed by it, so the next convolution follows. On the CPU this is a no-op.
    """
    global _tf32
    _tf32 = bool(enabled)
    if not on_gpu():
        return (f"TF32 {'requested' if _tf32 else 'disabled'}: no effect on the CPU "
                "(NumPy computes float32 in IEEE fp32)")
    _apply_tf32()
    if _tf32:
        return ("TF32 enabled: float32 GEMMs (cuBLAS) and cuDNN convolutions may round their "
                "inputs to 10 mantissa bits (faster on Ampere and newer; not Caffe's fp32 "
                "numerics)")
    return "TF32 disabled: float32 GEMMs and convolutions use full fp32 math"


def _apply_tf32():
    """Push the TF32 choice into CuPy's cuBLAS GEMM compute type for float32."""
    if not (_cupy_ok and on_gpu()):
        return
    from cupy._core import _routines_linalg
    code = _CUPY_COMPUTE_TYPE_TF32 if _tf32 else _CUPY_COMPUTE_TYPE_DEFAULT
    _routines_linalg.set_compute_type(numpy.float32, code)


# --- what the cuDNN binding needs from CuPy ----------------------------------------------------
def cuda_stream_ptr():
    """The raw ``cudaStream_t`` of CuPy's current stream on this thread (0: the legacy stream)."""
    return int(cupy.cuda.get_current_stream().ptr)


def cuda_device_id():
    """The CUDA device CuPy currently uses on this thread."""
    return int(cupy.cuda.runtime.getDevice())


def cuda_compute_capability():
    """(major, minor) of CuPy's current device, e.g. (9, 0) on an H100."""
    cc = str(cupy.cuda.Device().compute_capability)
    return int(cc[:-1]), int(cc[-1])


def cuda_runtime_major():
    """The CUDA major version of CuPy's runtime (12, 13, ...), or None without CuPy."""
    if not _cupy_ok:
        return None
    try:
        return int(cupy.cuda.runtime.runtimeGetVersion()) // 1000
    except cupy.cuda.runtime.CUDARuntimeError:
        return None


def is_out_of_memory(error):
    """True for CuPy's device out-of-memory error."""
    return _cupy_ok and isinstance(error, cupy.cuda.memory.OutOfMemoryError)


def device_workspace(nbytes):
    """A byte buffer of ``nbytes`` (at least 1) from CuPy's memory pool, ordered on the current
    stream, so a library's scratch space is recycled like any other array."""
    return cupy.empty(max(int(nbytes), 1), dtype=numpy.uint8)


def is_device_array(a):
    """True for a CuPy array."""
    return _cupy_ok and isinstance(a, cupy.ndarray)


@functools.lru_cache(maxsize=None)
def elementwise_kernel(in_params, out_params, operation, name, preamble=""):
    """The ``cupy.ElementwiseKernel`` of these arguments, made once per process (CuPy compiles it
    on first launch and caches the binary), so that layer and comm modules fuse a step's
    arithmetic into one launch without importing cupy or keeping kernel caches of their own."""
    return cupy.ElementwiseKernel(in_params, out_params, operation, name, preamble=preamble)
