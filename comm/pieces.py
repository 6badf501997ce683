"""Buckets in pieces, on one thread: the schedule of a front door whose transport posts a level's
moves asynchronously (caffe8.ddp, over torch.distributed), around the steps of comm/pipeline.py.

Buckets are taken in the order they come (:meth:`Pieces.put`); each is cut into pieces of at
most ``piece_bytes`` wire bytes. A piece is encoded and its first level's moves posted
(``MovedLevel.post``) as soon as its bucket arrives; pieces are finished (the ordered sum's levels,
comm.levels.ordered_levels, with the codec's step between them for each tensor's part, then
the decode) oldest first, ``AHEAD`` behind the newest, and all of them whenever no bucket
waits: so one piece's encode and transfers overlap the others', and every communicator sees
its collectives in the same order on every rank (pieces start in order and finish in order).
A bucket's agreement on scales (one MAX over ranks for all its tensors due for a new one)
first finishes the pieces in flight: a rank waiting in it while another waits for this one's
later transfers of a pending piece would wait for each other forever.

A bucket, as the front door hands it over, is a :class:`Bucket` with ``side()`` (the device
side of its buffers: an arithmetic of comm/arithmetic.py, taken from the thread's first bucket,
whose ``on_thread()`` holds for the thread's life), ``tensors(side)`` ([(key, weight, grad,
codec name)], arrays of ``side``, made on the thread) and ``zeros(length, dtype)`` (a zeroed
wire buffer in the transport's type). :meth:`Pieces.close_all` ends every thread still running
(an exit handler's).
"""
import collections
import contextlib
import queue
import threading
import weakref

from caffe8.comm.levels import ordered_levels
from caffe8.comm.ops import padded_length
from caffe8.comm.pipeline import Pipeline, Trip

#: pieces whose first moves are posted while the oldest one is being finished
AHEAD = 2
#: the schedules whose thread runs
RUNNING = weakref.WeakSet()


class Bucket:
    """A bucket handed over (module docstring): ``key``, the same for the same bucket in every
    iteration; ``iteration``; ``event``, what ``side.wait`` waits for before the gradients are
    read; ``future`` (``set_result``, ``set_exception``, ``done``: concurrent.futures' or
    torch's), which gets ``result`` once every piece is decoded, or the error; ``pieces``: those
    not finished yet (:class:`Pieces` counts them)."""
    event = None
    pieces = 0

    def __init__(self, key, iteration, future, result):
        self.key, self.iteration, self.future, self.result = key, iteration, future, result

    def done(self):
        self.future.set_result(self.result)

    def fail(self, exc):
        if not self.future.done():
            self.future.set_exception(exc)


class Piece:
    """A span ``wire`` of one bucket's wire buffer (``codes``: the same as an array) on its way:
    its tensors' parts (``trips``, ``at`` their offsets in the piece), its first level's moves
    (``posted``)."""

    def __init__(self, bucket, pipeline, wire, codes, trips, posted):
        self.bucket, self.pipeline, self.wire, self.codes = bucket, pipeline, wire, codes
        self.trips, self.posted = trips, posted


