"""The fixed cost of an iteration: BVLC's brewing-logreg nonlinear net, ``solver.step(1)`` in
caffe8 against PyTorch eager's step of the same net (and BVLC Caffe's iteration, optionally),
in interleaved rounds.

``python -m studies.host.logreg_step [--rounds 5] [--steps 998] [--caffe <build>/tools/caffe] [--out runs/logreg_step]``

The net and solver are those of Caffe's ``examples/brewing-logreg.ipynb`` ("nonlinear_net"):
HDF5Data (batch 10) → InnerProduct 40 (xavier) → ReLU → InnerProduct 2 (xavier) → Accuracy and
SoftmaxWithLoss; SGD, base_lr 0.01, momentum 0.9, weight_decay 5e-4, lr_policy step (gamma 0.1,
stepsize 5000), display 1000, test_interval 1000 (250 test iterations); the data is the
notebook's: scikit-learn's ``make_classification`` (10,000 samples, 4 features, 2 informative,
2 clusters a class), three quarters for training, written as float64 data and float32 labels.

Each program runs in its own process (one process a round each, the order alternating):

* ``caffe8``: pycaffe's ``caffe.get_solver(S)``; ``step(1)`` once (iteration 0 and its test),
  then ``--steps`` calls of ``step(1)`` timed together (iterations 1 .. steps, between the tests
  and the displays of iterations 0 and 1000, as in the notebook's own loop);
* ``pytorch``: the same layers as ``torch.nn`` modules with the same initial weights, the batch
  sliced from the training tensors in memory (as HDF5Data holds its file), forward, the loss and
  the accuracy, ``zero_grad``, ``backward``, ``SGD(momentum, weight_decay).step()`` and the
  rate schedule's step, timed the same way after the same warm-up;
* ``caffe`` (with ``--caffe``): ``caffe train`` of the solver without its test net and with
  ``max_iter`` = ``--caffe-iters``, per iteration from the log's "Solving" to
  "Optimization Done" (its start-up is not in it; its glog lines are).

Prints every run and the medians, writes ``logreg_step.csv`` (program, round, microseconds per
step, the 1-minute load before the run) into ``--out``.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy

from studies._runs import write_rows

FIELDS = ("program", "round", "us_per_step", "load_1min")
NET = """name: "LogisticRegressionNet"
layer {{ name: "data" type: "HDF5Data" top: "data" top: "label"
  hdf5_data_param {{ source: "{source}" batch_size: 10 }} }}
layer {{ name: "ip1" type: "InnerProduct" bottom: "data" top: "ip1"
  inner_product_param {{ num_output: 40 weight_filler {{ type: "xavier" }} }} }}
layer {{ name: "relu1" type: "ReLU" bottom: "ip1" top: "ip1" }}
layer {{ name: "ip2" type: "InnerProduct" bottom: "ip1" top: "ip2"
  inner_product_param {{ num_output: 2 weight_filler {{ type: "xavier" }} }} }}
layer {{ name: "accuracy" type: "Accuracy" bottom: "ip2" bottom: "label" top: "accuracy" }}
layer {{ name: "loss" type: "SoftmaxWithLoss" bottom: "ip2" bottom: "label" top: "loss" }}
"""
SOLVER = """train_net: "{train}"
{test}base_lr: 0.01
lr_policy: "step"
gamma: 0.1
stepsize: 5000
momentum: 0.9
weight_decay: 0.0005
display: 1000
max_iter: {max_iter}
snapshot: 10000
snapshot_prefix: "{prefix}"
solver_mode: CPU
"""
TEST = 'test_net: "{test}"\ntest_interval: 1000\ntest_iter: 250\n'


def write_problem(folder):
    """The notebook's data, nets and solver in ``folder``; the solver's path."""
    from sklearn.datasets import make_classification
    from sklearn.model_selection import train_test_split
    import h5py
    x, y = make_classification(n_samples=10000, n_features=4, n_redundant=0, n_informative=2,
                               n_clusters_per_class=2, hypercube=False, random_state=0)
    x, xt, y, yt = train_test_split(x, y, random_state=0)
    os.makedirs(folder, exist_ok=True)
    for name, data, label in (("train", x, y), ("test", xt, yt)):
        h5 = os.path.join(folder, f"{name}.h5")
        with h5py.File(h5, "w") as f:
            f["data"] = data
            f["label"] = label.astype(numpy.float32)
        with open(os.path.join(folder, f"{name}.txt"), "w") as f:
            f.write(h5 + "\n")
        with open(os.path.join(folder, f"{name}.prototxt"), "w") as f:
            f.write(NET.format(source=os.path.join(folder, f"{name}.txt")))
    return solver_file(folder, "solver.prototxt", 10000, test=True)


def solver_file(folder, name, max_iter, test):
    path = os.path.join(folder, name)
    test_lines = TEST.format(test=os.path.join(folder, "test.prototxt")) if test else ""
    with open(path, "w") as f:
        f.write(SOLVER.format(train=os.path.join(folder, "train.prototxt"), test=test_lines,
                              max_iter=max_iter, prefix=os.path.join(folder, "snap", "train")))
    os.makedirs(os.path.join(folder, "snap"), exist_ok=True)
    return path


def caffe8_step_us(solver_path, steps):
    """Microseconds per ``solver.step(1)`` over iterations 1 .. steps (pycaffe's loop)."""
    import caffe8 as caffe
    caffe.set_mode_cpu()
    solver = caffe.get_solver(solver_path)
    solver.step(1)
    t = time.perf_counter()
    for _ in range(steps):
        solver.step(1)
    us = (time.perf_counter() - t) / steps * 1e6
    solver.close()
    return us


def pytorch_step(folder, weights):
    """The eager step of the same net in PyTorch, from ``weights`` (caffe8's initial [ip1 W,
    ip1 b, ip2 W, ip2 b]): a function that runs one step and returns its loss."""
    import h5py
    import torch
    torch.set_num_threads(int(os.environ.get("OPENBLAS_NUM_THREADS") or os.cpu_count()))
    with h5py.File(os.path.join(folder, "train.h5"), "r") as f:
        x = torch.tensor(numpy.asarray(f["data"], numpy.float32))
        y = torch.tensor(numpy.asarray(f["label"])).long()
    model = torch.nn.Sequential(torch.nn.Linear(4, 40), torch.nn.ReLU(), torch.nn.Linear(40, 2))
    with torch.no_grad():
        for p, w in zip(model.parameters(), weights):
            p.copy_(torch.from_numpy(w))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4)
    schedule = torch.optim.lr_scheduler.StepLR(opt, step_size=5000, gamma=0.1)
    rows, at = len(x), [0]

    def step():
        i = at[0]
        xb, yb = x[i:i + 10], y[i:i + 10]
        at[0] = (i + 10) % (rows - rows % 10)
        opt.zero_grad()
        out = model(xb)
        loss = torch.nn.functional.cross_entropy(out, yb)
        (out.argmax(1) == yb).float().mean()
        loss.backward()
        opt.step()
        schedule.step()
        return loss.item()
    return step


