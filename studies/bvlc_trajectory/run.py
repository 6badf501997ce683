"""Modern-net blocks trained step by step by caffe8 and by a real BVLC Caffe build, from the same
initial weights on the same batches; each step's weights compared blob by blob.

``python -m studies.bvlc_trajectory.run --caffe <build>/tools/caffe --out runs/bvlc_trajectory``

The nets are the blocks of _blocks.py (the trajectory oracle's too: ResNet bottleneck
stage, MobileNet separable blocks, SqueezeNet fire modules, an Inception module), Dropout taken
out (its random masks differ between the two programs). Both programs train the same solver
(SGD, momentum 0.9, fixed rate, one snapshot a step) from a caffemodel caffe8 initialised, on an
HDF5 file of changing batches. For each step k and parameter blob: ``max |caffe8 - Caffe| /
max |Caffe_k - initial|``, the disagreement relative to how far training moved the blob, and
its ratio to step 1's (float32 rounding of two BLAS libraries grows slowly; a wrong gradient
shows as a jump). BVLC Caffe also trains three more times on copies of the batches moved one
ulp each: the worst of its disagreements with itself is the floor (a deep net amplifies
rounding from layer to layer and step to step: one ReLU input within rounding of zero that falls
on the other side moves a whole weight gradient; no program can be held closer to Caffe than
that). Prints a table and writes ``summary.csv`` (caffe8's disagreement per step, then the floor
per step).

``--prototxt FILE`` trains a famous net as published instead (studies/bvlc_trajectory/famous.py:
its input becomes HDF5Data, Dropout goes, a deploy net gets a loss), from weights drawn per layer
type, with weight decay.
"""
import argparse
import csv
import os
import re
import subprocess
import sys

import h5py
import numpy

from caffe8 import wiring
from caffe8.engine import model_io
from caffe8.engine.net import Net
from caffe8.engine.prototxt import parse_text
from studies.bvlc_trajectory import _blocks as blocks, famous


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


#: the solver both programs train the blocks with (``{net}``, ``{steps}``, ``{prefix}`` filled in)
SOLVER = ('net: "{net}"\nbase_lr: 0.05\nlr_policy: "fixed"\nmomentum: 0.9\n'
          'max_iter: {steps}\nsnapshot: 1\nsnapshot_prefix: "{prefix}"\n'
          'display: 1\nrandom_seed: 1\nsolver_mode: CPU\n')
#: the famous nets' solver: a smaller rate (deep nets from drawn weights) and weight decay, so
#: that every parameter's ``decay_mult`` takes part
FAMOUS_SOLVER = SOLVER.replace("base_lr: 0.05", "base_lr: 0.001") + "weight_decay: 0.0001\n"


def run_net(name, build, caffe, out, steps):
    """Train block ``name`` (``build()``: body, inputs, batch maker) with both programs."""
    folder = os.path.abspath(os.path.join(out, name))
    os.makedirs(folder, exist_ok=True)
    body, inputs, make = build()
    listing = blocks.write_batches(folder, inputs, steps, make)
    train, _ = blocks.net_texts(body, inputs, listing)
    net_path = os.path.join(folder, "net.prototxt")
    with open(net_path, "w") as f:
        f.write(train)
    init = os.path.join(folder, "init.caffemodel")
    model_io.write_binary_model(Net(parse_text(train, net_path), phase="TRAIN"), init)
    return compare_runs(name, folder, net_path, init, caffe, steps, SOLVER)


def run_prototxt(path, caffe, out, steps, batch):
    """Train the famous net at ``path`` (studies.bvlc_trajectory.famous) with both programs."""
    name = os.path.splitext(os.path.basename(path))[0]
    folder = os.path.abspath(os.path.join(out, name))
    os.makedirs(folder, exist_ok=True)
    listing = os.path.join(folder, "batches.txt")
    train, inputs = famous.training_net(path, batch, listing)
    blocks.write_batches(folder, inputs, steps, famous.make_batch)
    net_path = os.path.join(folder, "net.prototxt")
    with open(net_path, "w") as f:
        f.write(train)
    init = os.path.join(folder, "init.caffemodel")
    famous.write_initial_model(train, init)
    return compare_runs(name, folder, net_path, init, caffe, steps, FAMOUS_SOLVER)


#: the runs of one net: BVLC Caffe; BVLC Caffe again on the batches moved by one float32 ulp
#: each in random directions, once per seed here (the floor: rounding of that size is all that
#: separates two faithful programs, and a deep net amplifies it from layer to layer and step to
#: step: a ReLU input within rounding of zero that takes the other side moves a whole weight
#: gradient, half of a unit's gradient in an inner product at batch 2; whether that happens is
#: chance, so the floor is the worst of a few such runs. The weights are not moved: a weight one
#: ulp away lands on another float32 grid at every update, an error of its own); caffe8
ULP_SEEDS = (1, 2, 3)
RUNS = ("caffe",) + tuple(f"caffe_ulp{s}" for s in ULP_SEEDS) + ("caffe8",)


