#!/usr/bin/env python
"""The epsilon sweep of Oyama et al.'s figure 8 on the digits demo.

Oyama, Nomura, Sato and Matsuoka ("reducing communication in data-parallel deep learning with
floating-point numbers smaller than single precision", figure 8) train CaffeNet with float and
with fp8 carrying D = grad / (|W| + eps) for eps = 1e-3, 1e-4, 1e-5, and with D = grad itself;
all ratio variants reach float's accuracy, D = grad loses 8.25 points of best top-1 accuracy.
Here: the same five variants on the digits demo under mpiexec (studies/accuracy/accuracy_compare.py:
same solver, same random_seed, only the ``comm`` block differs; fp8 from the first iteration).

Usage (from the repository root)::

    python -m studies.accuracy.epsilon_sweep --out docs/figures --runs runs/epsilon_sweep \
        --procs 4 --processes-per-node 2 --max-iter 400 --test-interval 50

Writes OUT/epsilon_sweep_digits_accuracy.{csv,png} (test accuracy per variant and test) and
OUT/epsilon_sweep_digits_summary.csv (final and best accuracy per variant, and the differences
to float).
"""
import argparse
import os
import sys

from studies._runs import REPO, write_rows

EPSILONS = (1e-3, 1e-4, 1e-5)
SUMMARY_FIELDS = ("variant", "final_iteration", "final_accuracy", "best_accuracy",
                  "final_minus_fp32_points", "best_minus_fp32_points", "final_loss")


def variants_text(epsilons=EPSILONS):
    """accuracy_compare variants: float, fp8 with each epsilon, fp8 with D = grad."""
    fp8 = "codec=fp8,hierarchical=true,warmup_fp32_iters=0"
    items = ["fp32:codec=fp32"]
    items += [f"fp8_eps{e:g}:{fp8},relative=true,epsilon={e:g}" for e in epsilons]
    items.append(f"fp8_direct:{fp8},relative=false")
    return ",".join(items)


def summarise(rows):
    """One row per variant: final and best accuracy, their distance to fp32 in points."""
    by = {}
    for r in rows:
        by.setdefault(r["variant"], []).append(r)
    out = []
    for name, pts in by.items():
        pts = sorted(pts, key=lambda r: r["iteration"])
        out.append({"variant": name, "final_iteration": pts[-1]["iteration"],
                    "final_accuracy": pts[-1]["test_accuracy"],
                    "best_accuracy": max(r["test_accuracy"] for r in pts),
                    "final_loss": pts[-1]["test_loss"]})
    ref = {r["variant"]: r for r in out}.get("fp32")
    for r in out:
        r["final_minus_fp32_points"] = (100 * (r["final_accuracy"] - ref["final_accuracy"])
                                        if ref else "")
        r["best_minus_fp32_points"] = (100 * (r["best_accuracy"] - ref["best_accuracy"])
                                       if ref else "")
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(REPO, "docs", "figures"))
    ap.add_argument("--runs", default=os.path.join("runs", "epsilon_sweep"))
    ap.add_argument("--procs", type=int, default=4)
    ap.add_argument("--processes-per-node", type=int, default=2)
    ap.add_argument("--max-iter", type=int, default=400)
    ap.add_argument("--test-interval", type=int, default=50)
    ap.add_argument("--solver", default="")
    ap.add_argument("--replot", action="store_true",
                    help="only redo the outputs from RUNS/accuracy.csv (no training)")
    args = ap.parse_args(argv)
    from studies.accuracy import accuracy_compare
    os.makedirs(args.out, exist_ok=True)
    if args.replot:
        rows = accuracy_compare.read_csv(os.path.join(args.runs, "accuracy.csv"))
    else:
        rows = accuracy_compare.run_variants(args.runs, variants_text(), args.procs,
                                             args.processes_per_node, args.max_iter,
                                             args.test_interval, args.solver)
        if isinstance(rows, int):
            return rows
    base = os.path.join(args.out, "epsilon_sweep_digits_")
    accuracy_compare.write_csv(rows, base + "accuracy.csv")
    accuracy_compare.plot(rows, base + "accuracy.png",
                          f"digits, {args.procs} processes: fp8 ratio with eps 1e-3/1e-4/1e-5 "
                          f"vs D = grad vs float (Oyama et al.'s figure 8)")
    summary = summarise(rows)
    write_rows(summary, SUMMARY_FIELDS, base + "summary.csv")
    for r in summary:
        print(f"{r['variant']:14s} final {100 * r['final_accuracy']:.2f}% best "
              f"{100 * r['best_accuracy']:.2f}% (vs fp32: {r['final_minus_fp32_points']:+.2f} / "
              f"{r['best_minus_fp32_points']:+.2f} points)")
    print(f"wrote {base}accuracy.csv/.png and {base}summary.csv")
    return 0


if __name__ == "__main__":
    sys.exit(main())
