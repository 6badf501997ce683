"""The gradient exchange: a solver callback whose per-layer hook returns a future.

As PyTorch DDP's communication hooks. Right after a layer's backward (``on_backward``) the
compute thread starts that layer's exchange and hands a future on. Each tensor of the layer
goes through five steps:

stat
    the codec's statistic (fp8's quantile on refresh iterations, APS' peak), left on the device;
agree
    its one host read and the MAX over ranks (communication thread: an MPI call);
encode
    into the tensor's span of its bucket's wire buffer (handed to the codec as ``t.out``), or a
    gather payload; on the GPU then an asynchronous copy into pinned host memory;
reduce
    the bucket's sum or the tensor's gather (comm/allreduce.py), communication thread;
decode
    the mean into the gradient (after the H2D copy on the GPU).

Where each step runs is decided once, at construction (``stages``, ``local_at_launch``): on the
GPU the compute thread runs the local steps (stat, and the encode of a tensor with nothing to
agree on) at launch, on the layer's own CUDA stream after an event recorded on the compute
stream: it only launches kernels and never reads the device; the communication thread agrees,
encodes what waited for the agreement (and, for a codec whose payload size depends on the data,
Strom's, every encode: its size is a host read), waits for the copies and reduces; a decode
stage decodes and records a done event, which the compute stream waits for before the update.
On the CPU the same steps run without copies or streams (the wire buffer is the host buffer)
in three stages: an encode stage runs the local steps, since a host encode on the compute
thread would lengthen backward instead of overlapping it; the communication thread; an update
stage decodes (then the pipelined update: ``pipeline``).
The stages are the table ``Exchange.stages`` of :class:`Stage` (a thread's name and a bound
step), made in the constructor; each tensor's :class:`Trip` carries its gradient from step to
step.
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
import time
from dataclasses import dataclass
from typing import Callable

import numpy

from caffe8.engine import backend
from caffe8.engine.callbacks import SolverCallback
from caffe8.engine.errors import CaffeError
from caffe8.engine.timing import PHASES, BucketTimes, Clock, ExchangeTimes
from caffe8.comm.allreduce import create_transport
from caffe8.comm.collective import BLOCKING, bit_identical, max_over
from caffe8.comm.codecs import Tensor, create_codec
from caffe8.comm.config import transport_name
from caffe8.comm.ops import padded_length
from caffe8.comm.ipc import ALIGN as DEVICE_ALIGN, D2H, H2D, copy_async
from caffe8.comm.shm import ALIGN


def build_schedule(layer_param_slices):
    """{layer index: [slices]}: each distinct slice at the lowest layer index that uses it."""
    owner = {}
    for i in sorted(layer_param_slices):
        for _, sl in layer_param_slices[i]:
            if sl.stop > sl.start:
                owner.setdefault((sl.start, sl.stop), (i, sl))
    schedule = {}
    for i, sl in owner.values():
        schedule.setdefault(i, []).append(sl)
    return schedule


def build_buckets(schedule, limit_bytes, itemsize):
    """[[layer, ...], ...]: the layers of ``schedule`` in backward (descending) order, grouped
    into buckets whose tensors are summed together in one transport call: a bucket closes once
    its wire bytes reach ``limit_bytes`` (so a large layer is a bucket of its own, and small
    ones share one collective instead of paying its latency each). A layer's tensors always
    share a bucket; 0 makes every layer a bucket of its own."""
    buckets, current, size = [], [], 0
    for layer in sorted(schedule, reverse=True):
        current.append(layer)
        size += sum(sl.stop - sl.start for sl in schedule[layer]) * itemsize
        if size >= limit_bytes:
            buckets.append(current)
            current, size = [], 0
    if current:
        buckets.append(current)
    return buckets


@dataclass(eq=False, slots=True)
class Trip:
    """One tensor's way through the exchange in one iteration; each step fills its own fields.

    At launch: ``sl`` (its slice of the net's flat buffers), ``grad`` (that slice of the flat
    diff: every step reads and the decode writes it), ``codec``, ``transport``, ``tensor`` (what
    the codec sees, its output buffer included) and, for sum codecs, ``at`` (its offset in its
    bucket's wire buffer), ``host`` and ``wire`` (its spans of the bucket's pinned host and
    device wire buffers; one array on the CPU; no host span where the bucket has no mirror).
    The statistic: ``stat`` (left on the device; None: nothing to agree on this iteration) and
    ``quantile`` (seconds of the statistic and its agreement). The encode: ``payload`` and
    ``ctx`` (gather codecs: ``host``, the payload's host copy). The reduction: ``reduced`` (the
    sum or the gathered rows; on the GPU the device copy), cleared by the decode.
    """
    sl: slice
    grad: object
    codec: object
    transport: object
    tensor: Tensor
    at: int = 0
    host: object = None
    wire: object = None
    on_device: bool = False
    stat: object = None
    quantile: float = 0.0
    payload: object = None
    ctx: object = None
    reduced: object = None


class BetweenStages:
    """The codec's step between the hierarchical sum's stages over one bucket's wire buffer
    ``buffer``, tensor by tensor: the transport hands it its intra-node partial sum ``piece``
    (a block of ``buffer``), and each tensor's part of the piece is transformed with that
    tensor's own codec context (fp8: the number of nodes it divides by)."""

    def __init__(self, buffer, trips):
        self.buffer = buffer
        self.spans = [(t.at, t.at + t.host.size, t.codec, t.ctx) for t in trips]

    def __call__(self, piece):
        lo = (piece.ctypes.data - self.buffer.ctypes.data) // piece.itemsize
        hi = lo + piece.size
        for start, stop, codec, ctx in self.spans:
            a, b = max(start, lo), min(stop, hi)
            if a < b:
                codec.between_stages(piece[a - lo:b - lo], ctx)


