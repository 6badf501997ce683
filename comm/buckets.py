"""The trainer's buckets, and how a codec's tensors travel in them: the exchange's one fork on
the codec (``reduction``), chosen once, when the buckets are made (comm/exchange.py).

:func:`build_schedule` gives each distinct parameter slice to one layer, :class:`Layout` groups
the layers into buckets (:func:`build_buckets`) and places each tensor in its bucket's wire
buffer. Then per codec one of

:class:`Summed`
    sum codecs: a bucket's tensors side by side in one zero-padded wire buffer (made here, kept
    from one iteration to the next; on GPUs in the node's device arena where it has room, with
    a pinned host mirror for the stage between nodes), each encoded into its span, the bucket
    summed by one transport call once its last layer is in;
:class:`Gathered`
    gather codecs: every tensor by itself, every rank's payload to every rank, in rank order.

Both give a layer's trips (comm.pipeline.Trip), the host memory a payload reaches
(``host_for``), the reduction of an arrived layer (``arrive``: the layers whose reduction is
done) and, on a GPU, the way back to the device (``copy_back``).
"""
import time

import numpy

from caffe8.comm.ipc import ALIGN as DEVICE_ALIGN, H2D, copy_async
from caffe8.comm.ops import padded_length
from caffe8.comm.pipeline import Trip
from caffe8.comm.shm import ALIGN
from caffe8.engine import backend


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


class Layout:
    """``buckets`` of ``schedule`` (:func:`build_buckets`) and each tensor's place:
    ``bucket_of[layer]``, ``offset[(start, stop)]`` in its bucket's wire buffer, ``sizes[b]``
    (elements of bucket b)."""

    def __init__(self, schedule, limit_bytes, itemsize):
        self.schedule = schedule
        self.buckets = build_buckets(schedule, limit_bytes, itemsize)
        self.bucket_of, self.offset, self.sizes = {}, {}, []
        for b, layers in enumerate(self.buckets):
            n = 0
            for layer in layers:
                self.bucket_of[layer] = b
                for sl in schedule[layer]:
                    self.offset[(sl.start, sl.stop)] = n
                    n += sl.stop - sl.start
            self.sizes.append(n)


def reduction_of(codec):
    """:class:`Summed` or :class:`Gathered`: how ``codec``'s tensors are reduced."""
    return {"sum": Summed, "gather": Gathered}[codec.reduction]


