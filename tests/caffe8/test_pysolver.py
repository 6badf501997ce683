"""pycaffe's solvers over the training loop: typed constructors, step/solve/snapshot/restore,
Python callbacks, and the nets they expose."""
import numpy
import pytest

import caffe8 as caffe
from engine.errors import CaffeError
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


def test_set_random_seed_makes_fillers_repeatable(tmp_path):
    path = tmp_path / "n.prototxt"
    path.write_text('layer { name: "d" type: "Input" top: "d" input_param { shape { dim: 1 '
                    'dim: 3 } } }\nlayer { name: "ip" type: "InnerProduct" bottom: "d" top: "ip" '
                    'inner_product_param { num_output: 2 weight_filler { type: "gaussian" } } }')
    caffe.set_random_seed(5)
    a = caffe.Net(str(path), caffe.TEST).params["ip"][0].data.copy()
    caffe.set_random_seed(5)
    b = caffe.Net(str(path), caffe.TEST).params["ip"][0].data
    c = caffe.Net(str(path), caffe.TEST).params["ip"][0].data
    numpy.testing.assert_array_equal(a, b)
    assert not numpy.array_equal(b, c)


def test_gpu_mode_without_a_gpu_is_a_clear_error():
    from engine import backend
    if backend.gpu_available():
        pytest.skip("a GPU is present")
    with pytest.raises(CaffeError, match="no CUDA GPU"):
        caffe.set_mode_gpu()
    caffe.set_mode_cpu()
