"""Synchronous per-tensor gradient exchange over a Net's flat buffers (SPEC §3.2-3.6).

:class:`GradientExchange` takes the net's contiguous ``flat_diff`` / ``flat_data`` and its
``layer_param_slices`` (docs/ARCHITECTURE.md) and, one parameter tensor at a time (weights and
biases separately), replaces the local gradient by the MEAN gradient over all processes, in
place. ``exchange_layer(i)`` is what the backward hook calls; ``exchange_all()`` does the whole
net (layers in backward order) and ends the iteration. The asynchronous communication thread
(SPEC §3.6) is built on top of this by a colleague: everything here runs on whichever single
thread calls it, which is what MPI_THREAD_SERIALIZED allows.
"""
import hashlib
import time
from functools import partial

import numpy

from engine import backend
from comm.allreduce import create_allreduce
from comm.codecs import TensorPlan, create_codec
from comm.gather_codecs import create_gather_codec

_DEFAULTS = dict(codec="fp8", relative=True, hierarchical=True, quantile=0.95,
                 quantile_interval=100, samples=1024, epsilon=1e-5, processes_per_node=0,
                 warmup_fp32_iters=0, rounding="nearest", algorithm="")


def _setting(comm_param, name):
    """A field of the solver's ``comm`` block (a parsed Message or any object with attributes)."""
    if comm_param is None:
        return _DEFAULTS[name]
    return getattr(comm_param, name, _DEFAULTS[name])


def _add(timings, **seconds):
    if timings is not None:
        for k, v in seconds.items():
            timings[k] = timings.get(k, 0.0) + v


class GradientExchange:
    """Averages the net's parameter gradients over ``world`` (see the module docstring).

    ``world``: comm.mpi.World; ``comm_param``: the solver's ``comm`` block; ``net``: an
    engine Net (``flat_data``, ``flat_diff``, ``layer_param_slices``).
    """

    def __init__(self, world, comm_param, net):
        self.world, self.net = world, net
        self.iteration = 0
        self.warmup_fp32_iters = int(_setting(comm_param, "warmup_fp32_iters"))
        options = {k: _setting(comm_param, k) for k in
                   ("relative", "epsilon", "rounding", "quantile", "quantile_interval", "samples")}
        name = _setting(comm_param, "codec")
        # APS / Dettmers / Strom carry their own allgather-based collective.
        self.gather_mean = create_gather_codec(name, comm_param)
        self.codec = create_codec("fp32" if self.gather_mean else name, rank=world.rank, **options)
        self.fp32 = create_codec("fp32")
        default_algo = "hierarchical" if _setting(comm_param, "hierarchical") else "rsag"
        chosen = _setting(comm_param, "algorithm") or None
        self._algo_for = {c.name: chosen or c.preferred_algorithm or default_algo
                          for c in (self.codec, self.fp32)}
        self.algorithms = {}
        if world.size > 1:
            ppn = int(_setting(comm_param, "processes_per_node"))
            # Creating the hierarchical sum's communicators is collective: do it here, in the
            # same order on every rank, never lazily from inside a layer hook.
            for name in sorted(set(self._algo_for.values())):
                self.algorithms[name] = create_allreduce(name, world.comm, ppn)

    def codec_for_iteration(self):
        """The float32 codec during the warm-up iterations, the configured codec after."""
        return self.fp32 if self.iteration < self.warmup_fp32_iters else self.codec

    def tensor_slices(self, layer_index):
        """Slices of flat_diff of the layer's learnable tensors (weights, biases, ...)."""
        return [sl for _, sl in self.net.layer_param_slices.get(layer_index, [])]

    def exchange_tensor(self, sl, timings=None):
        """Replace ``flat_diff[sl]`` by its mean over all processes (no-op on one process).

        ``timings``: a dict that receives seconds of "encode", "quantile", "d2h" (device-to-host
        copy, GPU only), "comm", "decode" and "h2d", added to what it holds.
        """
        if self.world.size == 1 or sl.stop <= sl.start:
            return
        grad = self.net.flat_diff[sl]
        t0 = time.perf_counter()
        if self.gather_mean is not None and self.iteration >= self.warmup_fp32_iters:
            grad[...] = self.gather_mean(self.world.comm, grad, (sl.start, sl.stop), self.iteration)
            _add(timings, comm=time.perf_counter() - t0)
            return
        codec = self.codec_for_iteration()
        algo = self.algorithms[self._algo_for[codec.name]]
        plan = TensorPlan(stages=algo.stages, parts=algo.parts, comm=self.world.comm,
                          key=(sl.start, sl.stop), weight=self.net.flat_data[sl],
                          iteration=self.iteration)
        q0, d0, h0 = codec.quantile_seconds, codec.d2h_seconds, codec.h2d_seconds
        wire, ctx = codec.compress(grad, plan)
        t1 = time.perf_counter()
        between = partial(codec.between_stages, ctx=ctx) if codec.between_stages else None
        algo.sum(wire, codec.wire, between)
        t2 = time.perf_counter()
        codec.decompress(wire, ctx, grad)
        quantile, d2h, h2d = (codec.quantile_seconds - q0, codec.d2h_seconds - d0,
                              codec.h2d_seconds - h0)
        _add(timings, encode=t1 - t0 - quantile - d2h, quantile=quantile, d2h=d2h, comm=t2 - t1,
             decode=time.perf_counter() - t2 - h2d, h2d=h2d)

    def exchange_layer(self, layer_index, layer=None):
        """Exchange every learnable tensor of one layer (signature of Net.add_backward_hook)."""
        for sl in self.tensor_slices(layer_index):
            self.exchange_tensor(sl)

    def exchange_all(self):
        """Exchange the whole net, layers in backward order (shared slices once), then
        :meth:`end_iteration`."""
        seen = set()
        for layer_index in sorted(self.net.layer_param_slices, reverse=True):
            for sl in self.tensor_slices(layer_index):
                if (sl.start, sl.stop) not in seen:
                    seen.add((sl.start, sl.stop))
                    self.exchange_tensor(sl)
        self.end_iteration()

    def state(self):
        """What an exact resume needs: the iteration (warm-up, quantile refresh) and every
        tensor's current q. (Strom's residuals are not saved: a resumed Strom run restarts them.)"""
        tracker = getattr(self.codec, "tracker", None)
        values = tracker.values.items() if tracker is not None else ()
        return {"iteration": self.iteration,
                "quantiles": [[int(k[0]), int(k[1]), float(q)] for k, q in values]}

    def restore(self, state):
        self.iteration = int(state["iteration"])
        tracker = getattr(self.codec, "tracker", None)
        if tracker is not None:
            tracker.values = {(a, b): q for a, b, q in state["quantiles"]}

    def end_iteration(self):
        """Advance the iteration counter (warm-up and quantile refresh depend on it)."""
        self.iteration += 1

    def checksum_check(self, params=None):
        """True when every rank holds bit-identical ``params`` (default: the net's flat_data).

        ``params``: an array or a list of arrays. Each rank hashes the raw bytes (SHA-256) and
        the digests are allgathered, so the answer is the same on every rank.
        """
        if params is None:
            params = [self.net.flat_data]
        elif not isinstance(params, (list, tuple)):
            params = [params]
        h = hashlib.sha256()
        for p in params:
            h.update(numpy.ascontiguousarray(backend.to_numpy(p)).tobytes())
        if self.world.size == 1:
            return True
        digests = self.world.comm.allgather(h.hexdigest())
        return len(set(digests)) == 1

    def free(self):
        for algo in self.algorithms.values():
            algo.free()
