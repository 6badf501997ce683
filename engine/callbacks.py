"""Caffe's ``Solver::Callback``: the seam through which gradient exchange attaches to training.

The training loop (``engine.trainer.Trainer``) knows nothing about how gradients travel: the
exchange is a callback. The loop's own collectives, on the world it was given, keep the ranks
alike: rank 0's weights broadcast at the start, BatchNorm's statistics broadcast after each
update, the NaN/Inf verdict and the stop/snapshot requests OR-ed over the ranks once an
iteration, and a few small ones around snapshots and tests (the prefix's lock, a failed write,
each rank's state; the test scores' mean). It calls, on every callback it was given:

``on_start()``
    once per iteration, before its forward/backward passes (Caffe's ``on_start``);
``on_backward(layer_index)``
    right after layer ``layer_index``'s backward in the *last* of ``iter_size`` passes, i.e. the
    moment that layer's gradients are final for this iteration (Caffe's per-layer
    ``after_backward``; the hook an exchange uses to overlap communication with backward);
``on_gradients_ready()``
    after all passes and the display, before the update (Caffe's ``on_gradients_ready``: the
    place where gradients are averaged over processes);
``state()`` / ``restore(state)``
    JSON-able per-rank state saved in snapshots for an exact resume;
``consistency_check()``
    True when every rank holds bit-identical parameters (called every
    ``consistency_check_interval`` iterations when that is set);
``pipeline(update)``
    called once when the callback is added, with an ``engine.pipelined.PipelinedUpdate`` (when
    the solver can update one layer at a time): True when the callback takes it and will call
    ``update.layer_ready(slices)`` for every layer whose gradients it finished, as it finishes
    them (the pipelined update); False (the default) leaves the update at the iteration's end;
``close()``
    end threads and free resources; called once, also on errors.

:class:`SolverCallback` gives no-op defaults so a callback overrides only what it needs.
"""


class SolverCallback:
    """No-op base of the callback protocol described in the module docstring."""

    #: seconds per phase and layer of the last iteration, read by the timing log
    timings = None
    #: True when on_backward work overlaps backward (the timing log's split depends on it)
    asynchronous = False

    def on_start(self):
        pass

    def on_backward(self, layer_index):
        pass

    def on_gradients_ready(self):
        pass

    def state(self):
        return None

    def restore(self, state):
        pass

    def consistency_check(self):
        return True

    def pipeline(self, update):
        return False

    def close(self):
        pass
