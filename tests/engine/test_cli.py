"""The caffe8 command: inspect, time, test, train --weights, through main() as a user calls it."""
import os
import re

import pytest

from caffe8.cli import main
from tests.engine.trainer_util import REPO, write_solver


def test_inspect_counts_parameters(capsys):
    assert main(["inspect", os.path.join(REPO, "prototxt/caffenet/deploy.prototxt"), "--phase", "TEST"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out[-1] == "Total parameters: 60965224"
    assert any(line.split()[:2] == ["conv1", "Convolution"] for line in out)


def test_time_reports_every_layer(capsys):
    assert main(["time", "--model", os.path.join(REPO, "prototxt/lenet/train_val_small.prototxt"),
                 "--iterations", "2"]) == 0
    err = capsys.readouterr().err
    for name in ("conv1", "pool1", "ip2", "loss"):
        assert re.search(rf"{name}\tforward: [\d.e+-]+ ms\.", err), name
        assert re.search(rf"{name}\tbackward: [\d.e+-]+ ms\.", err), name
    assert "Average Forward-Backward:" in err


def test_train_then_test_then_finetune(in_digits_cwd, tmp_path, capsys):
    solver = write_solver(tmp_path, max_iter=60, display=0, test_interval=0, test_iter=[], snapshot=0)
    assert main(["train", "--solver", solver]) == 0
    model = tmp_path / "snap" / "digits_iter_60.caffemodel.h5"
    assert model.exists()
    capsys.readouterr()
    assert main(["test", "--model", os.path.join(REPO, "prototxt/digits/train_val.prototxt"),
                 "--weights", str(model), "--iterations", "6"]) == 0
    err = capsys.readouterr().err
    acc = float(re.findall(r"\] accuracy = ([\d.e+-]+)", err)[-1])
    assert acc > 0.8
    # --weights initialises a new run from the model: its first test is already good
    solver2 = write_solver(tmp_path / "ft", max_iter=1, display=0, test_interval=1, test_iter=[6],
                           snapshot=0, snapshot_after_train=False)
    assert main(["train", "--solver", solver2, "--weights", str(model)]) == 0
    err = capsys.readouterr().err
    first = float(re.findall(r"Test net output #0: accuracy = ([\d.e+-]+)", err)[0])
    assert first == pytest.approx(acc, abs=1e-6)


def test_errors_are_one_line_without_traceback(tmp_path, capsys):
    bad = tmp_path / "s.prototxt"
    bad.write_text('net: "x.prototxt"\nmax_iter: 1\nlr_policy: "fixed"\n')
    assert main(["train", "--solver", str(bad)]) == 1
    err = capsys.readouterr().err
    assert "caffe8: error:" in err and "x.prototxt" in err and "Traceback" not in err
