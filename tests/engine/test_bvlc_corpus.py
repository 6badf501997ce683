"""Every prototxt we ship or keep from BVLC Caffe loads the way a user runs it: nets through
`caffe8 inspect` in both phases (data layers swapped for Input layers with ``--data-shape``),
solvers through the prototxt parser; Caffe's published parameter totals where they are known.

The second half builds nets written here in the layout of three BVLC examples that exercise
features the model files above do not: weights shared by param name across two towers (the MNIST
siamese net), several loss layers of which two share a name, with Flatten, SigmoidCrossEntropyLoss
and a zero-weighted EuclideanLoss (the MNIST autoencoder), and BatchNorm after bias-free
convolutions (the CIFAR-10 sigmoid + BN net). Each runs one forward/backward on random inputs and
is checked against a NumPy closed form.
"""
import glob
import io
import os
import re

import numpy
import pytest

from caffe8.tools.inspect import inspect_main
from caffe8.engine.net import Net
from caffe8.engine.net_graph import swap_data_layers
from caffe8.engine.prototxt import parse_file, parse_text

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FILE_DATA_TYPES = ("Data", "ImageData", "HDF5Data", "WindowData", "MemoryData")

# per-sample shape of the "data" top, by the folder a file lives in
SAMPLE = {"bvlc_googlenet": (3, 224, 224), "googlenet": (3, 224, 224),
          "bvlc_reference_caffenet": (3, 227, 227), "bvlc_alexnet": (3, 227, 227),
          "caffenet": (3, 227, 227), "mnist": (1, 28, 28), "lenet": (1, 28, 28),
          "cifar10": (3, 32, 32), "hdf5_classification": (4,), "digits": (1, 8, 8),
          "fashion_mnist": (1, 28, 28), "paper": (1, 28, 28)}

# Caffe's totals (learnable parameters, shared ones once)
CAFFENET = 60_965_224
KNOWN_TOTALS = {
    "tests/data/bvlc/models/bvlc_reference_caffenet/train_val.prototxt": CAFFENET,
    "tests/data/bvlc/models/bvlc_reference_caffenet/deploy.prototxt": CAFFENET,
    "tests/data/bvlc/models/bvlc_alexnet/train_val.prototxt": CAFFENET,
    "tests/data/bvlc/models/bvlc_alexnet/deploy.prototxt": CAFFENET,
    "tests/data/bvlc/models/bvlc_googlenet/train_val.prototxt": 13_378_280,
    "tests/data/bvlc/models/bvlc_googlenet/deploy.prototxt": 6_998_552,
    "tests/data/bvlc/examples/mnist/lenet_train_test.prototxt": 431_080,
    "tests/data/bvlc/examples/mnist/lenet.prototxt": 431_080,
    "tests/data/bvlc/examples/cifar10/cifar10_quick_train_test.prototxt": 145_578,
    "tests/data/bvlc/examples/hdf5_classification/train_val.prototxt": 4 * 2 + 2,
    "tests/data/bvlc/examples/hdf5_classification/nonlinear_train_val.prototxt": 282,
    "tests/data/bvlc/examples/hdf5_classification/nonlinear_auto_train.prototxt": 282,
    "tests/data/bvlc/examples/hdf5_classification/nonlinear_auto_test.prototxt": 282,
    "prototxt/caffenet/train_val.prototxt": CAFFENET,
    "prototxt/caffenet/deploy.prototxt": CAFFENET,
    "prototxt/googlenet/train_val.prototxt": 13_378_280,
    "prototxt/googlenet/deploy.prototxt": 6_998_552,
    "prototxt/lenet/train_val.prototxt": 431_080,
}


def _corpus():
    files = sorted(glob.glob(os.path.join(ROOT, "tests", "data", "bvlc", "**", "*.prototxt"),
                             recursive=True) +
                   glob.glob(os.path.join(ROOT, "prototxt", "**", "*.prototxt"), recursive=True))
    return [os.path.relpath(f, ROOT) for f in files]


CORPUS = _corpus()
SOLVERS = [f for f in CORPUS if "solver" in os.path.basename(f)]
NETS = [f for f in CORPUS if f not in SOLVERS]


