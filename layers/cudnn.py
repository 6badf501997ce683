"""The cuDNN binding: library loading, descriptors and the convolution algorithm cache (ctypes).

CuPy 14 no longer binds cuDNN, so this module calls the cuDNN C API of ``libcudnn.so.9`` (the
``nvidia-cudnn-cuNN`` wheel of the CUDA major version, or a system install) through ctypes, as
CuPy's own binding did. cuDNN is used once it answers an algorithm query for a tiny
convolution (``ready``): cuDNN 9 loads its engine sub-libraries lazily, so a broken install
passes ``cudnnCreate`` and fails there, and the layers then fall back to CAFFE with one note.
An algorithm that fails when run (not supported, out of memory) gives way to the next one.
Only the legacy API is used (``cudnn_graph``/``cudnn_ops``/``cudnn_cnn`` headers): tensor,
filter, convolution, pooling and LRN descriptors, ``cudnnGet*Algorithm_v7`` heuristics (or,
opt-in, ``cudnnFind*AlgorithmEx`` benchmarks). docs/ARCHITECTURE.md ("GPU path") gives the
reasons. The layers that run on it: ``layers.cudnn_conv``, ``layers.cudnn_pooling``,
``layers.cudnn_lrn``; each picks its engine as Caffe's layer factory does (``engine_for``).

Nothing here synchronises with the host per call: descriptors and the algorithm of each
(shape, dtype, geometry, TF32 setting, device) are made once and cached; workspaces come from
CuPy's memory pool (stream-ordered, so freeing one right after the launch is safe); the cuDNN
handle (one per thread and device) follows CuPy's current stream, rebound only when it changes.

Environment: ``CAFFE8_CUDNN_LIBRARY`` (path of libcudnn.so.9, overriding the search),
``CAFFE8_CUDNN_ALGO`` (``heuristic``, the default, as Caffe's cuDNN layer; or ``find`` to time
the candidates once per shape), ``CAFFE8_CUDNN_WORKSPACE_MB`` (largest workspace an algorithm
may use, default 1024).
"""
import collections
import ctypes
import glob
import importlib.util
import os
import sys
import threading

import numpy

from caffe8.engine import backend
from caffe8.layers.im2col import conv_out_size

LIBRARY_ENV = "CAFFE8_CUDNN_LIBRARY"
ALGO_ENV = "CAFFE8_CUDNN_ALGO"
WORKSPACE_ENV = "CAFFE8_CUDNN_WORKSPACE_MB"

#: cuDNN 9 ships a small dispatcher (libcudnn.so.9) that dlopens these sub-libraries; loading
#: them first, globally, from the same folder makes the dispatcher find them even when that
#: folder is not on the loader's search path (the usual case for a pip wheel).
SUBLIBRARIES = ("libcudnn_graph.so.9", "libcudnn_engines_precompiled.so.9",
                "libcudnn_engines_runtime_compiled.so.9", "libcudnn_engines_tensor_ir.so.9",
                "libcudnn_heuristic.so.9", "libcudnn_ops.so.9", "libcudnn_cnn.so.9")
LIBRARY_NAME = "libcudnn.so.9"
#: the legacy API and the perf-struct layout used here exist from cuDNN 8 on
MIN_VERSION = 8000

# cudnn_graph.h enums
STATUS_SUCCESS = 0
#: statuses after which the next algorithm candidate is tried: not supported (cuDNN 9: the
#: 3000s; cuDNN 8: 9) and device or host memory exhausted (cuDNN 9: 4003, 4004; cuDNN 8: 2)
RETRY_STATUSES = frozenset(range(3000, 4000)) | {4003, 4004, 9, 2}
DATA_FLOAT, DATA_DOUBLE, DATA_HALF = 0, 1, 2
TENSOR_NCHW = 0
CROSS_CORRELATION = 1
DEFAULT_MATH, TENSOR_OP_MATH, TENSOR_OP_MATH_ALLOW_CONVERSION, FMA_MATH = 0, 1, 2, 3
POOLING_AVERAGE_COUNT_INCLUDE_PADDING = 1
NOT_PROPAGATE_NAN = 0
LRN_CROSS_CHANNEL_DIM1 = 0
#: cuDNN's LRN limits (CUDNN_LRN_MAX_N, CUDNN_LRN_MIN_K, CUDNN_LRN_MIN_BETA)
LRN_MAX_N, LRN_MIN_K, LRN_MIN_BETA = 16, 1e-5, 0.01

