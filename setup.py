"""Build of the C kernels only; all metadata lives in setup.cfg.

``comm._kernels`` is a plain shared library (no Python C API) that comm/kernels.py loads with
ctypes. It is built with -O3 -fno-trapping-math -ffp-contract=off (see kernels.c) and without
-march: the AVX-512 and AVX2+F16C loops carry their own function-level target attributes and are
chosen at run time, so one build runs on any x86-64 CPU. ``optional=True``: without a compiler the install
still succeeds, and comm.kernels then compiles into ~/.cache/caffe8 at first use or falls back
to NumPy.
"""
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


class build_plain_library(build_ext):
    """build_ext for a ctypes library: there is no PyInit_ symbol to export."""

    def get_export_symbols(self, ext):
        return []


setup(
    ext_modules=[Extension("comm._kernels", sources=["comm/csrc/kernels.c"],
                           extra_compile_args=["-O3", "-std=c99", "-fno-trapping-math",
                                               "-ffp-contract=off"],
                           optional=True)],
    package_data={"comm": ["csrc/*.c"]},      # the source travels for the run-time fallback
    cmdclass={"build_ext": build_plain_library},
)
