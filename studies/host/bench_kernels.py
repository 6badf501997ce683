"""Throughput of the host fp8/half kernels on every CPU path, in G elements per second.

    python -m studies.host.bench_kernels [--n 16777216] [--repeat 7] [--csv runs/bench_kernels.csv]

Each row is one operation on one path (single thread, best of --repeat runs, arrays of --n
elements; rates from wall-clock and from thread CPU time): fp8 sum (dst = sat(src + dst), the
MPI op), half sum, float32 -> fp8 encode (nearest and truncate), fp8 -> float32 decode, and the fp8
codec's relative conversions: ``encode_ratio_fused`` / ``decode_ratio_fused`` (one pass:
comm.kernels.encode_ratio_fp8 / decode_ratio_fp8) against ``*_unfused``, the sequence the codec
ran before (D = g / (|W| + eps) in NumPy, then the encode kernel; the decode kernel, then
``*= |W| + eps`` in NumPy), with the fused/unfused speed-up printed per path. NumPy
rows for comparison: float32 and float16 in-place add (what MPI_SUM / a NumPy half op would do
per element) and ml_dtypes' float32 -> float8_e5m2 cast.
"""
import argparse
import csv
import os
import platform
import time

import numpy

from caffe8.comm import kernels


def best_seconds(fn, repeat):
    """Shortest (wall, thread CPU) time of ``repeat`` calls, after one warm-up call.

    The CPU time of the calling thread leaves out time spent descheduled, which is what a wall
    clock mostly measures on a shared 2-core machine; on an idle machine the two agree.
    """
    fn()
    wall = cpu = float("inf")
    for _ in range(repeat):
        c0, t0 = time.thread_time(), time.perf_counter()
        fn()
        wall = min(wall, time.perf_counter() - t0)
        cpu = min(cpu, time.thread_time() - c0)
    return wall, max(cpu, 1e-9)


def kernel_ops(n, rng):
    """(name, callable) pairs for the current kernels path on fresh random data."""
    codes = rng.integers(0, 256, n, dtype=numpy.uint8)
    codes[(codes & 0x7C) == 0x7C] = 0x3C                      # finite inputs, as in training
    dst8 = numpy.roll(codes, 1)
    halves = rng.standard_normal(n).astype(numpy.float16)
    dst16 = numpy.roll(halves, 1)
    x = rng.standard_normal(n).astype(numpy.float32)
    out8 = numpy.empty(n, numpy.uint8)
    out32 = numpy.empty(n, numpy.float32)
    w = (rng.standard_normal(n) * 0.05).astype(numpy.float32)
    eps = numpy.float32(1e-5)

    def encode_unfused():
        kernels.encode_fp8(x / (numpy.abs(w) + eps), out8, scale=3.0)

    def decode_unfused():
        d = kernels.decode_fp8(codes, numpy.empty(n, numpy.float32), scale=0.5)
        d *= numpy.abs(w) + eps
        out32[:] = d

    return [
        ("fp8_sum", lambda: kernels.fp8_sum(codes, dst8)),
        ("half_sum", lambda: kernels.half_sum(halves, dst16)),
        ("encode_nearest", lambda: kernels.encode_fp8(x, out8, scale=3.0)),
        ("encode_truncate", lambda: kernels.encode_fp8(x, out8, scale=3.0, rounding="truncate")),
        ("decode", lambda: kernels.decode_fp8(codes, out32, scale=0.5)),
        ("encode_ratio_fused", lambda: kernels.encode_ratio_fp8(x, w, eps, 3.0, out8)),
        ("encode_ratio_unfused", encode_unfused),
        ("decode_ratio_fused", lambda: kernels.decode_ratio_fp8(codes, w, eps, 0.5, out32)),
        ("decode_ratio_unfused", decode_unfused),
    ]


def numpy_ops(n, rng):
    """Plain NumPy reference operations."""
    a32 = rng.standard_normal(n).astype(numpy.float32)
    b32 = a32[::-1].copy()
    a16, b16 = a32.astype(numpy.float16), b32.astype(numpy.float16)
    ops = [("float32_add", lambda: numpy.add(a32, b32, out=b32)),
           ("float16_add", lambda: numpy.add(a16, b16, out=b16))]
    try:
        import ml_dtypes
        ops.append(("ml_dtypes_encode", lambda: a32.astype(ml_dtypes.float8_e5m2)))
    except ImportError:
        pass
    return ops


def rates(n, seconds):
    """G elements/s for each of the (wall, cpu) times."""
    return tuple(n / t / 1e9 for t in seconds)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1 << 24, help="elements per array")
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--csv", default=os.path.join("runs", "bench_kernels.csv"))
    args = ap.parse_args(argv)

    rng = numpy.random.default_rng(0)
    rows = []
    saved = kernels.current_path()
    for path in kernels.paths():
        kernels.use_path(path)
        for op, fn in kernel_ops(args.n, rng):
            rows.append((path, op, *rates(args.n, best_seconds(fn, args.repeat))))
    kernels.use_path(saved)
    for op, fn in numpy_ops(args.n, rng):
        rows.append(("numpy-op", op, *rates(args.n, best_seconds(fn, args.repeat))))

    print(f"# {platform.processor() or platform.machine()}, n = {args.n}, best of {args.repeat},"
          f" library {kernels.library_file()}")
    print(f"{'path':<10} {'operation':<20} {'G elem/s wall':>14} {'G elem/s cpu':>13}")
    for path, op, wall, cpu in rows:
        print(f"{path:<10} {op:<20} {wall:14.3f} {cpu:13.3f}")
    by = {(p, o): (r, c) for p, o, r, c in rows}
    for path in kernels.paths():
        for kind in ("encode_ratio", "decode_ratio"):
            fused, unfused = by[(path, kind + "_fused")], by[(path, kind + "_unfused")]
            print(f"{path:<10} {kind} fused / unfused speed: wall {fused[0] / unfused[0]:.2f}x, "
                  f"cpu {fused[1] / unfused[1]:.2f}x")
    if args.csv:
        os.makedirs(os.path.dirname(args.csv) or ".", exist_ok=True)
        with open(args.csv, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["path", "operation", "n", "g_elements_per_s_wall",
                        "g_elements_per_s_thread_cpu"])
            w.writerows((p, o, args.n, f"{r:.4f}", f"{c:.4f}") for p, o, r, c in rows)
        print(f"wrote {args.csv}")


if __name__ == "__main__":
    main()