FORWARD, BACKWARD_DATA, BACKWARD_FILTER = "forward", "backward_data", "backward_filter"


class CudnnUnavailable(RuntimeError):
    """The cuDNN library could not be loaded (the message says where it looked and why)."""


class CudnnError(RuntimeError):
    """A cuDNN call returned an error status (``status``: the cudnnStatus_t, None when the
    error is the binding's own)."""

    def __init__(self, message, status=None):
        super().__init__(message)
        self.status = status


class AlgoPerf(ctypes.Structure):
    """``cudnnConvolution{Fwd,BwdData,BwdFilter}AlgoPerf_t`` (one layout for all three)."""
    _fields_ = [("algo", ctypes.c_int), ("status", ctypes.c_int), ("time", ctypes.c_float),
                ("memory", ctypes.c_size_t), ("determinism", ctypes.c_int),
                ("mathType", ctypes.c_int), ("reserved", ctypes.c_int * 3)]


# --- loading -------------------------------------------------------------------------------------
def nvidia_roots():
    """Every ``nvidia`` folder the NVIDIA wheels install into: the parts of the ``nvidia``
    namespace package, then each import path entry's own (an older wheel's
    ``nvidia/__init__.py`` makes the first one a regular package that hides the others, e.g.
    a user-site CuPy beside a venv's cuDNN)."""
    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        spec = None
    roots = list(spec.submodule_search_locations or []) if spec else []
    for entry in sys.path:
        folder = os.path.join(entry or os.getcwd(), "nvidia")
        if os.path.isdir(folder) and folder not in roots:
            roots.append(folder)
    return roots


def wheel_library_dirs(roots=None):
    """``lib`` folders holding libcudnn.so.9 inside the installed NVIDIA wheels
    (``nvidia/cudnn/lib`` in both ``nvidia-cudnn-cu12`` and ``-cu13``, whatever sibling folder
    a later layout uses), cuDNN's own folder first. ``roots`` replaces ``nvidia_roots()``."""
    if roots is None:
        roots = nvidia_roots()
    dirs = []
    for root in roots:
        found = sorted(glob.glob(os.path.join(root, "*", "lib", LIBRARY_NAME)),
                       key=lambda f: (os.path.basename(os.path.dirname(os.path.dirname(f)))
                                      != "cudnn", f))
        for f in found:
            if os.path.dirname(f) not in dirs:
                dirs.append(os.path.dirname(f))
    return dirs


def load_library(path=None, search_dirs=None, system=True):
    """Load libcudnn and return the ``ctypes.CDLL``; raise ``CudnnUnavailable`` naming every
    place tried. ``path`` (or ``$CAFFE8_CUDNN_LIBRARY``) is used alone when given; otherwise the
    NVIDIA wheels' folders (``search_dirs`` overrides them), then (``system``) the loader path."""
    path = path or os.environ.get(LIBRARY_ENV) or None
    tried = []
    candidates = [path] if path else (
        [os.path.join(d, LIBRARY_NAME) for d in
         (wheel_library_dirs() if search_dirs is None else search_dirs)]
        + ([LIBRARY_NAME] if system else []))
    for candidate in candidates:
        if os.sep in candidate and not os.path.exists(candidate):
            tried.append(f"{candidate} (no such file)")
            continue
        _preload(os.path.dirname(candidate))
        try:
            lib = ctypes.CDLL(candidate, mode=ctypes.RTLD_GLOBAL)
        except OSError as e:
            tried.append(f"{candidate} ({e})")
            continue
        try:
            _declare(lib)
        except AttributeError as e:  # not a cuDNN, or one without the legacy convolution API
            tried.append(f"{candidate} (missing symbol: {e})")
            continue
        version = int(lib.cudnnGetVersion())
        if version < MIN_VERSION:
            tried.append(f"{candidate} (version {version}; cuDNN 8 or newer is needed)")
            continue
        return lib
    hint = (f"set {LIBRARY_ENV} to the file" if path is None else
            f"check {LIBRARY_ENV}" if os.environ.get(LIBRARY_ENV) else "check the path")
    raise CudnnUnavailable("cuDNN library not loaded; tried: " + "; ".join(tried) +
                           preload_note() + f". Install it with '{install_command()}' or {hint}")


