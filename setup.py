"""Build of the C kernels only; all metadata lives in setup.cfg.

``caffe8.layers._layer_kernels`` is the same kind of library for the layers' host kernels (im2col,
pooling, LRN, ...; layers/native.py loads it through engine/native.py). Its hot loops carry
target_clones (AVX2 and baseline, chosen at load), so it also needs no -march. Also optional:
without it layers.native compiles into ~/.cache/caffe8 at first use or falls back to NumPy.

``caffe8.solvers._solver_kernels`` (solvers/native.py) holds the fused SGD step and the finiteness test
of the update path, built and found the same way.

``caffe8.comm._kernels`` is a plain shared library (no Python C API) that comm/kernels.py loads with
ctypes. It is built with -O3 -fno-trapping-math -ffp-contract=off (see kernels.c) and without
-march: the AVX-512 and AVX2+F16C loops carry their own function-level target attributes and are
chosen at run time, so one build runs on any x86-64 CPU. ``optional=True``: without a compiler the install
still succeeds, and comm.kernels then compiles into ~/.cache/caffe8 at first use or falls back
to NumPy.

``caffe8.engine._gemm_pool`` (engine/gemm_pool.py) runs the host GEMM's blocks on a pool of C
threads (POSIX threads, -pthread), built and found the same way; without it the blocks run on
Python threads.

All four include ``engine/csrc/c8_kernels.h``, the dispatch block they share (``KERNEL``'s
target_clones, ``C8_X86``, ``idx``, ``C8_ABI``): an include directory here, installed with the
sources (package_data) for engine/native.py's run-time build.
"""
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


_INCLUDE = ["engine/csrc"]          # = engine.native.INCLUDE_DIR


class build_plain_library(build_ext):
    """build_ext for a ctypes library: there is no PyInit_ symbol to export."""

    def get_export_symbols(self, ext):
        return []


setup(
    ext_modules=[Extension("caffe8.comm._kernels", sources=["comm/csrc/kernels.c"],
                           extra_compile_args=["-O3", "-std=c99", "-fno-trapping-math",
                                               "-ffp-contract=off"],
                           include_dirs=_INCLUDE, optional=True),
                 Extension("caffe8.solvers._solver_kernels", sources=["solvers/csrc/solver_kernels.c"],
                           extra_compile_args=["-O3", "-std=c99", "-fno-trapping-math",
                                               "-ffp-contract=off"],    # = solvers.native.CFLAGS
                           include_dirs=_INCLUDE, optional=True),
                 Extension("caffe8.layers._layer_kernels", sources=["layers/csrc/layer_kernels.c"],
                           extra_compile_args=["-O3", "-std=c99", "-fno-trapping-math",
                                               "-ffp-contract=off", "-pthread"],  # = layers.native.CFLAGS
                           extra_link_args=["-pthread"],
                           include_dirs=_INCLUDE, optional=True),
                 Extension("caffe8.engine._gemm_pool", sources=["engine/csrc/gemm_pool.c"],
                           extra_compile_args=["-O2", "-std=c99", "-pthread"],  # = gemm_pool.CFLAGS
                           extra_link_args=["-pthread"],
                           include_dirs=_INCLUDE, optional=True)],
    # the sources travel for the run-time fallback
    package_data={"caffe8.comm": ["csrc/*.c"], "caffe8.layers": ["csrc/*.c"],
                  "caffe8.engine": ["csrc/*.h", "csrc/*.c"], "caffe8.engine.proto": ["caffe.proto"],
                  "caffe8.solvers": ["csrc/*.c"]},
    cmdclass={"build_ext": build_plain_library},
)
