"""studies/host/gemm_bench.py: one pass writes a CSV whose rates and ratios are consistent."""
import csv
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))


def test_one_pass_writes_the_csv(tmp_path):
    out = tmp_path / "gemm.csv"
    proc = subprocess.run([sys.executable, "-m", "studies.host.gemm_bench", "--repeat", "1",
                           "--csv", str(out)], cwd=REPO, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "host GEMM:" in proc.stdout.splitlines()[0]
    with open(out, newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["shape"] for r in rows][0] == "square" and len(rows) == 6
    for r in rows:
        numpy_rate, ours = float(r["numpy_gflops"]), float(r["caffe8_gflops"])
        assert numpy_rate > 0 and ours > 0
        # the rates are written to 0.1 GFLOP/s and the ratio to 0.01 from the unrounded rates:
        # on a loaded machine the rates are small and their rounding moves the quotient most
        slack = 0.005 + 0.05 * (1 + ours / numpy_rate) / (numpy_rate - 0.05)
        assert float(r["ratio"]) == pytest.approx(ours / numpy_rate, abs=slack)