def test_corpus_is_complete():
    """The lists below are built from the folders; a file moved away would silently drop out."""
    assert len(NETS) >= 25 and len(SOLVERS) >= 7
    assert set(KNOWN_TOTALS) <= set(NETS)


@pytest.fixture
def no_fill(monkeypatch):
    """Shapes and counts do not depend on the weights; skip drawing hundreds of millions of them."""
    from caffe8.engine import filler
    monkeypatch.setattr(filler, "fill", lambda array, filler_param: None)


def _data_shape_args(rel):
    """``--data-shape`` for every top of a data layer that reads files, batch 2."""
    folder = os.path.basename(os.path.dirname(rel))
    tops = {t for layer in parse_file(os.path.join(ROOT, rel)).layer
            if layer.type in FILE_DATA_TYPES for t in layer.top}
    args = []
    for top in sorted(tops):
        shape = (2,) + SAMPLE[folder] if top == "data" else (2,)
        args += ["--data-shape", f"{top}=" + ",".join(str(d) for d in shape)]
    return args


# the GRU benchmark holds 270 M parameters (over 2 GB with their gradients)
BIG = {"prototxt/gru/gru_benchmark.prototxt"}


@pytest.mark.parametrize("phase", ["TRAIN", "TEST"])
@pytest.mark.parametrize("rel", [pytest.param(f, marks=pytest.mark.slow) if f in BIG else f
                                 for f in NETS])
def test_inspect_loads_every_net(rel, phase, no_fill, capsys):
    out = io.StringIO()
    rc = inspect_main([os.path.join(ROOT, rel), "--phase", phase] + _data_shape_args(rel), out=out)
    assert rc == 0, capsys.readouterr().err
    lines = out.getvalue().splitlines()
    total = int(re.fullmatch(r"Total parameters: (\d+)", lines[-1]).group(1))
    assert len(lines) >= 3 and total > 0
    if rel in KNOWN_TOTALS:
        assert total == KNOWN_TOTALS[rel]


@pytest.mark.parametrize("rel", SOLVERS)
def test_every_solver_parses_and_names_a_net_that_exists(rel):
    """Run from the repository root, as `caffe8 train --solver prototxt/...` is."""
    solver = parse_file(os.path.join(ROOT, rel), "SolverParameter")
    nets = [n for n in (solver.net, solver.train_net) if n]
    assert nets and solver.base_lr > 0 and solver.max_iter > 0
    folder = os.path.dirname(os.path.join(ROOT, rel))
    for net in nets:  # as the trainer resolves it: the working directory, else the solver's folder
        assert any(os.path.isfile(os.path.join(d, net)) for d in (ROOT, folder)), net


# --- nets in the layout of BVLC's examples, written here ----------------------------------------
def _layer(name, typ, bottoms=(), tops=(), body=""):
    text = f'layer {{ name: "{name}" type: "{typ}"\n'
    text += "".join(f'  bottom: "{b}"\n' for b in bottoms)
    text += "".join(f'  top: "{t}"\n' for t in tops)
    return text + body + "}\n"


def _data(tops, phase, stage=""):
    rule = f"include {{ phase: {phase}" + (f' stage: "{stage}"' if stage else "") + " }\n"
    return _layer("data", "Data", (), tops, rule + '  data_param { source: "absent_lmdb" '
                  "batch_size: 2 backend: LMDB }\n")


def _params(*specs):
    return "".join("  param { " + s + " }\n" for s in specs)


def _conv(name, bottom, n, k, pad=0, bias=True, share=None):
    names = (f'name: "{share}_w" ', f'name: "{share}_b" ') if share else ("", "")
    p = (_params(names[0] + "lr_mult: 1", names[1] + "lr_mult: 2") if bias
         else _params("lr_mult: 1"))
    return _layer(name, "Convolution", [bottom], [name], p +
                  f"  convolution_param {{ num_output: {n} kernel_size: {k} pad: {pad} "
                  f"bias_term: {'true' if bias else 'false'}\n"
                  "    weight_filler { type: \"xavier\" } }\n")


def _ip(name, bottom, n, share=None, sparse=False):
    names = (f'name: "{share}_w" ', f'name: "{share}_b" ') if share else ("", "")
    filler = ('weight_filler { type: "gaussian" std: 1 sparse: 15 }' if sparse
              else 'weight_filler { type: "xavier" }')
    return _layer(name, "InnerProduct", [bottom], [name],
                  _params(names[0] + "lr_mult: 1", names[1] + "lr_mult: 2") +
                  f"  inner_product_param {{ num_output: {n} {filler} }}\n")


