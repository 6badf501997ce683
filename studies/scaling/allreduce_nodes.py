#!/usr/bin/env python
"""Allreduce time vs emulated node count at a fixed vector size (Oyama et al.'s figure 4).

Oyama, Nomura, Sato and Matsuoka ("reducing communication in data-parallel deep learning with
floating-point numbers smaller than single precision", figure 4) time the allreduce of 256 M
elements on 1, 2, 4, ..., 32 nodes with one process each: the time approaches a constant as the
node count grows (reduce-scatter + allgather cost ~ n (p - 1) / p) and fp8 is at least 3.19x
faster than float with MPI_SUM at every count. Here each process is one emulated node
(``--processes-per-node 1``) on this one machine: ``caffe8 bench`` (comm/bench.py) under
``mpiexec -n P`` for every P, then one CSV and one plot of time vs P.

Usage (from the repository root)::

    python -m studies.scaling.allreduce_nodes --procs 2,4,8 --elements 4M --repeat 5 \
        --runs runs/allreduce_nodes --out docs/figures

Writes OUT/allreduce_time_vs_nodes.{csv,png}: codec, processes, elements, median and min
seconds (the slowest rank's time per repetition), the fp8 speedup over fp32, and
(p - 1) / p, the shape the paper's explanation predicts.
"""
import argparse
import csv
import os
import sys

from caffe8.comm.bench import STEM
from studies._runs import (REPO, _default_mpiexec, int_list, label_axes, pyplot, run_job,
                           save_figure, write_rows)

FIELDS = ("codec", "processes", "elements", "median_seconds", "min_seconds",
          "fp8_speedup_over_fp32", "ring_shape")


def bench_command(p, elements, repeat, out_dir, python, mpiexec):
    """``caffe8 bench`` (comm.bench) on ``p`` processes, its CSVs into ``out_dir``."""
    return [mpiexec, "-n", str(p), python, "-m", "caffe8.cli", "bench",
            "--elements", elements, "--codecs", "fp32,fp16,fp8", "--repeat", str(repeat),
            "--processes-per-node", "1", "--out", out_dir]


def combine(per_p):
    """Rows of every P's bench CSV plus the fp8/fp32 speedup and (p - 1) / p."""
    rows = []
    for p, bench_rows in sorted(per_p.items()):
        by = {r["codec"]: r for r in bench_rows}
        speed = (float(by["fp32"]["median_seconds"]) / float(by["fp8"]["median_seconds"])
                 if "fp32" in by and "fp8" in by else "")
        for r in bench_rows:
            rows.append({"codec": r["codec"], "processes": p, "elements": int(r["elements"]),
                         "median_seconds": float(r["median_seconds"]),
                         "min_seconds": float(r["min_seconds"]),
                         "fp8_speedup_over_fp32": speed, "ring_shape": (p - 1) / p})
    return rows


def read_bench(path):
    with open(path, encoding="utf-8") as f:
        return list(csv.DictReader(f))


def plot(rows, path, title):
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4.3))
    for codec, color in (("fp32", "C0"), ("fp16", "C2"), ("fp8", "C3")):
        pts = sorted((r["processes"], r["median_seconds"]) for r in rows if r["codec"] == codec)
        if pts:
            ax.plot([p for p, _ in pts], [1e3 * t for _, t in pts], "o-", color=color,
                    label=codec)
    ax.set_xscale("log", base=2)
    label_axes(ax, xlabel="processes (one emulated node each)",
               ylabel="allreduce time, median (ms)", title=title, title_size=9, legend_size=8)
    save_figure(fig, path)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--procs", type=int_list, default=[2, 4, 8])
    ap.add_argument("--elements", default="4M")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--runs", default=os.path.join("runs", "allreduce_nodes"))
    ap.add_argument("--out", default=os.path.join(REPO, "docs", "figures"))
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--mpiexec", default=_default_mpiexec())
    args = ap.parse_args(argv)
    os.makedirs(args.runs, exist_ok=True)
    os.makedirs(args.out, exist_ok=True)
    per_p = {}
    for p in args.procs:
        bench_dir = os.path.abspath(os.path.join(args.runs, f"p{p}"))
        cmd = bench_command(p, args.elements, args.repeat, bench_dir, args.python, args.mpiexec)
        print(" ".join(cmd), flush=True)
        run_job(cmd, args.timeout, os.path.join(args.runs, f"p{p}.log"))
        per_p[p] = read_bench(os.path.join(bench_dir, STEM + ".csv"))
    rows = combine(per_p)
    path = os.path.join(args.out, "allreduce_time_vs_nodes.csv")
    write_rows(rows, FIELDS, path)
    plot(rows, path[:-4] + ".png", f"allreduce of {args.elements} elements vs emulated nodes "
                                   f"(Oyama et al.'s figure 4 shape)")
    for r in rows:
        print(f"P={r['processes']} {r['codec']:5s} median {1e3 * r['median_seconds']:8.2f} ms "
              f"(fp8 speedup over fp32 {r['fp8_speedup_over_fp32']:.2f})")
    print(f"wrote {path} and its .png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
