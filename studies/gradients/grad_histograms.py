#!/usr/bin/env python
"""Histograms of |∇W| and |D| = |∇W / (|W| + ε)| per tensor (Oyama et al.'s figures 1 and 9).

Usage (from the repository root)::

    python -m studies.gradients.grad_histograms --out runs/hist --at 0,100,999 \
        --tensors conv2.weight,ip1.weight

Trains the solver's net in one process (quantile_trace.probe_training) and, at each ``--at``
iteration, bins the nonzero |values| of the raw gradient and of D (the fp8 codec's ``ratio``)
into log10 bins (``--bins-per-decade``) and counts zeros apart. For each it also marks the range
that the fp8 exchange can represent: with q the Q-quantile of the tensor (the same estimate as
the exchange, a comm.quantile.QuantileTracker), values are scaled by 57344/q, so
[q·2^-16/57344, q] maps onto fp8's [2^-16, 57344] (a ratio of 10^9.5); smaller values flush to
zero, larger ones saturate. With ``--processes-per-node`` P' the exchange sends
D·57344/(q·P'), so the window of one process's values is [P'·q·2^-16/57344, P'·q] (the sum of
P' such values is what must stay below 57344).

Writes OUT/grad_histograms.csv (iteration, tensor, kind, bin_lo, bin_hi, count; the zero count
as bin 0..0), OUT/grad_window.csv (iteration, tensor, kind, q, window_lo, window_hi,
frac_below, frac_above, frac_zero) and OUT/grad_histograms.png.
"""
import argparse
import os
import sys

import numpy

from caffe8.comm.codecs import create_codec
from caffe8.comm.config import parse_comm
from caffe8.comm.kernels import FP8_MAX
from caffe8.comm.quantile import QuantileTracker
from caffe8.engine import backend
from caffe8.engine.errors import CaffeError
from studies._runs import pyplot, write_rows
from studies.gradients.quantile_trace import REPO, make_trainer, probe_training, tracker_quantile

FP8_MIN_SUBNORMAL = 2.0 ** -16
KINDS = ("grad", "ratio")


def log_histogram(values, bins_per_decade=4):
    """(edges, counts, zeros) of |values|: log10-spaced bins covering the nonzero entries
    (edges at multiples of 1/bins_per_decade decades), and the number of exact zeros."""
    a = numpy.abs(numpy.asarray(values, dtype=numpy.float64).ravel())
    nz = a[a > 0]
    zeros = int(a.size - nz.size)
    if nz.size == 0:
        return numpy.array([]), numpy.array([], dtype=numpy.int64), zeros
    lo = numpy.floor(numpy.log10(nz.min()) * bins_per_decade) / bins_per_decade
    hi = numpy.ceil(numpy.log10(nz.max()) * bins_per_decade) / bins_per_decade
    hi = max(hi, lo + 1.0 / bins_per_decade)
    edges = 10.0 ** numpy.linspace(lo, hi, int(round((hi - lo) * bins_per_decade)) + 1)
    counts, _ = numpy.histogram(nz, bins=edges)
    return edges, counts, zeros


def fp8_window(q, ppn=1):
    """[P'·q·2^-16/57344, P'·q]: the |values| the fp8 exchange represents when it sends
    value·57344/(q·P')."""
    return ppn * q * FP8_MIN_SUBNORMAL / FP8_MAX, ppn * q


def window_fractions(values, lo, hi):
    """(below, above, zero): fractions of entries with 0 < |v| < lo, |v| > hi, v == 0."""
    a = numpy.abs(numpy.asarray(values, dtype=numpy.float64).ravel())
    n = max(a.size, 1)
    return (float(((a > 0) & (a < lo)).sum()) / n, float((a > hi).sum()) / n,
            float((a == 0).sum()) / n)


def collect(trainer, iterations, at, tensors, quantile, samples, epsilon, seed=0,
            bins_per_decade=4, ppn=1):
    """(histogram rows, window rows) at the iterations in ``at``."""
    codec = create_codec("fp8", parse_comm(f"relative: true epsilon: {float(epsilon)!r}"))
    tracker = QuantileTracker(quantile, 1, samples, seed)
    hist, window = [], []

    def record(it, name, grad, weight):
        arrays = {"grad": grad, "ratio": codec.ratio(grad, weight)}
        for kind in KINDS:
            host = backend.to_numpy(arrays[kind]).ravel()
            q = tracker_quantile(tracker, (name, kind), arrays[kind], it)
            edges, counts, zeros = log_histogram(host, bins_per_decade)
            base = {"iteration": it, "tensor": name, "kind": kind}
            hist.append(dict(base, bin_lo=0.0, bin_hi=0.0, count=zeros))
            hist.extend(dict(base, bin_lo=float(edges[j]), bin_hi=float(edges[j + 1]),
                             count=int(c)) for j, c in enumerate(counts))
            lo, hi = fp8_window(q, ppn) if q > 0 else (0.0, 0.0)
            below, above, zero = window_fractions(host, lo, hi)
            window.append(dict(base, q=q, window_lo=lo, window_hi=hi, frac_below=below,
                               frac_above=above, frac_zero=zero))

    probe_training(trainer, iterations, lambda it: it in at, record, tensors)
    return hist, window