#: "file: error" of each sub-library that was found but did not load (``_preload``)
preload_errors = []


def _preload(folder):
    """Load the sub-libraries found in ``folder`` globally, recording each failure."""
    for sub in SUBLIBRARIES if folder else ():
        sub_path = os.path.join(folder, sub)
        if os.path.exists(sub_path):
            try:
                ctypes.CDLL(sub_path, mode=ctypes.RTLD_GLOBAL)
            except OSError as e:
                preload_errors.append(f"{sub_path}: {e}")


def preload_note():
    """The sub-libraries that did not load, as a clause to append to an error ('' if none)."""
    return ("; sub-libraries that failed to load: " + "; ".join(preload_errors)
            if preload_errors else "")


def install_command(cuda_major=None):
    """pip's command for cuDNN 9's wheel of the CUDA major version CuPy runs on (or
    ``cuda_major``); without CuPy, the wheel's pattern."""
    major = cuda_major if cuda_major is not None else backend.cuda_runtime_major()
    return f"pip install nvidia-cudnn-cu{major}" if major else \
        "pip install nvidia-cudnn-cuNN, NN your CUDA major version"


_P, _I, _SZ = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t
_PI, _PSZ = ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_size_t)
_PPERF = ctypes.POINTER(AlgoPerf)
_PP = ctypes.POINTER(ctypes.c_void_p)
#: name -> argument types; every function returns cudnnStatus_t (int)
_SIGNATURES = {
    "cudnnCreate": [_PP], "cudnnSetStream": [_P, _P],
    "cudnnCreateTensorDescriptor": [_PP], "cudnnDestroyTensorDescriptor": [_P],
    "cudnnSetTensorNdDescriptor": [_P, _I, _I, _PI, _PI],
    "cudnnCreateFilterDescriptor": [_PP], "cudnnDestroyFilterDescriptor": [_P],
    "cudnnSetFilterNdDescriptor": [_P, _I, _I, _I, _PI],
    "cudnnCreateConvolutionDescriptor": [_PP], "cudnnDestroyConvolutionDescriptor": [_P],
    "cudnnSetConvolutionNdDescriptor": [_P, _I, _PI, _PI, _PI, _I, _I],
    "cudnnSetConvolutionGroupCount": [_P, _I], "cudnnSetConvolutionMathType": [_P, _I],
    "cudnnGetConvolutionForwardAlgorithmMaxCount": [_P, _PI],
    "cudnnGetConvolutionBackwardDataAlgorithmMaxCount": [_P, _PI],
    "cudnnGetConvolutionBackwardFilterAlgorithmMaxCount": [_P, _PI],
    "cudnnGetConvolutionForwardAlgorithm_v7": [_P, _P, _P, _P, _P, _I, _PI, _PPERF],
    "cudnnGetConvolutionBackwardDataAlgorithm_v7": [_P, _P, _P, _P, _P, _I, _PI, _PPERF],
    "cudnnGetConvolutionBackwardFilterAlgorithm_v7": [_P, _P, _P, _P, _P, _I, _PI, _PPERF],
    "cudnnFindConvolutionForwardAlgorithmEx":
        [_P, _P, _P, _P, _P, _P, _P, _P, _I, _PI, _PPERF, _P, _SZ],
    "cudnnFindConvolutionBackwardDataAlgorithmEx":
        [_P, _P, _P, _P, _P, _P, _P, _P, _I, _PI, _PPERF, _P, _SZ],
    "cudnnFindConvolutionBackwardFilterAlgorithmEx":
        [_P, _P, _P, _P, _P, _P, _P, _P, _I, _PI, _PPERF, _P, _SZ],
    "cudnnGetConvolutionForwardWorkspaceSize": [_P, _P, _P, _P, _P, _I, _PSZ],
    "cudnnGetConvolutionBackwardDataWorkspaceSize": [_P, _P, _P, _P, _P, _I, _PSZ],
    "cudnnGetConvolutionBackwardFilterWorkspaceSize": [_P, _P, _P, _P, _P, _I, _PSZ],
    "cudnnConvolutionForward": [_P, _P, _P, _P, _P, _P, _P, _I, _P, _SZ, _P, _P, _P],
    "cudnnConvolutionBackwardData": [_P, _P, _P, _P, _P, _P, _P, _I, _P, _SZ, _P, _P, _P],
    "cudnnConvolutionBackwardFilter": [_P, _P, _P, _P, _P, _P, _P, _I, _P, _SZ, _P, _P, _P],
    "cudnnConvolutionBackwardBias": [_P, _P, _P, _P, _P, _P, _P],
    "cudnnAddTensor": [_P, _P, _P, _P, _P, _P, _P],
    "cudnnCreatePoolingDescriptor": [_PP], "cudnnDestroyPoolingDescriptor": [_P],
    "cudnnSetPoolingNdDescriptor": [_P, _I, _I, _I, _PI, _PI, _PI],
    "cudnnPoolingForward": [_P, _P, _P, _P, _P, _P, _P, _P],
    "cudnnPoolingBackward": [_P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P],
    "cudnnCreateLRNDescriptor": [_PP], "cudnnDestroyLRNDescriptor": [_P],
    "cudnnSetLRNDescriptor": [_P, ctypes.c_uint, ctypes.c_double, ctypes.c_double,
                              ctypes.c_double],
    "cudnnLRNCrossChannelForward": [_P, _P, _I, _P, _P, _P, _P, _P, _P],
    "cudnnLRNCrossChannelBackward": [_P, _P, _I, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P],
}


