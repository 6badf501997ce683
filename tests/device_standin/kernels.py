"""``cupy.ElementwiseKernel`` of the stand-in: the kernel's own CUDA text compiled as C for the
host, so the arithmetic the device path runs is the text the GPU compiles (comm/fp8.py's sums and
conversions, engine/backend.py's random numbers), not a NumPy re-statement of it.

:data:`HOST_SHIM` stands in for the CUDA intrinsics the texts use (``__device__``,
``__forceinline__``, ``__float_as_uint``, ``__fadd_rn``, ...); the C is compiled with
``-ffp-contract=off`` (no fused multiply-adds the text did not write) into a cache folder
shared by the processes of a job (one compile per text, under a file lock). A kernel runs
element by element over its broadcast arguments, on the current stream: it reads its array
inputs and writes its outputs there (ordering.Op), so an unordered launch fails like any other
access. Parameters are ``type name`` pairs; a one-letter type (``T``) takes the dtype of the
first argument that has it. CUDA's ``-ftz`` (flush of float32 subnormals in each float32
instruction) is not reproduced: comm/fp8.py's texts keep subnormals by construction, and
tests/comm/test_fp8_denormal.py checks them under a flushing shim.
"""
import ctypes
import fcntl
import hashlib
import os
import shutil
import subprocess
import tempfile

import numpy

from tests.device_standin import ordering

HOST_SHIM = r"""
#include <math.h>
#include <stddef.h>
#include <string.h>
#define __device__ static
#define __forceinline__ inline
static unsigned int __float_as_uint(float f) { unsigned int u; memcpy(&u, &f, 4); return u; }
static float __uint_as_float(unsigned int u) { float f; memcpy(&f, &u, 4); return f; }
static float __fadd_rn(float a, float b) { return a + b; }
static float __fmul_rn(float a, float b) { return a * b; }
static float __fdiv_rn(float a, float b) { return a / b; }
static long long __double_as_longlong(double d) { long long u; memcpy(&u, &d, 8); return u; }
static double __longlong_as_double(long long u) { double d; memcpy(&d, &u, 8); return d; }
static unsigned long long __umul64hi(unsigned long long a, unsigned long long b) {
    return (unsigned long long)(((unsigned __int128)a * b) >> 64); }
"""
C_TYPES = {"float32": "float", "float64": "double", "uint8": "unsigned char",
           "uint16": "unsigned short", "uint32": "unsigned int", "uint64": "unsigned long long",
           "int8": "signed char", "int16": "short", "int32": "int", "int64": "long long",
           "bool": "_Bool"}
CFLAGS = ["-O2", "-std=gnu99", "-fPIC", "-shared", "-ffp-contract=off", "-fno-fast-math"]
CACHE = os.path.join(tempfile.gettempdir(), f"caffe8-standin-kernels-{os.getuid()}")


def parse_params(text):
    """[(type, name)] of ``"float32 x, uint8 y"``; a ``raw`` parameter is not supported."""
    out = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        words = part.split()
        if len(words) != 2:
            raise NotImplementedError(f"stand-in ElementwiseKernel: parameter {part!r} "
                                      f"(raw and other forms are not supported)")
        out.append((words[0], words[1]))
    return out


