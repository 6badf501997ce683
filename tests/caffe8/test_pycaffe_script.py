"""Acceptance: a pycaffe script (tests/caffe8/pycaffe_lenet.py) runs unchanged with
``import caffe8 as caffe``: NetSpec → SGDSolver training → save → Classifier."""
import json
import os
import subprocess
import sys

from tests.engine.trainer_util import REPO

SCRIPT = os.path.join(REPO, "tests", "caffe8", "pycaffe_lenet.py")


def test_pycaffe_lenet_script_trains_and_classifies(in_digits_cwd):
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, SCRIPT, "300"], cwd=str(in_digits_cwd), env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    assert r["iter"] == 300
    assert r["loss_first"] > 1.5 and r["loss_last"] < 0.3  # ln(10) ≈ 2.3 at the start
    assert r["test_acc"][0] < 0.5 and r["test_acc"][-1] > 0.9
    # Classifier on the PNG files agrees with the test net on the same pixels from the LMDB
    assert r["center_shape"] == [300, 10] and r["ten_shape"] == [20, 10]
    assert abs(r["center_acc"] - r["test_acc"][-1]) <= 0.01
    assert r["ten_agree"] >= 0.7  # ten crops of an 8×8 image: the mirrors of a digit differ
    assert r["by_hand_max_diff"] < 1e-6
    # the log a Caffe user reads: net setup, the exchange line, no blank lines
    err = proc.stderr
    for text in ("Creating layer conv1", "Setting up conv1", "Top shape: 64 20 8 8 (81920)",
                 "Memory required for data:", "conv1 needs backward computation.",
                 "This network produces output loss", "Network initialization done.",
                 "Gradient exchange: none (1 process)"):
        assert text in err, text