def _pool(name, bottom, kind, k, s):
    return _layer(name, "Pooling", [bottom], [name],
                  f"  pooling_param {{ pool: {kind} kernel_size: {k} stride: {s} }}\n")


def _siamese_tower(suffix):
    s = suffix
    return (_conv("conv1" + s, "data" + s, 20, 5, share="conv1") +
            _pool("pool1" + s, "conv1" + s, "MAX", 2, 2) +
            _conv("conv2" + s, "pool1" + s, 50, 5, share="conv2") +
            _pool("pool2" + s, "conv2" + s, "MAX", 2, 2) +
            _ip("ip1" + s, "pool2" + s, 500, share="ip1") +
            _layer("relu1" + s, "ReLU", ["ip1" + s], ["ip1" + s]) +
            _ip("ip2" + s, "ip1" + s, 10, share="ip2") +
            _ip("feat" + s, "ip2" + s, 2, share="feat"))


SIAMESE = ('name: "siamese"\n' + _data(["pair_data", "sim"], "TRAIN") +
           _data(["pair_data", "sim"], "TEST") +
           _layer("slice_pair", "Slice", ["pair_data"], ["data", "data_p"],
                  "  slice_param { slice_dim: 1 slice_point: 1 }\n") +
           _siamese_tower("") + _siamese_tower("_p") +
           _layer("loss", "ContrastiveLoss", ["feat", "feat_p", "sim"], ["loss"],
                  "  contrastive_loss_param { margin: 1 }\n"))


def _built(text, shapes, phase="TRAIN", stages=()):
    return Net(swap_data_layers(parse_text(text, "net.prototxt"), shapes), phase=phase,
               stages=stages)


def test_siamese_shares_weights_by_name_and_matches_the_contrastive_loss():
    rng = numpy.random.default_rng(0)
    net = _built(SIAMESE, {"pair_data": (4, 2, 28, 28), "sim": (4,)})
    # LeNet (431,080) + feat 2x10+2, the second tower adds nothing: its params are shared
    assert sum(b.count for b in net.learnable_params) == 431_080 + 22
    assert len(net.learnable_params) == 10
    a, b = net.params["conv1"][0], net.params["conv1_p"][0]
    assert numpy.shares_memory(a.data, b.data)
    net.blobs["pair_data"].data[...] = rng.random((4, 2, 28, 28))
    net.blobs["sim"].data[...] = [1, 0, 1, 0]
    loss = net.forward_loss()
    f, g = net.blobs["feat"].data.astype(float), net.blobs["feat_p"].data.astype(float)
    d2 = ((f - g) ** 2).sum(axis=1)
    sim = numpy.array([1, 0, 1, 0])
    want = (sim * d2 + (1 - sim) * numpy.maximum(1 - numpy.sqrt(d2), 0) ** 2).sum() / 2 / 4
    assert loss == pytest.approx(want, rel=1e-4)
    net.clear_param_diffs()
    net.backward()
    assert numpy.isfinite(net.flat_diff).all() and numpy.abs(net.params["conv1"][0].diff).sum() > 0


def _autoencoder():
    sizes = [("encode1", 1000), ("encode2", 500), ("encode3", 250), ("encode4", 30),
             ("decode4", 250), ("decode3", 500), ("decode2", 1000), ("decode1", 784)]
    text = ('name: "autoencoder"\n' + _data(["data"], "TRAIN") +
            _data(["data"], "TEST", "test-on-train") + _data(["data"], "TEST", "test-on-test") +
            _layer("flatdata", "Flatten", ["data"], ["flatdata"]))
    bottom = "data"
    for name, n in sizes:
        text += _ip(name, bottom, n, sparse=True)
        bottom = name
        if name not in ("encode4", "decode1"):
            text += _layer(name + "neuron", "Sigmoid", [name], [name + "neuron"])
            bottom = name + "neuron"
    # two layers named "loss", as in BVLC's file; only the first one is weighted
    text += _layer("loss", "SigmoidCrossEntropyLoss", ["decode1", "flatdata"],
                   ["cross_entropy_loss"], "  loss_weight: 1\n")
    text += _layer("decode1neuron", "Sigmoid", ["decode1"], ["decode1neuron"])
    text += _layer("loss", "EuclideanLoss", ["decode1neuron", "flatdata"], ["l2_error"],
                   "  loss_weight: 0\n")
    return text


