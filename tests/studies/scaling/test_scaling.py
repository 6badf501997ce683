"""studies/scaling/weak_scaling.py, strong_scaling.py and their shared _runs module.

The prototxt rewriting is checked in-process; the sweeps run for real (p = 1, 2 under mpiexec,
a tiny net, 3 iterations) and their CSV is recomputed here from the per-rank timing logs."""
import csv
import json
import os
import re
import subprocess
import sys

import pytest

from caffe8.engine.errors import CaffeError
from caffe8.engine.prototxt import parse_file
from studies import _runs
from studies.scaling import _sweep as sweep

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))
DATA = os.path.join(REPO, "tests", "scripts", "data")
TINY_SOLVER = os.path.join(DATA, "tiny_solver.prototxt")
GRU_SOLVER = os.path.join(REPO, "prototxt", "gru", "solver_small.prototxt")

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


# --- prototxt rewriting (no MPI) -------------------------------------------------------------
def test_batch_rewrite_dummy_data_and_sequence_data():
    _, tiny = _runs.load_train_net(TINY_SOLVER)
    assert _runs.net_batch_size(tiny) == 4
    shapes = _runs.with_batch_size(tiny, 2).layer[0].dummy_data_param.shape
    assert [list(s.dim) for s in shapes] == [[2, 6], [2, 2]]
    assert [list(s.dim) for s in tiny.layer[0].dummy_data_param.shape] == [[4, 6], [4, 2]]
    _, gru = _runs.load_train_net(GRU_SOLVER)
    assert _runs.net_batch_size(gru) == 4
    assert _runs.with_batch_size(gru, 1).layer[0].sequence_data_param.batch_size == 1


def test_run_prototxts_round_trip(tmp_path):
    extra = _runs.comm_settings("algorithm=ring, quantile_interval=10,relative=false")
    solver_path = _runs.write_run_prototxts(TINY_SOLVER, str(tmp_path / "run"), 2, "fp8", True,
                                            2, 7, {"fc2": (1.0, 2.5)}, extra)
    solver = parse_file(solver_path, "SolverParameter")
    assert (solver.comm.codec, getattr(solver.comm, "async"), solver.comm.processes_per_node) \
        == ("fp8", True, 2)
    assert (solver.comm.algorithm, solver.comm.quantile_interval, solver.comm.relative) \
        == ("ring", 10, False)
    assert sorted(solver.comm.fields()) == sorted(["codec", "async", "processes_per_node",
                                                   "algorithm", "quantile_interval", "relative"])
    assert solver.max_iter == 7 and solver.snapshot == 0 and not solver.snapshot_after_train
    assert solver.base_lr == pytest.approx(0.01) and solver.type == "SGD"   # kept
    net = parse_file(solver.net, "NetParameter")
    assert [l.name for l in net.layer] == ["data", "fc1", "fc1/emulate", "fc2", "fc2/emulate",
                                           "loss"]
    emu = net.layer[4].emulate_param
    assert (emu.forward_ms, emu.backward_ms) == (1.0, 2.5)
    assert [list(s.dim)[0] for s in net.layer[0].dummy_data_param.shape] == [2, 2]


def test_argument_parsers():
    assert _runs.int_list("1, 2,4") == [1, 2, 4]
    assert sweep.bool_list("sync,async") == [False, True]
    assert sweep.codec_list("float32,FP8,half") == ["fp32", "fp8", "fp16"]
    assert sweep.emulate_spec("a=1:2,b=0.5:0") == {"a": (1.0, 2.0), "b": (0.5, 0.0)}
    for bad, fn in (("0,1", _runs.int_list), ("maybe", sweep.bool_list),
                    ("a=1", sweep.emulate_spec), ("algorithm", _runs.comm_settings)):
        with pytest.raises(ValueError):
            fn(bad)
    with pytest.raises(CaffeError, match="quantile_interval=ten"):
        _runs.comm_settings("quantile_interval=ten")


def test_strong_batch_must_divide():
    args = type("A", (), {"global_batch": 6, "batch": 0})()
    assert sweep.batch_for("strong", args, 4, 2) == 3
    assert sweep.batch_for("weak", args, 4, 2) == 4
    with pytest.raises(CaffeError, match="not divisible by p = 4"):
        sweep.batch_for("strong", args, 4, 4)


