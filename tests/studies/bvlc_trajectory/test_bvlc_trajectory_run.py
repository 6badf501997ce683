"""studies/bvlc_trajectory: the harness that trains a block with caffe8 and a BVLC Caffe build
and compares every step's weights. With caffe8 on both sides the comparison must be exact (the
harness reads the right snapshots, in the right order, blob by blob); with the real build it
runs where $CAFFE8_BVLC_CAFFE names one."""
import os
import stat
import sys

import pytest

from studies.bvlc_trajectory import run
from tests.engine import trajectory_nets


def test_caffe8_against_itself_agrees_exactly(tmp_path):
    fake = tmp_path / "caffe"
    fake.write_text(f"#!/bin/sh\nexec {sys.executable} -m caffe8.cli \"$@\"\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    rows = run.run_net("squeezenet", run._without_dropout(trajectory_nets.squeezenet_block),
                       str(fake), str(tmp_path / "out"), steps=2)
    assert len(rows) == 2 * 11          # conv1, three fire modules of three, conv10: w and b
    assert all(r[2:] == (0.0, 0.0) for r in rows), rows


@pytest.mark.skipif(not os.environ.get("CAFFE8_BVLC_CAFFE"), reason="no BVLC Caffe build named")
def test_blocks_follow_bvlc_caffe_step_by_step(tmp_path):
    rows = run.run_net("resnet", trajectory_nets.resnet_block, os.environ["CAFFE8_BVLC_CAFFE"],
                       str(tmp_path), steps=4)
    for net, blob, *errs in rows:
        assert errs[0] < 1e-3 and max(errs[1:]) <= 10 * max(errs[0], 1e-6), (blob, errs)
