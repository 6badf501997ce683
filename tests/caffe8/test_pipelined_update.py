"""The pipelined update (engine.pipelined) through a real trainer and exchange: an asynchronous
exchange of host arrays takes the trainer's PipelinedUpdate when it is added as a callback, and
its update stage updates each layer's params as soon as their gradients are exchanged. The
weights must be the bits of the update at the end of the iteration (here: a synchronous
exchange, which does not take it); the NaN/Inf policy must hold before any param moves;
clip_gradients turns it off."""
import threading

import numpy

from caffe8.wiring import register_all
from caffe8.comm.exchange import Exchange
from caffe8.engine.pipelined import PipelinedUpdate
from caffe8.engine.trainer import Trainer
from tests.engine.trainer_util import write_solver


def _trainer(folder, asynchronous, **fields):
    """A trainer with a one-process exchange attached (the mean is the gradient); the names of
    the threads that ran each early update."""
    register_all()
    fields.setdefault("comm", {})["async"] = asynchronous
    fields["comm"]["codec"] = "fp32"
    common = dict(max_iter=12, test_interval=0, test_iter=[], display=0, snapshot=0,
                  weight_decay=0.01, momentum=0.9)
    common.update(fields)
    t = Trainer(write_solver(folder, **common))
    early = []
    update_early = t.solver.update_early
    t.solver.update_early = lambda indices: (early.append(threading.current_thread().name),
                                             update_early(indices))
    ex = Exchange(t.world, t.param.comm, t.net)
    t.add_callback(ex)
    return t, ex, early


def test_same_weights_as_the_update_at_the_end(in_digits_cwd, tmp_path):
    ends, end_ex, not_early = _trainer(tmp_path / "end", False)
    assert ends.pipelined is None and end_ex.pipelined is None     # synchronous: nothing taken
    ends.solve()
    piped, ex, early = _trainer(tmp_path / "piped", True)
    assert isinstance(piped.pipelined, PipelinedUpdate) and ex.pipelined is piped.pipelined
    piped.solve()
    assert piped.net.flat_data.tobytes() == ends.net.flat_data.tobytes()
    assert numpy.array_equal(piped.solver.history[0], ends.solver.history[0])
    # every exchanged layer was updated early, on the update stage's thread
    assert not not_early
    assert len(early) == 12 * len(ex.schedule) and set(early) == {"caffe8-update"}
    ends.close()
    piped.close()


def test_a_nonfinite_loss_stops_every_early_update(in_digits_cwd, tmp_path):
    t, ex, early = _trainer(tmp_path / "nan", True, base_lr=1e30, momentum=0.0,
                            lr_policy="fixed", max_iter=6,
                            comm={"nonfinite": "skip", "max_consecutive_skips": 10})
    t.solve()
    assert t.iter == 6
    # iteration 0 is finite and pipelined; its huge step makes every later loss non-finite,
    # agreed before backward, so no layer of those iterations moves
    assert len(early) == len(ex.schedule)
    assert numpy.isfinite(t.net.flat_data).all()
    t.close()


def test_clip_gradients_keeps_the_update_at_the_end(in_digits_cwd, tmp_path):
    t, ex, _ = _trainer(tmp_path / "clip", True, clip_gradients=1.0)
    assert t.pipelined is None and ex.pipelined is None
    t.close()


def test_only_an_asynchronous_exchange_of_host_arrays_takes_it(in_digits_cwd, tmp_path):
    t, ex, _ = _trainer(tmp_path / "sync", False)
    update = PipelinedUpdate(t.solver, t.net)
    assert ex.pipeline(update) is False and ex.pipelined is None
    live = Exchange(t.world, t.param.comm, t.net, asynchronous=True)
    assert live.pipeline(update) is True and live.pipelined is update
    live.close()
    t.close()