@dataclass(frozen=True)
class Stage:
    """One stage of the exchange: ``step(future)`` runs on the thread named ``thread``
    (asynchronous mode) and returns the futures it passes on to the next stage (None: the
    future itself)."""
    thread: str
    step: Callable


class LayerExchange:
    """The exchange of one layer in one iteration: ``wait()`` returns when the gradients hold the
    mean over all processes, or raises the error that ended it. ``stream``: the layer's CUDA
    stream (None on the CPU); ``copied``: an event after each batch of D2H copies, which the
    communication thread waits for; ``marks``: (phase, start, end) of each timed phase;
    ``reduce``: (start, end) host clock readings of its reduction (its bucket's sum)."""

    def __init__(self, layer, trips, stream=None):
        self.layer, self.trips, self.stream = layer, trips, stream
        self.error = None
        self.copied = []
        self.h2d = None                      # mark before the copies back (timed GPU runs)
        self.done_event = None               # CUDA event after the decode (GPU)
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
        self.gpu = backend.get_array_module(net.flat_diff) is not numpy
        self.clock = Clock(self.gpu)
        waiter = self.watchdog or BLOCKING
        self._transport_of = {c.name: transport_name(comm, c) for c in (self.codec, self.fp32)}
        # Creating the hierarchical sum's communicators is collective: here, in the same order
        # on every rank, never lazily from inside a layer hook.
        self.transports = {name: create_transport(name, world.comm, comm.processes_per_node,
                                                  waiter)
                           for name in sorted(set(self._transport_of.values()))}
        self._layout_buckets(comm.bucket_kb * 1024)
        self._reserve_shared_buffers()
        self.timings = ExchangeTimes({}, self.codec.quantile_interval, self.asynchronous)
        self._ready = None              # GPU: an event after the wire buffers' zero-fill
        self.buffers = self._make_buffers()
        self._gather_hosts = {}         # GPU, gather codecs: pinned host copies of payloads
        self._arrived = {}              # bucket -> futures of this iteration that reached it
        self._streams = {}
        self._futures = []              # this iteration's futures, in the order they started
        self._launched = {}             # layers whose hook came, in the order they came
        self._failed = False
        self._threads = []
        self.pipelined = None           # the trainer's PipelinedUpdate, when taken (pipeline)
        # Where each step runs, decided here once (module docstring): the stages a future
        # passes through, in order, each a bound method on a thread of its own. On the CPU
        # three, so that no host work holds up the link: an encode stage (the local steps of
        # the next layers while the current one is on the wire), the communication thread
        # (agreement, reduction: every MPI call) and an update stage (decode, then the
        # pipelined update). On the GPU the compute thread runs the local steps at launch
        # (kernel launches on the layer's stream), then the communication thread and a decode
        # stage that launches the decode on the layer's stream.
        self.local_at_launch = self.gpu
        if self.gpu:
            self.stages = (Stage("caffe8-comm", self._transfer),
                           Stage("caffe8-decode", self._settle))
        else:
            self.stages = (Stage("caffe8-encode", self._prepare),
                           Stage("caffe8-comm", self._transfer),
                           Stage("caffe8-update", self._settle_and_update))
        #: device phases timed with CUDA events (on the CPU every mark is a clock reading)
        self.timed = timed or not self.gpu
        if self.asynchronous:
            self._start_stages()

    def _layout_buckets(self, limit_bytes):
        """Buckets of layers (``build_buckets``, sized in the configured codec's wire bytes;
        gather codecs send every tensor by itself) and each tensor's place in its bucket's
        wire buffer: ``_bucket_of[layer]``, ``_offset[(start, stop)]``, ``_bucket_size[b]``."""
        item = numpy.dtype(self.codec.wire.dtype).itemsize if self.codec.reduction == "sum" \
            else 1
        limit = limit_bytes if self.codec.reduction == "sum" else 0
        self.buckets = build_buckets(self.schedule, limit, item)
        self._bucket_of, self._offset, self._bucket_size = {}, {}, []
        for b, layers in enumerate(self.buckets):
            n = 0
            for layer in layers:
                self._bucket_of[layer] = b
                for sl in self.schedule[layer]:
                    self._offset[(sl.start, sl.stop)] = n
                    n += sl.stop - sl.start
            self._bucket_size.append(n)

    def _reserve_shared_buffers(self):
        """Size each sum transport's node-shared arena for the wire buffers of the configured
        codec (one per bucket, as ``bucket_buffer`` takes them) and create it: collective, so
        here, in the same order on every rank, before the communication thread starts. The
        float32 warm-up's buffers stay private: a few iterations are not worth four more bytes
        of /dev/shm per parameter and process."""
        self._reserved = []
        codec = self.codec
        if codec.reduction != "sum":
            return
        name = self._transport_of[codec.name]
        transport = self.transports[name]
        item = numpy.dtype(codec.wire.dtype).itemsize
        align = max(ALIGN, DEVICE_ALIGN)
        transport.reserve(sum(self._wire_length(n, codec, transport) * item + align
                              for n in self._bucket_size), device=self.gpu)
        self._reserved = [name]

    def _make_buffers(self):
        """{(codec name, bucket): (host, device)}: every bucket's wire buffers, made here, before
        any stream uses them (``bucket_buffer``): the configured codec's (from the node-shared
        arena while it has room: on GPUs its device arena, when the node's GPUs share memory,
        and then the host buffer is a private pinned mirror for the stage between nodes, or
        None without one) and, with warm-up iterations, the float32 codec's (private).
        On the GPU each device buffer is zero-filled on the current stream, and ``_ready`` is an
        event after the fills, which every layer's stream waits for before its first step: a
        buffer made at a layer's first use on the compute stream was not ordered before that
        layer's encode on its own stream, so iteration 0 (and the first iteration after the
        warm-up) could send partly zero gradients."""
        codecs = [self.codec]
        if self.warmup_fp32_iters > 0 and self.fp32.name != self.codec.name:
            codecs.append(self.fp32)
        buffers = {}
        self._on_device = set()     # (codec name, bucket) whose buffers lie in the device arena
        xp = backend.get_array_module(self.net.flat_diff)
        for codec in codecs:
            if codec.reduction != "sum":
                continue
            transport = self.transports[self._transport_of[codec.name]]
            for b, size in enumerate(self._bucket_size):
                length = self._wire_length(size, codec, transport)
                device = transport.device_buffer(length, codec.wire.dtype) \
                    if codec is self.codec else None
                # summed on the GPUs with no stage between nodes: no host mirror at all (a
                # full-size pinned one cost 1.08 GB per rank for the fp32 GRU benchmark)
                host = None if device is not None and transport.stages[1] == 1 else \
                    transport.host_buffer(length, codec.wire.dtype, shared=codec is self.codec)
                if device is None:
                    device = xp.zeros(length, codec.wire.dtype) if self.gpu else host
                buffers[(codec.name, b)] = (host, device)
                if self.gpu and transport.on_device(device):
                    self._on_device.add((codec.name, b))
        if self.gpu:
            self._ready = self.clock.mark(backend.cupy.cuda.get_current_stream())
        return buffers

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
            if future.done_event is not None:
                backend.cupy.cuda.get_current_stream().wait_event(future.done_event)
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
    def _stream(self, layer):
        if not self.gpu:
            return None
        if layer not in self._streams:
            stream = self._streams[layer] = backend.cupy.cuda.Stream(non_blocking=True)
            stream.wait_event(self._ready)          # after the wire buffers' zero-fill
        return self._streams[layer]

    @staticmethod
    def _wire_length(n, codec, transport):
        """Items of the wire buffer of an ``n``-element tensor: padded so the transport's parts
        are whole wire units."""
        return padded_length(n, codec.wire.unit, transport.parts)

    def bucket_buffer(self, b, codec):
        """(host, device): bucket ``b``'s zero-padded wire buffer for ``codec`` (a sum codec of
        this exchange) on the gradient's device, and its pinned host mirror (one array on the
        CPU; None for a buffer summed on the GPUs of one node), made by the constructor and kept
        from one iteration to the next: fresh buffers of tens of MB cost page faults every call.
        Each tensor's encoder writes only its own span; the padding stays zero."""
        return self.buffers[(codec.name, b)]

    def launch(self, layer):
        """Start one layer's exchange (compute thread): its trips and, on the GPU, its local
        steps (kernel launches on the layer's stream only); returns its LayerExchange, not yet
        run."""
        codec = self.codec_for_iteration()
        transport = self.transports[self._transport_of[codec.name]]
        stream = self._stream(layer)
        if stream is not None:              # the layer's stream starts after its backward
            stream.wait_event(self.clock.mark(backend.cupy.cuda.get_current_stream()))
        future = LayerExchange(layer, [self._trip(layer, sl, codec, transport)
                                       for sl in self.schedule[layer]], stream)
        if self.local_at_launch:
            self._prepare(future)
        return future

    def _trip(self, layer, sl, codec, transport):
        """A tensor's trip, with its gradient and its spans of the bucket's wire buffers (sum
        codecs)."""
        key = (sl.start, sl.stop)
        at, host, wire, on_device = 0, None, None, False
        if codec.reduction == "sum":
            at, n = self._offset[key], sl.stop - sl.start
            b = self._bucket_of[layer]
            host, device = self.bucket_buffer(b, codec)
            on_device = (codec.name, b) in self._on_device
            host, wire = None if host is None else host[at:at + n], device[at:at + n]
        tensor = Tensor(key, self.net.flat_data[sl], self.iteration, self.world.size,
                        transport.stages, wire)
        return Trip(sl, self.net.flat_diff[sl], codec, transport, tensor, at, host, wire,
                    on_device)

    def _encodes_early(self, trip):
        """True when the tensor is encoded in the local steps, before any agreement: it has no
        statistic to agree on, and its payload's size does not depend on the data (on the GPU a
        ``varying`` codec, Strom, needs a host read to size it: its encode waits for the
        communication thread, so the compute thread never waits for the device)."""
        return trip.stat is None and not (self.gpu and trip.codec.varying)

    def _prepare(self, future):
        """The local steps: each tensor's statistic, then the encode of those encoded early."""
        with _on(future.stream):
            for trip in future.trips:
                self._stat(trip)
            self._encode(future, [t for t in future.trips if self._encodes_early(t)])

    def _stat(self, trip):
        """The codec's statistic, left on the device (``_agree`` reads it); quantile time."""
        t = time.perf_counter()
        trip.stat = trip.codec.device_stat(trip.grad, trip.tensor)
        if trip.stat is not None:
            trip.quantile += time.perf_counter() - t

    def _agree(self, trip):
        """The MAX over ranks of the statistic, handed to the codec (communication thread)."""
        t = time.perf_counter()
        value = trip.codec.host_stat(trip.stat)
        trip.codec.agree(trip.tensor, max_over(self.world.comm, value, self.watchdog or BLOCKING))
        trip.quantile += time.perf_counter() - t

    def _encode(self, future, trips):
        """Encode ``trips``; on the GPU then one batch of copies of their payloads into pinned
        host memory, and an event after it (``future.copied``)."""
        if not trips:
            return
        stream = future.stream
        start = self._mark(stream)
        for trip in trips:
            trip.payload, trip.ctx = trip.codec.encode(trip.grad, trip.tensor)
        encoded = self._mark(stream)
        self._phase(future, "encode", start, encoded)
        copies = False
        for trip in trips:
            if self.gpu:
                if not trip.on_device:          # summed where it lies (the device arena)
                    self._copy_to_host(trip, stream)
                    copies = True
            elif trip.codec.reduction == "gather":
                trip.host = trip.payload
        if self.gpu:
            future.copied.append(self.clock.mark(stream))
            if copies:                          # no copy, no D2H time (an event gap is none)
                self._phase(future, "d2h", encoded, future.copied[-1])

    def _copy_to_host(self, trip, stream):
        """Start the payload's D2H copy on ``stream``: into the tensor's span of the bucket's
        pinned buffer (sum codecs), or a pinned buffer that fits (gather codecs, any length)."""
        payload = trip.payload = backend.cupy.ascontiguousarray(trip.payload)
        if trip.codec.reduction == "gather":
            key, n = trip.tensor.key, payload.size
            host = self._gather_hosts.get(key)
            if host is None or host.size < n or host.dtype != payload.dtype:
                host = self._gather_hosts[key] = backend.host_buffer(max(n, 1), payload.dtype)
            trip.host = host
        copy_async(trip.host.ctypes.data, payload.data.ptr, payload.nbytes, D2H, stream)

    def _transfer(self, future):
        """The communication thread's steps (every MPI call, so always this one thread): the
        agreements and the encodes they allow, the wait for the copies, then the reduction: each
        tensor's gather, or its bucket's sum once the bucket's last layer is in. Returns the
        futures whose reduction is done (a completed bucket's layers in the order they came; for
        a gather codec the layer itself)."""
        if self.watchdog is not None:
            self.watchdog.at(self.iteration, f"layer '{self.net.layers[future.layer].name}'")
        late = [trip for trip in future.trips if not self._encodes_early(trip)]
        with _on(future.stream):
            for trip in late:
                if trip.stat is not None:
                    self._agree(trip)
            self._encode(future, late)
        for trip in future.trips:
            future.times["quantile"] += trip.quantile
        if future.copied:
            t = time.perf_counter()
            for event in future.copied:
                event.synchronize()
            future.times["wait"] += time.perf_counter() - t
        if not future.trips or future.trips[0].codec.reduction != "sum":
            self._gather(future)
            return [self._copy_back(future)]
        b = self._bucket_of[future.layer]
        arrived = self._arrived.setdefault(b, [])
        arrived.append(future)
        if len(arrived) < len(self.buckets[b]):
            return []
        self._sum_bucket(b, arrived)
        del self._arrived[b]
        return [self._copy_back(f) for f in arrived]

    def _gather(self, future):
        """Every rank's payload of each tensor of the layer, in rank order."""
        start = time.perf_counter()
        for trip in future.trips:
            t = time.perf_counter()
            trip.reduced = trip.transport.gather(trip.host[:trip.payload.size],
                                                 trip.codec.varying)
            future.times["comm"] += time.perf_counter() - t
        future.reduce = (start, time.perf_counter())

    def _sum_bucket(self, b, futures):
        """One transport call over bucket ``b``'s wire buffer (every tensor of ``futures``),
        with the codec's step between the stages for each tensor (``BetweenStages``); its time
        is shared out to the layers by their element counts."""
        trips = [trip for f in futures for trip in f.trips]
        codec, transport = trips[0].codec, trips[0].transport
        host, device = self.bucket_buffer(b, codec)
        # no mirror: summed on one node's GPUs, where there is no stage between nodes
        between = BetweenStages(host, trips) \
            if codec.between_stages is not None and host is not None else None
        t = time.perf_counter()
        if trips[0].on_device:          # on the GPUs; the node's piece crosses nodes via host
            transport.sum(device, codec.wire, between, host=host)
        else:
            transport.sum(host, codec.wire, between)
        end = time.perf_counter()
        for f in futures:
            for trip in f.trips:
                trip.reduced = trip.wire if trip.on_device else trip.host
            n = sum(trip.wire.size for trip in f.trips)
            f.times["comm"] += (end - t) * n / max(self._bucket_size[b], 1)
            f.reduce = (t, end)

    def _copy_back(self, future):
        """On the GPU, start each tensor's copy of its reduced bytes back to the device (on the
        layer's stream); returns ``future``."""
        if not self.gpu:
            return future
        with _on(future.stream):
            copies = any(not trip.on_device for trip in future.trips)
            future.h2d = self._mark(future.stream) if copies else None     # None: no H2D time
            for trip in future.trips:
                if trip.on_device:
                    pass                        # the sum is already in the device buffer
                elif trip.codec.reduction == "sum":
                    copy_async(trip.wire.data.ptr, trip.host.ctypes.data, trip.host.nbytes,
                               H2D, future.stream)
                    trip.reduced = trip.wire
                else:
                    trip.reduced = [backend.cupy.asarray(row) for row in trip.reduced]
        return future

    def _settle(self, future):
        """Decode every tensor of the layer into its gradient (the decode stage on the GPU, the
        update stage on the CPU); on the GPU an event after it (``done_event``)."""
        stream = future.stream
        with _on(stream):
            start = self._mark(stream)
            self._phase(future, "h2d", future.h2d, start)
            for trip in future.trips:
                trip.codec.decode(trip.reduced, trip.ctx, trip.grad)
                trip.reduced = None
            end = self.clock.mark(stream) if self.gpu or self.timed else None
        if self.gpu:
            future.done_event = end
        self._phase(future, "decode", start, end)

    # --- timing -----------------------------------------------------------------------------
    def _mark(self, stream):
        """A timing mark (a CUDA event on the GPU), or None when device phases are not timed."""
        return self.clock.mark(stream) if self.timed else None

    @staticmethod
    def _phase(future, phase, start, end):
        if start is not None and end is not None:
            future.marks.append((phase, start, end))

    @staticmethod
    def _bucket_times(b, futures):
        """Bucket ``b``'s timeline of this iteration: the marks of its layers' phases and of
        its reduction (engine.timing.BucketTimes; the timing log places them in time)."""
        marks = [m for f in futures for m in f.marks]
        marks += [("reduce", *f.reduce) for f in futures if f.reduce is not None]
        return BucketTimes(b, [f.layer for f in futures], marks)

    def _read_times(self, future):
        """The phases of a finished future from its marks (CUDA events read after the wait)."""
        for phase, start, end in future.marks:
            future.times[phase] += self.clock.seconds(start, end)

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
            held = [f for fs in self._arrived.values() for f in fs if f is not future]
            self._arrived.clear()
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

    def _settle_and_update(self, future):
        self._settle(future)
        if self.pipelined is not None:
            self.pipelined.layer_ready([trip.sl for trip in future.trips])

    def pipeline(self, update):
        """Take the trainer's pipelined update (engine.callbacks): an asynchronous exchange of
        host arrays does, and calls ``update.layer_ready(slices)`` for each exchanged layer in
        its update stage. On a GPU the update is a few device kernels after the exchange, and
        stays there; a synchronous exchange has nothing to overlap it with."""
        if not self.asynchronous or self.gpu:
            return False
        self.pipelined = update
        return True

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
        self.buffers.clear()        # the arenas' mappings close only with no buffer left on them
        self._gather_hosts.clear()
        for transport in self.transports.values():
            transport.free()



class _on:
    """``with _on(stream):`` makes ``stream`` current on the GPU; nothing on the CPU."""

    def __init__(self, stream):
        self.stream = stream

    def __enter__(self):
        if self.stream is not None:
            self.stream.__enter__()
        return self.stream

    def __exit__(self, *exc):
        if self.stream is not None:
            self.stream.__exit__(*exc)
