"""GFLOP/s of the host GEMM: NumPy's BLAS against caffe8's OpenBLAS (engine.blas), interleaved.

    python -m studies.host.gemm_bench [--repeat 5] [--csv runs/gemm_bench.csv]

Shapes: a square 2048³ product and the per-image / per-batch products of CaffeNet at batch 16
(conv1, conv2 per group, conv3, fc6 forward, fc6 weight gradient). Each shape runs both
libraries in turn ``--repeat`` times (median seconds); the two thread pools get a pause between
them so neither spins while the other works. Prints the core each library uses.
"""
import argparse
import csv
import ctypes
import os
import statistics
import sys
import time

import numpy

from caffe8.engine import blas

SHAPES = [("square", 2048, 2048, 2048),
          ("conv1 b16 (per image)", 96, 363, 3025),
          ("conv2 b16 (per image, group)", 128, 1200, 729),
          ("conv3 b16 (batch)", 384, 2304, 169 * 16),
          ("fc6 forward b16", 16, 9216, 4096),
          ("fc6 weight gradient b16", 4096, 16, 9216)]


def numpy_core():
    """The core NumPy's OpenBLAS runs (from the library already in the process), or '?'."""
    with open("/proc/self/maps") as f:
        paths = {line.split()[-1] for line in f if "openblas" in line and ".so" in line}
    for path in paths:
        if "scipy_openblas32" in path:
            continue        # caffe8's own instance
        lib = ctypes.CDLL(path)
        for name in ("scipy_openblas_get_corename64_", "openblas_get_corename64_",
                     "scipy_openblas_get_corename", "openblas_get_corename"):
            if hasattr(lib, name):
                fn = getattr(lib, name)
                fn.restype = ctypes.c_char_p
                return fn().decode()
    return "?"


def timed(fn, repeat):
    fn()
    out = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return statistics.median(out)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--csv", default=None)
    args = p.parse_args(argv)
    rng = numpy.random.default_rng(0)
    numpy.ones((64, 64), numpy.float32) @ numpy.ones((64, 64), numpy.float32)  # load NumPy's BLAS
    print(f"NumPy's BLAS core: {numpy_core()} (OPENBLAS_CORETYPE="
          f"{os.environ.get('OPENBLAS_CORETYPE', 'unset')}); {blas.describe()}")
    rows = []
    for name, m, k, n in SHAPES:
        a = rng.standard_normal((m, k), dtype=numpy.float32)
        b = rng.standard_normal((k, n), dtype=numpy.float32)
        out = numpy.empty((m, n), numpy.float32)
        rates = {}
        for side, fn in (("numpy", lambda: numpy.matmul(a, b, out=out)),
                         ("caffe8", lambda: blas.matmul(a, b, out=out))):
            time.sleep(0.2)
            rates[side] = 2.0 * m * k * n / timed(fn, args.repeat) / 1e9
        rows.append(dict(shape=name, m=m, k=k, n=n, numpy_gflops=round(rates["numpy"], 1),
                         caffe8_gflops=round(rates["caffe8"], 1),
                         ratio=round(rates["caffe8"] / rates["numpy"], 2)))
        print(f"{name:30s} {m:5d}x{k:5d}x{n:6d}  numpy {rates['numpy']:7.1f}  "
              f"caffe8 {rates['caffe8']:7.1f} GFLOP/s  ({rows[-1]['ratio']:.2f}x)", flush=True)
    if args.csv:
        os.makedirs(os.path.dirname(os.path.abspath(args.csv)), exist_ok=True)
        with open(args.csv, "w", newline="") as f:
            w = csv.DictWriter(f, list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