def one_ulp_away(net_path, out_path, seed):
    """Write the net at ``net_path`` to ``out_path`` reading a copy of its HDF5 batches in which
    every value of a non-integer dataset (labels stay) moved one float32 ulp up or down."""
    with open(net_path) as f:
        text = f.read()
    listing = re.search(r'source:\s*"([^"]+)"', text).group(1)   # the HDF5Data list file
    stem = os.path.splitext(out_path)[0]
    with open(listing) as f:
        sources = [line.strip() for line in f if line.strip()]
    copies = []
    rng = numpy.random.default_rng(seed)
    for i, source in enumerate(sources):
        copies.append(f"{stem}_{i}.h5")
        with h5py.File(source) as src, h5py.File(copies[-1], "w") as dst:
            for name, data in src.items():
                data = data[...]
                if data.dtype == numpy.float32 and numpy.any(data != numpy.round(data)):
                    away = numpy.where(rng.random(data.shape) < 0.5, -numpy.inf, numpy.inf)
                    data = numpy.nextafter(data, away.astype(numpy.float32))
                dst[name] = data
    with open(f"{stem}.txt", "w") as f:
        f.write("".join(c + "\n" for c in copies))
    with open(out_path, "w") as f:
        f.write(text.replace(f'"{listing}"', f'"{stem}.txt"'))


def compare_runs(name, folder, net_path, init, caffe, steps, solver_text):
    """The RUNS train ``net_path`` (the floor's runs: its one-ulp copies) from ``init``, one
    snapshot a step; rows of (name, blob, caffe8's disagreement with Caffe relative to the
    blob's movement at each step, then the floor's at each step)."""
    for tool in RUNS:
        net = net_path
        if tool.startswith("caffe_ulp"):
            net = os.path.join(folder, f"net_{tool[len('caffe_'):]}.prototxt")
            one_ulp_away(net_path, net, int(tool[len("caffe_ulp"):]))
        prefix = os.path.join(folder, tool)
        solver = os.path.join(folder, f"{tool}_solver.prototxt")
        with open(solver, "w") as f:
            f.write(solver_text.format(net=net, steps=steps, prefix=prefix))
        exe = [sys.executable, "-m", "caffe8.cli"] if tool == "caffe8" else [caffe]
        done = subprocess.run(exe + ["train", "-solver", solver, "-weights", init],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        with open(os.path.join(folder, f"{tool}.log"), "w") as f:
            f.write(done.stdout)
        if done.returncode:
            raise SystemExit(f"{tool} failed on {name}:\n{done.stdout[-2000:]}")
    return compared(name, folder, init, steps)


def compared(name, folder, init, steps):
    """compare_runs' rows from the snapshots the RUNS left in ``folder``; the floor is the worst
    of the one-ulp runs, blob by blob and step by step."""
    runs = {tool: [_blobs(os.path.join(folder, f"{tool}_iter_{k}.caffemodel"))
                   for k in range(1, steps + 1)] for tool in RUNS}
    start = _blobs(init)
    rows = []
    for key in start:
        errs = {tool: [] for tool in RUNS[1:]}
        for k in range(steps):
            ref = runs["caffe"][k][key]
            moved = numpy.abs(ref - start[key]).max()
            for tool, out in errs.items():
                diff = numpy.abs(runs[tool][k][key] - ref).max()
                out.append(diff / moved if moved > 0 else (0.0 if diff == 0 else float("inf")))
        floor = numpy.max([errs[tool] for tool in RUNS[1:-1]], axis=0)
        rows.append((name, key, *errs["caffe8"], *floor.tolist()))
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--caffe", required=True, help="BVLC Caffe's tools/caffe binary")
    ap.add_argument("--out", default="runs/bvlc_trajectory")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--nets", default=None, help="comma-separated names (default: all)")
    ap.add_argument("--prototxt", action="append", default=[],
                    help="a famous net's prototxt as published (repeatable; deploy or "
                         "train_val, see famous.py); with it, only the nets named by --nets run")
    ap.add_argument("--batch", type=int, default=2, help="--prototxt nets: images a step")
    args = ap.parse_args(argv)
    wiring.register_all()
    nets = {name: _without_dropout(build) for name, build in blocks.BLOCKS.items()}
    nets.update({f"{n}_family": _without_dropout(b) for n, b in blocks.FAMILIES.items()
                 if n != "recurrent"})    # GRU is caffe8's own; BVLC has no such layer
    if args.nets:
        unknown = sorted(set(args.nets.split(",")) - set(nets))
        if unknown:
            ap.error(f"--nets: unknown {', '.join(unknown)}; valid: {', '.join(nets)}")
        nets = {name: nets[name] for name in args.nets.split(",")}
    elif args.prototxt:
        nets = {}
    rows = []
    for name, build in nets.items():
        rows += run_net(name, build, args.caffe, args.out, args.steps)
    for path in args.prototxt:
        rows += run_prototxt(path, args.caffe, args.out, args.steps, args.batch)
    nets = list(dict.fromkeys(r[0] for r in rows))
    n = args.steps
    with open(os.path.join(args.out, "summary.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["net", "blob"] + [f"step{k + 1}" for k in range(n)] +
                   [f"floor{k + 1}" for k in range(n)])
        w.writerows(rows)
    print(f"{'net':<18} blobs  worst step-1 error  worst later error  worst later/step-1 "
          f"(>= 1e-6)  floor (Caffe, batches one ulp away): step 1, later")
    for name in nets:
        mine = [r for r in rows if r[0] == name]
        first = max(r[2] for r in mine)
        later = max(max(r[3:2 + n]) for r in mine)
        ratio = max(max(r[3:2 + n]) / max(r[2], 1e-6) for r in mine)
        floor1 = max(r[2 + n] for r in mine)
        floor = max(max(r[3 + n:]) for r in mine)
        print(f"{name:<18} {len(mine):>5}  {first:>18.2e}  {later:>17.2e}  {ratio:>19.1f}  "
              f"{floor1:>10.2e}  {floor:.2e}")

if __name__ == "__main__":
    main()
