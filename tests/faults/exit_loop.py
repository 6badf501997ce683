"""Exit loop: many short trainings on an HDF5Data list of many small files must all end cleanly.

A prefetch thread still inside h5py when the interpreter shuts down used to hang the process
(or crash it) after "Optimization Done.". This script builds such a case — ``--files`` HDF5
files of ``--rows`` rows each, listed in one HDF5Data source read by a TRAIN and a TEST net —
then runs ``caffe8 train`` ``--single`` times in one process and ``--mpi`` times under
``mpiexec -n 2``, each with a wall-clock limit, and counts the outcomes:

    python -m tests.faults.exit_loop --single 50 --mpi 50 --limit 60

Exit status 0 only when every run exited 0 within the limit.
"""
import argparse
import collections
import os
import shutil
import subprocess
import sys
import tempfile
import time

import h5py
import numpy

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

NET = """name: "ExitLoop"
layer {{ name: "h5" type: "HDF5Data" top: "data" top: "label" include {{ phase: TRAIN }}
  hdf5_data_param {{ source: "{source}" batch_size: 8 shuffle: true }} }}
layer {{ name: "h5" type: "HDF5Data" top: "data" top: "label" include {{ phase: TEST }}
  hdf5_data_param {{ source: "{source}" batch_size: 4 }} }}
layer {{ name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
  inner_product_param {{ num_output: 3 weight_filler {{ type: "xavier" }} }} }}
layer {{ name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }}
"""

SOLVER = """net: "{net}"
base_lr: 0.01
lr_policy: "fixed"
momentum: 0.9
max_iter: {iters}
display: 5
test_iter: 2
test_interval: 10
snapshot: 0
snapshot_after_train: false
random_seed: 3
solver_mode: CPU
"""


def make_case(folder, files=160, rows=4, iters=20):
    """Write the HDF5 files, their list, the net and the solver under ``folder``; returns the
    solver path. Rows are random 6-vectors with labels 0..2 (only the exit matters here)."""
    folder = os.path.abspath(str(folder))
    h5dir = os.path.join(folder, "h5")
    os.makedirs(h5dir, exist_ok=True)
    rng = numpy.random.default_rng(0)
    names = []
    for i in range(files):
        name = os.path.join(h5dir, f"part{i:04d}.h5")
        with h5py.File(name, "w") as f:
            f["data"] = rng.standard_normal((rows, 6)).astype(numpy.float32)
            f["label"] = rng.integers(0, 3, rows).astype(numpy.float32)
        names.append(name)
    source = os.path.join(folder, "list.txt")
    with open(source, "w") as f:
        f.write("\n".join(names) + "\n")
    net = os.path.join(folder, "net.prototxt")
    with open(net, "w") as f:
        f.write(NET.format(source=source))
    solver = os.path.join(folder, "solver.prototxt")
    with open(solver, "w") as f:
        f.write(SOLVER.format(net=net, iters=iters))
    return solver


def cli_module():
    """The CLI module of this checkout (it moved from engine/ to the caffe8 package)."""
    return "caffe8.cli" if os.path.exists(os.path.join(REPO, "caffe8", "cli.py")) else "engine.cli"


def mpiexec():
    exe = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    return exe if os.path.exists(exe) else shutil.which("mpiexec")


def train_command(solver, processes=1):
    cmd = [sys.executable, "-m", cli_module(), "train", "--solver", solver]
    if processes > 1:
        cmd = [mpiexec(), "-n", str(processes)] + cmd
    return cmd


def run_once(solver, processes=1, limit=60.0):
    """One training run: (outcome, seconds, output tail). Outcome: "ok", "rc=N" or "timeout"
    (the whole process group is killed, so no rank outlives a timed-out run)."""
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    t0 = time.monotonic()
    proc = subprocess.Popen(train_command(solver, processes), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, env=env, cwd=os.path.dirname(solver),
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=limit)
        outcome = "ok" if proc.returncode == 0 else f"rc={proc.returncode}"
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        out, _ = proc.communicate()
        outcome = "timeout"
    text = out.decode(errors="replace")
    if outcome == "ok" and "Optimization Done." not in text:
        outcome = "no 'Optimization Done.'"
    return outcome, time.monotonic() - t0, text[-2000:]


def loop(solver, runs, processes, limit, report=print):
    """``runs`` runs; returns a Counter of outcomes (and reports each failure's output)."""
    counts = collections.Counter()
    for i in range(runs):
        outcome, seconds, tail = run_once(solver, processes, limit)
        counts[outcome] += 1
        if outcome != "ok":
            report(f"run {i + 1} ({processes} process(es)): {outcome} after {seconds:.1f}s\n{tail}")
    return counts


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--single", type=int, default=50, help="single-process runs")
    ap.add_argument("--mpi", type=int, default=50, help="runs under mpiexec -n 2")
    ap.add_argument("--files", type=int, default=160)
    ap.add_argument("--rows", type=int, default=4)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--limit", type=float, default=60.0, help="seconds allowed per run")
    ap.add_argument("--dir", help="work folder (default: a temporary one, removed afterwards)")
    args = ap.parse_args(argv)
    folder = args.dir or tempfile.mkdtemp(prefix="exit_loop-")
    try:
        solver = make_case(folder, args.files, args.rows, args.iters)
        failed = 0
        for processes, runs in ((1, args.single), (2, args.mpi)):
            if not runs:
                continue
            t0 = time.monotonic()
            counts = loop(solver, runs, processes, args.limit)
            ok = counts.pop("ok", 0)
            failed += sum(counts.values())
            print(f"{processes} process(es): {ok}/{runs} exited 0 within {args.limit:g}s"
                  + (f"; failures: {dict(counts)}" if counts else "")
                  + f" ({time.monotonic() - t0:.0f}s)", flush=True)
        return 1 if failed else 0
    finally:
        if not args.dir:
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
