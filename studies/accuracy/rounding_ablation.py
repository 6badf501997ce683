#!/usr/bin/env python
"""Rounding ablation: Oyama et al.'s truncating fp8 sum ("oyama") against nearest even.

Oyama, Nomura, Sato and Matsuoka ("reducing communication in data-parallel deep learning with
floating-point numbers smaller than single precision") sum fp8 values by converting to float32,
adding, converting to half with nearest even and keeping the upper byte: truncation toward zero
at fp8 precision. caffe8's default rounds to nearest even. Two measurements:

1. Sum bias. Chains of k = 2, 4, 8 fp8 addends, ((x1 + x2) + x3) + ..., summed with
   ``comm.fp8.add`` (the MPI op's own code) in each mode, against the exact (float64) sum of the
   same fp8 addends ("sum" columns: the sum op alone) and of the float32 values before the
   conversion ("total" columns: conversion + sum). Per row: relative bias
   ``sum(sign(exact) * (s - exact)) / sum(|exact|)`` (negative: toward zero) and relative RMS
   ``sqrt(sum((s - exact)^2) / sum(exact^2))``. Addends are scaled so that the largest |x| is
   57344 / k: no partial sum can saturate, and the errors are the rounding's alone (the codec
   scales by a 95 % quantile instead, so its largest sums do saturate). Two addend laws:
   "same_sign" (|N(0,1)|, where truncation can never cancel) and "symmetric" (N(0,1)).
2. Training. The digits demo under mpiexec (studies/accuracy/accuracy_compare.py), fp8 hierarchical
   relative, no float32 warm-up, rounding "nearest" vs "oyama"; test accuracy per test interval.

Usage (from the repository root)::

    python -m studies.accuracy.rounding_ablation bias --out docs/figures
    python -m studies.accuracy.rounding_ablation train --out docs/figures --runs runs/rounding_ablation \
        --procs 4 --processes-per-node 2 --max-iter 400 --test-interval 50

Writes OUT/rounding_ablation_sum_bias.{csv,png} and OUT/rounding_ablation_digits_accuracy.{csv,png}.
"""
import argparse
import math
import os
import sys

import numpy

from caffe8.comm import fp8
from studies._runs import pyplot, REPO, save_figure, write_rows

MODES = ("nearest", "oyama")
FP8_MAX = 57344.0
BIAS_FIELDS = ("law", "addends", "rounding", "samples", "sum_rel_bias", "sum_rel_rms",
               "total_rel_bias", "total_rel_rms")


# --- 1. sum bias ---------------------------------------------------------------------------------
def chain_sum(codes, rounding):
    """fp8 chain ((c0 + c1) + c2) + ... over axis 0 of a (k, n) uint8 array, with fp8.add."""
    acc = codes[0]
    for c in codes[1:]:
        acc = fp8.add(c, acc, rounding)
    return acc


def relative_errors(got, exact):
    """(relative bias toward |exact|, relative RMS) of ``got`` against ``exact`` (float64)."""
    got, exact = numpy.asarray(got, numpy.float64), numpy.asarray(exact, numpy.float64)
    err = got - exact
    bias = float(numpy.sum(numpy.sign(exact) * err) / numpy.sum(numpy.abs(exact)))
    rms = float(math.sqrt(numpy.sum(err * err) / numpy.sum(exact * exact)))
    return bias, rms


def addends(law, k, n, rng):
    """(k, n) float32 addends of ``law``, scaled so that max |x| = 57344 / k (no saturation)."""
    x = rng.standard_normal((k, n))
    if law == "same_sign":
        x = numpy.abs(x)
    elif law != "symmetric":
        raise ValueError(f"unknown addend law {law!r}; valid: same_sign, symmetric")
    # a little under 57344 / k, so that rounding the largest addend up cannot saturate either
    return (x * (0.875 * FP8_MAX / k / numpy.abs(x).max())).astype(numpy.float32)