def pytorch_step_us(folder, steps, weights):
    """Microseconds per eager PyTorch step (:func:`pytorch_step`), after one step."""
    step = pytorch_step(folder, weights)
    step()
    t = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - t) / steps * 1e6


def worker(program, folder, steps):
    """One measurement in this process; prints one JSON line."""
    solver_path = os.path.join(folder, "solver.prototxt")
    if program == "caffe8":
        us = caffe8_step_us(solver_path, steps)
    else:
        us = pytorch_step_us(folder, steps, initial_weights(solver_path))
    print(json.dumps({"us_per_step": us}), flush=True)


def initial_weights(solver_path):
    """caffe8's initial weights of the solver's train net (the Trainer's own filling)."""
    import caffe8 as caffe
    solver = caffe.get_solver(solver_path)
    try:
        return [b.data.copy() for name in ("ip1", "ip2") for b in solver.net.params[name]]
    finally:
        solver.close()


def caffe_iteration_us(caffe, folder, iters, timeout):
    """BVLC Caffe's ``caffe train`` of the solver (no test net), microseconds per iteration."""
    from studies.host.busy_neighbour import train_ms
    solver = solver_file(folder, "solver_caffe.prototxt", iters, test=False)
    done = subprocess.run([caffe, "train", "-solver", solver], capture_output=True, text=True,
                          timeout=timeout)
    if done.returncode:
        raise SystemExit(f"logreg_step: {caffe} train failed:\n{done.stderr[-2000:]}")
    return train_ms(done.stdout + done.stderr, iters) * 1000.0


def run_worker(program, folder, steps, timeout):
    cmd = [sys.executable, "-m", "studies.host.logreg_step", "--worker", program,
           "--out", folder, "--steps", str(steps)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    lines = [l for l in done.stdout.splitlines() if l.startswith("{")]
    if done.returncode or not lines:
        raise SystemExit(f"logreg_step: {' '.join(cmd)} failed:\n{done.stderr[-2000:]}")
    return json.loads(lines[-1])["us_per_step"]


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m studies.host.logreg_step",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=998,
                    help="timed step(1) calls a run (at most 998: no test or display among them)")
    ap.add_argument("--caffe", help="BVLC Caffe's caffe binary, to time its iteration too")
    ap.add_argument("--caffe-iters", type=int, default=10000)
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--out", default="runs/logreg_step")
    ap.add_argument("--worker", choices=("caffe8", "pytorch"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if not 1 <= args.steps <= 998:
        ap.error("--steps must be within 1 .. 998 (iterations 1 .. 998 hold no test)")
    folder = os.path.abspath(args.out)
    if args.worker:
        worker(args.worker, folder, args.steps)
        return 0
    write_problem(folder)
    programs = ["caffe8", "pytorch"] + (["caffe"] if args.caffe else [])
    rows = []
    for k in range(args.rounds):
        order = programs if k % 2 == 0 else programs[::-1]
        for program in order:
            before = os.getloadavg()[0]
            if program == "caffe":
                us = caffe_iteration_us(args.caffe, folder, args.caffe_iters, args.timeout)
            else:
                us = run_worker(program, folder, args.steps, args.timeout)
            rows.append({"program": program, "round": k + 1, "us_per_step": us,
                         "load_1min": before})
            print(f"round {k + 1} {program:<8} {us:9.1f} us/step  (load {before:.2f})",
                  flush=True)
    out = os.path.join(folder, "logreg_step.csv")
    write_rows(rows, FIELDS, out)
    medians = {p: statistics.median(r["us_per_step"] for r in rows if r["program"] == p)
               for p in programs}
    print("medians: " + ", ".join(f"{p} {us:.1f} us" for p, us in medians.items())
          + f"; caffe8 / pytorch {medians['caffe8'] / medians['pytorch']:.2f}"
          + (f", caffe8 / caffe {medians['caffe8'] / medians['caffe']:.1f}" if args.caffe else ""))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
