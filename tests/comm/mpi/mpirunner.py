"""``run_ranks``: a rank program under mpiexec with a timeout (a hang fails, never blocks)."""
import os
import shutil
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
MPIEXEC = os.path.join(os.path.dirname(sys.executable), "mpiexec")


def run_ranks(prog, n, *args, timeout=120):
    """``mpiexec -n n python prog args``; returns the CompletedProcess (stdout+stderr text)."""
    if not os.path.exists(MPIEXEC) and shutil.which("mpiexec") is None:
        pytest.skip("no mpiexec next to the Python interpreter")
    exe = MPIEXEC if os.path.exists(MPIEXEC) else shutil.which("mpiexec")
    cmd = [exe, "-n", str(n), sys.executable, os.path.join(HERE, prog), *map(str, args)]
    return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=timeout)