def bias_rows(ks=(2, 4, 8), laws=("same_sign", "symmetric"), n=200_000, seed=0):
    rows = []
    for law in laws:
        for k in ks:
            x = addends(law, k, n, numpy.random.default_rng([seed, k]))
            exact_total = x.astype(numpy.float64).sum(axis=0)
            for mode in MODES:
                codes = fp8.encode(x, mode)
                exact_sum = fp8.decode(codes).astype(numpy.float64).sum(axis=0)
                s = fp8.decode(chain_sum(codes, mode))
                sb, sr = relative_errors(s, exact_sum)
                tb, tr = relative_errors(s, exact_total)
                rows.append(dict(law=law, addends=k, rounding=mode, samples=n, sum_rel_bias=sb,
                                 sum_rel_rms=sr, total_rel_bias=tb, total_rel_rms=tr))
    return rows


def plot_bias(rows, path):
    plt = pyplot()
    laws = sorted({r["law"] for r in rows})
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, (col, label) in zip(axes, (("sum_rel_bias", "relative bias of the fp8 sum"),
                                       ("sum_rel_rms", "relative RMS error of the fp8 sum"))):
        for law in laws:
            for mode, style in zip(MODES, ("o-", "s--")):
                pts = sorted((r["addends"], 100 * r[col]) for r in rows
                             if r["law"] == law and r["rounding"] == mode)
                ax.plot([p[0] for p in pts], [p[1] for p in pts], style, label=f"{mode}, {law}")
        ax.set_xscale("log", base=2)
        ax.set_xticks([2, 4, 8])
        ax.set_xticklabels(["2", "4", "8"])
        ax.set_xlabel("addends in the chain")
        ax.set_ylabel(label + " (%)")
        ax.axhline(0, color="k", lw=0.5)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("fp8 chain sums vs the exact sum of the same fp8 addends: "
                 "Oyama et al.'s truncating sum (oyama) vs nearest even")
    save_figure(fig, path)


# --- 2. training ---------------------------------------------------------------------------------
def variants_text(warmup=0):
    return ",".join(f"fp8_{m}:codec=fp8,relative=true,hierarchical=true,rounding={m},"
                    f"warmup_fp32_iters={warmup}" for m in MODES)


def plot_accuracy(rows, path):
    from studies.accuracy import accuracy_compare
    accuracy_compare.plot(rows, path, "digits, 4 processes (2 emulated nodes): fp8 sum "
                                      "rounding, nearest even vs Oyama et al.'s truncation")


def train(args):
    from studies.accuracy import accuracy_compare
    rows = accuracy_compare.run_variants(args.runs, variants_text(), args.procs,
                                         args.processes_per_node, args.max_iter,
                                         args.test_interval, args.solver)
    if isinstance(rows, int):
        return rows
    csv_path = os.path.join(args.out, "rounding_ablation_digits_accuracy.csv")
    accuracy_compare.write_csv(rows, csv_path)
    plot_accuracy(rows, os.path.join(args.out, "rounding_ablation_digits_accuracy.png"))
    print(f"wrote {csv_path} and its .png")
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="what", required=True)
    b = sub.add_parser("bias", help="sum bias of 2/4/8-addend chains")
    b.add_argument("--out", default=os.path.join(REPO, "docs", "figures"))
    b.add_argument("--samples", type=int, default=200_000)
    t = sub.add_parser("train", help="digits accuracy with each rounding under mpiexec")
    t.add_argument("--out", default=os.path.join(REPO, "docs", "figures"))
    t.add_argument("--runs", default=os.path.join("runs", "rounding_ablation"))
    t.add_argument("--procs", type=int, default=4)
    t.add_argument("--processes-per-node", type=int, default=2)
    t.add_argument("--max-iter", type=int, default=400)
    t.add_argument("--test-interval", type=int, default=50)
    t.add_argument("--solver", default="")
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    if args.what == "train":
        return train(args)
    rows = bias_rows(n=args.samples)
    path = os.path.join(args.out, "rounding_ablation_sum_bias.csv")
    write_rows(rows, BIAS_FIELDS, path)
    plot_bias(rows, path[:-4] + ".png")
    for r in rows:
        print(f"{r['law']:9s} k={r['addends']} {r['rounding']:7s} sum bias "
              f"{100 * r['sum_rel_bias']:+.3f}% rms {100 * r['sum_rel_rms']:.3f}%  total bias "
              f"{100 * r['total_rel_bias']:+.3f}% rms {100 * r['total_rel_rms']:.3f}%")
    print(f"wrote {path} and its .png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
