"""Where the trainer's exchange runs its steps: on the host or through a GPU, the exchange's
one fork on the device, chosen once, when the buckets are made (comm/exchange.py).

:class:`HostSide`
    host arrays: the wire buffer is the host buffer; no streams, no copies. Three stages, so
    that no host work holds up the link: an encode stage runs the local steps (a host encode
    on the compute thread would lengthen backward instead of overlapping it), the
    communication thread, an update stage decodes (then the pipelined update);
:class:`DeviceSide`
    CuPy arrays: the compute thread runs the local steps at launch, on the layer's own CUDA
    stream after an event recorded on the compute stream (kernel launches only, never a read
    of the device); each payload is copied asynchronously into pinned host memory (none for a
    bucket summed in the node's device arena), the communication thread waits for the copies,
    and a decode stage copies the sums back and decodes on the layer's stream, then records the
    event the compute stream waits for before the update.

Both give the stage table (``stages``), the layer's stream, timing marks (``mark``: CUDA
events on a GPU when the exchange is ``timed``, host clock readings on the CPU) and the
copies around the reduction (``copy_out``, ``wait_copies``, ``copy_back``).
"""
import time

from caffe8.comm.ipc import D2H, copy_async
from caffe8.engine import backend
from caffe8.engine.timing import Clock


class on_stream:
    """``with on_stream(stream):`` makes ``stream`` current on the GPU; nothing for None."""

    def __init__(self, stream):
        self.stream = stream

    def __enter__(self):
        if self.stream is not None:
            self.stream.__enter__()
        return self.stream

    def __exit__(self, *exc):
        if self.stream is not None:
            self.stream.__exit__(*exc)


def phase(future, name, start, end):
    """Record phase ``name`` of ``future`` between two marks (None: not timed)."""
    if start is not None and end is not None:
        future.marks.append((name, start, end))


class HostSide:
    """Host arrays (module docstring)."""
    gpu = False
    local_at_launch = False
    takes_update = True                 # an update stage to run the pipelined update in
    timed = True                        # host phases are always timed

    def __init__(self):
        self.clock = Clock(False)

    @staticmethod
    def stages(exchange, stage):
        return (stage("caffe8-encode", exchange.prepare),
                stage("caffe8-comm", exchange.transfer),
                stage("caffe8-update", exchange.settle_and_update))

    @staticmethod
    def zeros(length, dtype, host):
        """The device wire buffer: the host buffer itself."""
        return host

    def ready(self):
        pass

    def stream(self, layer):
        return None

    @staticmethod
    def encodes_early(trip, codec):
        """Encoded in the local steps: nothing to agree on first."""
        return trip.stat is None

    def mark(self, stream=None):
        return self.clock.mark()

    def copy_out(self, future, trips, reduction, encoded):
        """No copies: the payload's host memory is the payload (gather) or the span it was
        encoded into (sum)."""
        for trip in trips:
            trip.host = reduction.host_for(trip, self)

    @staticmethod
    def landing(trip):
        return trip.payload

    @staticmethod
    def wait_copies(future):
        return 0.0

    @staticmethod
    def copy_back(future):
        return future

    @staticmethod
    def wait_done(future):
        pass

    def close(self):
        pass


class DeviceSide:
    """CuPy arrays (module docstring). ``timed``: time the device phases with CUDA events too
    (a timing log records them); else only the three events each layer needs (after its
    backward, after its copies, after its decode)."""
    gpu = True
    local_at_launch = True
    takes_update = False                # the update is a few device kernels after the exchange

    def __init__(self, timed):
        self.clock = Clock(True)
        self.timed = timed
        self._streams = {}
        self._ready = None              # an event after the wire buffers' zero-fill
        self._pinned = {}               # gather codecs: pinned host copies of payloads, by key

    @staticmethod
    def stages(exchange, stage):
        return (stage("caffe8-comm", exchange.transfer), stage("caffe8-decode", exchange.settle))

    @staticmethod
    def zeros(length, dtype, host):
        return backend.cupy.zeros(length, dtype)

    def ready(self):
        """Every wire buffer is made: an event after their zero-fill, which every layer's stream
        waits for before its first step (a buffer made at a layer's first use on the compute
        stream was not ordered before that layer's encode on its own stream, so iteration 0
        could send partly zero gradients)."""
        self._ready = self.clock.mark(backend.cupy.cuda.get_current_stream())

    def stream(self, layer):
        """The layer's stream, which starts after the layer's backward (on the compute
        stream)."""
        stream = self._streams.get(layer)
        if stream is None:
            stream = self._streams[layer] = backend.cupy.cuda.Stream(non_blocking=True)
            stream.wait_event(self._ready)
        stream.wait_event(self.clock.mark(backend.cupy.cuda.get_current_stream()))
        return stream

    @staticmethod
    def encodes_early(trip, codec):
        """Encoded in the local steps: nothing to agree on first, and a payload whose size does
        not depend on the data (Strom's is a host read: its encode waits for the communication
        thread, so the compute thread never waits for the device)."""
        return trip.stat is None and not codec.varying

    def mark(self, stream=None):
        return self.clock.mark(stream) if self.timed else None

    def copy_out(self, future, trips, reduction, encoded):
        """One batch of copies of ``trips``' payloads into pinned host memory on the layer's
        stream (``reduction.host_for``; none for a tensor summed where it lies, the device
        arena), and an event after it (``future.copied``)."""
        copies = False
        for trip in trips:
            if trip.on_device:
                continue
            payload = trip.payload = backend.cupy.ascontiguousarray(trip.payload)
            trip.host = reduction.host_for(trip, self)
            copy_async(trip.host.ctypes.data, payload.data.ptr, payload.nbytes, D2H,
                       future.stream)
            copies = True
        future.copied.append(self.clock.mark(future.stream))
        if copies:                          # no copy, no D2H time (an event gap is none)
            phase(future, "d2h", encoded, future.copied[-1])

    def landing(self, trip):
        """A pinned buffer that fits the payload of ``trip`` (kept per tensor)."""
        key, payload = trip.tensor.key, trip.payload
        host = self._pinned.get(key)
        if host is None or host.size < payload.size or host.dtype != payload.dtype:
            host = self._pinned[key] = backend.host_buffer(max(payload.size, 1), payload.dtype)
        return host

    @staticmethod
    def wait_copies(future):
        """Wait for the layer's copies to the host; returns the seconds waited."""
        t = time.perf_counter()
        for event in future.copied:
            event.synchronize()
        return time.perf_counter() - t

    def copy_back(self, future):
        """Start each tensor's copy of its reduced bytes back to the device (on the layer's
        stream; none for a sum already in the device arena); returns ``future``."""
        with on_stream(future.stream):
            copies = any(not trip.on_device for trip in future.trips)
            future.h2d = self.mark(future.stream) if copies else None   # None: no H2D time
            for trip in future.trips:
                if not trip.on_device:
                    future.reduction.copy_back(trip, future.stream)
        return future

    @staticmethod
    def wait_done(future):
        """The compute stream waits for the layer's decode before the update."""
        backend.cupy.cuda.get_current_stream().wait_event(future.done_event)

    def close(self):
        self._pinned.clear()
