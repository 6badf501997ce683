"""engine/timing.py: the timing log attaches once, to the trainer, and reads the per-layer
records of whatever callbacks the trainer has when an iteration ends; the exchange's per-bucket
timeline and the overlap (T_sync - T_async) / (T_sync - T_none), on synthetic records and on the
logs of real runs (one process, and two ranks with the synchronous and the asynchronous
exchange)."""
import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from caffe8.engine.callbacks import SolverCallback
from caffe8.engine.timing import (PHASES, BucketTimes, ExchangeTimes, TimingLog, mean_wall, merged,
                                  overlap, overlap_of_logs, read_log)


class _Net:
    def __init__(self):
        self.layers = [SimpleNamespace(name="a", type="InnerProduct"),
                       SimpleNamespace(name="b", type="ReLU")]
        self.forward_hooks, self.backward_hooks = [], []

    def add_forward_hook(self, fn):
        self.forward_hooks.append(fn)

    def add_backward_hook(self, fn):
        self.backward_hooks.append(fn)


class _Recorder(SolverCallback):
    def __init__(self, layers):
        self.timings = ExchangeTimes(layers, 1, False)


def test_attached_once_it_reads_the_callbacks_the_trainer_has_when_an_iteration_ends(tmp_path):
    net = _Net()
    trainer = SimpleNamespace(net=net, callbacks=[SolverCallback()], timing=None)
    log = TimingLog(str(tmp_path / "t.jsonl"))
    log.attach(trainer)
    assert trainer.timing is log and len(net.forward_hooks) == len(net.backward_hooks) == 1
    # a callback added after the log was attached is read all the same
    trainer.callbacks.append(_Recorder({0: dict(dict.fromkeys(PHASES, 0.0), comm=0.25)}))
    log.begin_iteration()
    for i, layer in enumerate(net.layers):
        net.forward_hooks[0](i, layer)
    for i, layer in reversed(list(enumerate(net.layers))):
        net.backward_hooks[0](i, layer)
    log.end_iteration(0, 1.0)
    log.close()
    with open(tmp_path / "t.jsonl") as f:
        record = json.loads(f.readline())
    assert [l["comm"] for l in record["layers"]] == [0.25, 0.0]
    assert record["split"]["Communication"] == 0.25


def test_records_of_several_callbacks_are_summed_per_layer_and_phase():
    a = ExchangeTimes({0: dict(dict.fromkeys(PHASES, 0.0), comm=1.0)}, 3, False, 0.5)
    b = ExchangeTimes({0: dict(dict.fromkeys(PHASES, 0.0), comm=2.0, encode=0.5),
                       4: dict.fromkeys(PHASES, 1.0)}, 1, True, 0.25)
    m = merged([a, b])
    assert m.layers[0]["comm"] == 3.0 and m.layers[0]["encode"] == 0.5
    assert m.layers[4] == dict.fromkeys(PHASES, 1.0)
    assert m.asynchronous and m.quantile_interval == 3 and m.quantile_pass == pytest.approx(0.75)
    assert merged([a]) is a and merged([]).layers == {}


# --- the exchange's timeline and the overlap, on synthetic records ------------------------------
def _record(iteration, rank, wall):
    return {"iteration": iteration, "rank": rank, "wall": wall}


def test_mean_wall_skips_the_first_iterations_and_can_take_one_rank(tmp_path):
    records = [_record(0, 0, 9.0), _record(0, 1, 9.0), _record(1, 0, 1.0), _record(1, 1, 3.0),
               _record(2, 0, 2.0), _record(2, 1, 4.0)]
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert mean_wall(str(path)) == pytest.approx(2.5)              # iterations 1 and 2
    assert mean_wall(records, skip=0) == pytest.approx(28 / 6)
    assert mean_wall(records, rank=1) == pytest.approx(3.5)
    with pytest.raises(ValueError, match="iteration 5"):
        mean_wall(records, skip=5)


def test_overlap_is_the_share_of_the_exchange_cost_that_the_async_run_hides():
    # no exchange 4 s, synchronous 10 s (the exchange costs 6 s), asynchronous 7 s: half hidden
    assert overlap(10.0, 7.0, 4.0) == pytest.approx(0.5)
    assert overlap(10.0, 4.0, 4.0) == pytest.approx(1.0)           # all of it hidden
    assert overlap(10.0, 11.5, 4.0) == pytest.approx(-0.25)        # async slower than sync
    with pytest.raises(ValueError, match="no exchange cost"):
        overlap(4.0, 3.0, 4.5)


