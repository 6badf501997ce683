"""pycaffe's process-wide settings: CPU or GPU mode, the device, the random seed; the
multi-GPU names (solver count and rank, NCCL) mapped onto MPI; ``Timer``; what to install
where a GPU is asked for and none is usable (``no_gpu_message``)."""
import importlib.util
import os
import time

from caffe8.engine import backend
from caffe8.engine.errors import CaffeError

_device = 0
#: the mode pycaffe was put in ("CPU" or "GPU"); "GPU" without a usable GPU fails when a net
#: runs (``check_mode``), as BVLC's pycaffe fails in the first GPU call, not in set_mode_gpu
_mode = "CPU"

#: setup.cfg's extras that install GPU support from wheels (CuPy, the CUDA libraries caffe8 has it
#: load and cuDNN 9), by the CUDA major version, and the oldest NVIDIA driver of each (NVIDIA's
#: minimum for CUDA 13 and 12: 580 and 525; a newer driver runs an older CUDA too)
GPU_EXTRAS = (("cuda13", "580"), ("cuda12", "525"))


def _source_tree():
    """The folder of caffe8's setup.cfg when caffe8 runs from a source checkout, else None."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return root if os.path.isfile(os.path.join(root, "setup.cfg")) else None


def install_line(extra):
    """pip's command that adds GPU support (setup.cfg's extra ``extra``) to this caffe8: the
    checkout's folder for a source install, the package's name otherwise."""
    root = _source_tree()
    return f"pip install -e '{root}[{extra}]'" if root else f"pip install 'caffe8[{extra}]'"


def no_gpu_message(what):
    """None when a CUDA GPU is usable; else ``what`` followed by why not and the install line
    of each CUDA major version (the README's "On GPUs")."""
    if backend.gpu_available():
        return None
    if importlib.util.find_spec("cupy") is None:
        why = "CuPy is not installed"
    elif backend.cupy is None:
        why = "CuPy is installed but does not import (a CuPy built for another CUDA version?)"
    else:
        why = ("CuPy sees no CUDA device (no NVIDIA driver, a driver older than CuPy's CUDA, "
               "or CUDA_VISIBLE_DEVICES empty)")
    lines = " or ".join(f"`{install_line(extra)}` (NVIDIA driver {driver} or newer)"
                        for extra, driver in GPU_EXTRAS)
    return f"{what}: no CUDA GPU can be used: {why}. Install GPU support with {lines}"


def set_mode_cpu():
    """Nets built from now on keep their arrays in host memory (NumPy)."""
    global _mode
    _mode = "CPU"
    backend.use_cpu()


def set_mode_gpu():
    """Nets built from now on live on the GPU chosen by :func:`set_device` (CuPy). As BVLC's,
    this only sets the mode: without a usable GPU a net or solver fails when it runs
    (``check_mode``), with the line that installs GPU support."""
    global _mode
    _mode = "GPU"
    if backend.gpu_available():
        backend.use_gpu(_device)


def check_mode(what):
    """Raise ``CaffeError`` when pycaffe is in GPU mode and this process has no usable GPU
    (pycaffe's Net forward/backward and Solver step/solve call it before they run)."""
    message = None if _mode != "GPU" or backend.on_gpu() else \
        no_gpu_message(f"{what} in GPU mode (caffe8.set_mode_gpu())")
    if message:
        raise CaffeError(message)


def set_device(device_id):
    """The GPU used by :func:`set_mode_gpu` (and at once, when already in GPU mode)."""
    global _device
    _device = int(device_id)
    if backend.on_gpu():
        backend.use_gpu(_device)


def set_random_seed(seed):
    """Seed the generator fillers, Dropout and data shuffling draw from."""
    backend.seed(int(seed))


# --- solver_mode GPU without a GPU: one note, from the CLI and pycaffe alike --------------------
_noted = set()


def note_solver_mode(solver_mode, log):
    """Log once per process that a solver file asks for the GPU while this process runs on the
    CPU: no GPU / CuPy here, or (pycaffe, which as BVLC's takes its mode from
    :func:`set_mode_gpu` alone) a GPU that the script did not select. Returns the note, or None."""
    if solver_mode != "GPU" or backend.on_gpu() or _mode == "GPU":
        return None  # (GPU mode without a GPU fails when the solver runs: check_mode)
    if backend.gpu_available():
        note = ("solver_mode is GPU but pycaffe is in CPU mode (call caffe8.set_mode_gpu() "
                "before building the solver, as with BVLC's pycaffe); running on the CPU")
    else:
        note = "solver_mode is GPU but no CUDA GPU / CuPy is available; running on the CPU"
    if note in _noted:
        return None
    _noted.add(note)
    log(note)
    return note


# --- pycaffe's multi-GPU names, mapped onto MPI ---------------------------------------------------
def _world():
    from caffe8.wiring import make_world
    return make_world()


def solver_count():
    """The number of solvers training together: the MPI world size (1 without mpiexec)."""
    return _world().size


def solver_rank():
    """This process's solver: its MPI rank."""
    return _world().rank


def _check_mpi(what, value, actual, unit):
    if int(value) != actual:
        raise CaffeError(f"{what}({value}): caffe8 runs one solver per MPI process, so the "
                         f"{unit} is fixed by mpiexec ({actual} here); start the script as "
                         "`mpiexec -n P python script.py` (one process per GPU) instead of "
                         "spawning solvers")


def set_solver_count(count):
    """Accepted when it equals the MPI world size (BVLC's multi-GPU scripts set it)."""
    _check_mpi("set_solver_count", count, solver_count(), "solver count")


def set_solver_rank(rank):
    """Accepted when it equals the MPI rank."""
    _check_mpi("set_solver_rank", rank, solver_rank(), "solver rank")


def set_multiprocess(multiprocess):
    """Accepted, no effect: every caffe8 solver is its own MPI process already."""
    del multiprocess


def has_nccl():
    """False: caffe8 exchanges gradients over MPI (the solver file's ``comm``), not NCCL."""
    return False


class NCCL:
    """pycaffe's ``caffe.NCCL(solver, uid)``, a no-op: under ``mpiexec`` every caffe8 solver
    already starts from rank 0's weights and sums its gradients with the others' (the solver's
    ``comm`` exchange), so BVLC's ``bcast()``, ``solver.add_callback(nccl)`` and
    ``net.after_backward(nccl)`` have nothing left to do."""

    def __init__(self, solver, uid):
        self.solver, self.uid = solver, uid

    @staticmethod
    def new_uid():
        """A session id (bytes, as pycaffe's); caffe8 does not need it."""
        return os.urandom(16).hex().encode()

    def bcast(self):
        """Nothing to do: the solvers broadcast rank 0's weights when they start."""


class Timer:
    """pycaffe's ``caffe.Timer`` (Caffe's util/benchmark Timer): ``start()``, ``stop()`` and
    ``ms`` / ``seconds``, the time from the last start to the last stop; reading it stops a
    running timer, and a timer never started reads 0. Wall-clock, with sub-millisecond
    resolution (Caffe's CPU timer truncates to whole milliseconds); on the GPU the device is
    synchronised at start and stop, so kernels queued before them count on their side."""

    def __init__(self):
        self._running = self._has_run = False
        self._start = self._stop = 0.0

    @staticmethod
    def _now():
        if backend.on_gpu():
            backend.cupy.cuda.Device().synchronize()
        return time.perf_counter()

    def start(self):
        if not self._running:
            self._start = self._now()
            self._running = self._has_run = True

    def stop(self):
        if self._running:
            self._stop = self._now()
            self._running = False

    @property
    def ms(self):
        if not self._has_run:
            return 0.0
        self.stop()
        return (self._stop - self._start) * 1e3

    @property
    def seconds(self):
        return self.ms / 1e3


def layer_type_list():
    """The registered layer type strings, sorted."""
    from caffe8.engine.layer import LAYERS
    return sorted(LAYERS)


def device_query(gpu=None):
    """Caffe's ``device_query`` lines for the GPU ids in ``gpu`` ("0,1"; None or "all": every
    visible GPU)."""
    message = no_gpu_message("device_query")
    if message:
        raise CaffeError(message)
    runtime = backend.cupy.cuda.runtime
    count = runtime.getDeviceCount()
    if gpu in (None, "all"):
        ids = list(range(count))
    else:
        try:
            ids = [int(g) for g in str(gpu).split(",")]
        except ValueError:
            raise CaffeError(f"-gpu {gpu}: give device ids (0,1,...) or 'all'") from None
    lines = []
    for i in ids:
        if not 0 <= i < count:
            raise CaffeError(f"-gpu {i}: no such device ({count} visible)")
        p = runtime.getDeviceProperties(i)
        name = p["name"].decode() if isinstance(p["name"], bytes) else p["name"]
        lines.append(f"Querying GPUs {i}")
        for label, value in (("Device id", i), ("Major revision number", p["major"]),
                             ("Minor revision number", p["minor"]), ("Name", name),
                             ("Total global memory", p["totalGlobalMem"]),
                             ("Total shared memory per block", p["sharedMemPerBlock"]),
                             ("Total registers per block", p["regsPerBlock"]),
                             ("Warp size", p["warpSize"]),
                             ("Maximum threads per block", p["maxThreadsPerBlock"]),
                             ("Clock rate", p["clockRate"]),
                             ("Number of multiprocessors", p["multiProcessorCount"])):
            lines.append(f"{label + ':':<32}{value}")
    return lines
