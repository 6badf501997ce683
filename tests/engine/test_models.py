"""The BVLC model files and our prototxt/ nets: parsing, Caffe's parameter counts, split names,
outputs, full-size forward/backward on the CPU, and `caffe8 inspect`.

Parameter counts are Caffe's published totals (BVLC's model files), computed here from the
nets we build; data layers are swapped for Input layers of the same shapes at batch 1 or 2 (the
counts do not depend on the batch)."""
import glob
import os

import numpy
import pytest

from caffe8.engine.errors import LayerError
from caffe8.tools.inspect import inspect_main
from caffe8.engine.net import Net
from caffe8.engine.net_graph import filter_net, swap_data_layers
from caffe8.engine.prototxt import parse_file, parse_text

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BVLC = os.path.join(ROOT, "tests", "data", "bvlc")
OURS = os.path.join(ROOT, "prototxt")

IMAGENET227, IMAGENET224 = (3, 227, 227), (3, 224, 224)
# (file, per-sample data shape, Caffe's parameter total)
TRAIN_VAL = [
    ("models/bvlc_reference_caffenet/train_val.prototxt", IMAGENET227, 60_965_224),
    ("models/bvlc_alexnet/train_val.prototxt", IMAGENET227, 60_965_224),
    ("models/bvlc_googlenet/train_val.prototxt", IMAGENET224, 13_378_280),
    ("examples/mnist/lenet_train_test.prototxt", (1, 28, 28), 431_080),
    ("examples/cifar10/cifar10_quick_train_test.prototxt", (3, 32, 32), 145_578),
    ("examples/hdf5_classification/train_val.prototxt", (4,), 10),
    ("examples/hdf5_classification/nonlinear_train_val.prototxt", (4,), 282),
    ("examples/hdf5_classification/nonlinear_auto_train.prototxt", (4,), 282),
    ("examples/hdf5_classification/nonlinear_auto_test.prototxt", (4,), 282),
]
DEPLOY = [
    ("models/bvlc_reference_caffenet/deploy.prototxt", 60_965_224),
    ("models/bvlc_alexnet/deploy.prototxt", 60_965_224),
    ("models/bvlc_googlenet/deploy.prototxt", 6_998_552),
    ("examples/mnist/lenet.prototxt", 431_080),
]


@pytest.fixture
def no_fill(monkeypatch):
    """Skip weight filling while building: counts and shapes do not depend on the values, and
    drawing 61 M Gaussian numbers per CaffeNet build dominates these tests' time."""
    from caffe8.engine import filler
    monkeypatch.setattr(filler, "fill", lambda array, filler_param: None)


def with_inputs(path, sample_shape, batch=1):
    """Parsed NetParameter with its data layers replaced by Input layers of the same shapes:
    data (batch, *sample_shape), label (batch,)."""
    return swap_data_layers(parse_file(path), {"data": (batch,) + tuple(sample_shape),
                                               "label": (batch,)})


def param_count(net):
    return sum(b.count for b in net.learnable_params)


def test_every_bvlc_file_parses_unchanged():
    files = sorted(glob.glob(os.path.join(BVLC, "**", "*.prototxt"), recursive=True))
    assert len(files) == 13
    for path in files:
        assert parse_file(path).layer, path


@pytest.mark.parametrize("phase", ["TRAIN", "TEST"])
@pytest.mark.parametrize("rel, sample, total", TRAIN_VAL, ids=[t[0].split("/")[-2] + "/" +
                                                              t[0].split("/")[-1] for t in TRAIN_VAL])
def test_bvlc_train_val_parameter_counts(rel, sample, total, phase, no_fill):
    net = Net(with_inputs(os.path.join(BVLC, rel), sample), phase=phase)
    assert param_count(net) == total
    assert sum(sl.stop - sl.start for sl in net.param_slices) == total


@pytest.mark.parametrize("rel, total", DEPLOY, ids=[d[0].split("/")[-2] for d in DEPLOY])
def test_bvlc_deploy_parameter_counts(rel, total, no_fill):
    net = Net(os.path.join(BVLC, rel), phase="TEST")   # legacy input fields / Input layers
    assert param_count(net) == total
    assert net.output_blob_names == ["prob"]


def test_lenet_test_net_splits_and_outputs():
    net = Net(with_inputs(os.path.join(BVLC, "examples/mnist/lenet_train_test.prototxt"),
                          (1, 28, 28), batch=2), phase="TEST")
    splits = [n for n, l in zip(net.layer_names, net.layers) if l.type == "Split"]
    assert splits == ["label_mnist_1_split", "ip2_ip2_0_split"]
    assert net.output_blob_names == ["accuracy", "loss"]
    train = Net(with_inputs(os.path.join(BVLC, "examples/mnist/lenet_train_test.prototxt"),
                            (1, 28, 28), batch=2), phase="TRAIN")
    assert train.output_blob_names == ["loss"]
    assert not any(l.type == "Split" for l in train.layers)


