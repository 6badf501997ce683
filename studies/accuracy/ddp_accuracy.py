#!/usr/bin/env python
"""PyTorch LeNet or small ResNet on Fashion-MNIST through DDP: float32, PyTorch's fp16 hook,
PowerSGD and caffe8's fp8 hook, over random seeds (docs/PYTORCH.md).

    python -m studies.accuracy.ddp_accuracy --net lenet --procs 4 --processes-per-node 2 \\
        --seeds 1,2,3 --variants fp32,fp16,powersgd,fp8 --rate 1gbit --out runs/ddp_accuracy

Each (variant, seed) is one run of examples/pytorch_ddp_fashion_mnist.py (``--net lenet``: BVLC's
LeNet recipe, 10,000 iterations of 64 images in all, a test of the 10,000 test images every 500;
``--net resnet``: docs/ACCURACY.md's small ResNet, 1,000 iterations, a test every 250),
``--procs`` processes of one intra-op thread: under torchrun on this machine, or with ``--rate``
on the emulated cluster (``caffe8 cluster run``, as root: nodes of ``--processes-per-node``
processes joined by links of that rate), where the curves' seconds are accuracy against wall
time on that link. ``--processes-per-node`` also makes the fp8 hook sum in two levels (caffe8's
ACCURACY runs: 4 processes as 2 nodes of 2).
Variants are the example's ``--hook`` values (fp32 is DDP's own all-reduce; powersgd of rank
``--powersgd-rank``). Writes in ``--out``: each run's curve ``<variant>_seed<s>.csv`` and log,
``seeds.csv`` (every test point of every run), ``summary.csv`` (final accuracy per variant:
mean, min, max, sd over the seeds, the gap to the first variant in points), ``curves.png``
(mean curve and min-max band per variant) and ``curves_time.png`` (the same against wall time).
``--resume`` keeps the runs whose curve exists.
"""
import argparse
import csv
import os
import subprocess
import sys

from studies._runs import REPO, write_rows
from studies.accuracy.accuracy_compare import SEED_FIELDS, SUMMARY_FIELDS, plot_seeds, \
    summarise_seeds

EXAMPLE = os.path.join(REPO, "examples", "pytorch_ddp_fashion_mnist.py")
VARIANTS = ("fp32", "fp16", "bf16", "powersgd", "fp8")


def run_one(args, variant, seed):
    """Train one (variant, seed) under torchrun; returns its curve's path."""
    curve = os.path.join(args.out, f"{variant}_seed{seed}.csv")
    if args.resume and os.path.exists(curve):
        return curve
    example = [EXAMPLE, "--net", args.net, "--data", args.data, "--hook", variant,
               "--seed", str(seed), "--powersgd-rank", str(args.powersgd_rank),
               "--csv", curve + ".tmp"]
    for flag, value in (("--iterations", args.iterations),
                        ("--test-interval", args.test_interval)):
        if value is not None:
            example += [flag, str(value)]
    if args.rate:
        from caffe8.cluster import DEFAULT_SUBNET
        ppn = args.processes_per_node or 1
        cmd = [sys.executable, "-m", "caffe8", "cluster", "run", "--nodes",
               str(args.procs // ppn), "--ppn", str(ppn), "--rate", args.rate, "--timeout",
               str(args.timeout), "--", sys.executable] + example + \
            ["--master", f"{DEFAULT_SUBNET}.1"]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node", str(args.procs)] + example
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
    ap.add_argument("--net", default="lenet", choices=("lenet", "resnet"))
    ap.add_argument("--iterations", type=int, default=None, help="default: the net's recipe")
    ap.add_argument("--test-interval", type=int, default=None, help="default: the net's recipe")
    ap.add_argument("--rate", default=None,
                    help="run on the emulated cluster with links of this rate (e.g. 1gbit)")
    ap.add_argument("--powersgd-rank", type=int, default=4)
    ap.add_argument("--out", default=os.path.join(REPO, "runs", "ddp_accuracy"))
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--timeout", type=float, default=6 * 3600, help="seconds per run")
    args = ap.parse_args(argv)
    variants = args.variants.split(",")
    bad = [v for v in variants if v not in VARIANTS]
    if bad:
        ap.error(f"--variants: unknown {', '.join(bad)}; valid: {', '.join(VARIANTS)}")
    if args.rate and args.procs % (args.processes_per_node or 1):
        ap.error(f"--procs {args.procs} is not a whole number of nodes of "
                 f"--processes-per-node {args.processes_per_node}")
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
    title = f"PyTorch {args.net}, Fashion-MNIST, {args.procs} processes" + \
        (f", {args.rate} links" if args.rate else "")
    plot_seeds(rows, os.path.join(args.out, "curves.png"), title=title)
    plot_seeds(rows, os.path.join(args.out, "curves_time.png"), title=title, x="seconds")
    for s in summary:
        print(f"{s['variant']:9s} {s['mean_accuracy']:.2f} % (min {s['min_accuracy']:.2f}, max "
              f"{s['max_accuracy']:.2f}, sd {s['std_accuracy']:.2f}; "
              f"{s['gap_to_first_points']:+.2f} points), {s['seeds']} seeds")
    return 0


if __name__ == "__main__":
    sys.exit(main())
