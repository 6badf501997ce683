"""studies/bvlc_trajectory/famous.py: a published net (deploy file or train_val) made trainable
from an HDF5 file for the comparison with BVLC Caffe, its weights drawn per layer type, and the
harness on it with caffe8 on both sides (exactly equal), and against a real BVLC Caffe build
where $CAFFE8_BVLC_CAFFE names its tools/caffe."""
import os
import stat
import sys

import numpy
import pytest

from caffe8 import wiring
from caffe8.engine import model_io
from caffe8.engine.prototxt import parse_text
from studies.bvlc_trajectory import _blocks as blocks, famous, run

DEPLOY = """name: "tiny-deploy"
input: "data"
input_dim: 1
input_dim: 3
input_dim: 12
input_dim: 12
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
        convolution_param { num_output: 4 kernel_size: 3 bias_term: false } }
layer { name: "bn1" type: "BatchNorm" bottom: "conv1" top: "conv1"
        batch_norm_param { use_global_stats: true } }
layer { name: "scale1" type: "Scale" bottom: "conv1" top: "conv1" scale_param { bias_term: true } }
layer { name: "relu1" type: "ReLU" bottom: "conv1" top: "conv1" }
layer { name: "drop1" type: "Dropout" bottom: "conv1" top: "conv1_drop" }
layer { name: "fc" type: "InnerProduct" bottom: "conv1_drop" top: "fc"
        inner_product_param { num_output: 10 } }
layer { name: "prob" type: "Softmax" bottom: "fc" top: "prob" }
"""

TRAIN_VAL = """name: "tiny-train-val"
layer { name: "data" type: "Data" top: "data" top: "target" include { phase: TRAIN }
        transform_param { crop_size: 9 mean_value: 104 mean_value: 117 mean_value: 123 }
        data_param { source: "nowhere_train_lmdb" batch_size: 32 backend: LMDB } }
layer { name: "data" type: "Data" top: "data" top: "target" include { phase: TEST }
        transform_param { crop_size: 9 } data_param { source: "nowhere_val_lmdb" batch_size: 8 } }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
        convolution_param { num_output: 10 kernel_size: 3 weight_filler { type: "xavier" } } }
layer { name: "drop" type: "Dropout" bottom: "conv1" top: "conv1" }
layer { name: "pool" type: "Pooling" bottom: "conv1" top: "pool"
        pooling_param { pool: AVE global_pooling: true } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "pool" bottom: "target" top: "loss" }
layer { name: "acc" type: "Accuracy" bottom: "pool" bottom: "target" top: "acc"
        include { phase: TEST } }
"""


@pytest.fixture(autouse=True)
def _layers():
    wiring.register_all()


def _write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_a_deploy_net_gets_an_hdf5_input_and_a_loss(tmp_path):
    text, inputs = famous.training_net(_write(tmp_path, "deploy.prototxt", DEPLOY), 2,
                                       str(tmp_path / "b.txt"))
    net = parse_text(text)
    assert inputs == {"data": (2, 3, 12, 12), "label": (2,)}
    assert not net.input and not net.input_dim
    types = [layer.type for layer in net.layer]
    assert types == ["HDF5Data", "Convolution", "BatchNorm", "Scale", "ReLU", "InnerProduct",
                     "SoftmaxWithLoss"]
    data, fc, loss = net.layer[0], net.layer[5], net.layer[-1]
    assert list(data.top) == ["data", "label"] and data.hdf5_data_param.batch_size == 2
    assert data.hdf5_data_param.source == str(tmp_path / "b.txt")
    assert list(fc.bottom) == ["conv1"]                  # the Dropout bridged
    assert list(loss.bottom) == ["fc", "label"]          # the closing Softmax became the loss
    assert net.layer[2].batch_norm_param.use_global_stats is True     # left as written


def test_a_train_val_net_keeps_its_loss_and_label_name(tmp_path):
    text, inputs = famous.training_net(_write(tmp_path, "tv.prototxt", TRAIN_VAL), 3,
                                       str(tmp_path / "b.txt"))
    net = parse_text(text)
    assert inputs == {"data": (3, 3, 9, 9), "target": (3,)}
    assert [layer.type for layer in net.layer] == ["HDF5Data", "Convolution", "Pooling",
                                                   "SoftmaxWithLoss"]
    assert list(net.layer[0].top) == ["data", "target"]
    assert list(net.layer[-1].bottom) == ["pool", "target"]