def compile_library(source):
    """A ctypes library of the C ``source``, compiled once into :data:`CACHE`."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise RuntimeError("stand-in device: no C compiler for the kernels' CUDA text")
    os.makedirs(CACHE, exist_ok=True)
    digest = hashlib.sha1((source + " ".join(CFLAGS)).encode()).hexdigest()[:20]
    lib = os.path.join(CACHE, f"k{digest}.so")
    if not os.path.exists(lib):
        with open(os.path.join(CACHE, f"k{digest}.lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not os.path.exists(lib):
                src = os.path.join(CACHE, f"k{digest}.{os.getpid()}.c")
                with open(src, "w") as f:
                    f.write(source)
                tmp = lib + f".{os.getpid()}"
                done = subprocess.run([cc, *CFLAGS, src, "-o", tmp, "-lm"],
                                      capture_output=True, text=True)
                os.unlink(src)
                if done.returncode:
                    raise RuntimeError(f"stand-in device: the kernel text does not compile as "
                                       f"C:\n{done.stderr[-3000:]}")
                os.replace(tmp, lib)
    return ctypes.CDLL(lib)


class ElementwiseKernel:
    """``cupy.ElementwiseKernel(in_params, out_params, operation, name, preamble=...)``."""

    def __init__(self, in_params, out_params, operation, name="kernel", reduce_dims=True,
                 preamble="", **options):
        self.inputs, self.outputs = parse_params(in_params), parse_params(out_params)
        self.operation, self.name, self.preamble = operation, name, preamble
        self._compiled = {}

    def _types(self, args):
        """{placeholder: dtype name} bound from the arguments, and the C type of each param."""
        bound = {}
        for (t, _), a in zip(self.inputs + self.outputs, args):
            if t not in C_TYPES and a is not None and t not in bound:
                bound[t] = numpy.dtype(getattr(a, "dtype", type(a))).name
        return bound

    def _function(self, bound):
        key = tuple(sorted(bound.items()))
        fn = self._compiled.get(key)
        if fn is None:
            typedefs = "".join(f"typedef {C_TYPES[d]} {t};\n" for t, d in bound.items())
            ctype = {t: C_TYPES.get(t) or C_TYPES[bound[t]] for t, _ in
                     self.inputs + self.outputs}
            params = self.inputs + self.outputs
            args = ", ".join(f"{ctype[t]} *{n}_" for t, n in params)
            loads = " ".join(f"{ctype[t]} {n} = {n}_[i];" for t, n in params)
            stores = " ".join(f"{n}_[i] = {n};" for _, n in self.outputs)
            source = (f"{HOST_SHIM}\n{typedefs}{self.preamble}\n"
                      f"void {self.name}({args}, long long n) {{\n"
                      f"  for (long long i = 0; i < n; i++) {{ {loads} {self.operation}; "
                      f"{stores} }}\n}}\n")
            fn = getattr(compile_library(source), self.name)
            fn.restype = None
            self._compiled[key] = fn
        return fn

    def __call__(self, *args, size=None, block_size=None, stream=None):
        from tests.device_standin import arrays
        n_in = len(self.inputs)
        if len(args) not in (n_in, n_in + len(self.outputs)):
            raise TypeError(f"{self.name}: {n_in} inputs and optionally "
                            f"{len(self.outputs)} outputs, got {len(args)} arguments")
        ins, outs = list(args[:n_in]), list(args[n_in:])
        for a in ins:
            if isinstance(a, numpy.ndarray) and a.ndim:
                raise TypeError(f"{self.name}: a host array among the kernel's arguments")
        bound = self._types(ins + outs)
        dtype = {t: numpy.dtype(t if t in C_TYPES else bound[t])
                 for t, _ in self.inputs + self.outputs}
        shape = numpy.broadcast_shapes(*[numpy.shape(a._v if isinstance(a, arrays.ndarray)
                                                     else a) for a in ins + outs])
        if not outs:
            outs = [arrays.empty(shape, dtype[t]) for t, _ in self.outputs]
        op = ordering.Op(f"kernel {self.name}")
        op.access(reads=[arrays.span_of(a, op) for a in ins if isinstance(a, arrays.ndarray)],
                  writes=[arrays.span_of(o, op) for o in outs])
        n = int(numpy.prod(shape, dtype=numpy.int64))
        host_ins = [numpy.ascontiguousarray(numpy.broadcast_to(
            a._v if isinstance(a, arrays.ndarray) else numpy.asarray(a, dtype[t]), shape),
            dtype[t]) for a, (t, _) in zip(ins, self.inputs)]
        host_outs = [numpy.ascontiguousarray(numpy.broadcast_to(o._v, shape), dtype[t])
                     for o, (t, _) in zip(outs, self.outputs)]
        self._function(bound)(*[a.ctypes.data_as(ctypes.c_void_p)
                                for a in host_ins + host_outs], ctypes.c_longlong(n))
        for o, h in zip(outs, host_outs):
            o._v[...] = h
        return outs[0] if len(outs) == 1 else tuple(outs)
