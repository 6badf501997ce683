"""Training loop: exact resume, Caffe log compatibility, solver validation, non-finite guard."""
import datetime
import io
import os
import re

import h5py
import numpy
import pytest

from caffe8.engine.errors import CaffeError, PrototxtError, SolverError
from caffe8.engine.glog import GLog
from caffe8.engine.prototxt import parse_file, parse_text, to_text
from caffe8.engine.trainer import Trainer
from tests.engine.trainer_util import DIGITS_NET, REPO, write_solver


def _shuffling_dropout_net(folder):
    """The digits net with an ImageData (shuffle, mirror) train source and a Dropout, so that
    an exact resume has to restore data order, data RNG and the dropout RNG."""
    net = parse_file(DIGITS_NET)
    train = net.layer[0]
    train.type = "ImageData"
    train.clear("data_param")
    train.image_data_param.source = "data/digits/train.txt"
    train.image_data_param.root_folder = "data/digits/"
    train.image_data_param.batch_size = 16
    train.image_data_param.shuffle = True
    train.image_data_param.is_color = False
    train.transform_param.mirror = True
    text = to_text(net).replace(
        'layer {\n  name: "ip2"',
        'layer {\n  name: "drop1"\n  type: "Dropout"\n  bottom: "ip1"\n  top: "ip1"\n'
        '  dropout_param {\n    dropout_ratio: 0.3\n  }\n}\nlayer {\n  name: "ip2"', 1)
    assert "drop1" in text
    path = os.path.join(str(folder), "net.prototxt")
    with open(path, "w") as f:
        f.write(text)
    return path


def _h5_datasets(path):
    out = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda name, obj: out.__setitem__(name, obj[()]) if isinstance(obj, h5py.Dataset) else None)
    return out


def test_resume_is_bit_identical(in_digits_cwd, tmp_path):
    net = _shuffling_dropout_net(tmp_path)
    common = dict(max_iter=20, test_interval=0, test_iter=[], display=0)
    full = Trainer(write_solver(tmp_path / "a", net, snapshot=10, **common))
    full.solve()
    first = tmp_path / "a" / "snap" / "digits_iter_10.solverstate.h5"
    assert first.exists()
    resumed = Trainer(write_solver(tmp_path / "b", net, snapshot=0, **common))
    resumed.solve(resume_file=str(first))
    a = _h5_datasets(tmp_path / "a" / "snap" / "digits_iter_20.caffemodel.h5")
    b = _h5_datasets(tmp_path / "b" / "snap" / "digits_iter_20.caffemodel.h5")
    assert a.keys() == b.keys() and len(a) == 8
    for k in a:
        assert numpy.array_equal(a[k], b[k]), k
    sa = _h5_datasets(tmp_path / "a" / "snap" / "digits_iter_20.solverstate.h5")
    sb = _h5_datasets(tmp_path / "b" / "snap" / "digits_iter_20.solverstate.h5")
    for k in sa:
        if k.startswith("history/") or k == "iter":
            assert numpy.array_equal(sa[k], sb[k]), k
    # Control: without the saved RNG/data state the continuation differs (the test can fail).
    w10 = _h5_datasets(tmp_path / "a" / "snap" / "digits_iter_10.caffemodel.h5")
    assert any(not numpy.array_equal(w10[k], a[k]) for k in a)


def test_binary_snapshots_resume_bit_identically(in_digits_cwd, tmp_path):
    """Caffe's default snapshot_format (BINARYPROTO): .caffemodel/.solverstate, read back with
    protobuf directly, and a resume from them continues exactly as the uninterrupted run."""
    from caffe8.engine.proto import caffe_pb2
    net = _shuffling_dropout_net(tmp_path)
    common = dict(max_iter=20, test_interval=0, test_iter=[], display=0,
                  snapshot_format="BINARYPROTO")
    Trainer(write_solver(tmp_path / "a", net, snapshot=10, **common)).solve()
    first = tmp_path / "a" / "snap" / "digits_iter_10.solverstate"
    assert first.exists() and not list((tmp_path / "a" / "snap").glob("*.h5"))
    Trainer(write_solver(tmp_path / "b", net, snapshot=0, **common)).solve(resume_file=str(first))

    def blobs(path):
        msg = caffe_pb2.NetParameter()
        msg.ParseFromString(path.read_bytes())
        return {(l.name, i): numpy.array(b.data, numpy.float32)
                for l in msg.layer for i, b in enumerate(l.blobs)}
    a = blobs(tmp_path / "a" / "snap" / "digits_iter_20.caffemodel")
    b = blobs(tmp_path / "b" / "snap" / "digits_iter_20.caffemodel")
    assert a.keys() == b.keys() and len(a) == 8
    for k in a:
        assert numpy.array_equal(a[k], b[k]), k
    state = caffe_pb2.SolverState()
    state.ParseFromString((tmp_path / "b" / "snap" / "digits_iter_20.solverstate").read_bytes())
    assert state.iter == 20 and len(state.history) == 8