def plot(hist, window, path, title):
    """One row per (iteration, tensor): |∇W| and |D| histograms, peak-normalised (figure 1),
    with the fp8 window shaded."""
    plt = pyplot()
    keys = list(dict.fromkeys((r["iteration"], r["tensor"]) for r in window))
    fig, axes = plt.subplots(len(keys), 2, figsize=(10, 1.9 * len(keys) + 0.8), squeeze=False)
    win = {(r["iteration"], r["tensor"], r["kind"]): r for r in window}
    for row, (it, name) in enumerate(keys):
        for col, kind in enumerate(KINDS):
            ax = axes[row][col]
            bins = [r for r in hist if (r["iteration"], r["tensor"], r["kind"]) == (it, name, kind)
                    and r["bin_hi"] > 0]
            if bins:
                peak = max(max(r["count"] for r in bins), 1)
                ax.stairs([r["count"] / peak for r in bins],
                          [bins[0]["bin_lo"]] + [r["bin_hi"] for r in bins], fill=True, alpha=0.6)
            w = win[(it, name, kind)]
            if w["window_hi"] > 0:
                ax.axvspan(w["window_lo"], w["window_hi"], color="orange", alpha=0.15,
                           label="fp8 range")
                ax.axvline(w["q"], color="red", lw=0.8, ls="--", label="q")
            ax.set_xscale("log")
            ax.set_yticks([])
            label = "|∇W|" if kind == "grad" else "|D|"
            ax.set_title(f"{name} iter {it}: {label}  (below {100 * w['frac_below']:.2g}%, "
                         f"above {100 * w['frac_above']:.2g}%, zero {100 * w['frac_zero']:.2g}%)",
                         fontsize=8)
            if row == 0 and col == 0:
                ax.legend(fontsize=7, loc="upper left")
    height = fig.get_figheight()
    fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.45 / height))   # keep the title off the first row
    fig.savefig(path, dpi=80)
    plt.close(fig)


def build_parser():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--solver", default=os.path.join(REPO, "prototxt", "digits", "solver.prototxt"))
    ap.add_argument("--out", required=True)
    ap.add_argument("--at", default="0,100", help="iterations, comma separated")
    ap.add_argument("--tensors", default="", help="tensor names, e.g. conv2.weight (default: all)")
    ap.add_argument("--quantile", type=float, default=None, help="Q (default: comm.quantile)")
    ap.add_argument("--samples", type=int, default=0, help="R (default: comm.samples)")
    ap.add_argument("--epsilon", type=float, default=None, help="default: comm.epsilon")
    ap.add_argument("--bins-per-decade", type=int, default=4)
    ap.add_argument("--processes-per-node", type=int, default=1,
                    help="P' of the fp8 window (values are sent as v*57344/(q*P'))")
    ap.add_argument("--seed", type=int, default=0)
    return ap


def main(argv=None):
    args = build_parser().parse_args(argv)
    at = sorted({int(v) for v in args.at.split(",") if v.strip()})
    if not at or at[0] < 0:
        print("grad_histograms: --at needs iterations >= 0", file=sys.stderr)
        return 2
    try:
        trainer = make_trainer(args.solver)
        comm = trainer.param.comm
        hist, window = collect(trainer, at[-1] + 1, set(at),
                               [t for t in args.tensors.split(",") if t] or None,
                               args.quantile if args.quantile is not None else comm.quantile,
                               args.samples or comm.samples,
                               args.epsilon if args.epsilon is not None else comm.epsilon,
                               args.seed, args.bins_per_decade, max(1, args.processes_per_node))
    except CaffeError as e:
        print(f"grad_histograms: error: {e}", file=sys.stderr)
        return 1
    os.makedirs(args.out, exist_ok=True)
    write_rows(hist, ("iteration", "tensor", "kind", "bin_lo", "bin_hi", "count"),
               os.path.join(args.out, "grad_histograms.csv"))
    write_rows(window, ("iteration", "tensor", "kind", "q", "window_lo", "window_hi",
                        "frac_below", "frac_above", "frac_zero"),
               os.path.join(args.out, "grad_window.csv"))
    plot(hist, window, os.path.join(args.out, "grad_histograms.png"),
         f"{trainer.net.name}: |∇W| and |D| (ε = {args.epsilon or comm.epsilon:g}); shaded: "
         f"values fp8 represents when sent as v·57344/(q·P'), P' = {args.processes_per_node}")
    for r in window:
        print(f"iter {r['iteration']:5d} {r['tensor']:14s} {r['kind']:5s} q={r['q']:.3g}  "
              f"below {100 * r['frac_below']:.3g}%  above {100 * r['frac_above']:.3g}%  "
              f"zero {100 * r['frac_zero']:.3g}%")
    print(f"wrote {args.out}/grad_histograms.csv, grad_window.csv and grad_histograms.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
