"""examples/pytorch_ddp_fashion_mnist.py as documented (torchrun on one machine), briefly, on
small IDX files of the real format: it trains with caffe8's fp8 hook and reports the test
accuracy; without its data it says so in one line."""
import csv
import os
import subprocess
import sys

import pytest

from tests.examples.fashion_idx import write_idx_slices

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(REPO, "examples", "pytorch_ddp_fashion_mnist.py")


def _run(argv, timeout=300):
    return subprocess.run(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=timeout,
                          env=dict(os.environ, PYTHONPATH=REPO, OMP_NUM_THREADS="1"))


@pytest.mark.mpi
def test_torchrun_trains_lenet_with_the_fp8_hook(tmp_path):
    pytest.importorskip("torch")
    data = write_idx_slices(str(tmp_path / "fm"))
    out = tmp_path / "curve.csv"
    r = _run([sys.executable, "-m", "torch.distributed.run", "--standalone",
              "--nproc-per-node", "2", EXAMPLE, "--data", data, "--iterations", "40",
              "--test-interval", "20", "--processes-per-node", "1", "--csv", str(out)])
    assert r.returncode == 0, r.stdout[-3000:]
    assert "final test accuracy" in r.stdout and "(fp8, 2 processes, 40 iterations" in r.stdout
    rows = list(csv.DictReader(open(out)))
    assert [int(row["iteration"]) for row in rows] == [0, 20, 40]
    # 10 equally likely classes: chance is 0.1; the blocks are learnt within 40 steps
    assert float(rows[0]["accuracy"]) < 0.3 < 0.8 < float(rows[-1]["accuracy"]), rows


def test_missing_data_is_one_line(tmp_path):
    pytest.importorskip("torch")
    r = _run([sys.executable, EXAMPLE, "--data", str(tmp_path)], timeout=120)
    assert r.returncode == 1
    assert r.stdout.strip().splitlines()[-1] == (
        f"pytorch_ddp_fashion_mnist: no train-images-idx3-ubyte[.gz] in {tmp_path} "
        f"(apt-get install dataset-fashion-mnist, or --data FOLDER)")
