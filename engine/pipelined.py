"""The pipelined update: each layer's params updated as soon as their gradients are exchanged.

An asynchronous gradient exchange (comm/exchange.py) finishes the layers one after another while
backward still runs. Instead of waiting for the last one, the trainer hands a callback that
offers it (``SolverCallback.pipeline``) a :class:`PipelinedUpdate`, and the callback calls
:meth:`PipelinedUpdate.layer_ready` for each layer right after its decode, on its own thread.
The object owns everything the pipelining needs, so that neither the trainer nor the exchange
keeps a piece of it:

* whether a layer may move now: only while every gradient seen so far is finite; the first
  non-finite one stops the early updates of the iteration (that layer and the later ones are
  left to the end; the layers already updated keep their update);
* the set of params already updated, which :meth:`finish` hands to the trainer, for the
  solver's ``apply_update(done=...)`` (not updated twice) and for :func:`gradients_finite`,
  which checks the gradients of the params left for the end.

The iteration's NaN/Inf verdict is the trainer's (``Trainer._verdict``): the loss, agreed over
the ranks before the last backward while no exchange is in flight, comes to :meth:`begin` (a
non-finite one moves nothing early), and the gradients need no agreement: after the exchange
they are the same bits on every rank, so every rank reaches the same verdict.
Every param's update reads only its own data, diff and history, so the weights are the bits of
the update at the end of the iteration (tests/caffe8/test_pipelined_update.py).

The calls of one iteration are ordered: ``begin`` (compute thread), ``layer_ready`` (the
exchange's thread, in the order the layers finish), ``finish`` (compute thread, after the
exchange's wait, which happens after every ``layer_ready`` of the iteration).
"""


class PipelinedUpdate:
    """The pipelined update of ``solver`` (an SGD-family solver that ``supports_early_update``)
    on ``net``'s learnable params (see the module docstring)."""

    def __init__(self, solver, net):
        self.solver, self.net = solver, net
        # the learnable param each slice of the flat buffers belongs to
        self._param_at = {(sl.start, sl.stop): i for i, sl in enumerate(net.param_slices)}
        self._updating = False          # True from a finite begin() to the first bad gradient
        self.done = set()               # learnable params updated this iteration

    def begin(self, finite_loss):
        """A new iteration's last backward starts; ``finite_loss``: the loss verdict agreed
        over the ranks (False: no param moves before the end's policy decides)."""
        self._updating = bool(finite_loss)
        self.done = set()

    def layer_ready(self, slices):
        """The exchange's call: the gradients of ``slices`` (of the net's flat diff; a layer's
        params) hold their exchanged mean. Updates those params now, unless this iteration
        already saw a non-finite loss or gradient."""
        if not self._updating:
            return
        indices = [self._param_at[(sl.start, sl.stop)] for sl in slices
                   if (sl.start, sl.stop) in self._param_at]
        params = self.net.learnable_params
        if not all(self.solver.gradients_finite(params[i].diff) for i in indices):
            self._updating = False
            return
        self.solver.update_early(indices)
        self.done.update(indices)

    def finish(self):
        """The iteration's exchange is over: the params already updated (their gradients were
        finite; the others are left to the end)."""
        self._updating = False
        return frozenset(self.done)


def gradients_finite(solver, net, done=frozenset()):
    """True when no gradient of ``net``'s learnable params holds an Inf or NaN, those of the
    params in ``done`` (checked before they moved early) aside; with none aside, the whole flat
    diff in one pass."""
    if not done:
        return solver.gradients_finite(net.flat_diff)
    params = net.learnable_params
    return all(solver.gradients_finite(params[i].diff) for i in range(len(params))
               if i not in done)