def _declare(lib):
    lib.cudnnGetVersion.restype = ctypes.c_size_t
    lib.cudnnGetVersion.argtypes = []
    lib.cudnnGetErrorString.restype = ctypes.c_char_p
    lib.cudnnGetErrorString.argtypes = [ctypes.c_int]
    for name, args in _SIGNATURES.items():
        fn = getattr(lib, name)
        fn.restype = ctypes.c_int
        fn.argtypes = args


_lib = None
_lib_error = None
_lib_lock = threading.Lock()


def library():
    """The loaded library (loaded on first use); raises ``CudnnUnavailable``."""
    global _lib, _lib_error
    with _lib_lock:
        if _lib is None and _lib_error is None:
            try:
                _lib = load_library()
            except CudnnUnavailable as e:
                _lib_error = str(e)
        if _lib is None:
            raise CudnnUnavailable(_lib_error)
        return _lib


def library_error():
    """None when cuDNN loads, else the reason it does not."""
    try:
        library()
        return None
    except CudnnUnavailable as e:
        return str(e)


def check(status, what):
    if status != STATUS_SUCCESS:
        text = _lib.cudnnGetErrorString(status).decode() if _lib is not None else "?"
        raise CudnnError(f"{what} failed: {text} (cudnnStatus_t {status})", status)


def retryable(error):
    """True when ``error`` (from running an algorithm) says that algorithm cannot run here
    (not supported, or out of memory for its workspace), so the next candidate may."""
    if isinstance(error, CudnnError):
        return error.status in RETRY_STATUSES
    return backend.is_out_of_memory(error)


#: cuDNN functions called through :func:`call`, by name (scripts/peer_bench.py reports the
#: calls per iteration: issue 30 counted 608 for GoogLeNet, half of them cudnnSetStream)
CALLS = collections.Counter()


def call(name, *args):
    CALLS[name] += 1
    check(getattr(library(), name)(*args), name)


# --- pure descriptor arithmetic (no library needed) ----------------------------------------------
def data_type(dtype):
    """cudnnDataType_t of a NumPy dtype; None when cuDNN does not take it."""
    return {numpy.dtype(numpy.float32): DATA_FLOAT, numpy.dtype(numpy.float64): DATA_DOUBLE,
            numpy.dtype(numpy.float16): DATA_HALF}.get(numpy.dtype(dtype))


def compute_type(dtype):
    """Accumulation type of the convolution: float for half and float data, double for double."""
    return DATA_DOUBLE if numpy.dtype(dtype) == numpy.float64 else DATA_FLOAT


def math_type(dtype, tf32):
    """The math type asked of cuDNN: float32 gets FMA_MATH (no tensor-op rounding) unless TF32
    is enabled; half may use tensor ops; double only has FMA."""
    dtype = numpy.dtype(dtype)
    if dtype == numpy.float32:
        return TENSOR_OP_MATH if tf32 else FMA_MATH
    if dtype == numpy.float16:
        return TENSOR_OP_MATH
    return DEFAULT_MATH