def test_overlap_of_logs_reads_every_rank_after_the_first_iterations(tmp_path):
    logs = {}
    for name, walls in (("sync", [50, 10, 12]), ("async", [50, 8, 8]), ("none", [50, 6, 6])):
        logs[name] = tmp_path / f"{name}.jsonl"
        logs[name].write_text("".join(json.dumps(_record(i, r, w)) + "\n"
                                      for i, w in enumerate(walls) for r in (0, 1)))
    # sync 11, async 8, none 6: (11 - 8) / (11 - 6)
    assert overlap_of_logs(str(logs["sync"]), str(logs["async"]), str(logs["none"])) == \
        pytest.approx(0.6)


def test_the_timeline_places_each_bucket_phase_from_the_iteration_start(tmp_path):
    """Each phase's first start and last end over the bucket's layers, in seconds from the
    iteration's start; each layer's backward end from the last backward hook."""
    net = _Net()
    trainer = SimpleNamespace(net=net, callbacks=[], timing=None)
    log = TimingLog(str(tmp_path / "t.jsonl"))
    log.attach(trainer)
    log.begin_iteration()
    t0 = log.host_start
    for i, layer in reversed(list(enumerate(net.layers))):
        net.backward_hooks[0](i, layer)
    log.marks = [m if m[0] != "b" else (m[0], m[1], t0 + 0.1 * (2 - m[1])) for m in log.marks]
    marks = [("encode", t0 + 0.3, t0 + 0.4), ("encode", t0 + 0.2, t0 + 0.25),
             ("reduce", t0 + 0.5, t0 + 0.9), ("decode", t0 + 1.0, t0 + 1.25)]
    trainer.callbacks.append(SimpleNamespace(timings=ExchangeTimes(
        {}, 1, True, 0.0, [BucketTimes(0, [1, 0], marks)])))
    log.end_iteration(0, 2.0)
    log.close()
    record = read_log(str(tmp_path / "t.jsonl"))[0]
    assert [l["backward_end"] for l in record["layers"]] == pytest.approx([0.2, 0.1])
    (bucket,) = record["buckets"]
    assert bucket["bucket"] == 0 and bucket["layers"] == ["b", "a"]
    assert bucket["encode"] == pytest.approx([0.2, 0.4])
    assert bucket["reduce"] == pytest.approx([0.5, 0.9])
    assert bucket["decode"] == pytest.approx([1.0, 1.25])
    assert "d2h" not in bucket and "h2d" not in bucket          # no copies on the CPU


# --- on the logs of real runs ---------------------------------------------------------------------
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.path.join(REPO, "tests", "scripts", "data")
SCHEMA = os.path.join(REPO, "docs", "timing_schema.json")


def _run(tmp, name, processes, comm):
    """``caffe8 train`` of the tiny timing net (EmulatedCompute between two InnerProducts) with
    ``comm``, in ``processes`` processes; the path of its timing log (every rank's records)."""
    with open(os.path.join(DATA, "tiny_solver.prototxt"), encoding="utf-8") as f:
        text = f.read().replace('net: "tiny_net.prototxt"',
                                f'net: "{os.path.join(DATA, "tiny_net.prototxt")}"')
    solver = tmp / f"{name}.prototxt"
    solver.write_text(text + comm + "\n")
    log = str(tmp / f"{name}.jsonl")
    cmd = [sys.executable, "-m", "caffe8.cli", "train", "--solver", str(solver),
           "--timing-log", log]
    if processes > 1:
        cmd = [os.path.join(os.path.dirname(sys.executable), "mpiexec"), "-n", str(processes)] + cmd
    env = dict(os.environ, PYTHONPATH=REPO)
    res = subprocess.run(cmd, cwd=str(tmp), env=env, capture_output=True, text=True, timeout=180)
    text = res.stdout + res.stderr
    errors = [line for line in text.splitlines() if "error" in line.lower() or "Abort" in line]
    assert res.returncode == 0, "\n".join(errors[:20]) + "\n...\n" + text[-1500:]
    return log


@pytest.fixture(scope="module")
def real_logs(tmp_path_factory):
    pytest.importorskip("mpi4py")
    tmp = tmp_path_factory.mktemp("timeline")
    comm = 'comm {{ codec: "fp8" async: {} bucket_kb: 0 }}'
    return {"none": _run(tmp, "none", 1, ""),
            "sync": _run(tmp, "sync", 2, comm.format("false")),
            "async": _run(tmp, "async", 2, comm.format("true"))}


