"""examples/pytorch_ddp_fashion_mnist.py as documented (torchrun on one machine), briefly, on
small IDX files of the real format: it trains with caffe8's fp8 hook and reports the test
accuracy; without its data it says so in one line."""
import csv
import math
import os
import subprocess
import sys

import pytest

from tests.examples.fashion_idx import write_idx_slices

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(REPO, "examples", "pytorch_ddp_fashion_mnist.py")


def _run(argv, timeout=300):
    return subprocess.run(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=timeout,
                          env=dict(os.environ, PYTHONPATH=REPO, OMP_NUM_THREADS="1"))


def _torchrun_two(tmp_path, net, interval, *extra):
    """The example under torchrun, 2 processes, 40 iterations on small IDX files: its test
    curve's rows, after checking its closing line."""
    pytest.importorskip("torch")
    data = write_idx_slices(str(tmp_path / "fm"))
    out = tmp_path / "curve.csv"
    r = _run([sys.executable, "-m", "torch.distributed.run", "--standalone",
              "--nproc-per-node", "2", EXAMPLE, "--net", net, "--data", data, "--iterations",
              "40", "--test-interval", str(interval), "--csv", str(out)] + list(extra))
    assert r.returncode == 0, r.stdout[-3000:]
    assert "final test accuracy" in r.stdout
    assert f"({net}, fp8, 2 processes, 40 iterations" in r.stdout
    rows = list(csv.DictReader(open(out)))
    assert [int(row["iteration"]) for row in rows] == list(range(0, 41, interval))
    # every row's training loss is a number, iteration 0's too (it printed "loss nan" once):
    # 10 classes at chance give about ln 10 before the first update
    losses = [float(row["loss"]) for row in rows]
    assert all(math.isfinite(v) for v in losses) and 1.0 < losses[0] < 4.0, losses
    assert "loss nan" not in r.stdout
    return rows


@pytest.mark.mpi
def test_torchrun_trains_lenet_with_the_fp8_hook(tmp_path):
    rows = _torchrun_two(tmp_path, "lenet", 20, "--processes-per-node", "1")
    # 10 equally likely classes: chance is 0.1; the blocks are learnt within 40 steps
    assert float(rows[0]["accuracy"]) < 0.3 < 0.8 < float(rows[-1]["accuracy"]), rows


def _example():
    import importlib.util
    spec = importlib.util.spec_from_file_location("pytorch_ddp_fashion_mnist", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_resnet_has_the_learned_tensors_of_the_prototxt():
    """The example's ResNet against prototxt/fashion_mnist/paper/resnet_b16.prototxt as caffe8
    builds it: the same learned tensors in the same order (convolution and linear weights,
    BatchNorm's scale and shift as Caffe's Scale layer, the linear bias)."""
    torch = pytest.importorskip("torch")
    from caffe8.engine.net import Net
    from caffe8.engine.prototxt import parse_file, parse_text, to_text
    param = parse_file(os.path.join(REPO, "prototxt", "fashion_mnist", "paper",
                                    "resnet_b16.prototxt"))
    layers = "".join(f"layer {{\n{to_text(layer, 1)}}}\n" for layer in param.layer
                     if layer.type != "Data")
    net = Net(parse_text('layer { name: "data" type: "Input" top: "data" top: "label" '
                         'input_param { shape { dim: 16 dim: 1 dim: 28 dim: 28 } '
                         'shape { dim: 16 } } }\n' + layers), "TRAIN")
    learned = [tuple(blob.shape) for layer in net.layers if layer.type != "BatchNorm"
               for blob in layer.blobs]
    model = _example().resnet()
    ours = [tuple(p.shape) for p in model.parameters()]
    # Caffe's Scale holds (C,) scale and shift where PyTorch's BatchNorm2d holds weight and bias
    assert ours == learned
    assert sum(p.numel() for p in model.parameters()) == 20506
    assert model(torch.zeros(2, 1, 28, 28)).shape == (2, 10)


@pytest.mark.mpi
def test_torchrun_trains_the_resnet_with_the_fp8_hook(tmp_path):
    rows = _torchrun_two(tmp_path, "resnet", 40)
    assert float(rows[0]["accuracy"]) < 0.3 < 0.6 < float(rows[-1]["accuracy"]), rows


def test_missing_data_is_one_line(tmp_path):
    pytest.importorskip("torch")
    r = _run([sys.executable, EXAMPLE, "--data", str(tmp_path)], timeout=120)
    assert r.returncode == 1
    assert r.stdout.strip().splitlines()[-1] == (
        f"pytorch_ddp_fashion_mnist: no train-images-idx3-ubyte[.gz] in {tmp_path} "
        f"(apt-get install dataset-fashion-mnist, or --data FOLDER)")