def allowed_math(dtype, tf32, candidate, tf32_device=False):
    """Whether an algorithm's math type keeps to the numerics asked for (no TF32 unless enabled):
    with TF32 off, float32 refuses tensor-op math, and DEFAULT_MATH too on a device where
    cuDNN's default permits TF32 (``tf32_device``: compute capability 8.0 or newer)."""
    if numpy.dtype(dtype) == numpy.float32 and not tf32:
        refused = (TENSOR_OP_MATH, TENSOR_OP_MATH_ALLOW_CONVERSION) + \
            ((DEFAULT_MATH,) if tf32_device else ())
        return candidate not in refused
    return True


def packed_strides(dims):
    """Element strides of a C-contiguous array of ``dims``."""
    strides, step = [], 1
    for d in reversed(dims):
        strides.append(step)
        step *= int(d)
    return tuple(reversed(strides))


class Geometry:
    """The cuDNN view of one convolution: x/w/y/bias dims (1-D lifted to 2-D with a trailing
    unit axis, since cuDNN's convolutions take 4-D and 5-D tensors), per-axis pad/stride/dilation
    and the group count. Equal geometries share descriptors' meaning and algorithms."""

    def __init__(self, x_shape, w_shape, pad, stride, dilation, group):
        spatial = len(x_shape) - 2
        if not 1 <= spatial <= 3:
            raise ValueError(f"cuDNN convolutions take 1 to 3 spatial axes, got {spatial}")
        lift = (1,) if spatial == 1 else ()
        self.x = tuple(int(v) for v in x_shape) + lift
        self.w = tuple(int(v) for v in w_shape) + lift
        self.pad = tuple(int(v) for v in pad) + ((0,) if lift else ())
        self.stride = tuple(int(v) for v in stride) + lift
        self.dilation = tuple(int(v) for v in dilation) + lift
        self.group = int(group)
        out = tuple(conv_out_size(*a) for a in zip(self.x[2:], self.w[2:], self.pad, self.stride,
                                                     self.dilation))
        self.y = (self.x[0], self.w[0]) + out
        self.bias = (1, self.w[0]) + (1,) * (len(self.x) - 2)

    def key(self):
        return (self.x, self.w, self.pad, self.stride, self.dilation, self.group)


def usable_algorithms(perfs, dtype, tf32, workspace_limit, tf32_device=False):
    """The usable candidates in cuDNN's order (best first): status success, workspace within
    the limit and a math type that respects the TF32 setting, as ``(algo, memory, math_type)``.
    ``perfs`` are ``AlgoPerf`` records or objects with the same fields."""
    return [(int(p.algo), int(p.memory), int(p.mathType)) for p in perfs
            if p.status == STATUS_SUCCESS and p.memory <= workspace_limit and
            allowed_math(dtype, tf32, p.mathType, tf32_device)]


def choose_algorithm(perfs, dtype, tf32, workspace_limit, tf32_device=False):
    """The first of :func:`usable_algorithms`, or None."""
    usable = usable_algorithms(perfs, dtype, tf32, workspace_limit, tf32_device)
    return usable[0] if usable else None


class AlgorithmCache:
    """Algorithm per (operation, device, dtype, geometry, TF32, search mode), chosen once.

    ``search(op, key_fields...)`` is only called on a miss; ``misses`` counts those searches."""

    def __init__(self, search):
        self._search = search
        self._chosen = {}
        self._lock = threading.Lock()
        self.misses = 0

    def get(self, op, device, dtype, geometry, tf32, mode, *search_args):
        key = (op, device, numpy.dtype(dtype).str, geometry.key(), bool(tf32), mode)
        with self._lock:
            hit = self._chosen.get(key)
        if hit is not None:
            return hit
        found = self._search(op, geometry, dtype, tf32, mode, *search_args)
        with self._lock:
            self.misses += 1
            self._chosen[key] = found
        return found

    def __len__(self):
        return len(self._chosen)


# --- handles and descriptors (need the library) ---------------------------------------------
_handles = threading.local()


class _BoundHandle:
    """A cuDNN handle and the stream it was last bound to (None before the first binding)."""

    __slots__ = ("ptr", "stream")

    def __init__(self):
        self.ptr, self.stream = ctypes.c_void_p(), None
        call("cudnnCreate", ctypes.byref(self.ptr))


