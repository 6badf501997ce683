"""studies/scaling/allreduce_nodes.py: the combination arithmetic on hand-made bench rows, and one tiny
real sweep (2 processes, 64K elements) under mpiexec."""
import csv
import os
import shutil

import pytest

from studies.scaling import allreduce_nodes as an

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))


def _bench(codec, median):
    return {"codec": codec, "elements": "1000", "processes": "4", "median_seconds": str(median),
            "min_seconds": str(median / 2)}


def test_combine():
    rows = an.combine({4: [_bench("fp32", 0.3), _bench("fp8", 0.1)], 2: [_bench("fp32", 0.2),
                                                                          _bench("fp8", 0.08)]})
    assert [r["processes"] for r in rows] == [2, 2, 4, 4]
    assert rows[0]["fp8_speedup_over_fp32"] == pytest.approx(2.5)
    assert rows[2]["fp8_speedup_over_fp32"] == pytest.approx(3.0)
    assert rows[2]["ring_shape"] == 0.75 and rows[0]["ring_shape"] == 0.5
    assert rows[1]["min_seconds"] == pytest.approx(0.04)


def test_command_uses_one_process_per_emulated_node():
    cmd = an.bench_command(8, "4M", 3, "x.csv", "py", "mpiexec")
    assert cmd[:3] == ["mpiexec", "-n", "8"]
    assert cmd[cmd.index("--processes-per-node") + 1] == "1"
    assert cmd[cmd.index("--elements") + 1] == "4M"


@pytest.mark.mpi
def test_tiny_real_sweep(tmp_path):
    pytest.importorskip("mpi4py")
    mpiexec = an._default_mpiexec()
    if not os.path.exists(mpiexec) and shutil.which("mpiexec") is None:
        pytest.skip("no mpiexec")
    assert an.main(["--procs", "2", "--elements", "64K", "--repeat", "2",
                    "--runs", str(tmp_path / "runs"), "--out", str(tmp_path)]) == 0
    with open(tmp_path / "allreduce_time_vs_nodes.csv") as f:
        rows = list(csv.DictReader(f))
    assert {r["codec"] for r in rows} == {"fp32", "fp16", "fp8"}
    assert all(int(r["processes"]) == 2 and float(r["median_seconds"]) > 0 for r in rows)
    assert (tmp_path / "allreduce_time_vs_nodes.png").read_bytes()[:4] == b"\x89PNG"
