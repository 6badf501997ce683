"""Per-layer gradient exchange, synchronous or on a communication thread.

``LayerwiseExchange`` wraps a ``GradientExchange`` and attaches to training as a solver callback
(``engine.callbacks``). In asynchronous mode one communication thread owns all MPI traffic
during backward: ``on_backward`` hands it each layer's tensors the moment that layer's backward
is done, and the compute thread goes on with the previous layer; ``on_gradients_ready`` waits
until every layer is through. Only that thread calls MPI while backward runs, which is what MPI_THREAD_SERIALIZED
permits. Each tensor is exchanged independently of the others, so the asynchronous and
synchronous orders give bit-identical results.

Shared parameters are exchanged after the *last* layer that accumulates into them (the lowest
layer index, since backward runs in reverse), and only during the last of ``iter_size`` passes.
"""
import queue
import threading

from engine import backend
from engine.callbacks import SolverCallback
from engine.errors import CaffeError


def build_schedule(layer_param_slices):
    """{layer index: [slices]} — each distinct slice at the lowest layer index that uses it."""
    owner = {}
    for i in sorted(layer_param_slices):
        for _, sl in layer_param_slices[i]:
            owner.setdefault((sl.start, sl.stop), (i, sl))
    schedule = {}
    for i, sl in owner.values():
        schedule.setdefault(i, []).append(sl)
    return schedule


class LayerwiseExchange(SolverCallback):
    """Drives ``exchange.exchange_tensor`` per layer; records per-layer communication times.

    ``timings``: {layer index: {"encode"|"quantile"|"comm"|"decode": seconds}} of the last
    iteration (read by the timing log).
    """

    def __init__(self, exchange, net, asynchronous=True):
        self.exchange = exchange
        self.net = net
        self.asynchronous = bool(asynchronous)
        self.schedule = build_schedule(net.layer_param_slices)
        self.timings = {}
        self.last_quantile_seconds = 0.0
        self._error = None
        self.quantile_interval = getattr(exchange.codec, "quantile_interval", 1)
        if self.asynchronous:
            self._queue = queue.Queue()
            self._thread = threading.Thread(target=self._run, name="caffe8-comm", daemon=True)
            self._thread.start()

    # --- compute-thread side -------------------------------------------------------------------
    def on_start(self):
        self.timings = {}

    def on_backward(self, layer_index):
        """The layer's gradients are final for this iteration: queue its exchange (async)."""
        if self.asynchronous and layer_index in self.schedule:
            self._queue.put(layer_index)

    def on_gradients_ready(self):
        """Wait for (async) or run (sync) every layer's exchange."""
        if self.asynchronous:
            self._queue.join()
            if self._error is not None:
                index, exc = self._error
                self._error = None
                name = self.net.layers[index].name
                raise CaffeError(f"gradient exchange of layer '{name}' failed: "
                                 f"{type(exc).__name__}: {exc}") from exc
        else:
            for index in sorted(self.schedule, reverse=True):
                self._exchange_layer(index)
        quantile = sum(t.get("quantile", 0.0) for t in self.timings.values())
        if quantile > 0:
            self.last_quantile_seconds = quantile  # one full pass; the timing log charges 1/N
        self.exchange.end_iteration()

    # --- communication-thread side -------------------------------------------------------------
    def _exchange_layer(self, index):
        phases = {}
        for sl in self.schedule[index]:
            self.exchange.exchange_tensor(sl, phases)
        self.timings[index] = phases

    def _run(self):
        backend.bind_thread()
        while True:
            index = self._queue.get()
            try:
                if index is None:
                    return
                if self._error is None:  # after a failure, drain without more MPI traffic
                    self._exchange_layer(index)
            except BaseException as exc:  # surfaces in the compute thread with the layer name
                self._error = (index, exc)
            finally:
                self._queue.task_done()

    def consistency_check(self):
        return self.exchange.checksum_check()

    def close(self):
        if self.asynchronous and self._thread.is_alive():
            self._error = self._error or (-1, RuntimeError("closing"))  # drain without MPI
            self._queue.put(None)
            self._thread.join(timeout=10)
            if self._thread.is_alive():
                return  # still inside MPI: freeing communicators now would race with it
        self.exchange.free()

    def state(self):
        return self.exchange.state()

    def restore(self, state):
        self.exchange.restore(state)