def handle():
    """This thread's cuDNN handle for CuPy's current device, bound to CuPy's current stream.
    ``cudnnSetStream`` runs only when that stream differs from the handle's last one: issued
    before every call, it was half of GoogLeNet's 608 cuDNN calls per iteration (issue 30)."""
    per_device = getattr(_handles, "by_device", None)
    if per_device is None:
        per_device = _handles.by_device = {}
    device = backend.cuda_device_id()
    bound = per_device.get(device)
    if bound is None:
        bound = per_device[device] = _BoundHandle()
    stream = backend.cuda_stream_ptr()
    if stream != bound.stream:
        call("cudnnSetStream", bound.ptr, ctypes.c_void_p(stream))
        bound.stream = stream
    return bound.ptr


def _ints(values):
    return (ctypes.c_int * len(values))(*[int(v) for v in values])


class _Descriptor:
    _create = _destroy = None

    def __init__(self):
        self.ptr = ctypes.c_void_p()
        call(self._create, ctypes.byref(self.ptr))
        self._lib = library()

    def __del__(self):
        try:
            if self.ptr.value:
                getattr(self._lib, self._destroy)(self.ptr)
        except Exception:  # interpreter shutdown, or construction failed half-way
            pass


class TensorDescriptor(_Descriptor):
    _create, _destroy = "cudnnCreateTensorDescriptor", "cudnnDestroyTensorDescriptor"

    def __init__(self, dims, dtype):
        super().__init__()
        call("cudnnSetTensorNdDescriptor", self.ptr, data_type(dtype), len(dims), _ints(dims),
             _ints(packed_strides(dims)))


class FilterDescriptor(_Descriptor):
    _create, _destroy = "cudnnCreateFilterDescriptor", "cudnnDestroyFilterDescriptor"

    def __init__(self, dims, dtype):
        super().__init__()
        call("cudnnSetFilterNdDescriptor", self.ptr, data_type(dtype), TENSOR_NCHW, len(dims),
             _ints(dims))


class ConvolutionDescriptor(_Descriptor):
    _create, _destroy = "cudnnCreateConvolutionDescriptor", "cudnnDestroyConvolutionDescriptor"

    def __init__(self, geometry, dtype, math):
        super().__init__()
        n = len(geometry.pad)
        call("cudnnSetConvolutionNdDescriptor", self.ptr, n, _ints(geometry.pad),
             _ints(geometry.stride), _ints(geometry.dilation), CROSS_CORRELATION,
             compute_type(dtype))
        call("cudnnSetConvolutionGroupCount", self.ptr, geometry.group)
        self.set_math(math)

    def set_math(self, math):
        call("cudnnSetConvolutionMathType", self.ptr, math)


# --- algorithm search ---------------------------------------------------------------------------
def workspace_limit():
    return int(float(os.environ.get(WORKSPACE_ENV, "1024")) * (1 << 20))


def search_mode():
    mode = os.environ.get(ALGO_ENV, "heuristic").strip().lower()
    return mode if mode in ("heuristic", "find") else "heuristic"


_MAX_COUNT = {FORWARD: "cudnnGetConvolutionForwardAlgorithmMaxCount",
              BACKWARD_DATA: "cudnnGetConvolutionBackwardDataAlgorithmMaxCount",
              BACKWARD_FILTER: "cudnnGetConvolutionBackwardFilterAlgorithmMaxCount"}
_HEURISTIC = {FORWARD: "cudnnGetConvolutionForwardAlgorithm_v7",
              BACKWARD_DATA: "cudnnGetConvolutionBackwardDataAlgorithm_v7",
              BACKWARD_FILTER: "cudnnGetConvolutionBackwardFilterAlgorithm_v7"}
_FIND = {FORWARD: "cudnnFindConvolutionForwardAlgorithmEx",
         BACKWARD_DATA: "cudnnFindConvolutionBackwardDataAlgorithmEx",
         BACKWARD_FILTER: "cudnnFindConvolutionBackwardFilterAlgorithmEx"}
_WORKSPACE = {FORWARD: "cudnnGetConvolutionForwardWorkspaceSize",
              BACKWARD_DATA: "cudnnGetConvolutionBackwardDataWorkspaceSize",
              BACKWARD_FILTER: "cudnnGetConvolutionBackwardFilterWorkspaceSize"}