def test_a_net_without_an_input_is_named(tmp_path):
    path = _write(tmp_path, "none.prototxt",
                  'layer { name: "r" type: "ReLU" bottom: "x" top: "x" }\n')
    with pytest.raises(ValueError, match="none.prototxt: no input found"):
        famous.training_net(path, 2, str(tmp_path / "b.txt"))


def test_drawn_weights_follow_the_layer_types(tmp_path):
    text, _ = famous.training_net(_write(tmp_path, "deploy.prototxt", DEPLOY), 2,
                                  str(tmp_path / "batches.txt"))
    blocks.write_batches(tmp_path, {"data": (2, 3, 12, 12), "label": (2,)}, 1,
                             famous.make_batch)
    path = str(tmp_path / "init.caffemodel")
    famous.write_initial_model(text, path)
    blobs = {(name, i): numpy.array(b.data) for name, bs, _ in
             model_io.source_layers(model_io.read_binary_net(path)) for i, b in enumerate(bs)}
    # BatchNorm's statistics: those of conv1's output on the first batch (a naive convolution)
    import h5py
    with h5py.File(tmp_path / "batches.h5") as f:
        x = f["data"][:2].astype(numpy.float64)
    w = blobs["conv1", 0].astype(numpy.float64).reshape(4, 3, 3, 3)
    out = numpy.zeros((2, 4, 10, 10))
    for i in range(3):
        for j in range(3):
            out += numpy.einsum("ck,nkyx->ncyx", w[:, :, i, j], x[:, :, i:i + 10, j:j + 10])
    m = out.size // 4
    assert numpy.allclose(blobs["bn1", 0], out.mean(axis=(0, 2, 3)), rtol=1e-4, atol=1e-5)
    assert numpy.allclose(blobs["bn1", 1], out.var(axis=(0, 2, 3)) * m / (m - 1), rtol=1e-4)
    assert blobs["bn1", 2].tolist() == [1.0]
    assert numpy.all((blobs["scale1", 0] >= 0.8) & (blobs["scale1", 0] <= 1.2))
    fc = blobs["fc", 0]                                  # 10 × (4·10·10): He scale of 400 inputs
    assert abs(fc.std() - numpy.sqrt(2.0 / 400)) < 0.1 * numpy.sqrt(2.0 / 400)
    assert numpy.abs(blobs["fc", 1]).max() <= 0.1 and numpy.abs(blobs["fc", 1]).max() > 0


def test_the_harness_on_a_famous_net_against_itself_is_exact(tmp_path):
    fake = tmp_path / "caffe"
    fake.write_text(f"#!/bin/sh\nexec {sys.executable} -m caffe8.cli \"$@\"\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    rows = run.run_prototxt(_write(tmp_path, "deploy.prototxt", DEPLOY), str(fake),
                            str(tmp_path / "out"), steps=2, batch=2)
    # conv1's weight; bn1's mean, variance, factor; scale1's γ, β; fc's weight, bias
    assert [r[1] for r in rows] == ["conv1/0", "bn1/0", "bn1/1", "bn1/2", "scale1/0",
                                    "scale1/1", "fc/0", "fc/1"]
    assert all(r[2:4] == (0.0, 0.0) for r in rows), rows   # then the one-ulp floor's two


@pytest.mark.skipif(not os.environ.get("CAFFE8_BVLC_CAFFE"), reason="no BVLC Caffe build named")
def test_a_deploy_net_follows_bvlc_caffe_within_its_floor(tmp_path):
    rows = run.run_prototxt(_write(tmp_path, "deploy.prototxt", DEPLOY),
                            os.environ["CAFFE8_BVLC_CAFFE"], str(tmp_path / "out"), steps=2,
                            batch=2)
    for net, blob, *errs in rows:
        ours, floor = errs[:2], errs[2:]
        assert all(e <= max(2 * f, 1e-4) for e, f in zip(ours, floor)), (blob, ours, floor)


def test_the_command_writes_the_trainable_net(tmp_path, capsys):
    out = tmp_path / "train.prototxt"
    famous.main([_write(tmp_path, "deploy.prototxt", DEPLOY), "--out", str(out), "--batch", "3"])
    net = parse_text(out.read_text())
    assert [layer.type for layer in net.layer][:2] == ["Input", "Input"]
    assert list(net.layer[0].input_param.shape[0].dim) == [3, 3, 12, 12]
    assert net.layer[-1].type == "SoftmaxWithLoss"
    assert "data (3, 3, 12, 12), label (3,)" in capsys.readouterr().out
