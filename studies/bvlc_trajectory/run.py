"""Modern-net blocks trained step by step by caffe8 and by a real BVLC Caffe build, from the same
initial weights on the same batches; each step's weights compared blob by blob.

``python -m studies.bvlc_trajectory.run --caffe <build>/tools/caffe --out runs/bvlc_trajectory``

The nets are the trajectory oracle's blocks (tests/engine/trajectory_nets.py: ResNet bottleneck
stage, MobileNet separable blocks, SqueezeNet fire modules, an Inception module), Dropout taken
out (its random masks differ between the two programs). Both programs train the same solver
(SGD, momentum 0.9, fixed rate, one snapshot a step) from a caffemodel caffe8 initialised, on an
HDF5 file of changing batches. For each step k and parameter blob: ``max |caffe8 - Caffe| /
max |Caffe_k - initial|``, the disagreement relative to how far training moved the blob, and
its ratio to step 1's (float32 rounding of two BLAS libraries grows slowly; a wrong gradient
shows as a jump). Prints a table and writes ``summary.csv``.
"""
import argparse
import csv
import os
import re
import subprocess
import sys

import numpy

from caffe8 import wiring
from caffe8.engine import model_io
from caffe8.engine.net import Net
from caffe8.engine.prototxt import parse_text
from tests.engine import trajectory, trajectory_nets     # the oracle's nets (run from the repository)


def _without_dropout(build):
    def built():
        body, inputs, make = build()
        body = "".join(line + "\n" for line in body.splitlines() if '"Dropout"' not in line)
        return body, inputs, make
    return built


def _blobs(path):
    net_pb = model_io.read_binary_net(path)
    out = {}
    for name, blobs, _ in model_io.source_layers(net_pb):
        for i, blob in enumerate(blobs):
            out[f"{name}/{i}"] = numpy.array(blob.data, numpy.float64)
    return out


def run_net(name, build, caffe, out, steps):
    folder = os.path.abspath(os.path.join(out, name))
    os.makedirs(folder, exist_ok=True)
    body, inputs, make = build()
    listing = trajectory.write_batches(folder, inputs, steps, make)
    train, _ = trajectory.net_texts(body, inputs, listing)
    net_path = os.path.join(folder, "net.prototxt")
    with open(net_path, "w") as f:
        f.write(train)
    init = os.path.join(folder, "init.caffemodel")
    model_io.write_binary_model(Net(parse_text(train, net_path), phase="TRAIN"), init)
    runs = {}
    for tool, exe in (("caffe", [caffe]), ("caffe8", [sys.executable, "-m", "caffe8.cli"])):
        prefix = os.path.join(folder, tool)
        solver = os.path.join(folder, f"{tool}_solver.prototxt")
        with open(solver, "w") as f:
            f.write(f'net: "{net_path}"\nbase_lr: 0.05\nlr_policy: "fixed"\nmomentum: 0.9\n'
                    f'max_iter: {steps}\nsnapshot: 1\nsnapshot_prefix: "{prefix}"\n'
                    f'display: 1\nrandom_seed: 1\nsolver_mode: CPU\n')
        done = subprocess.run(exe + ["train", "-solver", solver, "-weights", init],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if done.returncode:
            raise SystemExit(f"{tool} failed on {name}:\n{done.stdout[-2000:]}")
        runs[tool] = [_blobs(f"{prefix}_iter_{k}.caffemodel") for k in range(1, steps + 1)]
    start = _blobs(init)
    rows = []
    for key in start:
        errs = []
        for k in range(steps):
            moved = numpy.abs(runs["caffe"][k][key] - start[key]).max()
            diff = numpy.abs(runs["caffe8"][k][key] - runs["caffe"][k][key]).max()
            errs.append(diff / moved if moved > 0 else (0.0 if diff == 0 else float("inf")))
        rows.append((name, key, *errs))
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--caffe", required=True, help="BVLC Caffe's tools/caffe binary")
    ap.add_argument("--out", default="runs/bvlc_trajectory")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--nets", default=None, help="comma-separated names (default: all)")
    args = ap.parse_args(argv)
    wiring.register_all()
    nets = {name: _without_dropout(build) for name, build in trajectory_nets.BLOCKS.items()}
    nets.update({f"{n}_family": _without_dropout(b) for n, b in trajectory_nets.FAMILIES.items()
                 if n != "recurrent"})    # GRU is caffe8's own; BVLC has no such layer
    if args.nets:
        unknown = sorted(set(args.nets.split(",")) - set(nets))
        if unknown:
            ap.error(f"--nets: unknown {', '.join(unknown)}; valid: {', '.join(nets)}")
        nets = {name: nets[name] for name in args.nets.split(",")}
    rows = []
    for name, build in nets.items():
        rows += run_net(name, build, args.caffe, args.out, args.steps)
    with open(os.path.join(args.out, "summary.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["net", "blob"] + [f"step{k + 1}" for k in range(args.steps)])
        w.writerows(rows)
    print(f"{'net':<18} blobs  worst step-1 error  worst later error  worst later/step-1 (>= 1e-6)")
    for name in nets:
        mine = [r for r in rows if r[0] == name]
        first = max(r[2] for r in mine)
        later = max(max(r[3:]) for r in mine)
        ratio = max(max(r[3:]) / max(r[2], 1e-6) for r in mine)
        print(f"{name:<18} {len(mine):>5}  {first:>18.2e}  {later:>17.2e}  {ratio:>10.1f}")


if __name__ == "__main__":
    main()
