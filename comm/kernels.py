"""Host kernels for the fp8/half exchange: C (comm/csrc/kernels.c) through ctypes.

ctypes releases the GIL for the length of each foreign call, so the communication thread's
reductions run beside the compute thread. The library is looked up, in order:

1. built next to this package at install time (setup.py's ``comm._kernels`` extension), unless
   it is older than kernels.c (a stale in-place build: then 2., and this only if 2. fails);
2. the per-user cache (``$CAFFE8_CACHE_DIR``, else ``$XDG_CACHE_HOME/caffe8``, else
   ``~/.cache/caffe8``), compiled there once from the source with the system ``cc`` — under a
   file lock and published by an atomic rename, so MPI ranks starting together never load a
   half-written file; the name carries a hash of the source, so an edited kernels.c rebuilds;
3. none: the NumPy implementation below, with one warning.

Paths (``paths()``, best first): ``"avx512"``, ``"avx2"`` (AVX2 + F16C), ``"portable"`` (C99),
and always ``"numpy"``; ``use_path(name)`` forces one, e.g. to test each, or
``CAFFE8_KERNEL_PATH=portable`` in the environment. A SIMD path is listed only if the CPU (and the
OS, via XGETBV) supports it and it agrees with the portable C code on a load-time self-check
(``self_check``, ~20 ms), so a path never exercised on this kind of CPU cannot corrupt sums.

All arrays are NumPy, C-contiguous; fp8 arrays are uint8 (any 1-byte dtype), half arrays uint16 or
float16. Sums work in place on ``dst``: ``dst[i] = saturate(src[i] + dst[i])``, rounding to
nearest even (fp8 saturates to ±57344, half to ±65504; finite inputs never give Inf/NaN).
``fp8_sum(..., rounding="oyama")`` is instead the sum of Oyama, Nomura, Sato and Matsuoka's
Algorithm 2 (float32 sum, half with nearest even, keep the upper byte: truncation toward zero at
fp8 precision, still saturating). For the conversions ``"oyama"`` is their conversion, the same
as ``"truncate"``.

The ratio kernels (``encode_ratio_fp8`` / ``decode_ratio_fp8``) fuse the fp8 codec's relative
scaling with the conversion (one pass each way, no float32 temporaries): each step is a
float32 operation in NumPy's order, so their bits equal the NumPy sequence they replace.
"""
import ctypes
import os
import sys
import warnings

import numpy

from caffe8.comm import formats
from caffe8.engine.native import compile_cached, declare, load_library

_HERE = os.path.dirname(os.path.abspath(__file__))
_SOURCE = os.path.join(_HERE, "csrc", "kernels.c")
_ABI_VERSION = 8                       # must equal C8_ABI_VERSION in kernels.c
_PATH_BITS = (("avx512", 4), ("avx2", 2), ("portable", 1))
_CFLAGS = ["-O3", "-std=c99", "-fno-trapping-math", "-ffp-contract=off"]   # as in setup.py

FP8_MAX = 57344.0      # largest finite E5M2 value: saturation target and the codec's scale
MAX_CODE = 0x7B
NAN_CODE = 0x7E
ROUNDINGS = ("nearest", "truncate", "oyama")

_lib = None
_lib_file = None
_available = []
_current = None


# --- finding or building the library ------------------------------------------------------------
def _compile_into_cache():
    """Path of the per-user cached build of kernels.c, compiled once (``engine.native``)."""
    return compile_cached(_SOURCE, "_kernels", _CFLAGS, [])


def _find_library():
    """(CDLL, file) of the best library available (``engine.native.load_library``: a packaged
    build, else a cached one compiled on first use), or (None, None) with a warning."""
    lib, where = load_library(_SOURCE, "_kernels", "c8_abi_version", _ABI_VERSION,
                              [(_CFLAGS, [])])
    if lib is None:
        warnings.warn(f"comm.kernels: could not build or load {_SOURCE}: {where}",
                      RuntimeWarning)
        return None, None
    return lib, where


