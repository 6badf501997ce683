"""The gradient exchange: a solver callback whose per-layer hook returns a future.

As PyTorch DDP's communication hooks. Right after a layer's backward (``on_backward``) the
compute thread starts that layer's exchange and hands a future on. Each tensor of the layer
goes through the steps of comm/pipeline.py (the same steps caffe8.ddp's hook drives):

stat
    the codec's statistic (fp8's quantile on refresh iterations, APS' peak), left on the device;
agree
    its one host read and the MAX over ranks (communication thread: one MPI call per layer);
encode
    into the tensor's span of its bucket's wire buffer (handed to the codec as ``t.out``), or a
    gather payload; on the GPU then an asynchronous copy into pinned host memory;
reduce
    the bucket's sum (the ordered levels of comm/allreduce.py, the codec's step between them
    per tensor) or the tensor's gather, communication thread;
decode
    the mean into the gradient (after the H2D copy on the GPU).

The exchange's two forks are objects chosen once, in the constructor: how a codec's tensors
travel (comm/buckets.py: ``Summed`` in their bucket's wire buffer, or ``Gathered`` one by one)
and where the steps run (comm/sides.py: ``HostSide``, or ``DeviceSide`` with a CUDA stream per
layer, pinned copies and events). The side gives the stage table ``Exchange.stages`` of
:class:`Stage` (a thread's name and a bound step): on the CPU an encode stage, the
communication thread and an update stage (decode, then the pipelined update: ``pipeline``); on
the GPU the compute thread runs the local steps at launch (``local_at_launch``), then the
communication thread and a decode stage. Each tensor's comm.pipeline.Trip carries its gradient
from step to step.

Synchronous mode (``async: false``) runs exactly the same steps for each layer, in the order the
hooks came, on the compute thread after backward; every tensor's arithmetic is independent of
when it runs, so both modes give bit-identical weights. Only one thread calls MPI at a time
(MPI_THREAD_SERIALIZED): during backward that is the communication thread alone. The exchange
counts iterations once (``iteration``): the codecs get it in each tensor's ``Tensor``, the
watchdog with each layer, snapshots in ``state``.

Shared parameters are exchanged once, with the lowest layer index that uses them (the last
backward that accumulates into them), and only in the last of ``iter_size`` passes (the trainer
calls ``on_backward`` only then). Layers whose hook did not come are exchanged before the wait.

Every collective completes through the collective watchdog (comm/watchdog.py), so a stalled rank
ends the job with its name after ``comm.stall_timeout`` seconds instead of a hang. Per layer and
iteration the exchange records encode, d2h, wait (for the copy), comm, h2d, decode and quantile
seconds in ``timings`` (engine.timing); on the GPU the device phases come from CUDA events made
only when the exchange is ``timed`` (the wiring asks for it when a timing log records the run),
else only the three events each layer needs.
"""
import queue
import threading
from dataclasses import dataclass
from typing import Callable

import numpy

from caffe8.engine import backend
from caffe8.engine.callbacks import SolverCallback
from caffe8.engine.errors import CaffeError
from caffe8.engine.timing import PHASES, BucketTimes, ExchangeTimes
from caffe8.comm.allreduce import create_transport
from caffe8.comm.buckets import Layout, build_schedule, reduction_of
from caffe8.comm.collective import BLOCKING, bit_identical
from caffe8.comm.codecs import create_codec
from caffe8.comm.config import transport_name
from caffe8.comm.pipeline import Pipeline
from caffe8.comm.sides import DeviceSide, HostSide, on_stream, phase


@dataclass(frozen=True)
class Stage:
    """One stage of the exchange: ``step(future)`` runs on the thread named ``thread``
    (asynchronous mode) and returns the futures it passes on to the next stage (None: the
    future itself)."""
    thread: str
    step: Callable


class LayerExchange:
    """The exchange of one layer in one iteration: ``wait()`` returns when the gradients hold the
    mean over all processes, or raises the error that ended it. ``trips``: its tensors'
    (comm.pipeline.Trip); ``reduction``: how they travel this iteration (comm.buckets: its
    codec's ``Summed`` or ``Gathered``); ``stream``: the layer's CUDA stream (None on the CPU);
    ``copied``: an event after each batch of D2H copies, which the communication thread waits
    for; ``marks``: (phase, start, end) of each timed phase; ``reduce``: (start, end) host clock
    readings of its reduction (its bucket's sum)."""

    def __init__(self, layer, trips, reduction, stream=None):
        self.layer, self.trips, self.reduction, self.stream = layer, trips, reduction, stream
        self.pipeline = reduction.pipeline
        self.error = None
        self.copied = []
        self.h2d = None                      # mark before the copies back (timed GPU runs)
        self.done_event = None               # mark after the decode (a CUDA event on the GPU)
        self.marks = []
        self.reduce = None
        self.times = dict.fromkeys(PHASES, 0.0)
        self._done = threading.Event()

    def set_done(self, error=None):
        self.error = error
        self._done.set()

    def done(self):
        return self._done.is_set()

    def wait(self):
        self._done.wait()
        if self.error is not None:
            raise self.error