class Summed:
    """A sum codec's tensors in their buckets' wire buffers (module docstring). ``pipeline``:
    the codec's (comm.pipeline.Pipeline); ``side``: comm.sides' host or device side;
    ``shared``: the buffers come from the transport's node-shared arena (the configured codec's;
    the float32 warm-up's stay private)."""

    @staticmethod
    def bucketing(codec, limit_bytes):
        """(limit, itemsize) of :func:`build_buckets`: buckets of ``limit_bytes`` wire bytes."""
        return limit_bytes, numpy.dtype(codec.wire.dtype).itemsize

    @staticmethod
    def reserve(pipeline, layout, side):
        """Size the transport's node-shared arena for this codec's wire buffers (one per
        bucket) and create it: collective, so in the constructor, in the same order on every
        rank. Returns True (the transport then has a line in the exchange's summary)."""
        codec, transport = pipeline.codec, pipeline.transport
        item = numpy.dtype(codec.wire.dtype).itemsize
        align = max(ALIGN, DEVICE_ALIGN)
        transport.reserve(sum(padded_length(n, codec.wire.unit, transport.parts) * item + align
                              for n in layout.sizes), device=side.gpu)
        return True

    def __init__(self, pipeline, layout, side, shared):
        self.pipeline, self.layout = pipeline, layout
        codec, transport = pipeline.codec, pipeline.transport
        #: [(host, device)] per bucket: the host buffer (pinned on a GPU; None for a buffer
        #: summed on the GPUs of one node) and the buffer on the gradients' device (one array
        #: on the CPU)
        self.buffers, self.on_device = [], []
        for size in layout.sizes:
            length = padded_length(size, codec.wire.unit, transport.parts)
            device = transport.device_buffer(length, codec.wire.dtype) if shared else None
            # summed on the GPUs with no stage between nodes: no host mirror at all (a
            # full-size pinned one cost 1.08 GB per rank for the fp32 GRU benchmark)
            host = None if device is not None and transport.stages[1] == 1 else \
                transport.host_buffer(length, codec.wire.dtype, shared=shared)
            if device is None:
                device = side.zeros(length, codec.wire.dtype, host)
            self.buffers.append((host, device))
            self.on_device.append(transport.on_device(device))
        self._arrived = {}              # bucket -> futures of this iteration that reached it

    def trip(self, layer, sl, net, iteration):
        """The tensor ``sl`` of ``layer``, with its spans of its bucket's wire buffers."""
        key, n = (sl.start, sl.stop), sl.stop - sl.start
        at, b = self.layout.offset[key], self.layout.bucket_of[layer]
        host, device = self.buffers[b]
        wire = device[at:at + n]
        tensor = self.pipeline.tensor(key, net.flat_data[sl], iteration, wire)
        return Trip(net.flat_diff[sl], tensor, at, sl, None if host is None else host[at:at + n],
                    wire, self.on_device[b])

    @staticmethod
    def host_for(trip, side):
        """Where the payload's bytes go on the host: the tensor's span of the bucket's host
        buffer."""
        return trip.host

    def arrive(self, future):
        """Note ``future``'s layer in its bucket; once the bucket's last layer is in, sum it
        and return its layers in the order they came (else [])."""
        b = self.layout.bucket_of[future.layer]
        arrived = self._arrived.setdefault(b, [])
        arrived.append(future)
        if len(arrived) < len(self.layout.buckets[b]):
            return []
        self._sum(b, arrived)
        del self._arrived[b]
        return arrived

    def _sum(self, b, futures):
        """One transport call over bucket ``b``'s wire buffer (on the GPUs where it lies in the
        device arena; the node's piece crosses nodes via its host mirror); its time is shared
        out to the layers by their element counts."""
        trips = [trip for f in futures for trip in f.trips]
        host, device = self.buffers[b]
        t = time.perf_counter()
        self.pipeline.sum(device if self.on_device[b] else host, trips, host)
        end = time.perf_counter()
        for f in futures:
            for trip in f.trips:
                trip.reduced = trip.wire if trip.on_device else trip.host
            n = sum(trip.wire.size for trip in f.trips)
            f.times["comm"] += (end - t) * n / max(self.layout.sizes[b], 1)
            f.reduce = (t, end)

    def held(self):
        """The futures waiting for their bucket's sum (forgotten: an exchange failed)."""
        held = [f for fs in self._arrived.values() for f in fs]
        self._arrived.clear()
        return held

    @staticmethod
    def copy_back(trip, stream):
        """Start the copy of the sum from the host buffer into the device span."""
        copy_async(trip.wire.data.ptr, trip.host.ctypes.data, trip.host.nbytes, H2D, stream)
        trip.reduced = trip.wire

    def close(self):
        self.buffers.clear()        # the arenas' mappings close only with no buffer left on them


class Gathered:
    """A gather codec's tensors, each by itself (module docstring)."""

    @staticmethod
    def bucketing(codec, limit_bytes):
        """Every layer a bucket of its own (its payloads are gathered tensor by tensor)."""
        return 0, 1

    @staticmethod
    def reserve(pipeline, layout, side):
        """Nothing to reserve: the gather has no shared-memory stage."""
        return False

    def __init__(self, pipeline, layout, side, shared):
        self.pipeline = pipeline

    def trip(self, layer, sl, net, iteration):
        tensor = self.pipeline.tensor((sl.start, sl.stop), net.flat_data[sl], iteration)
        return Trip(net.flat_diff[sl], tensor, sl=sl)

    @staticmethod
    def host_for(trip, side):
        """The payload itself on the host; on a GPU a pinned buffer that fits it."""
        return side.landing(trip)

    def arrive(self, future):
        """Gather every tensor of the layer now; returns [future]."""
        start = time.perf_counter()
        for trip in future.trips:
            t = time.perf_counter()
            self.pipeline.gather(trip)
            future.times["comm"] += time.perf_counter() - t
        future.reduce = (start, time.perf_counter())
        return [future]

    @staticmethod
    def held():
        return []

    @staticmethod
    def copy_back(trip, stream):
        trip.reduced = [backend.cupy.asarray(row) for row in trip.reduced]

    def close(self):
        pass