def _signatures():
    """{function: (restype, argtypes)} of the library (``engine.native.declare``)."""
    u8 = f32 = ctypes.c_void_p                  # addresses; the names say what they point to
    n, real = ctypes.c_size_t, ctypes.c_float
    per_path = {"fp8_sum": [u8, u8, n], "fp8_sum_oyama": [u8, u8, n], "half_sum": [u8, u8, n],
                "encode": [f32, u8, n, real, ctypes.c_int], "decode": [u8, f32, n, real],
                "encode_ratio": [f32, f32, real, real, u8, n, ctypes.c_int],
                "decode_ratio": [u8, f32, real, real, f32, n]}
    table = {f"c8_{kind}_{path}": (None, argtypes)
             for path, _ in _PATH_BITS for kind, argtypes in per_path.items()}
    table.update({
        "c8_encode_half": (None, [f32, u8, n, real]),
        "c8_decode_half": (None, [u8, f32, n]),
        "c8_fp8_map": (None, [u8, u8, n]),
        "c8_cpu_paths": (ctypes.c_int, []),
        "c8_shm_arrive": (None, [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_void_p]),
        "c8_shm_wait": (ctypes.c_int, [ctypes.c_void_p, n, ctypes.c_int, ctypes.c_uint64,
                                       ctypes.c_void_p, ctypes.c_int64]),
        "c8_mpi_wait": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int,
                                       ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                                       ctypes.c_int64]),
    })
    return table


def _initialise():
    global _lib, _lib_file, _available
    _lib, _lib_file = _find_library()
    if _lib is None:
        warnings.warn("comm.kernels: no C kernels (no built library and no working C compiler);"
                      " using the NumPy fallback, which is several times slower", RuntimeWarning)
        _available = ["numpy"]
    else:
        declare(_lib, _signatures())
        bits = _lib.c8_cpu_paths()
        cpu = [name for name, bit in _PATH_BITS if bits & bit]
        _available = [name for name in cpu if name == "portable" or _self_check_ok(name)]
        _available.append("numpy")
    forced = os.environ.get("CAFFE8_KERNEL_PATH")
    if forced and forced not in _available:
        # An import must not fail on a setting meant for another machine: say so, go on.
        warnings.warn(f"comm.kernels: CAFFE8_KERNEL_PATH={forced!r} is not available here "
                      f"({_available}); using {_available[0]!r}", RuntimeWarning)
        forced = None
    use_path(forced or _available[0])


def self_check(name):
    """Names of the operations where C path ``name`` disagrees with the portable C path.

    Run at load for each SIMD path the CPU reports, so that a path never tested on this kind of
    CPU (e.g. AVX-512 on a machine the test suite never ran on) cannot silently corrupt sums:
    every fp8 pair, every half against a few values, the conversions on every half value, odd
    lengths for the loop tails. About 20 ms per path, once per process.
    """
    codes = numpy.arange(256, dtype=numpy.uint8)
    # [1:] and [3:]: odd lengths and unaligned starts, so the SIMD tails run too
    pairs = (numpy.repeat(codes, 256)[1:], numpy.tile(codes, 256)[1:])
    halves = numpy.arange(65536, dtype=numpy.uint16)
    against = numpy.float16([0.0, 1.0, -65504.0, 3.0e-5]).view(numpy.uint16)
    half_pairs = (numpy.tile(halves, 4)[3:], numpy.repeat(against, 65536)[3:])
    x = halves.view(numpy.float16).astype(numpy.float32)[:-3]      # odd length
    # ratios over every half value against weights from zero to huge (subnormal, zero, Inf and
    # NaN quotients; outputs from fp8 subnormals to saturation), odd length, unaligned
    with numpy.errstate(invalid="ignore"):                     # signalling NaNs in x
        w = numpy.roll(x, 12_345) * numpy.float32(1e-3)
    cases = {
        "fp8_sum": lambda fn: _run_sum(fn, *pairs),
        "fp8_sum_oyama": lambda fn: _run_sum(fn, *pairs),
        "half_sum": lambda fn: _run_sum(fn, *half_pairs),
        "encode_nearest": lambda fn: _run_encode(fn, x, 0),
        "encode_truncate": lambda fn: _run_encode(fn, x, 1),
        "decode": lambda fn: _run_decode(fn, codes.repeat(3)[1:]),
        "encode_ratio_nearest": lambda fn: _run_encode_ratio(fn, x[1:], w[1:], 0),
        "encode_ratio_truncate": lambda fn: _run_encode_ratio(fn, x[1:], w[1:], 1),
        "decode_ratio": lambda fn: _run_decode_ratio(fn, codes.repeat(3)[1:], w[1:768]),
    }
    failed = []
    for op, run in cases.items():
        kind = op.rsplit("_", 1)[0] if op.endswith(("_nearest", "_truncate")) else op
        mine = run(getattr(_lib, f"c8_{kind}_{name}"))
        ref = run(getattr(_lib, f"c8_{kind}_portable"))
        if not numpy.array_equal(_canonical_nan(mine), _canonical_nan(ref)):
            failed.append(op)
    return failed