@pytest.mark.mpi
def test_real_logs_hold_a_timeline_in_the_order_the_exchange_runs(real_logs):
    """Every record validates; each bucket of a layer with parameters is encoded after the
    layer's backward (asynchronously: after the hook that the timing log marks a moment later,
    which a GIL switch interval bounds), reduced after its encode, decoded after its
    reduction; asynchronously, the last layers' bucket is reduced while backward still runs (the
    EmulatedCompute layer's 8 ms); without an exchange there is no bucket."""
    import jsonschema
    with open(SCHEMA, encoding="utf-8") as f:
        validator = jsonschema.Draft202012Validator(json.load(f))
    for name, path in real_logs.items():
        records = read_log(path)
        assert sorted({r["rank"] for r in records}) == ([0] if name == "none" else [0, 1])
        slack = sys.getswitchinterval() if name == "async" else 0.0
        overlapped = 0
        for rec in records:
            validator.validate(rec)
            if name == "none":
                assert rec["buckets"] == []
                continue
            ends = {l["name"]: l["backward_end"] for l in rec["layers"]}
            assert [b["layers"] for b in rec["buckets"]] == [["fc2"], ["fc1"]]
            for b in rec["buckets"]:
                assert b["encode"][0] >= ends[b["layers"][0]] - slack
                assert b["encode"][0] <= b["encode"][1] <= b["reduce"][0] <= b["reduce"][1]
                assert b["reduce"][1] <= b["decode"][0] <= b["decode"][1] <= rec["wall"]
            overlapped += rec["buckets"][0]["reduce"][0] < ends["fc1"]
        if name == "sync":
            assert overlapped == 0
        elif name == "async":
            assert overlapped >= len(records) // 2


@pytest.mark.mpi
def test_overlap_of_real_logs_is_the_formula_over_their_mean_walls(real_logs):
    means = {}
    for name, path in real_logs.items():
        walls = [r["wall"] for r in read_log(path) if r["iteration"] >= 1]
        means[name] = sum(walls) / len(walls)
    if means["sync"] > means["none"]:
        assert overlap_of_logs(real_logs["sync"], real_logs["async"], real_logs["none"]) == \
            pytest.approx((means["sync"] - means["async"]) / (means["sync"] - means["none"]))
    else:           # a machine so loaded that the exchange cost nothing measurable
        with pytest.raises(ValueError):
            overlap_of_logs(real_logs["sync"], real_logs["async"], real_logs["none"])


@pytest.mark.mpi
@pytest.mark.slow
def test_the_emulated_caffenet_reduces_its_first_buckets_while_backward_runs(tmp_path):
    """prototxt/caffenet_emulated (CaffeNet's 61 M parameters, GPU-like compute times), 2 ranks,
    the asynchronous fp8 exchange: in every iteration after the first, the fc8 bucket is
    reduced and the fc7 bucket encoded before conv1's backward has ended; the timeline plot
    draws it."""
    pytest.importorskip("mpi4py")
    from scripts import plot_timeline
    folder = os.path.join(REPO, "prototxt", "caffenet_emulated")
    with open(os.path.join(folder, "solver.prototxt"), encoding="utf-8") as f:
        text = f.read()
    text = text.replace('net: "train.prototxt"',
                        f'net: "{os.path.join(folder, "train.prototxt")}"')
    text = text.replace("max_iter: 20", "max_iter: 4").replace("display: 20", "display: 0")
    text = text.replace('snapshot_prefix: "runs/caffenet_emulated/caffenet_emulated"',
                        f'snapshot_prefix: "{tmp_path / "snap"}"\nsnapshot_after_train: false')
    solver = tmp_path / "solver.prototxt"
    solver.write_text(text)
    log = str(tmp_path / "t.jsonl")
    cmd = [os.path.join(os.path.dirname(sys.executable), "mpiexec"), "-n", "2", sys.executable,
           "-m", "caffe8.cli", "train", "--solver", str(solver), "--timing-log", log]
    res = subprocess.run(cmd, cwd=str(tmp_path), env=dict(os.environ, PYTHONPATH=REPO),
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    records = [r for r in read_log(log) if r["iteration"] >= 1]
    assert len(records) == 6
    for rec in records:
        conv1 = next(l["backward_end"] for l in rec["layers"] if l["name"] == "conv1_w")
        first, second = rec["buckets"][:2]
        assert first["layers"] == ["fc8_b", "fc8_w"] and second["layers"] == ["fc7_b", "fc7_w"]
        assert first["reduce"][1] < conv1 and second["encode"][0] < conv1
    out = tmp_path / "timeline.png"
    assert plot_timeline.main([log, "--iteration", "2", "--out", str(out)]) == 0
