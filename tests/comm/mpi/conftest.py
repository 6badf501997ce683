"""The ``mpirun`` fixture for the rank-program tests of this folder."""
import pytest

from mpirunner import run_ranks


@pytest.fixture
def mpirun():
    """Run a rank program and assert it succeeded; returns its output."""
    pytest.importorskip("mpi4py")

    def _run(prog, n, *args):
        proc = run_ranks(prog, n, *args)
        assert proc.returncode == 0, proc.stdout[-4000:]
        return proc.stdout
    return _run
