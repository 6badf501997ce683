"""The exit loop: short trainings on an HDF5Data list of many small files always end with
status 0 and leave no process behind (the prefetch thread used to be frozen inside h5py at
interpreter shutdown: a hang or a crash after "Optimization Done.")."""
import pytest

from tests.faults.faultutil import caffe8, exit_loop


@pytest.fixture(scope="module")
def solver(tmp_path_factory):
    return exit_loop.make_case(tmp_path_factory.mktemp("exit"), files=160, rows=4, iters=20)


@pytest.mark.parametrize("processes,runs", [(1, 5), pytest.param(2, 3, marks=pytest.mark.mpi)])
def test_training_on_many_small_hdf5_files_always_exits(solver, processes, runs):
    for _ in range(runs):
        r = caffe8(["train", "--solver", solver], cwd=exit_loop.os.path.dirname(solver),
                   processes=processes, limit=60)
        assert r.rc == 0 and not r.leftover, r
        assert "Optimization Done." in r.out, r
        assert "Traceback" not in r.out, r
