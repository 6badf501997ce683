"""The caffe8 command: inspect, time, test, train --weights, through main() as a user calls it,
in Caffe's spellings (-solver, -weights ...) as well as --long ones."""
import os
import re
import signal

import pytest

from caffe8.cli import build_parser, main, translate_caffe_flags
from caffe8.tools.train import install_signal_handlers
from caffe8.engine import backend
from tests.engine.trainer_util import REPO, write_solver


def test_inspect_counts_parameters(capsys):
    assert main(["inspect", os.path.join(REPO, "prototxt/caffenet/deploy.prototxt"), "--phase", "TEST"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out[-1] == "Total parameters: 60965224"
    assert any(line.split()[:2] == ["conv1", "Convolution"] for line in out)


def test_time_reports_every_layer(capsys):
    assert main(["time", "--model", os.path.join(REPO, "prototxt/lenet/train_val_small.prototxt"),
                 "--iterations", "2"]) == 0
    err = capsys.readouterr().err
    for name in ("conv1", "pool1", "ip2", "loss"):
        assert re.search(rf"{name}\tforward: [\d.e+-]+ ms\.", err), name
        assert re.search(rf"{name}\tbackward: [\d.e+-]+ ms\.", err), name
    assert "Average Forward-Backward:" in err


DATA_NET = """name: "no_data_here"
layer { name: "mnist" type: "Data" top: "data" top: "label" include { phase: TRAIN }
  transform_param { scale: 0.00390625 } data_param { source: "absent_lmdb" batch_size: 64 } }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
  inner_product_param { num_output: 3 weight_filler { type: "xavier" } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
"""


def test_time_without_the_data_takes_the_data_shape(tmp_path, capsys, monkeypatch):
    """``caffe8 time --data-shape``: the Data layer becomes an Input layer of that shape (its
    label one per item), so a net is timed on a clone without its databases."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "net.prototxt").write_text(DATA_NET)
    assert main(["time", "-model", "net.prototxt", "-iterations", "1"]) == 1
    err = capsys.readouterr().err  # a relative path names the folder it was looked up in
    assert f"'absent_lmdb' does not exist (relative to the working directory {tmp_path})" in err
    assert main(["time", "-model", "absent.prototxt"]) == 1
    assert f"absent.prototxt: cannot be read: No such file or directory (relative to the " \
        f"working directory {tmp_path})" in capsys.readouterr().err
    assert main(["time", "-model", "net.prototxt", "-iterations", "1",
                 "--data-shape", "data=5,1,4,4"]) == 0
    err = capsys.readouterr().err
    assert "Top shape: 5 1 4 4 (80)" in err and "Top shape: 5 (5)" in err
    assert re.search(r"mnist\tforward: [\d.e+-]+ ms\.", err)
    assert "Average Forward-Backward:" in err


@pytest.mark.slow
def test_time_times_caffenets_train_val_without_imagenet(tmp_path, capsys, monkeypatch):
    """Issue 33's acceptance: BVLC's CaffeNet train_val (ImageNet LMDBs and mean file absent)
    is timed with --data-shape from a folder that holds no data; its label follows the batch."""
    monkeypatch.chdir(tmp_path)
    model = os.path.join(REPO, "prototxt/caffenet/train_val.prototxt")
    assert main(["time", "-model", model, "-iterations", "1", "--data-shape",
                 "data=1,3,227,227"]) == 0
    err = capsys.readouterr().err
    assert re.search(r"fc8\tbackward: [\d.e+-]+ ms\.", err) and "Total Time:" in err


def test_train_then_test_then_finetune(in_digits_cwd, tmp_path, capsys):
    solver = write_solver(tmp_path, max_iter=60, display=0, test_interval=0, test_iter=[], snapshot=0)
    assert main(["train", "--solver", solver]) == 0
    model = tmp_path / "snap" / "digits_iter_60.caffemodel.h5"
    assert model.exists()
    capsys.readouterr()
    assert main(["test", "--model", os.path.join(REPO, "prototxt/digits/train_val.prototxt"),
                 "--weights", str(model), "--iterations", "6"]) == 0
    err = capsys.readouterr().err
    assert f"Copying layers from {model}" in err
    acc = float(re.findall(r"\] accuracy = ([\d.e+-]+)", err)[-1])
    assert acc > 0.8
    # --weights initialises a new run from the model: its first test is already good
    solver2 = write_solver(tmp_path / "ft", max_iter=1, display=0, test_interval=1, test_iter=[6],
                           snapshot=0, snapshot_after_train=False)
    assert main(["train", "-solver", solver2, "-weights", str(model)]) == 0  # Caffe's spelling
    err = capsys.readouterr().err
    assert f"Finetuning from {model}" in err
    assert "Gradient exchange: none (1 process)" in err
    assert err.index("Finetuning from") < err.index("Solving")
    first = float(re.findall(r"Test net output #0: accuracy = ([\d.e+-]+)", err)[0])
    assert first == pytest.approx(acc, abs=1e-6)


def test_errors_are_one_line_without_traceback(tmp_path, capsys):
    bad = tmp_path / "s.prototxt"
    bad.write_text('net: "x.prototxt"\nmax_iter: 1\nlr_policy: "fixed"\n')
    assert main(["train", "--solver", str(bad)]) == 1
    err = capsys.readouterr().err
    assert "caffe8: error:" in err and "x.prototxt" in err and "Traceback" not in err


def test_caffe_flags_translate_to_long_options():
    argv = ["train", "-solver", "s.prototxt", "-weights=w.h5", "-gpu", "all", "-sigint_effect",
            "none", "-h", "-level", "-1", "-stage", "a,b", "-log_dir", "logs"]
    assert translate_caffe_flags(argv) == [
        "train", "--solver", "s.prototxt", "--weights=w.h5", "--gpu", "all", "--sigint_effect",
        "none", "-h", "--level", "-1", "--stage", "a,b", "--log_dir", "logs"]
    args = build_parser().parse_args(translate_caffe_flags(
        ["train", "-solver", "s", "-sigint_effect", "snapshot", "-stage", "a,b", "-level", "2"]))
    assert (args.solver, args.sigint_effect, args.sighup_effect, args.stage, args.level) == \
        ("s", "snapshot", "snapshot", ["a,b"], 2)
    # the benchmark script's own flags pass through untouched
    assert translate_caffe_flags(["bench", "-solver"]) == ["bench", "-solver"]


@pytest.mark.parametrize("command", ["train", "test", "time", "device_query", "inspect", "bench"])
def test_every_subcommand_answers_help(command, capsys):
    with pytest.raises(SystemExit) as e:
        main([command, "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage:") and "--help" in out


def test_time_in_caffe_spelling_and_gpu_without_a_gpu(capsys):
    model = os.path.join(REPO, "prototxt/lenet/train_val_small.prototxt")
    assert main(["time", "-model", model, "-iterations", "1", "-phase", "TEST"]) == 0
    assert "Average Forward-Backward:" in capsys.readouterr().err
    if not backend.gpu_available():
        assert main(["time", "-model", model, "-iterations", "1", "-gpu", "0"]) == 1
        err = capsys.readouterr().err
        assert "--gpu 0: no CUDA GPU can be used" in err and "[cuda13]'`" in err


@pytest.mark.gpu
def test_time_on_gpu_0(capsys):
    model = os.path.join(REPO, "prototxt/lenet/train_val_small.prototxt")
    try:
        assert main(["time", "-model", model, "-iterations", "2", "-gpu", "0"]) == 0
    finally:
        backend.use_cpu()
    assert re.search(r"conv1\tforward: [\d.e+-]+ ms\.", capsys.readouterr().err)


def test_tf32_flag_calls_the_backend_switch_or_says_it_is_missing(monkeypatch, capsys):
    model = os.path.join(REPO, "prototxt/lenet/train_val_small.prototxt")
    monkeypatch.delattr(backend, "set_tf32", raising=False)
    assert main(["time", "-model", model, "-iterations", "1", "--tf32"]) == 1
    assert "--tf32: this build has no TF32 switch" in capsys.readouterr().err
    calls = []
    monkeypatch.setattr(backend, "set_tf32", lambda on: calls.append(on) or "TF32 line",
                        raising=False)
    assert main(["time", "-model", model, "-iterations", "1", "--tf32"]) == 0
    assert calls == [True] and "] TF32 line" in capsys.readouterr().err


def test_inspect_train_val_without_its_data(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no data/ here
    assert main(["inspect", os.path.join(REPO, "prototxt/caffenet/train_val.prototxt")]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    # batch_size 256, three mean values → 3 channels, crop_size 227; shown as the Data layer
    assert out[0].split()[:4] == ["data", "Data", "top", "256x3x227x227"]
    assert out[-1] == "Total parameters: 60965224"  # CaffeNet's well-known count
    digits = os.path.join(REPO, "prototxt/digits/train_val.prototxt")
    assert main(["inspect", digits]) == 1  # no crop/mean: the shape is in the data only
    err = capsys.readouterr().err
    # the label's shape is the batch (batch_size 32): only the data's is asked for
    assert "--data-shape data=..." in err and "--data-shape label=..." not in err
    assert "Traceback" not in err
    assert main(["inspect", digits, "-data_shape", "data=32,1,8,8", "--data-shape", "label=32",
                 "-phase", "TEST"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out[0].split()[:4] == ["digits", "Data", "top", "32x1x8x8"]
    # the TEST data layer's batch_size is 50: its label is (50,) unless given
    assert main(["inspect", digits, "-data_shape", "data=50,1,8,8", "-phase", "TEST"]) == 0
    test_out = capsys.readouterr().out.strip().splitlines()
    assert test_out[0].split()[:5] == ["digits", "Data", "top", "50x1x8x8", "50"]
    assert test_out[-1] == out[-1]
    assert out[-1] == "Total parameters: 53002"  # (32·9+32) + (64·32·9+64) + (128·256+128) + (10·128+10)


def test_signal_effects(capsys):
    class Trainer:
        def __init__(self):
            self.requests = []

        def request(self, what):
            self.requests.append(what)

    lines = []
    old = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGHUP)
    try:
        t = Trainer()
        install_signal_handlers(t, lines.append, "snapshot", "none")
        os.kill(os.getpid(), signal.SIGHUP)
        os.kill(os.getpid(), signal.SIGINT)
        assert t.requests == ["snapshot"]
        assert lines == ["SIGHUP received; ignored (-sighup_effect none)"]
        with pytest.raises(KeyboardInterrupt):  # a second SIGINT stops at once
            os.kill(os.getpid(), signal.SIGINT)
        t = Trainer()
        install_signal_handlers(t, lines.append)  # Caffe's defaults
        os.kill(os.getpid(), signal.SIGHUP)
        os.kill(os.getpid(), signal.SIGINT)
        assert t.requests == ["snapshot", "stop"]
    finally:
        signal.signal(signal.SIGINT, old[0])
        signal.signal(signal.SIGHUP, old[1])


@pytest.mark.mpi
def test_mpiexec_logs_the_default_fp8_exchange_once(in_digits_cwd, tmp_path):
    import shutil
    import subprocess
    import sys
    from caffe8.engine.prototxt import parse_file, to_text
    from tests.engine.trainer_util import DIGITS_SOLVER, DIGITS_NET
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    mpiexec = mpiexec if os.path.exists(mpiexec) else shutil.which("mpiexec")
    if mpiexec is None:
        pytest.skip("no mpiexec")
    sp = parse_file(DIGITS_SOLVER, "SolverParameter")
    sp.clear("comm")  # no comm block: the defaults apply
    sp.net, sp.max_iter, sp.display, sp.test_interval = DIGITS_NET, 4, 0, 0
    sp.test_iter, sp.snapshot_after_train = [], False
    solver = tmp_path / "solver.prototxt"
    solver.write_text(to_text(sp))
    r = subprocess.run([mpiexec, "-n", "2", sys.executable, "-m", "caffe8.cli", "train",
                        "-solver", str(solver)], cwd=str(in_digits_cwd),
                       env=dict(os.environ, PYTHONPATH=REPO), stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:]
    lines = [l for l in r.stdout.splitlines() if "Gradient exchange:" in l]
    assert len(lines) == 1, r.stdout[-3000:]  # rank 0 only
    assert lines[0].endswith("] Gradient exchange: fp8 (ratio, q=0.95), hierarchical, "
                             "2 processes on 1 node, asynchronous")


def test_time_with_stage_level_and_log_dir(tmp_path, capsys):
    model = tmp_path / "staged.prototxt"
    model.write_text("""
layer { name: "data" type: "DummyData" top: "data"
  dummy_data_param { shape { dim: 2 dim: 3 } } }
layer { name: "big" type: "InnerProduct" bottom: "data" top: "out"
  include { stage: "big" min_level: 1 } inner_product_param { num_output: 4 } }
layer { name: "small" type: "InnerProduct" bottom: "data" top: "out"
  exclude { stage: "big" min_level: 1 } inner_product_param { num_output: 2 } }
""")
    logs = tmp_path / "logs"
    assert main(["time", "-model", str(model), "-iterations", "1", "-stage", "big",
                 "-level", "1", "-log_dir", str(logs)]) == 0
    text = (logs / "caffe8.time.INFO").read_text()
    assert re.search(r"big\tforward", text) and "small\tforward" not in text
    capsys.readouterr()
    assert main(["time", "-model", str(model), "-iterations", "1", "-stage", "big"]) == 0
    err = capsys.readouterr().err                       # level 0 < min_level 1
    assert re.search(r"small\tforward", err) and "big\tforward" not in err


def test_gpu_all_picks_one_gpu_per_process(monkeypatch):
    from types import SimpleNamespace
    from caffe8.tools._run import select_device
    from caffe8.engine.errors import CaffeError
    used, lines = [], []
    runtime = SimpleNamespace(getDeviceCount=lambda: 4)
    monkeypatch.setattr(backend, "gpu_available", lambda: True)
    monkeypatch.setattr(backend, "cupy", SimpleNamespace(cuda=SimpleNamespace(runtime=runtime)))
    monkeypatch.setattr(backend, "use_gpu", used.append)
    select_device("all", None, 0, SimpleNamespace(size=4, local_rank=3), lines.append)
    select_device("2", None, 0, SimpleNamespace(size=4, local_rank=3), lines.append)
    assert used == [3, 1] and lines == []                 # (id + local rank) mod 4
    select_device("all", None, 0, SimpleNamespace(size=1, local_rank=0), lines.append)
    assert used[-1] == 0 and "mpiexec -n 4" in lines[0]
    with pytest.raises(CaffeError, match="one device id or 'all'"):
        select_device("0,1", None, 0, SimpleNamespace(size=1, local_rank=0), lines.append)


def test_convert_round_trips_binary_and_hdf5(tmp_path, capsys):
    """caffe8 convert: binary -> HDF5 -> binary keeps every blob; the HDF5 file is Caffe's layout
    (read with h5py) and the binary one a NetParameter (read with protobuf)."""
    import h5py
    import numpy
    from caffe8.cli import main as cli_main
    from caffe8.engine.proto import caffe_pb2
    src = caffe_pb2.NetParameter(name="tiny")
    layer = src.layer.add(name="fc", type="InnerProduct")
    w = numpy.arange(6, dtype=numpy.float32).reshape(2, 3)
    blob = layer.blobs.add()
    blob.shape.dim.extend(w.shape)
    blob.data.extend(w.ravel().tolist())
    binary = tmp_path / "m.caffemodel"
    binary.write_bytes(src.SerializeToString())
    h5 = tmp_path / "m.caffemodel.h5"
    assert cli_main(["convert", str(binary), str(h5)]) == 0
    with h5py.File(h5, "r") as f:
        assert numpy.array_equal(f["data/fc/0"][()], w)
    back = tmp_path / "back.caffemodel"
    assert cli_main(["convert", str(h5), str(back)]) == 0
    msg = caffe_pb2.NetParameter()
    msg.ParseFromString(back.read_bytes())
    got = [l for l in msg.layer if l.name == "fc"][0].blobs[0]
    assert list(got.shape.dim) == [2, 3] and list(got.data) == w.ravel().tolist()
