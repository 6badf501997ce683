"""studies/host/bvlc_time.py: famous nets timed by caffe8 and BVLC Caffe's ``time``. Here the
"Caffe" is caffe8 behind a script speaking Caffe's single-dash flags, so the harness (the net
made once with Input layers, both commands, the parse, the CSV, the medians) runs without a
BVLC build."""
import csv
import stat
import sys

import pytest

from studies.host import bvlc_time
from tests.studies.bvlc_trajectory.test_famous import DEPLOY     # famous.py's deploy net


def test_both_programs_time_the_same_net_in_alternating_rounds(tmp_path, capsys):
    fake = tmp_path / "caffe"          # caffe's "time -model X -iterations N" → caffe8's flags
    fake.write_text(f"#!/bin/sh\nexec {sys.executable} -m caffe8.cli time --model \"$3\" "
                    f"--iterations \"$5\"\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    net = tmp_path / "deploy.prototxt"
    net.write_text(DEPLOY)
    out = tmp_path / "out"
    bvlc_time.main(["--caffe", str(fake), "--prototxt", str(net), "--batch", "4",
                    "--iterations", "2", "--rounds", "2", "--out", str(out)])
    rows = list(csv.DictReader(open(out / "bvlc_time.csv")))
    assert [(r["round"], r["program"]) for r in rows] == \
        [("1", "caffe"), ("1", "caffe8"), ("2", "caffe8"), ("2", "caffe")]
    assert all(float(r["forward_backward_ms"]) > 0 and r["batch"] == "4" for r in rows)
    timed = (out / "deploy_b4.prototxt").read_text()
    assert 'type: "Input"' in timed and "dim: 4" in timed and "SoftmaxWithLoss" in timed
    assert "deploy" in capsys.readouterr().out.splitlines()[-2]      # the medians' line


def test_a_failed_run_is_one_error_with_its_output(tmp_path):
    fake = tmp_path / "caffe"
    fake.write_text("#!/bin/sh\necho 'F1128 net.cpp] Check failed: no such layer'\nexit 134\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    with pytest.raises(SystemExit, match="Check failed: no such layer"):
        bvlc_time.forward_backward_ms([str(fake), "time"])
