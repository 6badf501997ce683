#!/usr/bin/env python
"""PyTorch LeNet on Fashion-MNIST through DDP: float32, PyTorch's fp16 hook, PowerSGD and caffe8's
fp8 hook, over random seeds (docs/PYTORCH.md).

    python -m studies.accuracy.ddp_accuracy --procs 4 --processes-per-node 2 --seeds 1,2,3 \\
        --variants fp32,fp16,powersgd,fp8 --out runs/ddp_accuracy

Each (variant, seed) is one run of examples/pytorch_ddp_fashion_mnist.py (BVLC's LeNet recipe,
10,000 iterations of 64 images in all, a test of the 10,000 test images every 500) under
torchrun on this machine, ``--procs`` processes of one intra-op thread; ``--processes-per-node``
makes the fp8 hook sum in two levels (caffe8's ACCURACY runs: 4 processes as 2 nodes of 2).
Variants are the example's ``--hook`` values (fp32 is DDP's own all-reduce; powersgd of rank
``--powersgd-rank``). Writes in ``--out``: each run's curve ``<variant>_seed<s>.csv`` and log,
``seeds.csv`` (every test point of every run), ``summary.csv`` (final accuracy per variant:
mean, min, max, sd over the seeds, the gap to the first variant in points) and ``curves.png``
(mean curve and min-max band per variant). ``--resume`` keeps the runs whose curve exists.
"""
import argparse
import csv
import os
import subprocess
import sys

from scripts._runs import REPO, write_rows
from studies.accuracy.accuracy_compare import SEED_FIELDS, SUMMARY_FIELDS, plot_seeds, \
    summarise_seeds

EXAMPLE = os.path.join(REPO, "examples", "pytorch_ddp_fashion_mnist.py")
VARIANTS = ("fp32", "fp16", "bf16", "powersgd", "fp8")


def run_one(args, variant, seed):
    """Train one (variant, seed) under torchrun; returns its curve's path."""
    curve = os.path.join(args.out, f"{variant}_seed{seed}.csv")
    if args.resume and os.path.exists(curve):
        return curve
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           "--nproc-per-node", str(args.procs), EXAMPLE, "--data", args.data, "--hook", variant,
           "--seed", str(seed), "--iterations", str(args.iterations),
           "--test-interval", str(args.test_interval), "--powersgd-rank",
           str(args.powersgd_rank), "--csv", curve + ".tmp"]
    if variant == "fp8" and args.processes_per_node:
        cmd += ["--processes-per-node", str(args.processes_per_node)]
    log = os.path.join(args.out, f"{variant}_seed{seed}.log")
    with open(log, "w", encoding="utf-8") as f:
        rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=REPO,
                            timeout=args.timeout,
                            env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=REPO)).returncode
    if rc != 0:
        raise SystemExit(f"ddp_accuracy: {variant} seed {seed} failed (exit {rc}); see {log}")
    os.replace(curve + ".tmp", curve)
    return curve


def read_curve(path, variant, seed):
    with open(path, newline="") as f:
        return [{"variant": variant, "seed": seed, "iteration": int(r["iteration"]),
                 "seconds": float(r["seconds"]), "test_accuracy": float(r["accuracy"]),
                 "test_loss": float("nan")} for r in csv.DictReader(f)]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--procs", type=int, default=4)
    ap.add_argument("--processes-per-node", type=int, default=2,
                    help="fp8: nodes of this many processes (0: one level)")
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--variants", default="fp32,fp16,powersgd,fp8")
    ap.add_argument("--iterations", type=int, default=10000)
    ap.add_argument("--test-interval", type=int, default=500)
    ap.add_argument("--powersgd-rank", type=int, default=4)
    ap.add_argument("--out", default=os.path.join(REPO, "runs", "ddp_accuracy"))
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--timeout", type=float, default=6 * 3600, help="seconds per run")
    args = ap.parse_args(argv)
    variants = args.variants.split(",")
    bad = [v for v in variants if v not in VARIANTS]
    if bad:
        ap.error(f"--variants: unknown {', '.join(bad)}; valid: {', '.join(VARIANTS)}")
    seeds = [int(s) for s in args.seeds.split(",")]
    os.makedirs(args.out, exist_ok=True)
    rows = []
    for seed in seeds:                    # seed by seed: every variant of a seed together
        for variant in variants:
            rows += read_curve(run_one(args, variant, seed), variant, seed)
            print(f"{variant} seed {seed}: final test accuracy "
                  f"{100 * rows[-1]['test_accuracy']:.2f} %", flush=True)
    rows.sort(key=lambda r: variants.index(r["variant"]))
    write_rows(rows, SEED_FIELDS, os.path.join(args.out, "seeds.csv"))
    summary = summarise_seeds(rows)
    write_rows(summary, SUMMARY_FIELDS, os.path.join(args.out, "summary.csv"))
    plot_seeds(rows, os.path.join(args.out, "curves.png"),
               title=f"PyTorch LeNet, Fashion-MNIST, {args.procs} processes")
    for s in summary:
        print(f"{s['variant']:9s} {s['mean_accuracy']:.2f} % (min {s['min_accuracy']:.2f}, max "
              f"{s['max_accuracy']:.2f}, sd {s['std_accuracy']:.2f}; "
              f"{s['gap_to_first_points']:+.2f} points), {s['seeds']} seeds")
    return 0


if __name__ == "__main__":
    sys.exit(main())