class Pieces:
    """The schedule of the module docstring over ``transport`` (``levels``: comm.levels
    ``Level``s; ``maxima``, ``size``, ``stages``: the seam of comm.pipeline.Pipeline) for
    ``codecs`` ({name: codec}), on a thread named ``name`` started by the first bucket."""

    def __init__(self, transport, codecs, piece_bytes, name):
        self.transport, self.codecs = transport, codecs
        self.piece_bytes, self.name = piece_bytes, name
        self._queue = queue.Queue()
        self._thread = None
        self._failed = None
        self._wires = {}

    @property
    def running(self):
        return self._thread is not None

    def put(self, bucket):
        """Queue ``bucket`` (the thread starts with the first); with one process there is
        nothing to exchange: its gradients are the mean already."""
        if self.transport.size == 1:
            return bucket.done()
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, name=self.name, daemon=True)
            self._thread.start()
            RUNNING.add(self)
        self._queue.put(bucket)

    def close(self, timeout=None):
        """End the thread after the buckets already queued, waiting at most ``timeout`` seconds
        (None: until it ends). Returns True when no thread is left."""
        thread = self._thread
        if thread is not None:
            self._queue.put(None)
            thread.join(timeout)
            if thread.is_alive():
                return False
            self._thread = None
            RUNNING.discard(self)
        return True

    @staticmethod
    def close_all(timeout):
        """:meth:`close` every running schedule, waiting at most ``timeout`` seconds for each
        (a peer gone mid-exchange must not hang an exit)."""
        for pieces in list(RUNNING):
            pieces.close(timeout)

    def _serve(self):
        pending, side = collections.deque(), None
        with contextlib.ExitStack() as scope:
            while True:
                while pending and self._queue.empty():
                    self._finish(pending)
                bucket = self._queue.get()
                if bucket is None:
                    self._drain(pending)
                    return
                if self._failed is not None:
                    bucket.fail(RuntimeError(f"an earlier bucket's exchange failed: "
                                             f"{self._failed}"))
                    continue
                try:
                    if side is None:
                        side = bucket.side()
                        scope.enter_context(side.on_thread())
                        pipelines = {name: Pipeline(codec, self.transport, side)
                                     for name, codec in self.codecs.items()}
                    side.wait(bucket.event)
                    for piece in self._start(bucket, pipelines, side, pending):
                        pending.append(piece)
                        while len(pending) > AHEAD:
                            self._finish(pending)
                except BaseException as exc:    # surfaces where the bucket's future is waited
                    self._fail(exc, bucket, pending)

    def _start(self, bucket, pipelines, side, pending):
        """Encode ``bucket`` piece by piece, posting each piece's first moves; yields the pieces
        in order, each as soon as it is on its way. The agreement comes first, after the
        ``pending`` pieces are finished (module docstring)."""
        plan, given = [], bucket.tensors(side)
        for name, pipeline in pipelines.items():
            tensors, at = [], 0                # side by side in the codec's wire buffer
            for key, weight, grad, codec in given:
                if codec == name:
                    tensors.append((key, weight, grad, at))
                    at += grad.size
            if not tensors:
                continue
            wire = self._wire(bucket, name, at)
            whole = [Trip(grad, pipeline.tensor(key, weight, bucket.iteration))
                     for key, weight, grad, _ in tensors]
            pipeline.stat(whole)
            if any(trip.stat is not None for trip in whole):
                self._drain(pending)
            pipeline.agree(whole)
            plan.append((pipeline, wire, tensors, self._piece_length(pipeline.codec.wire)))
        bucket.pieces = sum(-(-len(wire) // step) for _, wire, _, step in plan)
        for pipeline, wire, tensors, step in plan:
            codes = side.array(wire)
            for a in range(0, len(wire), step):
                trips = []
                for key, weight, grad, at in tensors:
                    lo, hi = max(a, at), min(a + step, at + grad.size)
                    if lo < hi:
                        t = pipeline.tensor(key, weight[lo - at:hi - at], bucket.iteration,
                                            codes[lo:hi])
                        trips.append(Trip(grad[lo - at:hi - at], t, lo - a))
                pipeline.encode(trips)
                yield Piece(bucket, pipeline, wire[a:a + step], codes[a:a + step], trips,
                            self.transport.levels[0].post(wire[a:a + step],
                                                          pipeline.codec.wire))

    def _wire(self, bucket, name, n):
        """``bucket``'s zero-padded wire buffer of codec ``name`` for ``n`` elements, kept from
        one iteration to the next (each encode writes only its tensors' spans; the padding stays
        zero)."""
        wire = self.codecs[name].wire
        length = padded_length(n, wire.unit, self.transport.size)
        buf = self._wires.get((bucket.key, name))
        if buf is None or len(buf) != length:
            buf = self._wires[(bucket.key, name)] = bucket.zeros(length, wire.dtype)
        return buf

    def _piece_length(self, wire):
        """Wire elements per piece: ``piece_bytes`` rounded down to whole items per process."""
        unit = wire.unit * self.transport.size
        return max(unit, self.piece_bytes // wire.dtype.itemsize // unit * unit)

    def _finish(self, pending):
        """The oldest piece: the rest of its sum, then the decode into its bucket."""
        piece = pending.popleft()
        try:
            pipeline = piece.pipeline
            ordered_levels(self.transport.levels, piece.wire, pipeline.codec.wire,
                           pipeline.between(piece.codes, piece.trips), None, pipeline.arith,
                           piece.posted)
            for trip in piece.trips:
                trip.reduced = trip.tensor.out
            pipeline.decode(piece.trips)
            piece.bucket.pieces -= 1
            if piece.bucket.pieces == 0:
                piece.bucket.done()
        except BaseException as exc:
            self._fail(exc, piece.bucket, pending)

    def _drain(self, pending):
        while pending:
            self._finish(pending)

    def _fail(self, exc, bucket, pending):
        """Fail ``bucket`` and every bucket with a piece in flight; later buckets fail at once
        (no more collectives from this rank)."""
        self._failed = f"{type(exc).__name__}: {exc}"
        for b in {id(p.bucket): p.bucket for p in pending}.values():
            b.fail(exc)
        pending.clear()
        bucket.fail(exc)
