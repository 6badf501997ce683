"""engine/timing.py by itself: the timing log attaches once, to the trainer, and reads the
per-layer records of whatever callbacks the trainer has when an iteration ends."""
import json
from types import SimpleNamespace

import pytest

from caffe8.engine.callbacks import SolverCallback
from caffe8.engine.timing import PHASES, ExchangeTimes, TimingLog, merged


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