# parse_log.py's regular expressions (BVLC tools/extra/parse_log.py), and its timestamp rule.
RE_ITER = re.compile(r"Iteration (\d+)")
RE_TRAIN = re.compile(r"Train net output #(\d+): (\S+) = ([\.\deE+-]+)")
RE_TEST = re.compile(r"Test net output #(\d+): (\S+) = ([\.\deE+-]+)")
RE_LR = re.compile(r"lr = ([-+]?[0-9]*\.?[0-9]+([eE]?[-+]?[0-9]+)?)")


def _timestamp(line):
    tok = line.strip().split()
    month, day = int(tok[0][1:3]), int(tok[0][3:])
    hms, micro = tok[1].rsplit(".", 1)
    h, m, s = (int(x) for x in hms.split(":"))
    return datetime.datetime(2026, month, day, h, m, s, int(micro))


def _parse_log(lines):
    """A re-statement of parse_log.parse_log's row logic: {kind: [row dict]}."""
    it = iter(lines)
    for line in it:
        if "Solving" in line:
            break
    else:
        return None
    rows, lr, cur = {"train": [], "test": []}, float("nan"), -1
    for line in it:
        m = RE_ITER.search(line)
        if m:
            cur = int(m.group(1))
        if cur == -1:
            continue
        _timestamp(line)  # raises on a line parse_log would crash on
        m = RE_LR.search(line)
        if m:
            lr = float(m.group(1))
        for kind, rx in (("train", RE_TRAIN), ("test", RE_TEST)):
            m = rx.search(line)
            if m:
                table = rows[kind]
                if not table or table[-1]["NumIters"] != cur:
                    table.append({"NumIters": cur, "LearningRate": lr})
                table[-1][m.group(2)] = float(m.group(3))
    return rows


def test_log_parses_with_caffe_parse_log_rules(in_digits_cwd, tmp_path):
    log_path = tmp_path / "train.log"
    log = GLog(str(log_path), stream=io.StringIO())
    solver = write_solver(tmp_path, max_iter=40, display=10, test_interval=20, test_iter=[2],
                          snapshot=0, snapshot_after_train=False)
    Trainer(solver, log=log).solve()
    log.close()
    lines = log_path.read_text().splitlines()
    assert all(line.strip() for line in lines), "a blank line crashes parse_log.py"
    glog = re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d\d\.\d{6} +\d+ [\w.]+:\d+\] ")
    assert all(glog.match(line) for line in lines)
    rows = _parse_log(lines)
    assert [r["NumIters"] for r in rows["train"]] == [0, 10, 20, 30]
    assert [r["NumIters"] for r in rows["test"]] == [0, 20, 40]
    assert all(set(r) == {"NumIters", "LearningRate", "loss"} for r in rows["train"])
    assert all(set(r) == {"NumIters", "LearningRate", "accuracy", "loss"} for r in rows["test"])
    # inv policy: lr at iteration N is 0.02 * (1 + 1e-4 N)^-0.75, printed with 6 digits
    expect = [float("%g" % (0.02 * (1 + 1e-4 * n) ** -0.75)) for n in (0, 10, 20)]
    assert [r["LearningRate"] for r in rows["train"][1:]] == expect  # row k carries lr of row k-1
    assert rows["test"][-1]["accuracy"] > 0.5
    assert lines[-1].endswith("Optimization Done.")


@pytest.mark.parametrize("fields, words", [
    (dict(type="Adamm"), ["type", "Adamm", "Adam", "Nesterov"]),
    (dict(lr_policy="stepp"), ["lr_policy", "stepp", "multistep"]),
    (dict(iter_size=0), ["iter_size", ">= 1"]),
    (dict(test_iter=[1, 2], test_state=[parse_text("stage: 'a'", "s", "NetState")]),
     ["test_state", "2 test net"]),
])
def test_bad_solver_values_name_the_field(in_digits_cwd, tmp_path, fields, words):
    # values outside caffe.proto's allowed ranges/choices fail when the file is parsed
    with pytest.raises((SolverError, PrototxtError)) as e:
        Trainer(write_solver(tmp_path, **fields))
    for w in words:
        assert w in str(e.value)


def test_nonfinite_gradient_stops_with_snapshot_or_skips(in_digits_cwd, tmp_path):
    common = dict(max_iter=6, base_lr=1e30, momentum=0.0, lr_policy="fixed", display=0,
                  test_interval=0, test_iter=[], snapshot=0)
    t = Trainer(write_solver(tmp_path / "stop", **common))
    with pytest.raises(CaffeError, match="non-finite"):
        t.solve()
    assert list((tmp_path / "stop" / "snap").glob("*.caffemodel.h5"))
    t = Trainer(write_solver(tmp_path / "skip", comm={"nonfinite": "skip"}, **common))
    t.solve()
    assert t.iter == 6
    assert all(numpy.isfinite(a).all() for a in [t.net.flat_data])


