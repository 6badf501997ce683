"""Transports: how the ranks reduce one tensor's payload. Sums (flat, rsag, hierarchical, ring)
and a gather (the codecs that reduce on every rank themselves). The rule that picks one per codec
is ``comm.config.transport_name``.

Every sum transport sums a 1-D numpy wire buffer in place across the processes of its communicator
with a :class:`comm.ops.WireOp`. The buffer length must be a multiple of ``wire.unit * P``
(``comm.ops.padded_length``). Every rank ends with bit-identical results: in the explicit
schedules each element is summed on exactly one rank, in ascending rank order, and then copied
to the others (allgather), so no rank ever adds the same numbers in another order.

``stages`` says how many addends the sum has before and after the optional ``between(piece)``
callback, which the hierarchical sum runs on each intra-node partial sum before the inter-node
sum: the fp8 codec divides by the number of nodes there. Single-stage algorithms
report ``(P, 1)`` and never call it.

The gather transport hands every rank all P payloads in rank order (their lengths may differ),
so codecs that reduce decoded values themselves get bit-identical sums on every rank whatever
the MPI library's reduction order.

Every collective goes through ``comm.collective.collective`` with a ``waiter``: a
``comm.watchdog.Watchdog`` in training (nonblocking calls completed with a deadline) or
``BLOCKING`` (the plain blocking calls: the benchmark's path).

Node-shared buffers: ``reserve(nbytes)`` (collective, once, before any sum) lets rsag and the
hierarchical sum map one shared file per node (comm.shm); wire buffers taken from
``host_buffer(length, dtype)`` then live in it, and their intra-node stages read the other
processes' blocks in place and copy finished blocks straight out of their owners' segments,
with barriers instead of messages; same additions, same order, same bytes. Buffers from
anywhere else, nodes without usable shared memory, and ``CAFFE8_SHM=0`` take the message path.

Registry: ``create_transport(name, comm, processes_per_node=0, waiter=BLOCKING)``; names in
``TRANSPORTS``, each with ``reduction`` "sum" or "gather".
"""
import os
from types import SimpleNamespace

import numpy

from caffe8.comm.collective import BLOCKING, collective, in_place
from caffe8.comm.mpi import mpi_module, node_comms
from caffe8.comm.shm import SharedArena
from caffe8.engine import backend
from caffe8.engine.registry import registrar

TRANSPORTS = {}
SHM_ENV = "CAFFE8_SHM"      # "0": no node-shared buffers, every stage by messages
SHARED_MIN_BYTES = 16384    # smaller buffers in the arena still take the message schedule


register_transport = registrar(TRANSPORTS, "transport", "name")


def create_transport(name, comm, processes_per_node=0, waiter=BLOCKING):
    """Instantiate the transport ``name`` on ``comm`` (an mpi4py intracommunicator)."""
    if name not in TRANSPORTS:
        raise ValueError(f"Unrecognized transport: {name!r}, valid: "
                         + ", ".join(sorted(TRANSPORTS)))
    return TRANSPORTS[name](comm, processes_per_node, waiter)


class _Scratch:
    """A reusable receive buffer: fresh 64 MB allocations cost page faults on every call."""

    def __init__(self):
        self._buf = numpy.empty(0, numpy.uint8)

    def get(self, n, dtype):
        nbytes = n * numpy.dtype(dtype).itemsize
        if self._buf.size < nbytes:
            self._buf = numpy.empty(nbytes, numpy.uint8)
        return self._buf[:nbytes].view(dtype)


def reduce_scatter_ordered(comm, buf, wire, scratch, waiter=BLOCKING):
    """Reduce-scatter in place: block ``rank`` of ``buf`` becomes the sum of every rank's block.

    ``buf`` is split into n equal blocks. One Alltoallv (no self block: nothing is copied
    locally) hands rank r the r-th block of every other rank; rank r then adds the n blocks
    itself in ascending source rank, ((x0 + x1) + x2) + ..., so the order is fixed and known
    (the tests' NumPy simulation repeats it) rather than whatever MPICH's reduce-scatter picks.
    The chain ends in ``buf``'s own block: once the running sum reaches the term x_r it is
    added *into* that block (dst = src + dst is exact-commutative), and later terms follow it.
    Returns that block (a view of ``buf``).
    """
    n, r = comm.Get_size(), comm.Get_rank()
    blocks = buf.reshape(n, -1)
    if n == 1:
        return blocks[0]
    size = blocks.shape[1]
    items = wire.items(size)
    recv = scratch.get((n - 1) * size, wire.dtype).reshape(n - 1, size)
    counts = [items] * n
    counts[r] = 0
    sdispls = [j * items for j in range(n)]
    rdispls = [(j - (j > r)) * items for j in range(n)]   # peer j -> row j (j < r) or j-1
    rdispls[r] = 0
    collective(waiter, "Alltoallv", comm, [buf, (counts, sdispls), wire.datatype],
               [recv, (counts, rdispls), wire.datatype])
    terms = [recv[j - (j > r)] if j != r else blocks[r] for j in range(n)]
    return _ordered_chain(terms, r, wire, start=None)