@pytest.mark.parametrize("phase, stages", [("TRAIN", ()), ("TEST", ("test-on-test",))])
def test_autoencoder_two_losses_flatten_and_stages(phase, stages):
    rng = numpy.random.default_rng(1)
    net = _built(_autoencoder(), {"data": (2, 1, 28, 28)}, phase, stages)
    assert net.layer_names.count("loss") == 2
    assert sum(b.count for b in net.learnable_params) == 2_837_314
    x = rng.random((2, 1, 28, 28))
    net.blobs["data"].data[...] = x
    loss = net.forward_loss()
    z = net.blobs["decode1"].data.astype(float)
    t = x.reshape(2, 784)
    ce = (numpy.maximum(z, 0) - z * t + numpy.log1p(numpy.exp(-numpy.abs(z)))).sum() / 2
    assert loss == pytest.approx(ce, rel=1e-4)
    l2 = ((1 / (1 + numpy.exp(-z)) - t) ** 2).sum() / 2 / 2
    assert float(net.blobs["l2_error"].data) == pytest.approx(l2, rel=1e-4)
    net.clear_param_diffs()
    net.backward()
    assert numpy.isfinite(net.flat_diff).all() and numpy.abs(net.params["encode1"][0].diff).sum() > 0


def test_autoencoder_test_phase_without_a_stage_has_no_data_as_in_caffe():
    from caffe8.engine.errors import LayerError
    with pytest.raises(LayerError, match="unknown bottom blob 'data'"):
        _built(_autoencoder(), {"data": (2, 1, 28, 28)}, "TEST")


def _bn(name, bottom):
    return _layer(name, "BatchNorm", [bottom], [name], _params("lr_mult: 0", "lr_mult: 0",
                                                                "lr_mult: 0"))


CIFAR_SIGMOID_BN = (
    'name: "cifar_bn"\n' + _data(["data", "label"], "TRAIN") + _data(["data", "label"], "TEST") +
    _conv("conv1", "data", 32, 5, 2, bias=False) + _pool("pool1", "conv1", "MAX", 3, 2) +
    _bn("bn1", "pool1") + _layer("Sigmoid1", "Sigmoid", ["bn1"], ["Sigmoid1"]) +
    _conv("conv2", "Sigmoid1", 32, 5, 2, bias=False) + _bn("bn2", "conv2") +
    _layer("Sigmoid2", "Sigmoid", ["bn2"], ["Sigmoid2"]) + _pool("pool2", "Sigmoid2", "AVE", 3, 2) +
    _conv("conv3", "pool2", 64, 5, 2, bias=False) + _bn("bn3", "conv3") +
    _layer("Sigmoid3", "Sigmoid", ["bn3"], ["Sigmoid3"]) + _pool("pool3", "Sigmoid3", "AVE", 3, 2) +
    _ip("ip1", "pool3", 10) +
    _layer("accuracy", "Accuracy", ["ip1", "label"], ["accuracy"], "  include { phase: TEST }\n") +
    _layer("loss", "SoftmaxWithLoss", ["ip1", "label"], ["loss"]))


