"""LayerwiseExchange: schedule of shared tensors, async hand-off during backward, errors with the
layer's name, and the same tensors exchanged in sync and async mode."""
import os
import threading

import pytest

from comm.comm_thread import LayerwiseExchange, build_schedule
from engine.errors import CaffeError
from engine.net import Net

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SMALL = os.path.join(REPO, "prototxt", "lenet", "train_val_small.prototxt")


class RecordingExchange:
    """Stands in for GradientExchange: records (thread, slice) and can fail on one slice."""

    def __init__(self, fail_at=None):
        self.calls, self.fail_at, self.ended, self.freed = [], fail_at, 0, False
        self.codec = type("C", (), {"quantile_interval": 1})()

    def exchange_tensor(self, sl, timings=None):
        self.calls.append((threading.current_thread().name, (sl.start, sl.stop)))
        if self.fail_at == (sl.start, sl.stop):
            raise RuntimeError("link down")
        timings["comm"] = timings.get("comm", 0.0) + 1e-6

    def end_iteration(self):
        self.ended += 1

    def checksum_check(self):
        return True

    def free(self):
        self.freed = True


def _attach(net, callback):
    """What the trainer does: on_backward per layer, only in the last pass of iter_size."""
    last = [True]
    net.add_backward_hook(lambda i, layer: callback.on_backward(i) if last[0] else None)
    return last


def test_shared_tensor_goes_with_its_lowest_layer():
    s0, s1, s2 = slice(0, 4), slice(4, 6), slice(6, 9)
    schedule = build_schedule({1: [(0, s0), (1, s1)], 3: [(0, s2)], 5: [(0, s0)]})
    assert schedule == {1: [s0, s1], 3: [s2]}


@pytest.mark.parametrize("asynchronous", [False, True])
def test_every_tensor_once_per_iteration(asynchronous):
    net = Net(SMALL, phase="TRAIN")
    fake = RecordingExchange()
    ex = LayerwiseExchange(fake, net, asynchronous)
    last = _attach(net, ex)
    expected = sorted({(sl.start, sl.stop) for v in net.layer_param_slices.values() for _, sl in v})
    for _ in range(2):
        net.clear_param_diffs()
        ex.on_start()
        last[0] = False            # iter_size 2: the first pass exchanges nothing
        net.forward_backward()
        last[0] = True
        net.forward_backward()
        ex.on_gradients_ready()
    ex.close()
    assert fake.ended == 2 and fake.freed
    assert sorted(s for _, s in fake.calls[:len(expected)]) == expected
    assert len(fake.calls) == 2 * len(expected)
    threads = {t for t, _ in fake.calls}
    assert threads == ({"caffe8-comm"} if asynchronous else {"MainThread"})
    # backward order: later layers first, in both modes
    layer_of = {(sl.start, sl.stop): i for i, v in net.layer_param_slices.items() for _, sl in v}
    order = [layer_of[s] for _, s in fake.calls[:len(expected)]]
    assert order == sorted(order, reverse=True)
    assert set(ex.timings) == {i for i in net.layer_param_slices if net.layer_param_slices[i]}


def test_thread_error_surfaces_with_layer_name():
    net = Net(SMALL, phase="TRAIN")
    i = next(i for i, layer in enumerate(net.layers) if layer.name == "conv2")
    sl = net.layer_param_slices[i][0][1]
    ex = LayerwiseExchange(RecordingExchange(fail_at=(sl.start, sl.stop)), net, True)
    _attach(net, ex)
    ex.on_start()
    net.forward_backward()
    with pytest.raises(CaffeError, match="layer 'conv2'.*link down"):
        ex.on_gradients_ready()
    ex.close()
