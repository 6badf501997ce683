"""The README's "Caffe's tools and real data: Fashion-MNIST" commands run as a new user runs
them, in a fresh folder, on small IDX slices written here under the Debian package's file names
(never the package itself) and with the solver's iteration counts shortened."""
import os
import re
import shutil
import subprocess
import sys

import numpy
import pytest

from tests.caffe8.tools.tool_helpers import write_idx

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))
DEBIAN = "/usr/share/datasets/fashion-mnist"
SOLVER = "prototxt/fashion_mnist/lenet_solver.prototxt"


def readme_commands():
    with open(os.path.join(REPO, "README.md"), encoding="utf-8") as f:
        text = f.read()
    block = re.search(r"## Caffe's tools and real data: Fashion-MNIST.*?```\n(.*?)```", text,
                      re.S).group(1)
    return [l for l in block.splitlines() if l.strip()]


def idx_slices(folder):
    rng = numpy.random.default_rng(0)
    for split, n in (("train", 96), ("t10k", 64)):
        write_idx(folder / f"{split}-images-idx3-ubyte.gz",
                  rng.integers(0, 256, (n, 28, 28)), 2051, gz=True)
        write_idx(folder / f"{split}-labels-idx1-ubyte.gz", rng.integers(0, 10, n), 2049, gz=True)


def short_solver(tmp_path):
    """BVLC's solver with 6 iterations, a test of 2 batches, no snapshot."""
    with open(os.path.join(REPO, SOLVER)) as f:
        text = f.read()
    for field, value in (("max_iter", 6), ("test_interval", 3), ("test_iter", 2),
                         ("display", 2), ("snapshot", 0)):
        text = re.sub(rf"^{field}: \d+", f"{field}: {value}", text, flags=re.M)
    (tmp_path / "short_solver.prototxt").write_text(text)
    return "short_solver.prototxt"


@pytest.mark.mpi
def test_readme_section_commands_run(tmp_path):
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    mpiexec = mpiexec if os.path.exists(mpiexec) else shutil.which("mpiexec")
    idx_slices(tmp_path)
    os.symlink(os.path.join(REPO, "prototxt"), tmp_path / "prototxt")
    solver = short_solver(tmp_path)
    env = dict(os.environ, PYTHONPATH=REPO)
    commands = readme_commands()
    assert sum(l.startswith("caffe8 convert_mnist_data") for l in commands) == 2
    for line in commands:
        words = line.replace(DEBIAN, str(tmp_path)).replace(SOLVER, solver).split()
        argv = []
        for w in words:
            argv += [sys.executable, "-m", "caffe8.cli"] if w == "caffe8" else [w]
        if argv[0] == "mpiexec":
            if mpiexec is None:
                continue
            argv[0] = mpiexec
        r = subprocess.run(argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, timeout=300)
        assert "Traceback" not in r.stdout, line
        if "draw_net" in argv and argv[-1].endswith(".png") and shutil.which("dot") is None:
            # without graphviz: one line that says what to install (a new user's machine)
            assert r.returncode != 0 and "apt-get install graphviz" in r.stdout, r.stdout
            continue
        assert r.returncode == 0, f"{line}\n{r.stdout[-3000:]}"
    # what the commands make under data/ is what the net reads: BVLC's LeNet recipe scales its
    # inputs and subtracts no mean, so the README makes no mean file for it (it made one once)
    with open(os.path.join(REPO, "prototxt/fashion_mnist/lenet_train_test.prototxt")) as f:
        net = f.read()
    made_data = sorted(os.listdir(tmp_path / "data" / "fashion_mnist"))
    assert made_data and all(f'"data/fashion_mnist/{name}"' in net for name in made_data), \
        made_data
    for png in ("lenet_accuracy.png", "lenet.png"):  # under runs/, the repository root clean
        if png == "lenet.png" and shutil.which("dot") is None:
            continue
        assert (tmp_path / "runs" / "fashion_mnist" / png).read_bytes()[:4] == b"\x89PNG"
    assert (tmp_path / "runs" / "fashion_mnist" / "lenet.log").exists()
    made = {p.name for p in tmp_path.iterdir()} - {"prototxt", "short_solver.prototxt"}
    assert made <= {"data", "runs"} | {p.name for p in tmp_path.glob("*-idx*-ubyte.gz")}, made
