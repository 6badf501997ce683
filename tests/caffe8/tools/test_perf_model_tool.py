"""caffe8 perf_model: predictions for a net from its per-layer times, checked by hand on a tiny
net; bad input is one error line."""
import csv
import os

import pytest

from tests.caffe8.tools.tool_helpers import cli

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))
MODEL = os.path.join(REPO, "tests", "scripts", "data", "tiny_net.prototxt")


def test_predict_from_caffe_time_lines(tmp_path):
    """On the tiny DummyData net from `caffe8 time`-style lines: one process costs exactly the
    listed layer times; the parameter tensors come from the built net, and on 2 processes of
    one node each pays 2 latency steps."""
    timing = tmp_path / "time.txt"
    timing.write_text("I1122 03:00:00.000000 1 tester.py:83]        fc1\tforward: 2 ms.\n"
                      "I1122 03:00:00.000000 1 tester.py:84]        fc1\tbackward: 4 ms.\n"
                      "I1122 03:00:00.000000 1 tester.py:83]        fc2\tforward: 1 ms.\n"
                      "I1122 03:00:00.000000 1 tester.py:84]        fc2\tbackward: 3 ms.\n")
    out = tmp_path / "pred.csv"
    assert cli("perf_model", "--model", MODEL, "--caffe-time", timing, "--procs", "1,2",
               "--codecs", "fp32,fp8", "--no-overlap", "--alpha-intra", "1e-3",
               "--processes-per-node", "2", "--beta-intra", "1e12", "--csv", out) == 0
    rows = {(r["codec"], r["p"]): r for r in csv.DictReader(open(out))}
    assert float(rows[("fp32", "1")]["iteration_s"]) == pytest.approx(0.010, rel=1e-6)
    # p = 2, one node, no overlap: each tensor pays 2 steps of α = 1 ms (bandwidth ~free).
    from caffe8.comm.perf_model import layer_params_from_net
    from caffe8.engine.net import Net
    tensors = sum(len(v) for v in layer_params_from_net(Net(MODEL, phase="TRAIN")).values())
    expect = 0.010 + tensors * 2e-3
    assert float(rows[("fp32", "2")]["iteration_s"]) == pytest.approx(expect, rel=1e-3)


@pytest.mark.parametrize("args, message", [
    (["--codecs", "fp4"], "--codecs: fp4 not modelled"),
    (["--procs", "4", "--processes-per-node", "3"], "processes_per_node 3 does not divide P = 4"),
    (["--procs", "two"], "expected process counts"),
])
def test_bad_input_is_one_error_line(tmp_path, capsys, args, message):
    timing = tmp_path / "time.txt"
    timing.write_text("I1122 03:00:00.000000 1 tester.py:83]        fc1\tforward: 2 ms.\n")
    try:
        status = cli("perf_model", "--model", MODEL, "--caffe-time", timing, "--procs", "2",
                     *args)
    except SystemExit as e:     # argparse's own error (exit status 2)
        status = e.code
    err = capsys.readouterr().err
    assert status != 0 and message in err and "Traceback" not in err, err