def _descriptor_args(op, plan, conv):
    """The (in, in, conv, out) descriptor order each operation's query functions take."""
    if op == FORWARD:
        return plan.x_desc.ptr, plan.w_desc.ptr, conv.ptr, plan.y_desc.ptr
    if op == BACKWARD_DATA:
        return plan.w_desc.ptr, plan.y_desc.ptr, conv.ptr, plan.x_desc.ptr
    return plan.x_desc.ptr, plan.y_desc.ptr, conv.ptr, plan.w_desc.ptr


def _find_args(op, plan, buffers, scratch):
    """The (desc, pointer) pairs, convolution and output of op's ``cudnnFind*AlgorithmEx``."""
    x, w, y = buffers
    if op == FORWARD:
        return (plan.x_desc.ptr, device_ptr(x), plan.w_desc.ptr, device_ptr(w),
                plan.conv[op].ptr, plan.y_desc.ptr, device_ptr(scratch))
    if op == BACKWARD_DATA:
        return (plan.w_desc.ptr, device_ptr(w), plan.y_desc.ptr, device_ptr(y),
                plan.conv[op].ptr, plan.x_desc.ptr, device_ptr(scratch))
    return (plan.x_desc.ptr, device_ptr(x), plan.y_desc.ptr, device_ptr(y), plan.conv[op].ptr,
            plan.w_desc.ptr, device_ptr(scratch))


def _search(op, geometry, dtype, tf32, mode, plan, buffers):
    """op's usable algorithms for ``plan``, best first: a list of ``(algo, workspace bytes,
    math type)`` (the exchange of a candidate that fails when run drops it: ``retryable``).

    ``buffers`` = (x, w, y) device arrays the "find" mode may run on; outputs are scratch
    arrays there, so the search never clobbers accumulated gradients; its workspace is
    ``plan.find_workspace``, one per GPU for every plan's searches."""
    h = handle()
    count = ctypes.c_int()
    call(_MAX_COUNT[op], h, ctypes.byref(count))
    perfs = (AlgoPerf * max(count.value, 1))()
    returned = ctypes.c_int()
    conv = plan.conv[op]
    conv.set_math(math_type(dtype, tf32))
    limit = workspace_limit()
    if mode == "find":
        x, w, y = buffers
        ws = plan.find_workspace(limit)
        scratch = backend.get_array_module(x).empty_like(
            {FORWARD: y, BACKWARD_DATA: x, BACKWARD_FILTER: w}[op])
        call(_FIND[op], h, *_find_args(op, plan, buffers, scratch), len(perfs),
             ctypes.byref(returned), perfs, device_ptr(ws), limit)
        del scratch  # (kept alive through the call: the benchmark writes into it)
    else:
        call(_HEURISTIC[op], h, *_descriptor_args(op, plan, conv), len(perfs),
             ctypes.byref(returned), perfs)
    usable = usable_algorithms(perfs[:returned.value], dtype, tf32, limit,
                               backend.cuda_compute_capability() >= (8, 0))
    if not usable:
        raise CudnnError(f"no cuDNN {op} algorithm for x {geometry.x}, w {geometry.w} "
                         f"within a {limit >> 20} MiB workspace ({WORKSPACE_ENV} raises it)")
    candidates = []
    for algo, _, math in usable:
        conv.set_math(math)
        size = ctypes.c_size_t()
        call(_WORKSPACE[op], h, *_descriptor_args(op, plan, conv), algo, ctypes.byref(size))
        candidates.append((algo, int(size.value), math))
    conv.set_math(candidates[0][2])
    return candidates


algorithms = AlgorithmCache(_search)


class PoolingDescriptor(_Descriptor):
    _create, _destroy = "cudnnCreatePoolingDescriptor", "cudnnDestroyPoolingDescriptor"

    def __init__(self, kernel, pad, stride):
        super().__init__()
        call("cudnnSetPoolingNdDescriptor", self.ptr, POOLING_AVERAGE_COUNT_INCLUDE_PADDING,
             NOT_PROPAGATE_NAN, len(kernel), _ints(kernel), _ints(pad), _ints(stride))