def _canonical_nan(a):
    """Results with every NaN replaced by one code: which NaN payload an addition propagates
    differs between the SIMD instructions and compiled C, and does not matter."""
    a = a.copy()
    if a.dtype == numpy.uint8:
        a[(a & 0x7F) > 0x7C] = 0x7F
    elif a.dtype == numpy.uint16:
        a[(a & 0x7FFF) > 0x7C00] = 0x7FFF
    else:
        a = a.view(numpy.uint32)
        a[(a & 0x7FFFFFFF) > 0x7F800000] = 0x7FFFFFFF
    return a


def _run_sum(fn, src, dst):
    out = dst.copy()
    fn(src.ctypes.data, out.ctypes.data, src.size)
    return out


def _run_encode(fn, x, truncate):
    out = numpy.empty(x.size, numpy.uint8)
    fn(x.ctypes.data, out.ctypes.data, x.size, 0.75, truncate)
    return out


def _run_decode(fn, b):
    out = numpy.empty(b.size, numpy.float32)
    fn(b.ctypes.data, out.ctypes.data, b.size, 0.75)
    return out


def _run_encode_ratio(fn, g, w, truncate):
    out = numpy.empty(g.size, numpy.uint8)
    fn(g.ctypes.data, w.ctypes.data, 1e-5, 0.75, out.ctypes.data, g.size, truncate)
    return out


def _run_decode_ratio(fn, b, w):
    out = numpy.empty(b.size, numpy.float32)
    fn(b.ctypes.data, w.ctypes.data, 1e-5, 0.75, out.ctypes.data, b.size)
    return out


def _self_check_ok(name):
    failed = self_check(name)
    if failed:
        warnings.warn(f"comm.kernels: the {name} path disagrees with the portable C code on "
                      f"{failed}; disabled (please report: CPU {_cpu_name()})", RuntimeWarning)
    return not failed


def _cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return sys.platform


# --- path selection -----------------------------------------------------------------------------
def paths():
    """Names of the usable implementations on this CPU, best first (``"numpy"`` always last)."""
    return list(_available)


def use_path(name):
    """Force implementation ``name`` (one of ``paths()``) for all later calls."""
    global _current
    if name not in _available:
        raise ValueError(f"comm.kernels: unknown or unsupported path {name!r}; "
                         f"this CPU has {_available}")
    _current = name


def current_path():
    """The implementation in use."""
    return _current


def library_file():
    """File of the loaded C library, or None when running on the NumPy fallback."""
    return _lib_file


def shm_barrier_functions():
    """(arrive, wait) of the node-shared barrier (C, with release/acquire ordering and a futex),
    or None without the C library: ``arrive(own_counter_address, epoch, futex_address)``;
    ``wait(base_address, stride, n, epoch, futex_address, timeout_ns) -> 1`` once all n
    counters reached epoch, 0 at the timeout; it sleeps on the futex without the GIL."""
    if _lib is None:
        return None
    return _lib.c8_shm_arrive, _lib.c8_shm_wait


def mpi_wait_function():
    """``c8_mpi_wait(test, requests, n, status, timeout_ns, hot_ns, sleep_ns)``: MPI requests
    completed by the MPI library's own MPI_Test (``test``, its address) in a loop without the
    GIL (comm/csrc/kernels.c), or None without the C library."""
    return None if _lib is None else _lib.c8_mpi_wait


#: the functions compiled once per path (``c8_<name>_<path>``); the others are ``c8_<name>``
_PER_PATH = frozenset(("fp8_sum", "fp8_sum_oyama", "half_sum", "encode", "decode",
                       "encode_ratio", "decode_ratio"))


def _call(name, numpy_way, *args):
    """The current path's C function ``name`` on ``args`` (NumPy arrays passed as their
    addresses, the GIL released for the call), or ``numpy_way()`` on the "numpy" path."""
    if _current == "numpy":
        numpy_way()
        return
    fn = getattr(_lib, f"c8_{name}_{_current}" if name in _PER_PATH else f"c8_{name}")
    fn(*(a.ctypes.data if isinstance(a, numpy.ndarray) else a for a in args))


