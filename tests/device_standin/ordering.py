"""Streams, events and the order they give: the stand-in's record of who wrote and who read every
byte, and the check that fails on an access no ordering guarantees.

Every operation runs at once on the host (eager), and is also placed in CUDA's order: the
``seq``-th operation of its stream, with a vector clock (``vc``: for each stream of this
process, the last operation known to come before it) made of its stream's earlier work, the
events the stream waited for (``wait_event``), what the host knew to be complete when it
launched it (:data:`HOST`, raised by ``synchronize``), and the legacy default stream's implicit
synchronisation with blocking streams (CuPy's ``Stream.null``; ``non_blocking`` streams take
none). Another process's operation is ordered before this one when its process had waited for it
on the host before this one was launched (its row of a shared segment's ``done`` table): the
arena's barrier, a host synchronisation then an MPI barrier, in real time.

Each region of memory keeps a :class:`Log` of the accesses still in flight (not yet known to be
complete by their process's host). A read must come after every overlapping write in the log, a
write after every overlapping access; otherwise :class:`UnorderedAccess` names both operations,
their streams and processes. A write into host memory (a D2H copy into pinned memory) lands only
when the host learns it is complete, and the bytes read 0xFF until then: a host that reads too
early sees garbage, as it may on a GPU.

Limits of the model: the threads of one process share one host (a synchronisation on one thread
orders every later launch, on any thread, in real time); another process's host knowledge
counts from the moment it is published, standing in for the MPI barrier that must follow it.
"""
import contextlib
import fcntl
import os
import threading
import time
import zlib

import numpy

LOCK = threading.RLock()
MAX_STREAMS = 1024
READ, WRITE = 1, 2
#: a log record: kind, lo, hi (byte offsets in the region), slot (process), stream, seq, op
FIELDS = 7

#: for each stream index of this process, the last operation the host knows to be complete
HOST = numpy.zeros(MAX_STREAMS, numpy.int64)
STREAMS = []                # by index
_BY_PTR = {}
_PENDING = []               # host-memory writes not landed: (region, lo, data, stream, seq)
_SHARED = set()             # logs in shared segments this process has mapped: publish HOST there
_OPS = {}                   # op code (crc32 of its name, the same in every process) -> name
_local = threading.local()


class UnorderedAccess(AssertionError):
    """An access that no stream order, event wait or host synchronisation puts after a
    conflicting access to the same bytes."""


def op_code(name):
    code = zlib.crc32(name.encode())
    _OPS.setdefault(code, name)
    return code


