"""studies/host/shm_bench.py under mpiexec: both buffers give the same bytes, the CSV is written."""
import csv
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))
pytestmark = pytest.mark.mpi


def test_two_ranks_write_the_csv(tmp_path):
    pytest.importorskip("mpi4py")
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    out = tmp_path / "shm.csv"
    proc = subprocess.run([mpiexec, "-n", "2", sys.executable,
                           "-m", "studies.host.shm_bench", "--sizes", "1K,32K",
                           "--repeat", "8", "--csv", str(out)],
                          cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = list(csv.DictReader(open(out, newline="")))
    assert [int(r["elements"]) for r in rows] == [1024, 32768]
    assert [r["arena_path"] for r in rows] == ["messages (below the minimum)", "shared"]
    assert all(float(r["arena_buffer_us"]) > 0 and float(r["plain_buffer_us"]) > 0 for r in rows)