def _ordered_chain(terms, r, wire, start):
    """((x0 + x1) + x2) + ... of the blocks ``terms`` (rank order; ``terms[r]`` is the own block)
    ending in the own block, which is returned: the one summation order of every explicit
    schedule. The running sum begins in ``terms[0]`` itself (a receive buffer), or in ``start``
    (a scratch block) when ``terms[0]`` is another rank's memory and must only be read; once it
    reaches x_r it is added *into* the own block (dst = src + dst is exact-commutative), and
    later terms follow it there."""
    own = terms[r]
    acc = own if r == 0 else terms[0]
    if start is not None and r >= 2:
        start[...] = terms[0]
        acc = start
    for j in range(1, len(terms)):
        if j == r:
            wire.local_sum(acc, own)
            acc = own
        else:
            wire.local_sum(terms[j], acc)
    return own


def ordered_sum(terms, local_sum):
    """((x0 + x1) + x2) + ... of the blocks ``terms`` (rank order, all held by the caller) into
    ``terms[0]``, which is returned: the summation order of every explicit schedule
    (:func:`_ordered_chain` as rank 0 runs it), for a transport that hands one process every
    block, such as caffe8.ddp's all-to-all. ``local_sum(src, dst)``: dst <- src + dst, in place
    (``comm.ops.local_sum``)."""
    return _ordered_chain(list(terms), 0, SimpleNamespace(local_sum=local_sum), start=None)


def allgather_in_place(comm, buf, wire, waiter=BLOCKING):
    """Every rank's block ``rank`` of ``buf`` copied to all ranks (MPI_IN_PLACE allgather)."""
    n = comm.Get_size()
    if n == 1:
        return
    items = wire.items(buf.size) // n
    collective(waiter, "Allgather", comm, in_place(), [buf, items, wire.datatype])


def reduce_scatter_shared(comm, arena, buf, wire, scratch, waiter=BLOCKING):
    """:func:`reduce_scatter_ordered` on a buffer in ``arena`` (``comm``'s node-shared memory):
    the same chain of additions in ascending rank, reading the other ranks' blocks where they
    lie; the running sum never lives in another rank's memory. Returns the own block."""
    n, r = comm.Get_size(), comm.Get_rank()
    if n == 1:
        return buf
    terms = [(buf if j == r else arena.peer(j, buf)).reshape(n, -1)[r] for j in range(n)]
    arena.barrier(comm, waiter)                 # every rank's payload is in place
    # x0 + x1 must not be written into rank 0's block: the sum starts in a scratch block
    return _ordered_chain(terms, r, wire, start=scratch.get(terms[r].size, terms[r].dtype))


def allgather_shared(comm, arena, buf, waiter=BLOCKING):
    """:func:`allgather_in_place` on a buffer in ``arena``: copy every other rank's finished
    block out of its segment. Barriers before (the blocks are final) and after (no rank writes
    its buffer again, e.g. the next iteration's encoding, while another still copies from it)."""
    n, r = comm.Get_size(), comm.Get_rank()
    if n == 1:
        return
    mine = buf.reshape(n, -1)
    arena.barrier(comm, waiter)
    for j in range(n):
        if j != r:
            mine[j][...] = arena.peer(j, buf).reshape(n, -1)[j]
    arena.barrier(comm, waiter)


def _shared_arena(comm, nbytes):
    """(arena or None, why not) for ``comm`` when all its processes share memory."""
    if comm is None or comm.Get_size() == 1:
        return None, "one process"
    MPI = mpi_module()
    node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
    together = node.Get_size() == comm.Get_size()
    node.Free()
    if not comm.allreduce(int(together), op=MPI.MIN):
        return None, "its processes are on different nodes"
    return SharedArena.create(comm, nbytes)