class Log:
    """The accesses to one region still in flight. ``table`` (capacity x FIELDS int64) and
    ``count`` live in process memory, or in a shared segment's header (then ``fd`` is locked
    around every use, and ``done``/``pids`` are the segment's tables of every process mapping
    it); ``slot`` is this process's row of ``done``."""

    def __init__(self, table, count, done, pids, slot, fd=None):
        self.table, self.count, self.done, self.pids, self.slot, self.fd = \
            table, count, done, pids, slot, fd

    @classmethod
    def private(cls):
        return cls(numpy.zeros((16, FIELDS), numpy.int64), numpy.zeros(1, numpy.int64),
                   HOST.reshape(1, -1), numpy.array([os.getpid()]), 0)

    @contextlib.contextmanager
    def _locked(self):
        if self.fd is None:
            yield
            return
        fcntl.lockf(self.fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.lockf(self.fd, fcntl.LOCK_UN)

    def publish(self):
        """This process's host knowledge into the shared ``done`` table."""
        with self._locked():
            numpy.maximum(self.done[self.slot], HOST, out=self.done[self.slot])

    def _live(self):
        return self.table[:int(self.count[0])]

    def _complete(self, recs):
        return self.done[recs[:, 3], recs[:, 4]] >= recs[:, 5]

    def check(self, kind, lo, hi, op, region):
        """Raise UnorderedAccess unless the access ``kind`` of [lo, hi) by ``op`` comes after
        every conflicting access in flight."""
        with self._locked():
            recs = self._live()
            sel = (recs[:, 1] < hi) & (recs[:, 2] > lo)
            if kind == READ:
                sel &= recs[:, 0] == WRITE
            if not sel.any():
                return
            cand = recs[sel]
            mine = cand[:, 3] == self.slot
            ordered = self._complete(cand) | (mine & (cand[:, 4] == op.stream.index)) | \
                (mine & (op.vc[cand[:, 4]] >= cand[:, 5]))
            if not ordered.all():
                raise UnorderedAccess(self._describe(cand[~ordered][0], kind, lo, hi, op,
                                                     region))

    def _describe(self, rec, kind, lo, hi, op, region):
        verb = {READ: "reads", WRITE: "writes"}
        process = "this process" if rec[3] == self.slot else f"process {self.pids[rec[3]]}"
        return (f"stand-in device: {op.name!r} (operation {op.seq} on stream "
                f"{op.stream.index} of process {os.getpid()}) {verb[kind]} bytes [{lo}, {hi}) "
                f"of {region.label}, which {_OPS.get(int(rec[6]), 'an operation')!r} "
                f"(operation {rec[5]} on stream {rec[4]} of {process}) "
                f"{verb[int(rec[0])]} ([{rec[1]}, {rec[2]})), with nothing ordering the two: "
                f"no stream order, no event waited for, no host synchronisation after it")

    def add(self, kind, lo, hi, op):
        """Record the access; a write drops the records it covers (all ordered before it)."""
        with self._locked():
            recs = self._live()
            keep = ~self._complete(recs)
            if kind == WRITE:
                keep &= ~((recs[:, 1] >= lo) & (recs[:, 2] <= hi))
            kept = recs[keep]
            n = len(kept)
            if n + 1 > len(self.table):
                if self.fd is not None:
                    raise RuntimeError(f"stand-in device: the access log of a shared segment "
                                       f"is full ({len(self.table)} accesses in flight)")
                self.table = numpy.zeros((2 * len(self.table), FIELDS), numpy.int64)
            self.table[:n] = kept
            self.table[n] = (kind, lo, hi, self.slot, op.stream.index, op.seq, op.code)
            self.count[0] = n + 1

    def in_flight(self, slot):
        """Records of process ``slot`` not yet complete."""
        with self._locked():
            recs = self._live()
            return recs[(recs[:, 3] == slot) & ~self._complete(recs)]

    def forget(self, slot):
        with self._locked():
            recs = self._live()
            kept = recs[recs[:, 3] != slot]
            self.table[:len(kept)] = kept
            self.count[0] = len(kept)


# --- the host -------------------------------------------------------------------------------
def merge_host(vc):
    """The host now knows every operation of ``vc`` complete: raise :data:`HOST`, land the
    host-memory writes that covers, and publish it to the shared segments."""
    with LOCK:
        numpy.maximum(HOST, vc, out=HOST)
        land(lambda stream, seq: HOST[stream] >= seq)
        for log in list(_SHARED):
            log.publish()


def land(ordered, region=None, lo=0, hi=None):
    """Write the pending host-memory writes that ``ordered(stream, seq)`` puts in the past (of
    ``region`` [lo, hi) only, when given)."""
    with LOCK:
        keep = []
        for item in _PENDING:
            r, at, data, stream, seq = item
            inside = region is None or (r is region and at < hi and at + len(data) > lo)
            if inside and ordered(stream, seq):
                r.write(at, data)
            else:
                keep.append(item)
        _PENDING[:] = keep


def defer_write(region, lo, data, op):
    """A write of ``data`` into host memory by ``op``: the bytes read 0xFF until it lands."""
    with LOCK:
        region.write(lo, b"\xff" * len(data))
        _PENDING.append((region, lo, data, op.stream.index, op.seq))


# --- streams and events ---------------------------------------------------------------------
class Stream:
    """A CUDA stream (CuPy's ``cupy.cuda.Stream``); ``Stream.null`` is the legacy default."""
    null = None

    def __init__(self, null=False, non_blocking=False, ptr=None, priority=None):
        from tests.device_standin import devices
        with LOCK:
            if len(STREAMS) >= MAX_STREAMS:
                raise RuntimeError(f"stand-in device: more than {MAX_STREAMS} streams")
            self.index = len(STREAMS)
            STREAMS.append(self)
            self.non_blocking = bool(non_blocking)
            self.seq = 0
            self.vc = numpy.zeros(MAX_STREAMS, numpy.int64)
            self.ptr = 0 if null else (ptr if ptr is not None else 0x5000 + self.index)
            self.device_id = devices.current()
            _BY_PTR[self.ptr] = self

    @staticmethod
    def from_ptr(ptr):
        stream = _BY_PTR.get(int(ptr))
        if stream is None:
            from tests.device_standin.runtime import CUDARuntimeError, INVALID_HANDLE
            raise CUDARuntimeError(INVALID_HANDLE, f"no stream {ptr:#x}")
        return stream

    def position(self):
        """The vector clock of everything launched on this stream so far."""
        p = self.vc.copy()
        p[self.index] = self.seq
        return p

    def launch(self):
        """(seq, vc) of a new operation on this stream."""
        with LOCK:
            vc = numpy.maximum(self.vc, HOST)
            if self is Stream.null:
                for s in STREAMS:
                    if s is not self and not s.non_blocking:
                        vc = numpy.maximum(vc, s.position())
            elif not self.non_blocking:
                vc = numpy.maximum(vc, Stream.null.position())
            self.seq += 1
            self.vc = vc
            return self.seq, vc.copy()

    def synchronize(self):
        merge_host(self.position())

    def wait_event(self, event):
        with LOCK:
            if event.vc is not None:
                self.vc = numpy.maximum(self.vc, event.vc)

    def record(self, event=None):
        event = Event() if event is None else event
        event.record(self)
        return event

    @property
    def done(self):
        self.synchronize()
        return True

    def use(self):
        _local.base = self
        return self

    def __enter__(self):
        _stack().append(self)
        return self

    def __exit__(self, *exc):
        _stack().pop()

    def __repr__(self):
        return f"<stand-in Stream {self.index} ptr={self.ptr:#x}>"


Stream.null = Stream(null=True)


class ExternalStream(Stream):
    """A stream made elsewhere, named by its pointer: the stand-in's own stream of that
    pointer (made on first sight)."""

    def __new__(cls, ptr, device_id=None):
        return _BY_PTR.get(int(ptr)) or Stream(ptr=int(ptr))


def _stack():
    if not hasattr(_local, "stack"):
        _local.stack = []
    return _local.stack


def current_stream():
    stack = _stack()
    return stack[-1] if stack else getattr(_local, "base", Stream.null)


class Event:
    """A CUDA event: the position of its stream when recorded, and the host time then."""

    def __init__(self, block=False, disable_timing=False, interprocess=False):
        self.vc, self.time = None, None

    def record(self, stream=None):
        stream = current_stream() if stream is None else stream
        with LOCK:
            self.vc = stream.position()
            self.time = time.perf_counter()

    def synchronize(self):
        if self.vc is not None:
            merge_host(self.vc)

    def query(self):
        self.synchronize()
        return True

    @property
    def done(self):
        return self.query()


def elapsed_ms(start, end):
    """cudaEventElapsedTime: both events recorded and known complete, else 'not ready'."""
    from tests.device_standin.runtime import CUDARuntimeError, NOT_READY, INVALID_HANDLE
    if start.vc is None or end.vc is None:
        raise CUDARuntimeError(INVALID_HANDLE, "an event was never recorded")
    if not ((HOST >= start.vc).all() and (HOST >= end.vc).all()):
        raise CUDARuntimeError(NOT_READY, "an event is not known to be complete")
    return (end.time - start.time) * 1000.0


class Op:
    """One operation launched on ``stream`` (default: the current one): its place in the
    order, checked against every region it reads or writes, and recorded there."""

    def __init__(self, name, stream=None):
        self.name, self.code = name, op_code(name)
        self.stream = current_stream() if stream is None else stream
        self.seq, self.vc = self.stream.launch()

    def access(self, reads=(), writes=()):
        """``reads``/``writes``: (region, lo, hi) spans; checked, then recorded."""
        with LOCK:
            for region, lo, hi in reads:
                region.log.check(READ, lo, hi, self, region)
            for region, lo, hi in writes:
                region.log.check(WRITE, lo, hi, self, region)
            for region, lo, hi in reads:
                region.log.add(READ, lo, hi, self)
                if region.host:             # what this copy reads must have landed first
                    land(self.ordered, region, lo, hi)
            for region, lo, hi in writes:
                region.log.add(WRITE, lo, hi, self)
        return self

    def ordered(self, stream, seq):
        return stream == self.stream.index or self.vc[stream] >= seq
