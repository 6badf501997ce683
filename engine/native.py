"""Finding or building a plain C shared library (no Python C API) for ctypes, and binding it.

``load_library`` looks, in order, for:

1. a build next to the source's package made at install time by setup.py (``<name>*.so``),
   unless, in a source tree (setup.py beside the package), it is older than the source (a stale
   in-place build; then it is the last resort). An installed package is never stale: pip writes
   the wheel's files in its order, so a source may be a few milliseconds newer than its build;
2. the per-user cache (``$CAFFE8_CACHE_DIR``, else ``$XDG_CACHE_HOME/caffe8``, else
   ``~/.cache/caffe8``), compiled there once with the system ``cc`` under a file lock and
   published by an atomic rename, so MPI ranks starting together never load a half-written
   file; the file name carries a hash of the source and flags, so an edited source rebuilds.

It returns ``(CDLL, path)`` or ``(None, reason)``; the caller keeps a NumPy fallback. Every
build gets ``-I`` :data:`INCLUDE_DIR` (engine/csrc: ``c8_kernels.h``, the dispatch block the
libraries share), and the header is part of the cache key and of the staleness test.

Binding, the one ctypes pattern of caffe8's kernel libraries: :func:`declare` gives functions
their signatures from a table, and :class:`Kernels` is a library of kernels compiled for float32
and float64 (``<prefix><name>_f32`` / ``_f64``) loaded on first use, whose :meth:`Kernels.run`
calls one on NumPy arrays (passed as addresses) and says whether it ran (False: no library, a
CuPy array, another dtype, a non-contiguous array, or the kernels switched off).
"""
import ctypes
import glob
import hashlib
import os
import platform
import subprocess
import sysconfig
import tempfile
import warnings

import numpy

#: the shared header's folder (engine/csrc), on every build's include path
INCLUDE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "csrc")
_HEADERS = (os.path.join(INCLUDE_DIR, "c8_kernels.h"),)


def _data_pointer_reader():
    """``address(array)``: the address of a NumPy array's first element, for ctypes calls.

    ``array.ctypes.data`` imports numpy._core._internal and builds a Python object on every
    call (~11,000 instructions; a small net's step passed 26 addresses). NumPy's C ABI keeps the
    data pointer right after the object header (``PyArrayObject_fields.data``, what
    ``PyArray_DATA`` reads), and CPython's ``id`` is the object's address, so the pointer can be
    read there (~2,600 instructions). Checked once here against ``ctypes.data`` on arrays of
    several layouts; where it does not hold (another interpreter or ABI), ``ctypes.data``."""
    header = ctypes.sizeof(ctypes.c_ssize_t) + ctypes.sizeof(ctypes.c_void_p)  # refcount, type
    read = ctypes.c_void_p.from_address

    def address(array):
        return read(id(array) + header).value

    base = numpy.arange(24, dtype=numpy.float32).reshape(4, 6)
    samples = (base, base.T, base[1:, 2:], base[::2], base.reshape(-1)[3:], numpy.zeros(0))
    if platform.python_implementation() == "CPython" and \
            all(address(a) == a.ctypes.data for a in samples):
        return address
    return lambda array: array.ctypes.data


address = _data_pointer_reader()


def cache_dir():
    base = os.environ.get("CAFFE8_CACHE_DIR")
    if not base:
        xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        base = os.path.join(xdg, "caffe8")
    return base


def _abi_ok(path, abi_symbol, abi_version):
    try:
        lib = ctypes.CDLL(path)
        fn = getattr(lib, abi_symbol)
        fn.restype = ctypes.c_int
        return lib if fn() == abi_version else None
    except (OSError, AttributeError):
        return None


def compile_cached(source, stem, cflags, ldflags):
    """Path of the cached build of ``source`` (compiled once); raises OSError/SubprocessError."""
    h = hashlib.sha256(" ".join(cflags + ldflags).encode())
    for path in (source, *_HEADERS):
        with open(path, "rb") as f:
            h.update(f.read())
    digest = h.hexdigest()[:16]
    cache = cache_dir()
    target = os.path.join(cache, f"{stem}-{sysconfig.get_platform()}-{digest}.so")
    if os.path.exists(target):
        return target
    os.makedirs(cache, exist_ok=True)
    with _FileLock(target + ".lock"):
        if os.path.exists(target):                    # another rank built it while we waited
            return target
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=cache)
        os.close(fd)
        try:
            cc = os.environ.get("CC", "cc")
            subprocess.run([cc, *cflags, "-I", INCLUDE_DIR, "-fPIC", "-shared", source, "-o",
                            tmp, *ldflags],
                           check=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           timeout=120)
            os.replace(tmp, target)                   # atomic: readers see all or nothing
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    return target


class _FileLock:
    """Exclusive advisory lock on a file (fcntl); a no-op where fcntl does not exist."""

    def __init__(self, path):
        self.path = path
        self.fd = None

    def __enter__(self):
        try:
            import fcntl
        except ImportError:
            return self
        self.fd = os.open(self.path, os.O_CREAT | os.O_RDWR, 0o644)
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        if self.fd is not None:
            os.close(self.fd)                         # closing releases the lock