class Transport:
    """Base of the transports. A sum transport (``reduction`` "sum") defines
    ``sum(buf, wire, between=None)`` (in place, returns ``buf``); the gather transport
    (``reduction`` "gather") defines ``gather(payload, varying)``."""
    name = None
    reduction = "sum"

    def __init__(self, comm, processes_per_node=0, waiter=BLOCKING):
        self.comm, self.waiter = comm, waiter
        self.size = comm.Get_size() if comm is not None else 1      # None: one process
        self.rank = comm.Get_rank() if comm is not None else 0

    @property
    def stages(self):
        """(addends before ``between``, addends after): their product is P."""
        return (self.size, 1)

    @property
    def parts(self):
        """Buffer lengths must be multiples of ``wire.unit * parts``."""
        return self.size

    #: the node-shared wire memory (reserve), and why there is none
    arena, shared_reason = None, "not reserved"

    def _stage_comm(self):
        """The communicator whose processes could share buffers (None: this algorithm can't)."""
        return None

    def reserve(self, nbytes):
        """Collective: set aside ``nbytes`` of node-shared wire memory per process for the
        buffers of ``host_buffer`` (where the algorithm has a shared-memory stage and the
        node allows it). Returns the arena or None."""
        if self._stage_comm() is None:
            self.shared_reason = f"the {self.name} schedule has no shared-memory stage"
            return None
        if os.environ.get(SHM_ENV, "1").strip().lower() in ("0", "false", "no", "off"):
            self.shared_reason = f"{SHM_ENV}={os.environ[SHM_ENV]}"
            return None
        self.close_arena()
        self.arena, self.shared_reason = _shared_arena(self._stage_comm(), nbytes)
        return self.arena

    def host_buffer(self, length, dtype, shared=True):
        """A zeroed wire buffer: from the node-shared arena while it has room (``shared``),
        else ``backend.host_buffer`` (pinned on a GPU). The same calls in the same order on
        every process give the same offsets, which the shared stages rely on."""
        out = self.arena.alloc(length, dtype) if shared and self.arena is not None else None
        return out if out is not None else backend.host_buffer(length, dtype)

    def _shared(self, buf):
        """Sum ``buf`` through shared memory? (Below a few pages the message schedule's fixed
        cost is as low, and the shared stages' Python steps cost more.)"""
        return self.arena is not None and buf.nbytes >= SHARED_MIN_BYTES and \
            self.arena.holds(buf)

    def close_arena(self):
        if self.arena is not None:
            self.arena.close()
            self.arena = None

    def free(self):
        """Release any communicators and shared memory the algorithm created."""
        self.close_arena()


@register_transport("flat")
class FlatAllreduce(Transport):
    """One MPI_Allreduce with the wire op (MPICH chooses the schedule; Oyama et al.'s ablation).

    For user-defined ops MPICH uses recursive doubling, applying the op to the whole vector at
    every step; every pairwise step is commutative-exact, so ranks still agree bit for bit.
    """

    def sum(self, buf, wire, between=None):
        if self.size > 1:
            collective(self.waiter, "Allreduce", self.comm, in_place(), wire.spec(buf),
                       wire.op)
        return buf


@register_transport("rsag")
class ReduceScatterAllgather(Transport):
    """Explicit reduce-scatter (Alltoallv + ordered local sum) then Allgather over all P ranks.

    Each rank adds only 1/P of the vector, P-1 times, instead of the whole vector log2(P) times.
    """

    def __init__(self, comm, processes_per_node=0, waiter=BLOCKING):
        super().__init__(comm, processes_per_node, waiter)
        self._scratch = _Scratch()

    def _stage_comm(self):
        return self.comm

    def sum(self, buf, wire, between=None):
        if self.size == 1:
            return buf
        if self._shared(buf):
            reduce_scatter_shared(self.comm, self.arena, buf, wire, self._scratch, self.waiter)
            allgather_shared(self.comm, self.arena, buf, self.waiter)
            return buf
        reduce_scatter_ordered(self.comm, buf, wire, self._scratch, self.waiter)
        allgather_in_place(self.comm, buf, wire, self.waiter)
        return buf


