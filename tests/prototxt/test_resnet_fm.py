"""The small ResNet of docs/ACCURACY.md's modern-net table (prototxt/fashion_mnist/paper/
resnet_b16.prototxt and its 4-process solver): the net parses and builds with the shapes its
comments state, its parameter count equals the closed forms per layer, and the shipped solver
trains it two steps through the trainer (the path of `caffe8 train`) on a small LMDB of
28x28 records written as `caffe8 convert_mnist_data` writes them."""
import os

import numpy
import pytest

from caffe8.engine.net import Net
from caffe8.engine.prototxt import parse_file, to_text
from caffe8.tools._common import write_records
from caffe8.tools.convert_mnist_data import mnist_records

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PAPER = os.path.join(REPO, "prototxt", "fashion_mnist", "paper")
NET = os.path.join(PAPER, "resnet_b16.prototxt")
SOLVER = os.path.join(PAPER, "resnet_solver_4p.prototxt")
BATCH = 16


@pytest.fixture
def net_param(tmp_path):
    """The shipped net with both Data layers reading a 40-record LMDB in tmp_path: class c's
    image is bright in rows 2c..2c+5 (learnable), ten records a class."""
    labels = numpy.repeat(numpy.arange(10, dtype=numpy.uint8), 4)
    images = numpy.zeros((len(labels), 28, 28), numpy.uint8)
    for i, c in enumerate(labels):
        images[i, 2 * c:2 * c + 6] = 200 + i
    db = str(tmp_path / "fm_lmdb")
    write_records(db, "lmdb", mnist_records(images.ravel(), labels, 28, 28))
    param = parse_file(NET)
    for layer in param.layer:
        if layer.type == "Data":
            layer.data_param.source = db
    return param


def closed_form_count(param):
    """Parameter values by closed forms: Convolution k*k*Cin*Cout (no bias, as ResNet), Scale
    2C (gamma and beta), InnerProduct D*O + O, BatchNorm 2C + 1 (mean, variance and factor: in
    Caffe's learnable_params, with lr_mult 0)."""
    channels, total = {"data": 1}, 0
    for layer in param.layer:
        if layer.type == "Convolution":
            c = layer.convolution_param
            assert not c.bias_term
            total += c.kernel_size[0] ** 2 * channels[layer.bottom[0]] * c.num_output
            channels[layer.top[0]] = c.num_output
        elif layer.type == "Scale":
            total += 2 * channels[layer.bottom[0]]
        elif layer.type == "BatchNorm":
            total += 2 * channels[layer.bottom[0]] + 1
        elif layer.type == "InnerProduct":
            total += channels[layer.bottom[0]] * 10 + 10
        elif layer.type in ("Eltwise", "Pooling") and layer.top[0] not in channels:
            channels[layer.top[0]] = channels[layer.bottom[0]]
    return total


def test_resnet_builds_with_its_stated_shapes(net_param):
    net = Net(net_param, "TRAIN")
    shape = {name: tuple(net.blobs[name].shape) for name in
             ("conv1", "res2a_branch2a", "res2a", "res3a", "res4a", "pool5", "fc10")}
    assert shape == {"conv1": (BATCH, 16, 28, 28), "res2a_branch2a": (BATCH, 8, 28, 28),
                     "res2a": (BATCH, 16, 28, 28), "res3a": (BATCH, 32, 14, 14),
                     "res4a": (BATCH, 64, 7, 7), "pool5": (BATCH, 64, 1, 1), "fc10": (BATCH, 10)}
    kinds = [layer.type for layer in net_param.layer]
    assert kinds.count("BatchNorm") == kinds.count("Scale") == kinds.count("Convolution") == 13
    assert kinds.count("Eltwise") == 3
    # the 1x1 convolutions at 28x28 (784 >= 512 positions: the per-image pointwise path)
    pointwise_28 = [l.name for l in net_param.layer if l.type == "Convolution"
                    and l.convolution_param.kernel_size[0] == 1
                    and net.blobs[l.top[0]].shape[2] == 28]
    assert pointwise_28 == ["res2a_branch1", "res2a_branch2a", "res2a_branch2c"]
    assert sum(p.count for p in net.learnable_params) == closed_form_count(net_param) == 21_223


def test_shipped_solver_trains_two_steps(net_param, tmp_path):
    from caffe8.wiring import build_trainer
    net_path = tmp_path / "net.prototxt"
    net_path.write_text(to_text(net_param))
    solver = parse_file(SOLVER, "SolverParameter")
    solver.net = str(net_path)
    solver.max_iter, solver.test_iter, solver.display = 2, [1], 0
    solver.comm.processes_per_node = 0   # one process here (the table's runs are 4 on 2 nodes)
    solver_path = tmp_path / "solver.prototxt"
    solver_path.write_text(to_text(solver))
    trainer = build_trainer(str(solver_path))
    try:
        net = trainer.net
        before = [numpy.array(p.data, copy=True) for p in net.learnable_params]
        trainer.step(2)
        # every parameter blob moved: both branches of each residual sum, the Scale biases, the
        # BatchNorm statistics
        moved = [not numpy.array_equal(b, p.data) for b, p in zip(before, net.learnable_params)]
        assert len(moved) == 13 + 2 * 13 + 3 * 13 + 2 and all(moved)
        assert trainer.iter == 2 and numpy.isfinite(trainer.losses).all()
        # Caffe's BatchNorm statistics: after two forward passes the factor is f * 1 + 1
        bns = [l for l in net.layers if l.type == "BatchNorm"]
        assert len(bns) == 13
        for bn in bns:
            assert float(bn.blobs[2].data[0]) == pytest.approx(0.99 + 1.0, rel=1e-6)
            assert numpy.all(bn.blobs[1].data > 0)
        out = trainer.test_nets[0].forward()
        assert 0.0 <= float(out["accuracy"]) <= 1.0 and numpy.isfinite(float(out["loss"]))
    finally:
        trainer.close()