def test_googlenet_test_outputs_and_loss_weights(no_fill):
    net = Net(with_inputs(os.path.join(BVLC, "models/bvlc_googlenet/train_val.prototxt"),
                          IMAGENET224), phase="TEST")
    assert net.output_blob_names == sorted(
        f"loss{i}/{s}" for i in (1, 2, 3) for s in (f"loss{i}", "top-1", "top-5"))
    assert "inception_4a/output_inception_4a/output_0_split" in net.layer_names
    assert net.blob_loss_weights == {"loss1/loss1": 0.3, "loss2/loss2": 0.3, "loss3/loss3": 1.0}


# --- our prototxt/ nets --------------------------------------------------------------------------
def structure(net_param, phase):
    """(name, type, bottoms, tops) of every layer that survives filtering, data layers excluded."""
    layers = filter_net(net_param, phase).layer
    return [(l.name, l.type, list(l.bottom), list(l.top)) for l in layers
            if l.type not in ("Data", "Input", "DummyData")]


@pytest.mark.parametrize("ours, bvlc", [
    ("googlenet/train_val.prototxt", "models/bvlc_googlenet/train_val.prototxt"),
    ("caffenet/train_val.prototxt", "models/bvlc_reference_caffenet/train_val.prototxt"),
    ("lenet/train_val.prototxt", "examples/mnist/lenet_train_test.prototxt"),
])
@pytest.mark.parametrize("phase", ["TRAIN", "TEST"])
def test_our_nets_have_bvlc_structure(ours, bvlc, phase):
    mine = structure(parse_file(os.path.join(OURS, ours)), phase)
    theirs = structure(parse_file(os.path.join(BVLC, bvlc)), phase)
    assert mine == theirs


def test_our_googlenet_deploy_matches_bvlc_structure():
    mine = structure(parse_file(os.path.join(OURS, "googlenet/deploy.prototxt")), "TEST")
    theirs = structure(parse_file(os.path.join(BVLC, "models/bvlc_googlenet/deploy.prototxt")), "TEST")
    assert mine == theirs


@pytest.mark.parametrize("rel, sample, total, tensors", [
    ("lenet/train_val.prototxt", (1, 28, 28), 431_080, 8),
    ("caffenet/train_val.prototxt", IMAGENET227, 60_965_224, 16),
    ("googlenet/train_val.prototxt", IMAGENET224, 13_378_280, 128),
    ("caffenet/deploy.prototxt", IMAGENET227, 60_965_224, 16),
    ("googlenet/deploy.prototxt", IMAGENET224, 6_998_552, 116),
])
def test_our_nets_have_bvlc_parameter_counts(rel, sample, total, tensors, no_fill):
    net_param = parse_file(os.path.join(OURS, rel))
    if any(l.type == "Input" for l in net_param.layer):   # deploy: shrink the batch to 1
        for l in net_param.layer:
            if l.type == "Input":
                l.input_param.shape[0].dim = [1] + list(l.input_param.shape[0].dim[1:])
        net = Net(net_param, phase="TEST")
    else:
        net = Net(with_inputs(os.path.join(OURS, rel), sample), phase="TRAIN")
    assert param_count(net) == total
    assert len(net.learnable_params) == tensors   # CaffeNet 16 tensors, GoogLeNet 128


@pytest.mark.parametrize("small, full", [
    ("lenet/train_val_small.prototxt", "lenet/train_val.prototxt"),
    ("caffenet/train_val_small.prototxt", "caffenet/train_val.prototxt"),
    ("googlenet/train_val_small.prototxt", "googlenet/train_val.prototxt"),
])
def test_small_variants_run_with_the_same_layer_types(small, full):
    small_param = parse_file(os.path.join(OURS, small))
    kinds = lambda p: sorted({l.type for l in filter_net(p, "TEST").layer} - {"Data", "DummyData"})
    assert kinds(small_param) == kinds(parse_file(os.path.join(OURS, full)))
    for phase in ("TRAIN", "TEST"):
        net = Net(small_param, phase=phase)
        loss = net.forward_backward()
        assert numpy.isfinite(loss) and loss > 0
        if phase == "TRAIN":
            assert numpy.isfinite(net.flat_diff).all() and net.flat_diff.any()


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("rel, sample", [("caffenet/train_val.prototxt", IMAGENET227),
                                         ("googlenet/train_val.prototxt", IMAGENET224)])
def test_full_net_forward_backward_batch2(rel, sample):
    """Full-size net at batch 2 on the CPU (about 7 s for CaffeNet, 13 s for GoogLeNet here)."""
    net = Net(with_inputs(os.path.join(OURS, rel), sample, batch=2), phase="TRAIN")
    net.blobs["data"].data[...] = numpy.random.default_rng(0).standard_normal(net.blobs["data"].shape)
    net.blobs["label"].data[...] = [3, 7]
    loss = net.forward_backward()
    # random init: each softmax loss is near ln(1000); GoogLeNet weighs 0.3 + 0.3 + 1
    expected = numpy.log(1000) * sum(net.blob_loss_weights.values())
    assert abs(loss - expected) < 0.25 * expected
    assert numpy.isfinite(net.flat_diff).all()
    assert all(net.flat_diff[s].any() for s in net.param_slices[::2])   # every weight got a gradient