class LRNDescriptor(_Descriptor):
    _create, _destroy = "cudnnCreateLRNDescriptor", "cudnnDestroyLRNDescriptor"

    def __init__(self, size, alpha, beta, k):
        super().__init__()
        call("cudnnSetLRNDescriptor", self.ptr, int(size), float(alpha), float(beta), float(k))


# --- helpers the layer engines share ---------------------------------------------------------
def device_ptr(a):
    """The raw device address of a CuPy array."""
    return ctypes.c_void_p(int(a.data.ptr))


def scaling(dtype):
    """Host alpha/beta (1, 0) in the type cuDNN reads for ``dtype``: double for double data,
    float otherwise."""
    kind = ctypes.c_double if numpy.dtype(dtype) == numpy.float64 else ctypes.c_float
    return ctypes.byref(kind(1.0)), ctypes.byref(kind(0.0))


def contiguous(xp, a):
    return a if a.flags.c_contiguous else xp.ascontiguousarray(a)


def forward_operands(bottom, top):
    """``(x, y, one, zero)`` of a one-bottom, one-top layer's forward (pooling, LRN): x made
    contiguous, y the top's data, alpha/beta for x's dtype."""
    x = contiguous(backend.get_array_module(bottom[0].data), bottom[0].data)
    return (x, top[0].data) + scaling(x.dtype)


def backward_operands(top, bottom):
    """``(x, y, dy, one, zero)`` of such a layer's backward, each array contiguous."""
    xp = backend.get_array_module(top[0].diff)
    x, y, dy = (contiguous(xp, a) for a in (bottom[0].data, top[0].data, top[0].diff))
    return (x, y, dy) + scaling(x.dtype)


def cpu_note(param_field, layer_type):
    """The one-time note for engine CUDNN asked of a layer that runs on the CPU."""
    return (f"{param_field}.engine CUDNN needs CuPy arrays on a GPU; this run is on the CPU, "
            f"so {layer_type} layers use the CAFFE engine")


def engine_for(chosen, layer, array, decide):
    """"CUDNN" or "CAFFE" for ``layer`` on ``array``'s module, decided once per layer and module
    (``chosen``: a WeakKeyDictionary the caller keeps). ``decide(on_device)`` returns
    ``(engine, note)``; a library that loads but cannot start falls back too. Notes are logged
    once per process (``backend.note_once``)."""
    on_device = backend.is_device_array(array)
    per_module = chosen.setdefault(layer, {})
    engine = per_module.get(on_device)
    if engine is None:
        engine, note = decide(on_device)
        error = ready() if engine == "CUDNN" else None
        if error is not None:
            engine, note = "CAFFE", f"cuDNN could not start, using the CAFFE engine: {error}"
        if note:
            backend.note_once(note)
        per_module[on_device] = engine
    return engine


def ready():
    """None when cuDNN runs on CuPy's current device, else why not (asked once per thread and
    device): a handle, then an algorithm query for a tiny float32 convolution, the first call
    that makes cuDNN 9 load its engine sub-libraries."""
    per_device = getattr(_handles, "ready", None)
    if per_device is None:
        per_device = _handles.ready = {}
    device = backend.cuda_device_id()
    if device not in per_device:
        try:
            _probe()
            per_device[device] = None
        except (CudnnError, CudnnUnavailable) as e:
            per_device[device] = str(e) + preload_note()
    return per_device[device]


def _probe():
    h = handle()
    g = Geometry((1, 1, 4, 4), (1, 1, 2, 2), (0, 0), (1, 1), (1, 1), 1)
    x, y = TensorDescriptor(g.x, numpy.float32), TensorDescriptor(g.y, numpy.float32)
    w = FilterDescriptor(g.w, numpy.float32)
    conv = ConvolutionDescriptor(g, numpy.float32, FMA_MATH)
    count, returned = ctypes.c_int(), ctypes.c_int()
    call(_MAX_COUNT[FORWARD], h, ctypes.byref(count))
    perfs = (AlgoPerf * max(count.value, 1))()
    call(_HEURISTIC[FORWARD], h, x.ptr, w.ptr, conv.ptr, y.ptr, len(perfs),
         ctypes.byref(returned), perfs)
    statuses = [p.status for p in perfs[:returned.value]]
    if STATUS_SUCCESS not in statuses:
        raise CudnnError("no algorithm for a 4x4 float32 convolution (candidates' statuses: "
                         f"{statuses or 'none'})")