def _lenet_on_hdf5(folder, batches=4):
    """BVLC's LeNet (batch 64) on random 28x28 images from HDF5: its conv2 forward is a
    50 x 500 x 4096 product, one whose OpenBLAS bits differ between 1 and 2 threads."""
    rng = numpy.random.default_rng(4)
    path = folder / "lenet.h5"
    with h5py.File(path, "w") as f:
        f["data"] = rng.random((64 * batches, 1, 28, 28), numpy.float32)
        f["label"] = rng.integers(0, 10, 64 * batches).astype(numpy.float32)
    (folder / "lenet.txt").write_text(f"{path}\n")
    text = open(os.path.join(REPO, "prototxt", "lenet", "train_val.prototxt")).read()
    body = text[text.index('layer {\n  name: "conv1"'):]
    net = folder / "lenet.prototxt"
    net.write_text(f'name: "LeNet"\nlayer {{ name: "data" type: "HDF5Data" top: "data" '
                   f'top: "label" hdf5_data_param {{ source: "{folder / "lenet.txt"}" '
                   f'batch_size: 64 }} }}\n' + body)
    return net


def test_resume_is_bit_identical_whatever_the_thread_count(in_digits_cwd, tmp_path, monkeypatch):
    """Resume beside a busy neighbour: the uninterrupted run computes on 2 workers, the resumed
    one on the count a busy machine gives (1, 2, 1, ...); the models are the same bytes (the
    products' bits do not depend on the thread count, engine/blas.py)."""
    from caffe8.engine import blas

    class Busy:                     # what cpu_share.ThreadBudget answers beside busy processes
        def __init__(self, answers):
            self.answers = answers

        def poll(self):
            return next(self.answers)
    net = _lenet_on_hdf5(tmp_path)
    common = dict(max_iter=8, test_interval=0, test_iter=[], display=0, base_lr=0.01)
    monkeypatch.setattr(blas, "_budget", Busy(iter(lambda: 2, None)))
    Trainer(write_solver(tmp_path / "a", net, snapshot=4, **common)).solve()
    answers = iter([1, 2, 1, 1, 2, 1, 2, 1, 1, 1])
    monkeypatch.setattr(blas, "_budget", Busy(answers))
    resumed = Trainer(write_solver(tmp_path / "b", net, snapshot=0, **common))
    resumed.solve(resume_file=str(tmp_path / "a" / "snap" / "digits_iter_4.solverstate.h5"))
    a = _h5_datasets(tmp_path / "a" / "snap" / "digits_iter_8.caffemodel.h5")
    b = _h5_datasets(tmp_path / "b" / "snap" / "digits_iter_8.caffemodel.h5")
    assert a.keys() == b.keys() and a
    assert all(numpy.array_equal(a[k], b[k]) for k in a), [k for k in a if not numpy.array_equal(a[k], b[k])]


def test_step_one_at_a_time_logs_a_rate(in_digits_cwd, tmp_path):
    """pycaffe's ``for _ in range(n): solver.step(1)``: the display line's rate spans the
    iterations since the last display, across calls (BVLC keeps iterations_last_), not 0."""
    lines = []
    t = Trainer(write_solver(tmp_path, max_iter=100, display=5, test_interval=0, test_iter=[]),
                log=lines.append)
    for _ in range(11):
        t.step(1)
    rates = [float(m.group(1)) for m in map(re.compile(r"Iteration (?:5|10) \(([\d.e+-]+) iter/s").search, lines) if m]
    assert len(rates) == 2 and all(r > 0 for r in rates), lines


def test_resume_splits_products_as_the_saved_run(in_digits_cwd, tmp_path, monkeypatch):
    """The host GEMM's partition (engine/blas.py) is part of the bits: the snapshot records it,
    and a resumed run started with another one (other cores) takes the saved one back."""
    from caffe8.engine import blas
    monkeypatch.setattr(blas, "_partition", 2)
    net = _lenet_on_hdf5(tmp_path)
    common = dict(max_iter=4, test_interval=0, test_iter=[], display=0, base_lr=0.01)
    Trainer(write_solver(tmp_path / "a", net, snapshot=2, **common)).solve()
    monkeypatch.setattr(blas, "_partition", 3)
    resumed = Trainer(write_solver(tmp_path / "b", net, snapshot=0, **common))
    resumed.solve(resume_file=str(tmp_path / "a" / "snap" / "digits_iter_2.solverstate.h5"))
    assert blas.partition() == 2
    a = _h5_datasets(tmp_path / "a" / "snap" / "digits_iter_4.caffemodel.h5")
    b = _h5_datasets(tmp_path / "b" / "snap" / "digits_iter_4.caffemodel.h5")
    assert all(numpy.array_equal(a[k], b[k]) for k in a)
