"""studies/host/logreg_step.py: the PyTorch step trains the same net as caffe8's solver (the same
losses step by step from the same weights and batches), and one round of the harness writes its
CSV."""
import csv

import numpy
import pytest

pytest.importorskip("torch")
pytest.importorskip("sklearn")

import caffe8 as caffe  # noqa: E402
from studies.host import logreg_step  # noqa: E402


def test_pytorch_trains_the_same_net_as_caffe8(tmp_path):
    solver_path = logreg_step.write_problem(str(tmp_path))
    solver = caffe.get_solver(solver_path)
    try:
        weights = [b.data.copy() for name in ("ip1", "ip2") for b in solver.net.params[name]]
        step = logreg_step.pytorch_step(str(tmp_path), weights)
        ours, theirs = [], []
        for _ in range(6):
            solver.step(1)
            ours.append(float(solver.net.blobs["loss"].data))
            theirs.append(step())
    finally:
        solver.close()
    # float32 rounding apart (PyTorch sums in another order): a wrong rate, decay, momentum or
    # batch moves the losses far more after a few steps
    assert numpy.allclose(ours, theirs, rtol=1e-5, atol=1e-6), (ours, theirs)
    assert len(set(ours)) == 6                       # the batches change


def test_one_round_writes_the_csv(tmp_path, capsys):
    out = tmp_path / "run"
    assert logreg_step.main(["--rounds", "1", "--steps", "3", "--out", str(out)]) == 0
    rows = list(csv.DictReader(open(out / "logreg_step.csv")))
    assert [r["program"] for r in rows] == ["caffe8", "pytorch"]
    assert all(float(r["us_per_step"]) > 0 for r in rows)
    assert "caffe8 / pytorch" in capsys.readouterr().out
