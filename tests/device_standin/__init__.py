"""A stand-in device for CI: the part of CuPy that caffe8's device-only control flow uses, on the
host, so that the GPU path's exchange, its CUDA-IPC arena and caffe8.ddp's CUDA hook run under
``mpiexec`` in the ordinary CPU suite. A test double, not a second GPU backend: it lives under
tests/, and nothing in the product imports it.

What it models, and how strictly:

* **device memory** (memory.py): arrays whose ``data.ptr`` are addresses; ``cupy.cuda.Memory``
  (cudaMalloc) as a named shared-memory file, so that ``ipcGetMemHandle`` /
  ``ipcOpenMemHandle`` share it between the processes of a node; pinned and registered host
  memory; GPUs by PCI bus id, with or without peer access between them (devices.py);
* **streams and events** (ordering.py): every operation runs at once, and is placed in CUDA's
  order (stream order, ``wait_event``, host synchronisation, the legacy default stream's
  implicit synchronisation, another process's host synchronisation before an MPI barrier).
  Each region records who wrote and who read its bytes while the accesses are in flight, and
  an access that nothing orders after a conflicting one raises :class:`UnorderedAccess` naming
  both; a copy into host memory lands only when the host learns it is complete (0xFF until
  then), so a host that reads too early reads garbage;
* **copies** (runtime.py): ``memcpyAsync`` / ``memcpy`` / ``memset`` with CUDA's kinds, checked
  against where the pointers lie;
* **kernels** (kernels.py): ``ElementwiseKernel`` compiles the kernel's own CUDA text as C on the
  host, so the sums and conversions are the GPU path's arithmetic, bit for bit; CuPy's built-in
  operations (ufuncs, reductions, indexing) are NumPy's on device arrays (arrays.py), which a
  device array never leaves by itself (``numpy.asarray`` of one raises, as on CuPy).

What it does not model: CUDA's ``-ftz`` in CuPy's own float32 operations, timing, memory
limits, several GPUs' null streams, and races between the threads of one process (the host is
one: a synchronisation on one thread orders every later launch).

Use: ``install()`` before anything imports caffe8 (the rank programs), or
``install(monkeypatch)`` in a test (undone at its end); then ``backend.use_gpu(0)`` as on a GPU.
tests/comm/conftest.py's ``device`` fixture gives the real GPU where there is one, else this.
"""
import sys
import types

import numpy

from tests.device_standin import arrays, cuda, devices, kernels, memory, ordering, runtime
from tests.device_standin.ordering import UnorderedAccess  # noqa: F401

_MODULES = {}
#: CuPy's GEMM compute type per dtype, as caffe8's backend sets it (cupy._core._routines_linalg)
COMPUTE_TYPES = {}
#: the seeds ``cupy.random.seed`` was given (caffe8 draws device numbers with its own kernel)
SEEDS = []


def _namespace(name, doc, **attrs):
    mod = types.ModuleType(name, doc)
    mod.__dict__.update(attrs)
    return mod


def modules():
    """{module name: module} of the stand-in ``cupy`` and the submodules caffe8 imports."""
    if _MODULES:
        return _MODULES
    memory_mod = _namespace("cupy.cuda.memory", "cupy.cuda.memory of the stand-in",
                            **{k: v for k, v in vars(cuda.memory).items()
                               if not k.startswith("__")})
    cuda_mod = _namespace("cupy.cuda", cuda.__doc__,
                          **{k: v for k, v in vars(cuda).items()
                             if not k.startswith("_") and k != "memory"})
    cuda_mod.runtime, cuda_mod.memory = runtime, memory_mod
    linalg = _namespace("cupy._core._routines_linalg", "GEMM compute types",
                        set_compute_type=lambda dtype, code:
                        COMPUTE_TYPES.__setitem__(numpy.dtype(dtype), code))
    core = _namespace("cupy._core", "cupy._core of the stand-in", _routines_linalg=linalg)
    random = _namespace("cupy.random", "cupy.random of the stand-in", seed=SEEDS.append)
    cp = _namespace("cupy", __doc__, __version__="14.0.0+standin", __standin__=True, cuda=cuda_mod,
                    _core=core, random=random, ElementwiseKernel=kernels.ElementwiseKernel,
                    __getattr__=arrays.numpy_function)
    for name in ("ndarray", "empty", "zeros", "ones", "full", "empty_like", "zeros_like",
                 "ones_like", "full_like", "asarray", "array", "ascontiguousarray", "arange",
                 "asnumpy", "get_array_module", "from_dlpack"):
        setattr(cp, name, getattr(arrays, name))
    _MODULES.update({"cupy": cp, "cupy.cuda": cuda_mod, "cupy.cuda.runtime": runtime,
                     "cupy.cuda.memory": memory_mod, "cupy._core": core,
                     "cupy._core._routines_linalg": linalg, "cupy.random": random})
    return _MODULES


def module():
    """The stand-in ``cupy`` module."""
    return modules()["cupy"]


def install(monkeypatch=None):
    """Make ``import cupy`` give the stand-in, and caffe8's array backend (when already
    imported) use it; with pytest's ``monkeypatch``, undone at the end of the test. Returns
    the module."""
    setitem = monkeypatch.setitem if monkeypatch is not None else \
        (lambda d, k, v: d.__setitem__(k, v))
    setattr_ = monkeypatch.setattr if monkeypatch is not None else setattr
    for name, mod in modules().items():
        setitem(sys.modules, name, mod)
    backend = sys.modules.get("caffe8.engine.backend")
    if backend is not None:
        setattr_(backend, "cupy", module())
        setattr_(backend, "_cupy_ok", True)
    return module()


memory.remove_stale_segments()
__all__ = ["install", "module", "modules", "devices", "memory", "ordering", "runtime",
           "UnorderedAccess", "COMPUTE_TYPES", "SEEDS"]