# --- argument checks ----------------------------------------------------------------------------
def check_rounding(rounding, what="rounding"):
    """ValueError naming ``what`` unless ``rounding`` is one of :data:`ROUNDINGS`."""
    if rounding not in ROUNDINGS:
        raise ValueError(f"{what}: {rounding!r}, valid: {', '.join(ROUNDINGS)}")


def _check(a, itemsize, what, writeable=False):
    if not isinstance(a, numpy.ndarray):
        raise TypeError(f"comm.kernels: {what} must be a numpy array, got {type(a).__name__}")
    if a.dtype.itemsize != itemsize or not a.flags.c_contiguous:
        raise ValueError(f"comm.kernels: {what} must be C-contiguous with {itemsize}-byte "
                         f"elements, got dtype {a.dtype} contiguous={a.flags.c_contiguous}")
    if writeable and not a.flags.writeable:
        raise ValueError(f"comm.kernels: {what} must be writeable")


def _check_float32(a, what, fn, writeable=False):
    _check(a, 4, what, writeable)
    if a.dtype != numpy.float32:
        raise ValueError(f"comm.kernels.{fn}: {what} must be float32, got {a.dtype}")


def _one_size(fn, **arrays):
    """The size the named ``arrays`` share; ValueError naming each size when they differ."""
    (first, n), *rest = [(name, a.size) for name, a in arrays.items()]
    if any(size != n for _, size in rest):
        raise ValueError(f"comm.kernels.{fn}: {first} has {n} elements, "
                         + ", ".join(f"{name} {size}" for name, size in rest))
    return n


def _check_pair(src, dst, itemsize, fn):
    _check(src, itemsize, "src")
    _check(dst, itemsize, "dst", writeable=True)
    return _one_size(fn, src=src, dst=dst)


# --- sums (the MPI reduction ops) ---------------------------------------------------------------
SUM_ROUNDINGS = ("nearest", "oyama")


def _check_sum_rounding(rounding):
    if rounding not in SUM_ROUNDINGS:
        raise ValueError(f"comm.kernels.fp8_sum: rounding must be one of {SUM_ROUNDINGS}, "
                         f"got {rounding!r}")


def fp8_sum(src, dst, rounding="nearest"):
    """``dst = sat(src + dst)`` on fp8 codes (uint8 arrays of equal size); returns dst.
    ``rounding``: "nearest" (nearest even) or "oyama" (Oyama et al.'s Algorithm 2, truncating)."""
    _check_sum_rounding(rounding)
    n = _check_pair(src, dst, 1, "fp8_sum")
    fp8_sum_ptr(src.ctypes.data, dst.ctypes.data, n, rounding)
    return dst


def fp8_sum_ptr(src_addr, dst_addr, n, rounding="nearest"):
    """fp8 sum on raw addresses of ``n`` bytes (for an MPI user op's in/inout buffers)."""
    if n > 0:
        _call("fp8_sum_oyama" if rounding == "oyama" else "fp8_sum",
             lambda: _numpy_fp8_sum(_from_address(src_addr, n, numpy.uint8),
                                    _from_address(dst_addr, n, numpy.uint8), rounding),
             src_addr, dst_addr, n)


def half_sum(src, dst):
    """``dst = sat(src + dst)`` on halves (uint16 or float16 arrays of equal size); returns dst."""
    n = _check_pair(src, dst, 2, "half_sum")
    half_sum_ptr(src.ctypes.data, dst.ctypes.data, n)
    return dst


def half_sum_ptr(src_addr, dst_addr, n):
    """Half sum on raw addresses of ``n`` 16-bit elements."""
    if n > 0:
        _call("half_sum", lambda: _numpy_half_sum(_from_address(src_addr, n, numpy.float16),
                                                 _from_address(dst_addr, n, numpy.float16)),
             src_addr, dst_addr, n)


# --- conversions --------------------------------------------------------------------------------
def encode_fp8(x_f32, out_u8, scale=1.0, rounding="nearest"):
    """``out_u8 = fp8(float32(x_f32 * scale))``; rounding "nearest" or "truncate" (Oyama et al.'s:
    half, nearest even, keep the upper byte); saturating. Returns out_u8."""
    check_rounding(rounding, "comm.kernels.encode_fp8: rounding")
    _check_float32(x_f32, "x_f32", "encode_fp8")
    _check(out_u8, 1, "out_u8", writeable=True)
    if _one_size("encode_fp8", x_f32=x_f32, out_u8=out_u8):
        _call("encode", lambda: _numpy_encode(x_f32, out_u8, scale, rounding), x_f32, out_u8,
             x_f32.size, float(scale), int(rounding != "nearest"))
    return out_u8


