"""``comm { nonfinite: "skip" }`` is bounded by ``max_consecutive_skips`` and the display
shows ``nan`` for a NaN loss.

The data decides which iterations are non-finite: ten HDF5 files of four rows, read in order
one file per iteration (on each of two ranks too: every rank reads two rows of each file), and
files 2, 3 and 6 hold a NaN. So iteration k has a NaN loss exactly when k mod 10 is 2, 3 or 6 —
the expected skips follow from that layout, not from the trainer's code.
"""
import re

import h5py
import numpy
import pytest

from tests.faults.faultutil import caffe8

NAN_FILES = {2, 3, 6}
FILES = 10
# parse_log.py's pattern for the display line (Caffe's tools/extra/parse_log.py)
PARSE_LOG = re.compile(r"Iteration (\d+) \(.*\), loss = ([\.\deE+-]+)$")

NET = """name: "nan"
layer {{ name: "h5" type: "HDF5Data" top: "data" top: "label"
  hdf5_data_param {{ source: "{source}" batch_size: {batch} }} }}
layer {{ name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
  inner_product_param {{ num_output: 1 weight_filler {{ type: "gaussian" std: 0.1 }} }} }}
layer {{ name: "loss" type: "EuclideanLoss" bottom: "ip" bottom: "label" top: "loss" }}
"""

SOLVER = """net: "{net}"
base_lr: 0.01
lr_policy: "fixed"
max_iter: {iters}
display: 1
snapshot: 0
snapshot_after_train: true
snapshot_prefix: "{prefix}"
snapshot_format: HDF5
random_seed: 5
solver_mode: CPU
comm {{ nonfinite: "skip"
  max_consecutive_skips: {k} }}
"""


def write_case(folder, k, processes, iters=20):
    rng = numpy.random.default_rng(1)
    names = []
    for i in range(FILES):
        data = rng.standard_normal((4, 3)).astype(numpy.float32)
        if i in NAN_FILES:
            data[:, 2] = numpy.nan  # every row: each rank (and rank 0's display) sees it
        names.append(str(folder / f"f{i}.h5"))
        with h5py.File(names[-1], "w") as f:
            f["data"] = data
            f["label"] = rng.standard_normal(4).astype(numpy.float32)
    (folder / "list.txt").write_text("\n".join(names) + "\n")
    (folder / "net.prototxt").write_text(NET.format(source=folder / "list.txt",
                                                    batch=4 // processes))
    solver = folder / "solver.prototxt"
    solver.write_text(SOLVER.format(net=folder / "net.prototxt", iters=iters, k=k,
                                    prefix=folder / "snap" / "nan"))
    return solver


def skipped(out):
    return [int(n) for n in re.findall(r"Iteration (\d+): non-finite gradient, update skipped", out)]


@pytest.mark.parametrize("processes", [1, pytest.param(2, marks=pytest.mark.mpi)])
def test_isolated_nan_batches_are_skipped_and_the_count_restarts(tmp_path, processes):
    solver = write_case(tmp_path, k=2, processes=processes)
    r = caffe8(["train", "--solver", solver], cwd=tmp_path, processes=processes, limit=60)
    assert r.rc == 0 and not r.leftover, r
    expected = [k for k in range(20) if k % FILES in NAN_FILES]
    assert skipped(r.out) == expected, r
    displayed = dict(re.findall(r"Iteration (\d+) \(.*\), loss = (\S+)", r.out))
    assert {int(k) for k, v in displayed.items() if v == "nan"} == set(expected), r
    finite = [line for line in r.out.splitlines() if PARSE_LOG.search(line)]
    assert len(finite) == 20 - len(expected)  # parse_log still reads every finite display
    with h5py.File(tmp_path / "snap" / "nan_iter_20.caffemodel.h5", "r") as f:
        assert numpy.isfinite(f["data/ip/0"][()]).all()


@pytest.mark.parametrize("processes", [1, pytest.param(2, marks=pytest.mark.mpi)])
def test_more_consecutive_nan_batches_than_allowed_stop_with_one_error(tmp_path, processes):
    solver = write_case(tmp_path, k=1, processes=processes)
    r = caffe8(["train", "--solver", solver], cwd=tmp_path, processes=processes, limit=60)
    assert r.rc not in (0, None) and not r.leftover, r
    assert skipped(r.out) == [2], r  # iteration 3 is the second NaN in a row: no more skipping
    assert "Optimization Done" not in r.out and "Traceback" not in r.out, r
    (line,) = r.error_lines()
    assert re.search(r"solver\.prototxt:\d+:\d+: iteration 3: .*max_consecutive_skips: 1", line), line
    assert (tmp_path / "snap" / "nan_iter_3.solverstate.h5").exists()
