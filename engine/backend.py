"""The array backend: ``xp`` is numpy or cupy.

This is the only module that imports cupy. Everything else calls ``get_array_module(x)`` or uses
``backend.xp`` (the module chosen by ``use_gpu``), so CPU and GPU share one body of array code.
"""
import numpy

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
    """Seed the host generator (and CuPy's, when present) deterministically."""
    global _rng
    _rng = numpy.random.default_rng(s)
    if _cupy_ok and gpu_available():
        cupy.random.seed(s)


def rng():
    """The process-wide host ``numpy.random.Generator``."""
    return _rng


def random_uniform(shape, dtype, module=None):
    """U[0,1) samples of ``shape`` on ``module`` (numpy by default), reproducible by ``seed``."""
    module = module or xp
    if module is numpy:
        return _rng.random(shape, dtype=numpy.float64).astype(dtype, copy=False)
    # Device samples seeded from the host generator: its saved state then also fixes the GPU
    # stream of random numbers, so a resumed run draws the same Dropout masks.
    seed = int(_rng.integers(0, 2**63 - 1))
    return module.random.RandomState(seed).random_sample(shape, dtype=dtype)


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