def decode_fp8(b, out_f32, scale=1.0):
    """``out_f32 = float32(fp8 value of b) * scale`` (scale applied in float32). Returns out_f32."""
    _check(b, 1, "b")
    _check_float32(out_f32, "out_f32", "decode_fp8", writeable=True)
    if _one_size("decode_fp8", b=b, out_f32=out_f32):
        _call("decode", lambda: _numpy_decode(b, out_f32, scale), b, out_f32, b.size,
             float(scale))
    return out_f32


def encode_half(x_f32, out_u16, divisor=1.0):
    """``out_u16 = float16 bits of float32(x_f32 / divisor)`` (nearest even; beyond the range
    inf, as NumPy's astype); NumPy's own conversion on the "numpy" path. Returns out_u16."""
    _check_float32(x_f32, "x_f32", "encode_half")
    _check(out_u16, 2, "out_u16", writeable=True)
    if _one_size("encode_half", x_f32=x_f32, out_u16=out_u16):
        _call("encode_half", lambda: _numpy_encode_half(x_f32, out_u16, divisor), x_f32,
             out_u16, x_f32.size, float(divisor))
    return out_u16


def decode_half(b_u16, out_f32):
    """``out_f32 = float32 value of the float16 bits b_u16`` (exact). Returns out_f32."""
    _check(b_u16, 2, "b_u16")
    _check_float32(out_f32, "out_f32", "decode_half", writeable=True)
    if _one_size("decode_half", b_u16=b_u16, out_f32=out_f32):
        _call("decode_half", lambda: _numpy_decode_half(b_u16, out_f32), b_u16, out_f32,
             b_u16.size)
    return out_f32


def fp8_map(table, x):
    """``x[i] = table[x[i]]`` in place for fp8 codes ``x`` (uint8) and a 256-entry uint8
    ``table``, in one pass and one call. Returns x."""
    _check(x, 1, "x", writeable=True)
    table = numpy.ascontiguousarray(table, numpy.uint8)
    if table.size != 256:
        raise ValueError(f"comm.kernels.fp8_map: the table needs 256 entries, got {table.size}")
    if x.size:
        _call("fp8_map", lambda: _numpy_map(table, x), table, x, x.size)
    return x


def encode_ratio_fp8(g, w, eps, scale, out, rounding="nearest"):
    """``out = fp8(float32(float32(g / float32(|w| + eps)) * scale))``: the fp8 codec's relative
    encode in one pass (float32 ``g``, ``w``; uint8 ``out``; all the same size). ``eps`` and
    ``scale`` are used as float32; rounding and saturation as in :func:`encode_fp8`. Returns out.
    """
    check_rounding(rounding, "comm.kernels.encode_ratio_fp8: rounding")
    _check_float32(g, "g", "encode_ratio_fp8")
    _check_float32(w, "w", "encode_ratio_fp8")
    _check(out, 1, "out", writeable=True)
    if _one_size("encode_ratio_fp8", g=g, w=w, out=out):
        _call("encode_ratio", lambda: _numpy_encode_ratio(g, w, eps, scale, out, rounding), g, w,
             float(eps), float(scale), out, g.size, int(rounding != "nearest"))
    return out


def decode_ratio_fp8(b, w, eps, inv_scale, out):
    """``out = float32(float32(fp8 value of b * inv_scale) * float32(|w| + eps))``: the fp8
    codec's relative decode in one pass (uint8 ``b``; float32 ``w``, ``out``). Returns out."""
    _check(b, 1, "b")
    _check_float32(w, "w", "decode_ratio_fp8")
    _check_float32(out, "out", "decode_ratio_fp8", writeable=True)
    if _one_size("decode_ratio_fp8", b=b, w=w, out=out):
        _call("decode_ratio", lambda: _numpy_decode_ratio(b, w, eps, inv_scale, out), b, w,
             float(eps), float(inv_scale), out, b.size)
    return out