# --- real sweeps -----------------------------------------------------------------------------
def _sweep(script, out, extra):
    cmd = [sys.executable, "-m", "studies.scaling." + script[:-3], "--solver", TINY_SOLVER, "--out",
           str(out), "--procs", "1,2", "--max-iter", "3", "--skip", "1", "--timeout", "120"]
    res = subprocess.run(cmd + extra, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    with open(out / f"{script.split('.')[0]}.csv", newline="") as f:
        return list(csv.DictReader(f))


def _iteration_walls(run_dirs, p, skip=1):
    """Independent: per run and iteration >= skip the slowest rank's wall; pooled, sorted."""
    return sorted(w for d in run_dirs for w in _run_walls(d, p, skip))


def _run_walls(run_dir, p, skip):
    per_iter = {}
    for rank in range(p):
        with open(os.path.join(run_dir, f"timing.r{rank}.jsonl")) as f:
            recs = [json.loads(line) for line in f]
        assert [r["iteration"] for r in recs] == [0, 1, 2] and {r["rank"] for r in recs} == {rank}
        for r in recs[skip:]:
            per_iter[r["iteration"]] = max(per_iter.get(r["iteration"], 0.0), r["wall"])
    return list(per_iter.values())


def _check_rows(rows, out, batches, repeats=1, stat="mean"):
    base = None
    for row in rows:
        p = int(row["p"])
        point = os.path.join(out, row["run_dir"])
        dirs = [os.path.join(point, f"rep{k}") for k in range(repeats)] if repeats > 1 else [point]
        walls = _iteration_walls(dirs, p)
        assert len(walls) == 2 * repeats and int(row["iterations"]) == len(walls)
        mean = sum(walls) / len(walls)
        median = (walls[len(walls) // 2 - 1] + walls[len(walls) // 2]) / 2   # even count
        assert float(row["mean_iter_s"]) == pytest.approx(mean, rel=1e-7)
        assert float(row["median_iter_s"]) == pytest.approx(median, rel=1e-7)
        assert int(row["batch_per_process"]) == batches[p]
        assert int(row["global_batch"]) == batches[p] * p
        assert float(row["load_1min"]) >= 0 and row["stat"] == stat
        tput = batches[p] * p / (mean if stat == "mean" else median)
        assert float(row["throughput_samples_s"]) == pytest.approx(tput, rel=1e-7)
        if p == 1:
            base = tput
        assert float(row["speedup"]) == pytest.approx(tput / base, rel=1e-6)
    assert (out / rows[0]["run_dir"]).name == "p1"


@pytest.mark.mpi
def test_weak_scaling_p1_p2(tmp_path):
    rows = _sweep("weak_scaling.py", tmp_path, ["--codecs", "float32,fp8"])
    assert [(r["p"], r["codec"], r["async"]) for r in rows] == [
        ("1", "fp32", "False"), ("2", "fp32", "False"),
        ("1", "fp8", "False"), ("2", "fp8", "False")]
    assert rows[0]["run_dir"] == rows[2]["run_dir"]   # one baseline run heads both series
    _check_rows(rows, tmp_path, {1: 4, 2: 4})
    assert (tmp_path / "weak_scaling.png").read_bytes()[:8] == PNG_MAGIC
    solver = (tmp_path / "p2_fp8_sync" / "solver.prototxt").read_text()
    assert re.search(r'codec: "fp8"\s+async: false\s+processes_per_node: 2', solver)


@pytest.mark.mpi
def test_strong_scaling_p1_p2(tmp_path):
    """Also --repeats 2 (two runs per point, pooled) and --stat median."""
    rows = _sweep("strong_scaling.py", tmp_path, ["--codecs", "fp8", "--global-batch", "4",
                                                  "--repeats", "2", "--stat", "median"])
    assert [(r["p"], r["codec"]) for r in rows] == [("1", "fp8"), ("2", "fp8")]
    _check_rows(rows, tmp_path, {1: 4, 2: 2}, repeats=2, stat="median")
    net = (tmp_path / "p2_fp8_sync" / "rep1" / "net.prototxt").read_text()
    assert re.findall(r"shape \{\s+dim: (\d+)", net) == ["2", "2"]
    assert (tmp_path / "strong_scaling.png").read_bytes()[:8] == PNG_MAGIC