class Exchange(SolverCallback):
    """Averages the net's parameter gradients over ``world`` (see the module docstring).

    :meth:`pipeline` (asynchronous mode, host arrays): the trainer's pipelined update
    (engine.pipelined.PipelinedUpdate), whose ``layer_ready`` gets each finished layer's slices
    of the flat diff in the update stage, right after their decode, in the order the layers
    finish, before the layer's future is done.

    ``world``: comm.mpi.World (or any world of engine.world with ``comm``); ``comm``: the solver's
    parsed ``comm`` block, already checked by comm.config.validate_comm; ``net``: an engine Net
    (``flat_data``, ``flat_diff``, ``layer_param_slices``, ``layers``). Every collective
    completes through the world's ``watchdog`` (borrowed; None: plain blocking waits).
    ``asynchronous``: None follows ``comm.async``; a bool overrides it (the wiring's call).
    ``timed``: time the device phases with CUDA events too (a timing log records them; the
    host phases are always timed); else only the three events each layer needs are made.
    """

    def __init__(self, world, comm, net, asynchronous=None, timed=False):
        self.world, self.net = world, net
        self.watchdog = getattr(world, "watchdog", None)        # borrowed: the world owns it
        # "async" is a Python keyword; ``asynchronous`` (the wiring's decision) overrides it
        self.asynchronous = bool(getattr(comm, "async") if asynchronous is None else asynchronous)
        self.iteration = 0
        self.warmup_fp32_iters = comm.warmup_fp32_iters
        self.codec = create_codec(comm.codec, comm, world.rank)
        self.fp32 = create_codec("fp32", comm, world.rank)
        self.schedule = build_schedule(net.layer_param_slices)
        self.codec.bind([(sl.start, sl.stop) for sls in self.schedule.values() for sl in sls])
        # host or device: decided here once
        gpu = backend.get_array_module(net.flat_diff) is not numpy
        self.side = DeviceSide(timed) if gpu else HostSide()
        waiter = self.watchdog or BLOCKING
        transport_of = {c.name: transport_name(comm, c) for c in (self.codec, self.fp32)}
        # Creating the hierarchical sum's communicators is collective: here, in the same order
        # on every rank, never lazily from inside a layer hook.
        self.transports = {name: create_transport(name, world.comm, comm.processes_per_node,
                                                  waiter)
                           for name in sorted(set(transport_of.values()))}
        # every bucket's wire buffers are made here, before any stream uses them: the
        # configured codec's and, with warm-up iterations, the float32 codec's
        codecs = [self.codec] + ([self.fp32] if self.warmup_fp32_iters > 0 and
                                 self.fp32.name != self.codec.name else [])
        pipelines = [Pipeline(c, self.transports[transport_of[c.name]]) for c in codecs]
        # sum or gather, decided here once: the configured codec's reduction lays out the
        # buckets (in its wire bytes; gather codecs send every tensor by itself) and reserves
        # its transport's node-shared arena (collective, before the communication thread),
        # whose buffers only its own wire buffers take (a few float32 iterations are not worth
        # four more bytes of /dev/shm per parameter and process)
        kind = reduction_of(self.codec)
        layout = Layout(self.schedule, *kind.bucketing(self.codec, comm.bucket_kb * 1024))
        self.buckets, self._bucket_of = layout.buckets, layout.bucket_of
        self._reserved = [transport_of[self.codec.name]] \
            if kind.reserve(pipelines[0], layout, self.side) else []
        #: {codec name: comm.buckets.Summed or Gathered}
        self.reductions = {p.codec.name: reduction_of(p.codec)(p, layout, self.side,
                                                               shared=p.codec is self.codec)
                           for p in pipelines}
        self.side.ready()
        self.timings = ExchangeTimes({}, self.codec.quantile_interval, self.asynchronous)
        self._futures = []              # this iteration's futures, in the order they started
        self._launched = {}             # layers whose hook came, in the order they came
        self._failed = False
        self._threads = []
        self.pipelined = None           # the trainer's PipelinedUpdate, when taken (pipeline)
        #: where each step runs (the side's, module docstring): the stages a future passes
        #: through, in order, each a bound method on a thread of its own
        self.stages = self.side.stages(self, Stage)
        self.local_at_launch = self.side.local_at_launch
        if self.asynchronous:
            self._start_stages()

    def shared_memory_summary(self):
        """One line per sum transport: whether its buffers are node-shared, and why not."""
        def line(t):
            if t.arena is None:
                return f"message buffers ({t.shared_reason})"
            where = "node-shared GPU wire buffers (CUDA IPC, " if t.arena.on_device else \
                "node-shared wire buffers ("
            text = f"{where}{t.arena.segment / 2**20:.1f} MiB per process)"
            return text + (f"; {t.shared_reason}" if t.shared_reason else "")
        return [f"{name}: {line(self.transports[name])}" for name in self._reserved]

    def codec_for_iteration(self):
        """The float32 codec during the warm-up iterations, the configured codec after."""
        return self.fp32 if self.iteration < self.warmup_fp32_iters else self.codec

    # --- the callback protocol (compute thread) -----------------------------------------------
    def on_start(self):
        self._futures, self._launched = [], {}

    def on_backward(self, layer_index):
        """The layer's gradients are final: start its exchange (async) or note it (sync)."""
        if layer_index not in self.schedule or layer_index in self._launched:
            return
        self._launched[layer_index] = True
        if self.asynchronous:
            self._start(layer_index)

    def _start(self, layer):
        future = self.launch(layer)
        self._futures.append(future)
        self._inboxes[0].put(future)

    def on_gradients_ready(self):
        """Wait for every layer's future (sync: run them now), then end the iteration."""
        missing = [i for i in sorted(self.schedule, reverse=True) if i not in self._launched]
        if self.asynchronous:
            for i in missing:
                self._start(i)
        else:
            self._futures = [self.launch(i) for i in list(self._launched) + missing]
            self.run_now(self._futures)
        layers, quantile, buckets = {}, 0.0, {}
        for future in self._futures:
            try:
                future.wait()
            except BaseException as exc:
                self._failed = True
                name = self.net.layers[future.layer].name
                raise CaffeError(f"gradient exchange of layer '{name}' failed: "
                                 f"{type(exc).__name__}: {exc}") from exc
            self.side.wait_done(future)
            self._read_times(future)
            layers[future.layer] = future.times
            quantile += future.times["quantile"]
            buckets.setdefault(self._bucket_of[future.layer], []).append(future)
        previous = self.timings.quantile_pass
        self.timings = ExchangeTimes(layers, self.codec.quantile_interval, self.asynchronous,
                                     quantile if quantile > 0 else previous,
                                     [self._bucket_times(b, fs)
                                      for b, fs in sorted(buckets.items())])
        self._futures, self._launched = [], {}
        self.iteration += 1

    # --- one layer: launch, then the steps stat -> agree -> encode -> reduce -> decode -----------
    def launch(self, layer):
        """Start one layer's exchange (compute thread): its trips and, on the GPU, its local
        steps (kernel launches on the layer's stream only); returns its LayerExchange, not yet
        run."""
        reduction = self.reductions[self.codec_for_iteration().name]
        future = LayerExchange(layer, [reduction.trip(layer, sl, self.net, self.iteration)
                                       for sl in self.schedule[layer]],
                               reduction, self.side.stream(layer))
        if self.local_at_launch:
            self.prepare(future)
        return future

    def prepare(self, future):
        """The local steps: each tensor's statistic, then the encode of those with nothing to
        agree on (``encodes_early``, the side's)."""
        codec = future.pipeline.codec
        with on_stream(future.stream):
            future.times["quantile"] += future.pipeline.stat(future.trips)
            self._encode(future, [t for t in future.trips if self.side.encodes_early(t, codec)])

    def _encode(self, future, trips):
        """Encode ``trips``, then bring their payloads to host memory (the side's
        ``copy_out``: on the GPU one batch of copies and an event after it)."""
        if not trips:
            return
        start = self.side.mark(future.stream)
        future.pipeline.encode(trips)
        encoded = self.side.mark(future.stream)
        phase(future, "encode", start, encoded)
        self.side.copy_out(future, trips, future.reduction, encoded)

    def transfer(self, future):
        """The communication thread's steps (every MPI call, so always this one thread): the
        agreement and the encodes it allows, the wait for the copies, then the reduction: each
        tensor's gather, or its bucket's sum once the bucket's last layer is in. Returns the
        futures whose reduction is done (a completed bucket's layers in the order they came; for
        a gather codec the layer itself), their copies back to the device started."""
        if self.watchdog is not None:
            self.watchdog.at(self.iteration, f"layer '{self.net.layers[future.layer].name}'")
        codec = future.pipeline.codec
        late = [trip for trip in future.trips if not self.side.encodes_early(trip, codec)]
        with on_stream(future.stream):
            future.times["quantile"] += future.pipeline.agree(late)
            self._encode(future, late)
        if future.copied:
            future.times["wait"] += self.side.wait_copies(future)
        return [self.side.copy_back(f) for f in future.reduction.arrive(future)]

    def settle(self, future):
        """Decode every tensor of the layer into its gradient (the decode stage on the GPU, the
        update stage on the CPU), then a mark after it (``done_event``: on the GPU the event
        the compute stream waits for)."""
        stream = future.stream
        with on_stream(stream):
            start = self.side.mark(stream)
            phase(future, "h2d", future.h2d, start)
            future.pipeline.decode(future.trips)
            future.done_event = self.side.clock.mark(stream)
        phase(future, "decode", start, future.done_event)

    def settle_and_update(self, future):
        self.settle(future)
        if self.pipelined is not None:
            self.pipelined.layer_ready([trip.sl for trip in future.trips])

    def pipeline(self, update):
        """Take the trainer's pipelined update (engine.callbacks): an asynchronous exchange of
        host arrays does, and calls ``update.layer_ready(slices)`` for each exchanged layer in
        its update stage. On a GPU the update is a few device kernels after the exchange, and
        stays there; a synchronous exchange has nothing to overlap it with."""
        if not self.asynchronous or not self.side.takes_update:
            return False
        self.pipelined = update
        return True

    # --- timing -----------------------------------------------------------------------------
    @staticmethod
    def _bucket_times(b, futures):
        """Bucket ``b``'s timeline of this iteration: the marks of its layers' phases and of
        its reduction (engine.timing.BucketTimes; the timing log places them in time)."""
        marks = [m for f in futures for m in f.marks]
        marks += [("reduce", *f.reduce) for f in futures if f.reduce is not None]
        return BucketTimes(b, [f.layer for f in futures], marks)

    def _read_times(self, future):
        """The phases of a finished future from its marks (CUDA events read after the wait)."""
        for name, start, end in future.marks:
            future.times[name] += self.side.clock.seconds(start, end)

    # --- the stages -------------------------------------------------------------------------------
    def _start_stages(self):
        self._inboxes = [queue.Queue() for _ in self.stages]
        for k, stage in enumerate(self.stages):
            thread = threading.Thread(target=self._run_stage, args=(k, stage), name=stage.thread,
                                      daemon=True)
            thread.start()
            self._threads.append(thread)

    def _step(self, stage, future):
        """Run ``stage`` on ``future``; returns the futures to pass on (the communication
        stage holds a layer back until its bucket is summed). A failure settles the future with
        its error, and every later step only releases waiters: no more MPI traffic."""
        if future.done():
            return [future]
        if self._failed:
            future.set_done(CaffeError("an earlier layer's exchange failed"))
            return [future]
        try:
            out = stage.step(future)
        except BaseException as exc:          # surfaces in the compute thread, with the layer
            self._failed = True
            # the layers held for a bucket's sum are released with the same error
            held = [f for r in self.reductions.values() for f in r.held() if f is not future]
            for f in [future] + held:
                f.set_done(exc)
            return [future] + held
        return [future] if out is None else out

    def _run_stage(self, k, stage):
        backend.bind_thread()
        inbox = self._inboxes[k]
        outbox = self._inboxes[k + 1] if k + 1 < len(self._inboxes) else None
        while True:
            future = inbox.get()
            if future is None:
                if outbox is not None:
                    outbox.put(None)
                return
            for f in self._step(stage, future):
                if outbox is not None:
                    outbox.put(f)
                elif not f.done():
                    f.set_done()

    def run_now(self, futures):
        """Every stage for every one of ``futures`` (from :meth:`launch`), in order, on this
        thread: synchronous mode's way, also for one layer by itself."""
        for stage in self.stages:
            futures = [f for future in futures for f in self._step(stage, future)]
        for f in futures:
            if not f.done():
                f.set_done()

    # --- state, checks, end ---------------------------------------------------------------------
    def state(self):
        """What an exact resume needs: the iteration (warm-up, quantile refresh) and the codec's
        state (fp8: every tensor's q). Strom's residuals are not saved: a resumed Strom run
        restarts them."""
        return {"iteration": self.iteration, **self.codec.state()}

    def restore(self, state):
        self.iteration = int(state["iteration"])
        self.codec.restore(state)

    def consistency_check(self, params=None):
        """True when every rank holds bit-identical ``params`` (an array or a list of arrays;
        default: the net's flat_data): ``comm.collective.bit_identical``."""
        return bit_identical(self.world, [self.net.flat_data] if params is None else params)

    def close(self):
        """End the communication thread; free communicators unless an exchange failed (a rank
        may then still be inside a collective on them, and the job is being aborted)."""
        if any(t.is_alive() for t in self._threads):
            self._inboxes[0].put(None)
            for thread in self._threads:
                thread.join(timeout=10)
            if any(t.is_alive() for t in self._threads):
                return
        if self._failed:
            return
        for reduction in self.reductions.values():
            reduction.close()
        self.side.close()
        for transport in self.transports.values():
            transport.free()
