"""Famous nets' forward + backward time on the CPU: caffe8 against BVLC Caffe, both with
``time`` (Caffe's benchmark command), in interleaved rounds.

``python -m studies.host.bvlc_time --caffe <build>/tools/caffe --prototxt FILE [--prototxt ...]``

Each net as published (a deploy file or a train_val) is made trainable by
studies/bvlc_trajectory/famous.py with ``Input`` layers at ``--batch`` images (their blobs stay
zero on both sides: dense products do not depend on the values) and a loss, written once and
timed by both programs from the same text: ``caffe time -model NET -iterations N`` and
``caffe8 time --model NET --iterations N``, each printing "Average Forward-Backward: X ms."
Rounds alternate the programs (round k starts with Caffe when k is odd). Both use every core:
OpenBLAS's default threads for Caffe (``OPENBLAS_CORETYPE`` and ``OPENBLAS_NUM_THREADS`` unset),
caffe8's own BLAS threads. Prints each net's medians and their ratio, writes a CSV of every
run with the 1-minute load before it.
"""
import argparse
import csv
import os
import re
import statistics
import subprocess
import sys

from caffe8 import wiring
from studies.bvlc_trajectory import famous

_AVERAGE = re.compile(r"Average Forward-Backward: ([0-9.]+) ms")
_UNSET = ("OPENBLAS_CORETYPE", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")


def forward_backward_ms(argv):
    """Run a ``time`` command; its average forward-backward milliseconds."""
    env = {k: v for k, v in os.environ.items() if k not in _UNSET}
    done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          env=env)
    found = _AVERAGE.findall(done.stdout)
    if done.returncode or not found:
        raise SystemExit(f"bvlc_time: {' '.join(argv)} failed:\n{done.stdout[-2000:]}")
    return float(found[-1])


def load():
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--caffe", required=True, help="BVLC Caffe's tools/caffe binary")
    ap.add_argument("--prototxt", action="append", required=True,
                    help="a net as published (repeatable)")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--iterations", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default="runs/bvlc_time")
    args = ap.parse_args(argv)
    wiring.register_all()
    os.makedirs(args.out, exist_ok=True)
    nets = {}
    for path in args.prototxt:
        name = os.path.splitext(os.path.basename(path))[0]
        nets[name] = os.path.abspath(os.path.join(args.out, f"{name}_b{args.batch}.prototxt"))
        with open(nets[name], "w") as f:
            f.write(famous.training_net(path, args.batch, None)[0])
    commands = {
        "caffe": lambda net: [args.caffe, "time", "-model", net, "-iterations",
                              str(args.iterations)],
        "caffe8": lambda net: [sys.executable, "-m", "caffe8.cli", "time", "--model", net,
                               "--iterations", str(args.iterations)],
    }
    rows = []
    for k in range(args.rounds):
        order = ("caffe", "caffe8") if k % 2 == 0 else ("caffe8", "caffe")
        for name, net in nets.items():
            for tool in order:
                before = load()
                ms = forward_backward_ms(commands[tool](net))
                rows.append((name, args.batch, k + 1, tool, ms, before))
                print(f"round {k + 1} {name:<20} {tool:<7} {ms:10.1f} ms  (load {before:.2f})",
                      flush=True)
    path = os.path.join(args.out, "bvlc_time.csv")
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(("net", "batch", "round", "program", "forward_backward_ms", "load_1min"))
        w.writerows(rows)
    print(f"{'net':<20} {'caffe ms':>10} {'caffe8 ms':>10} {'caffe8/caffe':>13}")
    for name in nets:
        med = {tool: statistics.median(r[4] for r in rows if r[0] == name and r[3] == tool)
               for tool in commands}
        print(f"{name:<20} {med['caffe']:10.1f} {med['caffe8']:10.1f} "
              f"{med['caffe8'] / med['caffe']:13.2f}")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