def load_library(source, stem, abi_symbol, abi_version, flag_sets):
    """``(CDLL, path)`` of the library built from ``source``, or ``(None, reason)``.

    ``flag_sets``: ``[(cflags, ldflags), ...]`` tried in order for the cache build (e.g. with
    OpenMP first, then without, for compilers that lack it).
    """
    here = os.path.dirname(source.rstrip(os.sep))
    package = os.path.dirname(here)
    packaged = sorted(glob.glob(os.path.join(package, stem + "*.so"))
                      + glob.glob(os.path.join(package, stem + "*.dylib")))
    in_tree = os.path.isfile(os.path.join(os.path.dirname(package), "setup.py"))
    stale = [p for p in packaged if in_tree and _older(p, source)]
    for path in (p for p in packaged if p not in stale):
        lib = _abi_ok(path, abi_symbol, abi_version)
        if lib is not None:
            return lib, path
    reasons = []
    if os.path.exists(source):
        for cflags, ldflags in flag_sets:
            try:
                path = compile_cached(source, stem, list(cflags), list(ldflags))
            except (OSError, subprocess.SubprocessError) as err:
                detail = getattr(err, "stderr", b"") or b""
                reasons.append(f"{err} {detail.decode(errors='replace')[:300]}")
                continue
            lib = _abi_ok(path, abi_symbol, abi_version)
            if lib is not None:
                return lib, path
            reasons.append(f"{path}: wrong ABI version")
    for path in stale:
        lib = _abi_ok(path, abi_symbol, abi_version)
        if lib is not None:
            return lib, path
    return None, "; ".join(reasons) or f"no source at {source}"


def _older(path, source):
    """True when the build ``path`` is older than ``source`` or a shared header."""
    try:
        built = os.path.getmtime(path)
        return any(built < os.path.getmtime(s) for s in (source, *_HEADERS))
    except OSError:
        return False


def declare(lib, signatures):
    """Give ``lib``'s functions their ctypes signatures: ``{name: (restype, [argtypes])}``."""
    for name, (restype, argtypes) in signatures.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, list(argtypes)


class Kernels:
    """C kernels for NumPy float arrays in one library (module docstring): each kernel ``name``
    exists as ``<prefix><name>_f32`` and ``_f64``, with the signature ``signatures(real)`` gives
    it: ``{name: (restype, [argtypes])}`` (``real``: the ctypes float of the suffix).

    The library is found or built on first use (:func:`load_library` with ``flag_sets``); without
    one, a warning names ``what`` and the callers take their NumPy path. ``env`` names the
    environment variable whose value ``numpy`` switches the kernels off (:meth:`use_native` at
    run time).
    """
    SUFFIX = {numpy.dtype(numpy.float32): "f32", numpy.dtype(numpy.float64): "f64"}
    REAL = {"f32": ctypes.c_float, "f64": ctypes.c_double}

    def __init__(self, what, source, stem, abi, prefix, signatures, env, flag_sets):
        """``abi``: (the library's version function, the version this code needs)."""
        self.what, self.source, self.stem, self.abi = what, source, stem, abi
        self.prefix, self.signatures = prefix, signatures
        self.flag_sets = flag_sets
        self.enabled = os.environ.get(env, "").lower() != "numpy"
        self._lib = self._file = None
        self._loaded = False
        self._functions = {}      # (name, dtype) -> the bound C function

    def _load(self):
        self._loaded = True
        lib, where = load_library(self.source, self.stem, *self.abi, self.flag_sets)
        if lib is None:
            warnings.warn(f"{self.what}: no C kernels ({where}); using NumPy", RuntimeWarning)
            return
        for suffix, real in self.REAL.items():
            declare(lib, {f"{self.prefix}{name}_{suffix}": signature
                          for name, signature in self.signatures(real).items()})
        self._lib, self._file = lib, where

    def library_file(self):
        """Path of the loaded library, or None when the NumPy path is in use."""
        if not self._loaded:
            self._load()
        return self._file

    def use_native(self, flag):
        """Enable (True) or disable (False) the kernels for this process; returns the setting
        before."""
        before, self.enabled = self.enabled, bool(flag)
        return before

    def enabled_for(self, *arrays):
        """True when the kernels run on ``arrays``: NumPy, one float dtype, C-contiguous."""
        if not self.enabled:
            return False
        if not self._loaded:
            self._load()
        dtype = arrays[0].dtype
        if self._lib is None or dtype not in self.SUFFIX:
            return False
        for a in arrays:
            if type(a) is not numpy.ndarray or a.dtype != dtype or not a.flags.c_contiguous:
                return False
        return True

    def kernel(self, name, *arrays):
        """The C function ``name`` for ``arrays``' dtype, or None (``enabled_for`` says no)."""
        if not self.enabled_for(*arrays):
            return None
        key = (name, arrays[0].dtype)
        fn = self._functions.get(key)
        if fn is None:
            fn = self._functions[key] = getattr(
                self._lib, f"{self.prefix}{name}_{self.SUFFIX[arrays[0].dtype]}")
        return fn

    def run(self, name, arrays, *args):
        """Call kernel ``name`` (chosen by the dtype of ``arrays``, every array it touches) with
        ``args``, each NumPy array passed as its address; True when it ran, False when the
        caller must take its NumPy (or CuPy) path."""
        fn = self.kernel(name, *arrays)
        if fn is None:
            return False
        fn(*[address(a) if isinstance(a, numpy.ndarray) else a for a in args])
        return True
