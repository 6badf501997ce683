"""scripts/peer_bench.py: one round on LeNet at batch 2 against PyTorch, and its CSV.

The run is real (both worker processes, the generated PyTorch twin, whose blob shapes the script
checks against caffe8's); timings are only checked to be positive numbers, never compared."""
import csv
import os
import subprocess
import sys

import pytest

from scripts import peer_bench

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_benchmark_net_swaps_data_for_dummy_data():
    net = peer_bench.benchmark_net_param("caffenet", 3)
    types = [layer.type for layer in net.layer]
    assert types[0] == "DummyData" and "Data" not in types
    shapes = [list(s.dim) for s in net.layer[0].dummy_data_param.shape]
    assert shapes == [[3, 3, 227, 227], [3]]


def test_emit_writes_prototxts_that_build(tmp_path):
    from caffe8.engine.net import Net
    from caffe8 import layers  # noqa: F401
    assert peer_bench.main(["--nets", "lenet", "--batch", "lenet=3", "--emit", str(tmp_path)]) == 0
    net = Net(str(tmp_path / "lenet_b3.prototxt"), phase="TRAIN")
    assert net.blobs["data"].shape == (3, 1, 28, 28)


def test_profile_lists_every_layer_type_and_the_total(capsys):
    assert peer_bench.main(["--nets", "lenet", "--batch", "lenet=2", "--profile", "--layers",
                            "--iters", "1", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    for name in ("conv1", "pool2", "ip1", "loss", "Convolution", "Pooling", "InnerProduct"):
        assert name in out
    total = [line for line in out.splitlines() if line.strip().startswith("total")][0]
    assert float(total.split("=")[1].split()[0]) > 0


def test_pytorch_twin_of_lenet_computes_the_same_loss():
    """The generated PyTorch graph is the same net: with caffe8's weights and input (LeNet has no
    dropout) its loss equals caffe8's to float32 rounding."""
    torch = pytest.importorskip("torch")
    from caffe8.engine import backend
    from caffe8.engine.net import Net
    from caffe8 import layers  # noqa: F401
    backend.seed(1)
    net = Net(peer_bench.benchmark_net_param("lenet", 2), phase="TRAIN")
    loss = net.forward_loss()
    twin = peer_bench.TorchRunner(net, torch, "cpu", lambda: None)
    twin.check_shapes()
    assert float(twin.loss.detach()) == pytest.approx(loss, rel=1e-5)


def test_unknown_net_is_refused():
    with pytest.raises(SystemExit):
        peer_bench.parse_args(["--nets", "alexnet"])


def test_one_round_on_lenet_writes_the_csv(tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "peer.csv"
    proc = subprocess.run(
        [sys.executable, "-m", "scripts.peer_bench", "--nets", "lenet", "--batch", "lenet=2", "--rounds", "1",
         "--iters", "1", "--threads", "1", "--csv", str(out)],
        cwd=REPO, capture_output=True, text=True,
        timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with open(out, newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == peer_bench.COLUMNS
    assert [(r["net"], r["batch"], r["device"], r["side"]) for r in rows] == \
        [("lenet", "2", "cpu", "caffe8"), ("lenet", "2", "cpu", "pytorch")]
    for r in rows:
        f, b, t = (float(r[k]) for k in ("forward_ms", "backward_ms", "total_ms"))
        assert f > 0 and b > 0 and t == pytest.approx(f + b, abs=2e-3)  # three roundings to 1e-3
    assert float(rows[0]["ratio"]) == pytest.approx(
        float(rows[0]["total_ms"]) / float(rows[1]["total_ms"]), rel=1e-2)
    assert rows[1]["ratio"] == "" and rows[1]["cudnn_calls"] == ""
    assert float(rows[0]["cudnn_calls"]) == 0.0          # on the CPU no cuDNN call is made