# --- NumPy fallback of the conversions ----------------------------------------------------------
def encode_numpy(x, rounding="nearest"):
    """NumPy float32 array -> uint8 fp8 codes, without the C kernels.

    Works on the float32 bit pattern (the same steps as the C and CUDA kernels): normal results
    round at bit 21 with the carry trick; below 2**-14 adding 128.0 puts fp8's subnormal quantum
    2**-16 at float32's last place, so the FPU rounds to nearest even. (NumPy's own float16 cast
    is slower than all of this and would round twice.)
    """
    check_rounding(rounding, "comm.kernels.encode_numpy: rounding")
    x = numpy.ascontiguousarray(x, dtype=numpy.float32)
    if rounding in ("truncate", "oyama"):  # Oyama et al.'s rounding converts as "truncate"
        return formats.FP8_E5M2.encode(x, "truncate")
    u = x.view(numpy.uint32)
    a = u & numpy.uint32(0x7FFFFFFF)
    c = a >> 21
    c &= 1
    c += 0xFFFFF
    c += a
    c >>= 21
    c -= 448                               # rebias 127 -> 15; wraps for tiny a, replaced next
    small = a < 0x38800000
    sub = a[small].view(numpy.float32) + numpy.float32(128.0)
    sub = sub.view(numpy.uint32)
    sub -= 0x43000000
    c[small] = sub
    numpy.minimum(c, MAX_CODE, out=c)      # saturate, inf included
    c[a > 0x7F800000] = NAN_CODE
    code = c.astype(numpy.uint8)
    code |= (u >> 24).astype(numpy.uint8) & 0x80
    return code


def decode_numpy(b):
    """NumPy uint8 fp8 codes -> float32 (256-entry table)."""
    return formats.FP8_E5M2.table(numpy)[numpy.asarray(b).view(numpy.uint8)]


def _numpy_encode(x, out, scale, rounding):
    y = x if scale == 1.0 else x * numpy.float32(scale)
    out.reshape(-1).view(numpy.uint8)[:] = encode_numpy(y.reshape(-1), rounding)


def _numpy_decode(b, out, scale):
    v = decode_numpy(b.reshape(-1).view(numpy.uint8))
    out.reshape(-1)[:] = v if scale == 1.0 else v * numpy.float32(scale)


def _numpy_encode_half(x, out, divisor):
    out.reshape(-1).view(numpy.float16)[:] = (
        x.reshape(-1) / numpy.float32(divisor)).astype(numpy.float16)


def _numpy_decode_half(b, out):
    out.reshape(-1)[:] = b.reshape(-1).view(numpy.float16).astype(numpy.float32)


def _numpy_map(table, x):
    flat = x.reshape(-1).view(numpy.uint8)
    flat[...] = table[flat]


def _numpy_encode_ratio(g, w, eps, scale, out, rounding):
    with numpy.errstate(divide="ignore", over="ignore", invalid="ignore"):
        d = g.reshape(-1) / (numpy.abs(w.reshape(-1)) + numpy.float32(eps))
        d *= numpy.float32(scale)
    out.reshape(-1).view(numpy.uint8)[:] = encode_numpy(d, rounding)


def _numpy_decode_ratio(b, w, eps, inv_scale, out):
    with numpy.errstate(over="ignore", invalid="ignore"):
        v = decode_numpy(b.reshape(-1).view(numpy.uint8)) * numpy.float32(inv_scale)
        v *= numpy.abs(w.reshape(-1)) + numpy.float32(eps)
    out.reshape(-1)[:] = v


# --- NumPy fallback of the sums -----------------------------------------------------------------
def _from_address(addr, n, dtype):
    buf = (ctypes.c_char * (n * numpy.dtype(dtype).itemsize)).from_address(addr)
    return numpy.frombuffer(buf, dtype=dtype)


def _numpy_fp8_sum(src, dst, rounding="nearest"):
    with numpy.errstate(invalid="ignore"):                  # inf + -inf inputs: NaN, as in C
        total = decode_numpy(src) + decode_numpy(dst)      # float32: kernels.c on rounding
    # Oyama et al.'s sum converts as "truncate" does: float32 -> half (nearest even), keep the
    # upper byte
    dst[:] = encode_numpy(total, "truncate" if rounding == "oyama" else "nearest")


def _numpy_half_sum(src, dst):
    with numpy.errstate(over="ignore", invalid="ignore"):   # overflow saturates below
        total = src.astype(numpy.float32) + dst.astype(numpy.float32)
        s = total.astype(numpy.float16)
    bits = s.view(numpy.uint16)
    bits[(bits & 0x7FFF) == 0x7C00] -= 1                      # ±inf → ±65504
    dst[:] = s


_initialise()

if __name__ == "__main__":  # pragma: no cover - `python -m caffe8.comm.kernels` reports the setup
    print(f"library: {_lib_file}\npaths: {paths()}\ncurrent: {current_path()}", file=sys.stdout)