# --- bad input ------------------------------------------------------------------------------------
def test_concat_of_different_heights_names_the_layer():
    text = """
layer { name: "a" type: "Input" top: "a" input_param { shape { dim: 1 dim: 2 dim: 4 dim: 4 } } }
layer { name: "b" type: "Input" top: "b" input_param { shape { dim: 1 dim: 2 dim: 5 dim: 4 } } }
layer { name: "cat" type: "Concat" bottom: "a" bottom: "b" top: "c" }
"""
    with pytest.raises(LayerError, match="layer 'cat'"):
        Net(parse_text(text, "cat.prototxt"))


# --- caffe8 inspect -------------------------------------------------------------------------------
def test_inspect_prints_layers_and_total(capsys):
    path = os.path.join(BVLC, "examples/mnist/lenet.prototxt")
    assert inspect_main([path, "--phase", "TEST"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1] == "Total parameters: 431080"
    assert len(lines) == 1 + 9   # the legacy-input layer "input" and LeNet's 8 layers
    conv1 = lines[1].split()
    assert conv1[:2] == ["conv1", "Convolution"] and "64x20x24x24" in conv1 and "20x1x5x5" in conv1
    assert lines[0].split()[:2] == ["input", "Input"]


def test_inspect_with_data_shapes_and_error(capsys):
    path = os.path.join(OURS, "lenet/train_val.prototxt")
    assert inspect_main([path, "--phase", "TEST", "--data-shape", "data=2,1,28,28",
                         "--data-shape", "label=2"]) == 0
    out = capsys.readouterr().out
    assert "ip2_ip2_0_split" in out and out.endswith("Total parameters: 431080\n")
    assert inspect_main([os.path.join(ROOT, "no/such.prototxt")]) == 1
    assert "cannot read prototxt" in capsys.readouterr().err


# --- the Net's backward wiring with the real layers, against finite differences -------------------
FD_NET = """
layer { name: "in" type: "Input" top: "data" top: "label"
  input_param { shape { dim: 2 dim: 1 dim: 8 dim: 8 } shape { dim: 2 } } }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
  convolution_param { num_output: 3 kernel_size: 3 weight_filler { type: "gaussian" std: 0.5 }
                      bias_filler { type: "gaussian" std: 0.5 } } }
layer { name: "relu" type: "ReLU" bottom: "conv" top: "conv" relu_param { negative_slope: 0.1 } }
layer { name: "pool" type: "Pooling" bottom: "conv" top: "pool"
  pooling_param { pool: AVE kernel_size: 2 stride: 2 } }
layer { name: "ip1" type: "InnerProduct" bottom: "pool" top: "ip1" loss_weight: 0.5
  inner_product_param { num_output: 5 weight_filler { type: "gaussian" std: 0.5 }
                        bias_filler { type: "gaussian" std: 0.5 } } }
layer { name: "ip2" type: "InnerProduct" bottom: "ip1" top: "ip2"
  param { name: "shared_w" } param { lr_mult: 0 }
  inner_product_param { num_output: 5 weight_filler { type: "gaussian" std: 0.5 } } }
layer { name: "ip3" type: "InnerProduct" bottom: "ip2" top: "ip3" param { name: "shared_w" }
  inner_product_param { num_output: 5 weight_filler { type: "gaussian" std: 0.5 } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip3" bottom: "label" top: "loss" }
layer { name: "acc" type: "Accuracy" bottom: "ip3" bottom: "label" top: "acc" }
"""


def test_net_gradients_match_finite_differences_with_real_layers():
    """Splits (ip1 feeds ip2 and carries loss_weight 0.5; label feeds two layers), an in-place
    leaky ReLU, a weight shared by ip2 and ip3, an lr_mult 0 bias: every learnable param's analytic
    gradient equals the central difference of the net's loss."""
    net = Net(parse_text(FD_NET, "fd.prototxt"), dtype=numpy.float64)
    rng = numpy.random.default_rng(1)
    net.blobs["data"].data[...] = rng.standard_normal((2, 1, 8, 8))
    net.blobs["label"].data[...] = [1, 3]
    assert [l.type for l in net.layers].count("Split") == 3   # label, ip1, ip3
    net.clear_param_diffs()
    net.forward_backward()
    analytic = net.flat_diff.copy()
    ip2_bias = net.learnable_params.index(net.params["ip2"][1])
    assert not analytic[net.param_slices[ip2_bias]].any()   # lr_mult 0: no gradient
    assert len(net.learnable_params) == 7                    # ip3's weight is ip2's
    eps = 1e-6
    for sl, lr in zip(net.param_slices, net.params_lr):
        if lr == 0:
            continue
        for idx in rng.choice(numpy.arange(sl.start, sl.stop), min(4, sl.stop - sl.start),
                              replace=False):
            old = net.flat_data[idx]
            net.flat_data[idx] = old + eps
            up = net.forward_loss()
            net.flat_data[idx] = old - eps
            down = net.forward_loss()
            net.flat_data[idx] = old
            assert analytic[idx] == pytest.approx((up - down) / (2 * eps), rel=1e-5, abs=1e-8), idx