@register_transport("hierarchical")
class HierarchicalAllreduce(Transport):
    """Oyama et al.'s Algorithm 1, lines 16-23.

    1. intra-node reduce-scatter: local rank l owns piece l (1/P') and adds the P' pieces of
       its node in local-rank order;
    2. ``between(piece)`` (fp8: divide by the number of nodes);
    3. inter-node reduce-scatter of that piece among the ranks with local index l (node order),
       then inter-node allgather, so each element is summed once, on one rank;
    4. intra-node allgather.
    """

    def __init__(self, comm, processes_per_node=0, waiter=BLOCKING):
        super().__init__(comm, processes_per_node, waiter)
        self.intra = self.inter = None
        self.local_size, self.nodes = 1, 1
        if comm is not None:
            self.intra, self.inter = node_comms(comm, processes_per_node)
            self.local_size, self.nodes = self.intra.Get_size(), self.inter.Get_size()
        self._scratch = _Scratch()

    @property
    def stages(self):
        return (self.local_size, self.nodes)

    def _stage_comm(self):
        return self.intra

    def sum(self, buf, wire, between=None):
        if self.size == 1:
            return buf
        w = self.waiter
        shared = self._shared(buf)
        if shared:
            piece = reduce_scatter_shared(self.intra, self.arena, buf, wire, self._scratch, w)
        else:
            piece = reduce_scatter_ordered(self.intra, buf, wire, self._scratch, w)
        if self.nodes > 1:
            if between is not None:
                between(piece)
            reduce_scatter_ordered(self.inter, piece, wire, self._scratch, w)
            allgather_in_place(self.inter, piece, wire, w)
        if shared:
            allgather_shared(self.intra, self.arena, buf, w)
        else:
            allgather_in_place(self.intra, buf, wire, w)
        return buf

    def free(self):
        self.close_arena()
        for c in (self.intra, self.inter):
            if c is not None:
                c.Free()


@register_transport("ring")
class RingAllreduce(Transport):
    """The classic ring allreduce: P-1 scatter-reduce steps then P-1 allgather steps over Sendrecv.

    Chunk c starts at rank c and travels right, each rank adding its own chunk into what it
    received, so chunk c is summed in the order c, c+1, ..., c-1 (mod P) and ends on rank c-1,
    from where the allgather ring copies it to everyone. Works for any wire op.
    """

    def __init__(self, comm, processes_per_node=0, waiter=BLOCKING):
        super().__init__(comm, processes_per_node, waiter)
        self._scratch = _Scratch()

    def sum(self, buf, wire, between=None):
        p, r = self.size, self.rank
        if p == 1:
            return buf
        chunks = buf.reshape(p, -1)
        right, left = (r + 1) % p, (r - 1) % p
        recv = self._scratch.get(chunks.shape[1], wire.dtype)
        for s in range(p - 1):
            send_c, recv_c = (r - s) % p, (r - s - 1) % p
            self._sendrecv(chunks[send_c], recv, right, left, 17, wire)
            wire.local_sum(recv, chunks[recv_c])
        for s in range(p - 1):
            send_c, recv_c = (r + 1 - s) % p, (r - s) % p
            self._sendrecv(chunks[send_c], chunks[recv_c], right, left, 18, wire)
        return buf

    def _sendrecv(self, send, recv, dest, source, tag, wire):
        if self.waiter is BLOCKING:
            self.comm.Sendrecv(wire.spec(send), dest, tag, wire.spec(recv), source, tag)
        else:
            self.waiter.wait([self.comm.Isend(wire.spec(send), dest, tag),
                              self.comm.Irecv(wire.spec(recv), source, tag)])


@register_transport("gather")
class Gather(Transport):
    """Every rank's 1-D payload to every rank: ``gather(payload, varying)`` → list of P arrays in
    rank order (``varying``: lengths may differ, one more collective for the counts). No
    shared-memory stage: ``reserve`` gives None and ``host_buffer`` plain (pinned) memory."""
    reduction = "gather"
    stages = (1, 1)
    parts = 1

    def gather(self, payload, varying=False):
        payload = numpy.ascontiguousarray(payload).ravel()
        if self.size == 1:
            return [payload]
        if varying:
            counts = numpy.empty(self.size, numpy.int64)
            collective(self.waiter, "Allgather", self.comm,
                       numpy.array([payload.size], numpy.int64), counts)
        else:
            counts = numpy.full(self.size, payload.size, numpy.int64)
        displs = numpy.concatenate(([0], numpy.cumsum(counts)[:-1]))
        data = numpy.empty(int(counts.sum()), payload.dtype)
        collective(self.waiter, "Allgatherv", self.comm, payload,
                   [data, (counts.tolist(), displs.tolist())])
        return [data[d:d + c] for d, c in zip(displs, counts)]
