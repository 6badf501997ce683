"""pycaffe's solvers over the training loop: typed constructors, step/solve/snapshot/restore,
Python callbacks, and the nets they expose."""
import numpy
import pytest

import caffe8 as caffe
from tests.engine.trainer_util import DIGITS_NET, write_solver

FAST = dict(display=0, test_interval=0, test_iter=[], snapshot=0, snapshot_after_train=False)


def test_typed_constructors_force_their_algorithm(in_digits_cwd, tmp_path):
    path = write_solver(tmp_path, max_iter=2, type="Adam", **FAST)
    assert caffe.SGDSolver(path).type == "SGD"
    assert caffe.NesterovSolver(path).type == "Nesterov"
    assert caffe.AdaDeltaSolver(path).type == "AdaDelta"
    assert caffe.get_solver(path).type == "Adam"


def test_step_callbacks_and_net_views(in_digits_cwd, tmp_path):
    solver = caffe.SGDSolver(write_solver(tmp_path, max_iter=100, test_iter=[1], **{
        k: v for k, v in FAST.items() if k != "test_iter"}))
    calls = []
    solver.add_callback(lambda: calls.append("start"), lambda: calls.append("ready"))
    before = solver.net.params["conv1"][0].data.copy()
    solver.step(3)
    assert solver.iter == 3 and calls == ["start", "ready"] * 3
    assert not numpy.array_equal(before, solver.net.params["conv1"][0].data)
    # the test net reads the train net's weights
    assert numpy.shares_memory(solver.test_nets[0].params["conv1"][0].data,
                               solver.net.params["conv1"][0].data)
    assert solver.net.blobs["data"].shape == (32, 1, 8, 8)
    assert solver.net.blobs["loss"].data.shape == ()
    out = solver.test_nets[0].forward()
    assert set(out) == {"accuracy", "loss"}


def test_snapshot_restore_and_solve(in_digits_cwd, tmp_path):
    path = write_solver(tmp_path, max_iter=6, **FAST)
    a = caffe.SGDSolver(path)
    a.step(4)
    model, state = a.snapshot()
    w4 = a.net.params["ip2"][0].data.copy()
    a.step(2)
    b = caffe.SGDSolver(path)
    b.restore(state)
    assert b.iter == 4
    numpy.testing.assert_array_equal(b.net.params["ip2"][0].data, w4)
    b.solve()
    assert b.iter == 6
    # the resumed run reproduces the uninterrupted one exactly
    numpy.testing.assert_array_equal(b.net.params["ip2"][0].data, a.net.params["ip2"][0].data)
    c = caffe.SGDSolver(path)
    c.solve(state)           # solve(resume_file): pycaffe's positional spelling
    assert c.iter == 6
    # the snapshot's model file loads into a pycaffe Net
    net = caffe.Net(DIGITS_NET, caffe.TEST, weights=model)
    numpy.testing.assert_array_equal(net.params["ip2"][0].data, w4)


@pytest.mark.mpi
def test_a_pycaffe_script_under_mpiexec_trains_data_parallel(in_digits_cwd, tmp_path):
    import os
    import re
    import shutil
    import subprocess
    import sys
    from tests.engine.trainer_util import REPO
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    mpiexec = mpiexec if os.path.exists(mpiexec) else shutil.which("mpiexec")
    if mpiexec is None:
        pytest.skip("no mpiexec")
    path = write_solver(tmp_path, max_iter=100, **FAST)
    prog = os.path.join(REPO, "tests", "caffe8", "mpi_solver_prog.py")
    r = subprocess.run([mpiexec, "-n", "2", sys.executable, prog, path, "5"],
                       cwd=str(in_digits_cwd), env=dict(os.environ, PYTHONPATH=REPO),
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:]
    # the ranks' lines may interleave on mpiexec's shared stdout: match anywhere, not per line
    ranks = dict(re.findall(r"rank (\d) iter 5 sha256 ([0-9a-f]{64})", r.stdout))
    assert set(ranks) == {"0", "1"} and ranks["0"] == ranks["1"], r.stdout[-3000:]
    assert len(re.findall(r"\] Gradient exchange: fp8 \(ratio, q=0\.95, fp32 for the first 20 "
                          r"iterations\), hierarchical, 2 processes on 1 node, asynchronous",
                          r.stdout)) == 1
