"""The one pipeline of a bucket: the steps every gradient goes through, whichever front door
drives them (comm/exchange.py's solver callback over MPI, caffe8/ddp.py's PyTorch DDP hook over
torch.distributed)::

    stat -> agree (MAX over ranks) -> encode -> sum in levels, between-stages step per tensor
    (or gather) -> decode

A :class:`Pipeline` is one codec's steps over one transport (the seam: MPI transports of
comm/allreduce.py, or caffe8.ddp's) with the arithmetic of where the wire buffers lie
(comm/arithmetic.py). Each tensor, or a tensor's part of a bucket piece (caffe8.ddp's pieces),
is a :class:`Trip` that carries its gradient from step to step; a step takes a list of trips.
The codec is called only here (its protocol: comm/codecs.py).
"""
import time
from dataclasses import dataclass

from caffe8.comm.arithmetic import HOST
from caffe8.comm.codecs import Tensor


@dataclass(eq=False, slots=True)
class Trip:
    """One tensor's (or a part's) way through the pipeline in one iteration; each step fills its
    own fields.

    Made by a front door: ``grad`` (every step reads it, the decode writes the mean into it),
    ``tensor`` (what the codec sees, its output buffer ``out`` included), ``at`` (sum codecs:
    its offset in its bucket's wire buffer), ``sl`` (the trainer: its slice of the net's flat
    buffers), ``host`` and ``wire`` (the trainer's sum codecs: its spans of the bucket's host
    and device wire buffers; one array on the CPU; no host span where the bucket is summed on
    the GPUs: ``on_device``). The statistic: ``stat`` (None: nothing to agree on). The encode:
    ``payload`` and ``ctx`` (gather codecs: ``host``, the payload's host copy). The reduction:
    ``reduced`` (the sum or the gathered rows), cleared by the decode.
    """
    grad: object
    tensor: Tensor
    at: int = 0
    sl: slice = None
    host: object = None
    wire: object = None
    on_device: bool = False
    stat: object = None
    payload: object = None
    ctx: object = None
    reduced: object = None


class BetweenStages:
    """The codec's step between the levels of a sum over the wire buffer ``buffer`` (an array of
    ``arith``), tensor by tensor: the transport hands it a block ``piece`` of ``buffer`` (a
    level's partial sum), and each tensor's part of the block is transformed with that tensor's
    own codec context (fp8: the number of nodes it divides by)."""

    def __init__(self, codec, buffer, trips, arith=HOST):
        self.codec, self.arith = codec, arith
        self.base = arith.address(buffer)
        self.spans = [(t.at, t.at + t.grad.size, t.ctx) for t in trips]

    def __call__(self, piece):
        lo = (self.arith.address(piece) - self.base) // piece.itemsize
        hi = lo + piece.size
        host = self.arith.on_host(piece)
        for start, stop, ctx in self.spans:
            a, b = max(start, lo), min(stop, hi)
            if a < b:
                self.codec.between_stages(host[a - lo:b - lo], ctx)
        self.arith.back(piece, host)


class Pipeline:
    """``codec``'s steps over ``transport`` (its ``maxima``, ``sum``/``gather``, ``stages``),
    on wire buffers of ``arith`` (comm/arithmetic.py), for lists of :class:`Trip`."""

    def __init__(self, codec, transport, arith=HOST):
        self.codec, self.transport, self.arith = codec, transport, arith

    def tensor(self, key, weight, iteration, out=None):
        """What the codec sees of the tensor ``key`` (its weights ``weight``)."""
        return Tensor(key, weight, iteration, self.transport.size, self.transport.stages, out)

    def stat(self, trips):
        """The codec's statistic of each trip, left on its device (``trip.stat``; None: nothing
        to agree on this iteration); returns the seconds of those that had one."""
        seconds = 0.0
        for trip in trips:
            t = time.perf_counter()
            trip.stat = self.codec.device_stat(trip.grad, trip.tensor)
            if trip.stat is not None:
                seconds += time.perf_counter() - t
        return seconds

    def agree(self, trips):
        """The MAX over ranks of the statistics of ``trips`` (one read of each, one collective
        for all), handed to the codec; returns the seconds it took (0: nothing to agree on)."""
        due = [trip for trip in trips if trip.stat is not None]
        if not due:
            return 0.0
        t = time.perf_counter()
        values = self.transport.maxima([self.codec.host_stat(trip.stat) for trip in due])
        for trip, value in zip(due, values):
            self.codec.agree(trip.tensor, value)
        return time.perf_counter() - t

    def encode(self, trips):
        """Each trip's payload (sum codecs: into ``trip.tensor.out``) and context."""
        for trip in trips:
            trip.payload, trip.ctx = self.codec.encode(trip.grad, trip.tensor)

    def between(self, buffer, trips):
        """The between-stages step over ``buffer`` for ``trips`` (their ``at`` in it), or None
        for a codec without one."""
        if self.codec.between_stages is None:
            return None
        return BetweenStages(self.codec, buffer, trips, self.arith)

    def sum(self, buf, trips, host):
        """The transport's sum of the wire buffer ``buf`` holding ``trips``, with the step
        between its levels on ``host``: the buffer's host memory (``buf`` itself, or a device
        buffer's pinned mirror, through which the node's piece crosses nodes; None: a device
        buffer summed on one node's GPUs, where no step between nodes runs)."""
        between = None if host is None else self.between(host, trips)
        return self.transport.sum(buf, self.codec.wire, between, host=host)

    def gather(self, trip):
        """Every rank's payload of ``trip`` (its host copy ``trip.host``), in rank order."""
        trip.reduced = self.transport.gather(trip.host[:trip.payload.size], self.codec.varying)

    def decode(self, trips):
        """The mean over the ranks into each trip's gradient, from ``trip.reduced``."""
        for trip in trips:
            self.codec.decode(trip.reduced, trip.ctx, trip.grad)
            trip.reduced = None