def test_cifar_sigmoid_batchnorm_normalises_and_backpropagates():
    rng = numpy.random.default_rng(2)
    net = _built(CIFAR_SIGMOID_BN, {"data": (4, 3, 32, 32), "label": (4,)})
    # convs without bias 2400 + 25600 + 51200, ip1 10x1024 + 10, BatchNorm mean/var per channel
    # and the moving-average factor: 2 * (32 + 32 + 64) + 3
    assert sum(b.count for b in net.learnable_params) == 79_200 + 10_250 + 259
    net.blobs["data"].data[...] = rng.normal(size=(4, 3, 32, 32))
    net.blobs["label"].data[...] = [0, 3, 7, 9]
    loss = net.forward_loss()
    p = net.blobs["ip1"].data.astype(float)
    p = numpy.exp(p - p.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    assert loss == pytest.approx(-numpy.log(p[range(4), [0, 3, 7, 9]]).mean(), rel=1e-4)
    bn = net.blobs["bn2"].data.astype(float)
    numpy.testing.assert_allclose(bn.mean(axis=(0, 2, 3)), 0, atol=1e-4)
    numpy.testing.assert_allclose(bn.var(axis=(0, 2, 3)), 1, atol=2e-3)
    net.clear_param_diffs()
    net.backward()
    assert numpy.isfinite(net.flat_diff).all() and numpy.abs(net.params["conv1"][0].diff).sum() > 0


def _lrn(name, bottom):
    return _layer(name, "LRN", [bottom], [name], "  lrn_param { local_size: 3 alpha: 5e-05 "
                  "beta: 0.75 norm_region: WITHIN_CHANNEL }\n")


CIFAR_FULL = (
    'name: "cifar_full"\n' + _data(["data", "label"], "TRAIN") + _data(["data", "label"], "TEST") +
    _conv("conv1", "data", 32, 5, 2) + _pool("pool1", "conv1", "MAX", 3, 2) +
    _layer("relu1", "ReLU", ["pool1"], ["pool1"]) + _lrn("norm1", "pool1") +
    _conv("conv2", "norm1", 32, 5, 2) + _layer("relu2", "ReLU", ["conv2"], ["conv2"]) +
    _pool("pool2", "conv2", "AVE", 3, 2) + _lrn("norm2", "pool2") +
    _conv("conv3", "norm2", 64, 5, 2) + _layer("relu3", "ReLU", ["conv3"], ["conv3"]) +
    _pool("pool3", "conv3", "AVE", 3, 2) + _ip("ip1", "pool3", 10) +
    _layer("loss", "SoftmaxWithLoss", ["ip1", "label"], ["loss"]))


def test_cifar_full_shapes_and_parameter_count():
    """CIFAR-10 full: 32x32 → pool1 16 → pool2 8 → pool3 4 (ceil pooling, k3 s2), so ip1 sees
    64x4x4 = 1024 inputs; the count follows from the layer shapes."""
    net = _built(CIFAR_FULL, {"data": (2, 3, 32, 32), "label": (2,)})
    shapes = {n: net.blobs[n].shape for n in ("pool1", "norm1", "pool2", "pool3", "ip1")}
    assert shapes == {"pool1": (2, 32, 16, 16), "norm1": (2, 32, 16, 16),
                      "pool2": (2, 32, 8, 8), "pool3": (2, 64, 4, 4), "ip1": (2, 10)}
    want = (32 * 3 * 25 + 32) + (32 * 32 * 25 + 32) + (64 * 32 * 25 + 64) + (10 * 1024 + 10)
    assert sum(b.count for b in net.learnable_params) == want == 89_578


V1_NET = """name: "v1"
layers { name: "d" type: DATA top: "data" top: "label"
  data_param { source: "absent_leveldb" batch_size: 3 scale: 0.00390625 } }
layers { name: "ip" type: INNER_PRODUCT bottom: "data" top: "ip" blobs_lr: 1 blobs_lr: 2
  weight_decay: 1 weight_decay: 0
  inner_product_param { num_output: 4 weight_filler { type: "xavier" } } }
layers { name: "loss" type: SOFTMAX_LOSS bottom: "ip" bottom: "label" }
"""


def test_v1_net_whose_loss_layer_has_no_top():
    """Old (V1) nets often leave the loss layer's top out; Caffe adds an anonymous one."""
    net = _built(V1_NET, {"data": (3, 5), "label": (3,)})
    assert net.output_blob_names == [] and net.layer_loss_weights[-1] == [1.0]
    assert net.params_lr == [1.0, 2.0] and net.params_weight_decay == [1.0, 0.0]
    rng = numpy.random.default_rng(3)
    x = rng.normal(size=(3, 5))
    net.blobs["data"].data[...] = x
    net.blobs["label"].data[...] = [0, 2, 3]
    w, b = (p.data.astype(float) for p in net.params["ip"])
    z = x @ w.T + b
    logp = z - z.max(axis=1, keepdims=True)
    logp -= numpy.log(numpy.exp(logp).sum(axis=1, keepdims=True))
    assert net.forward_loss() == pytest.approx(-logp[range(3), [0, 2, 3]].mean(), rel=1e-5)
