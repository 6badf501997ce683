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
On GPUs ``reserve(nbytes, device=True)`` shares device memory instead (comm.ipc, CUDA IPC):
buffers from ``device_buffer`` are summed by the same functions on the GPUs, with the device's
own kernels for the same arithmetic, and only the node's piece goes to host memory for the
inter-node stage (``sum(buf, wire, between, host=mirror)``); ``CAFFE8_IPC=0`` keeps host memory.

Registry: ``create_transport(name, comm, processes_per_node=0, waiter=BLOCKING)``; names in
``TRANSPORTS``, each with ``reduction`` "sum" or "gather".
"""
import os
import numpy

from caffe8.comm.collective import BLOCKING, Scratch, collective, in_place
from caffe8.comm.ipc import DeviceArena
from caffe8.comm.mpi import mpi_module, node_comms
from caffe8.comm.shm import SharedArena
from caffe8.engine import backend
from caffe8.engine.registry import registrar

TRANSPORTS = {}
SHM_ENV = "CAFFE8_SHM"      # "0": no node-shared buffers, every stage by messages
IPC_ENV = "CAFFE8_IPC"      # "0": GPU wire buffers staged through host memory, as without IPC
SHARED_MIN_BYTES = 16384    # smaller buffers in the arena still take the message schedule


register_transport = registrar(TRANSPORTS, "transport", "name")


def _off(env):
    return os.environ.get(env, "1").strip().lower() in ("0", "false", "no", "off")


def create_transport(name, comm, processes_per_node=0, waiter=BLOCKING):
    """Instantiate the transport ``name`` on ``comm`` (an mpi4py intracommunicator)."""
    if name not in TRANSPORTS:
        raise ValueError(f"Unrecognized transport: {name!r}, valid: "
                         + ", ".join(sorted(TRANSPORTS)))
    return TRANSPORTS[name](comm, processes_per_node, waiter)


#: blocks of at least this many bytes go to their peers one peer at a time (``_pairwise``)
PAIRWISE_MIN_BYTES = 1 << 16
_PAIRWISE_TAG = 0x0C8A


def reduce_scatter_ordered(comm, buf, wire, scratch, waiter=BLOCKING):
    """Reduce-scatter in place: block ``rank`` of ``buf`` becomes the sum of every rank's block.

    ``buf`` is split into n equal blocks. Rank r receives the r-th block of every other rank
    (no self block: nothing is copied locally) and then adds the n blocks itself in ascending
    source rank, ((x0 + x1) + x2) + ..., so the order is fixed and known (the tests' NumPy
    simulation repeats it) rather than whatever MPICH's reduce-scatter picks. The chain ends in
    ``buf``'s own block: once the running sum reaches the term x_r it is added *into* that block
    (dst = src + dst is exact-commutative), and later terms follow it. Returns that block (a
    view of ``buf``).

    The blocks travel by one Alltoallv, or, from 3 ranks on with blocks of at least
    PAIRWISE_MIN_BYTES, one peer at a time (:func:`_pairwise`): the same bytes and sums.
    """
    n, r = comm.Get_size(), comm.Get_rank()
    blocks = buf.reshape(n, -1)
    if n == 1:
        return blocks[0]
    size = blocks.shape[1]
    items = wire.items(size)
    recv = scratch.get((n - 1) * size, wire.dtype).reshape(n - 1, size)
    if n > 2 and blocks[0].nbytes >= PAIRWISE_MIN_BYTES:
        _pairwise(comm, blocks, recv, [items, wire.datatype], waiter)
    else:
        counts = [items] * n
        counts[r] = 0
        sdispls = [j * items for j in range(n)]
        rdispls = [(j - (j > r)) * items for j in range(n)]   # peer j -> row j (j < r) or j-1
        rdispls[r] = 0
        collective(waiter, "Alltoallv", comm, [buf, (counts, sdispls), wire.datatype],
                   [recv, (counts, rdispls), wire.datatype])
    terms = [recv[j - (j > r)] if j != r else blocks[r] for j in range(n)]
    return _ordered_chain(terms, r, wire.local_sum)


def _pairwise(comm, blocks, recv, count_type, waiter):
    """An Alltoallv's exchange in n - 1 rounds: in round i rank r sends block r + i to rank
    r + i and receives its own block from rank r - i (mod n), so each process sends one message
    and receives one at a time. Across nodes an Alltoallv's n - 1 transfers at once converge on
    every receiving link together (incast): a switch port's queue overflows and TCP backs off;
    one transfer a link each way keeps the queue short."""
    n, r = comm.Get_size(), comm.Get_rank()
    for i in range(1, n):
        dst, src = (r + i) % n, (r - i) % n
        waiter.wait([comm.Irecv([recv[src - (src > r)]] + count_type, source=src,
                                tag=_PAIRWISE_TAG),
                     comm.Isend([blocks[dst]] + count_type, dest=dst, tag=_PAIRWISE_TAG)])


def _ordered_chain(terms, r, local_sum, start=None, copy=None):
    """((x0 + x1) + x2) + ... of the blocks ``terms`` (rank order; ``terms[r]`` is the own block)
    ending in the own block, which is returned: the one summation order of every explicit
    schedule. The running sum begins in ``terms[0]`` itself (a receive buffer), or in ``start``
    (a scratch block, filled by ``copy(dst, src)``) when ``terms[0]`` is another rank's memory
    and must only be read; once it reaches x_r it is added *into* the own block (dst = src + dst
    is exact-commutative), and later terms follow it there. ``local_sum(src, dst)``:
    dst <- src + dst."""
    own = terms[r]
    acc = own if r == 0 else terms[0]
    if start is not None and r >= 2:
        copy(start, terms[0])
        acc = start
    for j in range(1, len(terms)):
        if j == r:
            local_sum(acc, own)
            acc = own
        else:
            local_sum(terms[j], acc)
    return own


def ordered_sum(terms, local_sum):
    """((x0 + x1) + x2) + ... of the blocks ``terms`` (rank order, all held by the caller) into
    ``terms[0]``, which is returned: the summation order of every explicit schedule
    (:func:`_ordered_chain` as rank 0 runs it), for a transport that hands one process every
    block, such as caffe8.ddp's all-to-all. ``local_sum(src, dst)``: dst <- src + dst, in place
    (``comm.ops.local_sum``)."""
    return _ordered_chain(list(terms), 0, local_sum)


def allgather_in_place(comm, buf, wire, waiter=BLOCKING):
    """Every rank's block ``rank`` of ``buf`` copied to all ranks (MPI_IN_PLACE allgather)."""
    n = comm.Get_size()
    if n == 1:
        return
    items = wire.items(buf.size) // n
    collective(waiter, "Allgather", comm, in_place(), [buf, items, wire.datatype])


def reduce_scatter_shared(comm, arena, buf, wire, waiter=BLOCKING):
    """:func:`reduce_scatter_ordered` on a buffer in ``arena`` (``comm``'s node memory: shared
    host memory, comm/shm.py, or device memory, comm/ipc.py): the same chain of additions in
    ascending rank, reading the other ranks' blocks where they lie, by the arena's own
    arithmetic; the running sum never lives in another rank's memory. Returns the own block."""
    n, r = comm.Get_size(), comm.Get_rank()
    if n == 1:
        return buf
    terms = [(buf if j == r else arena.peer(j, buf)).reshape(n, -1)[r] for j in range(n)]
    arena.barrier(comm, waiter)                 # every rank's payload is in place
    # x0 + x1 must not be written into rank 0's block: the sum starts in a scratch block
    return _ordered_chain(terms, r, arena.local_sum(wire),
                          start=arena.scratch(terms[r].size, terms[r].dtype), copy=arena.copy)


def allgather_shared(comm, arena, buf, waiter=BLOCKING):
    """:func:`allgather_in_place` on a buffer in ``arena``: copy every other rank's finished
    block out of its memory. Barriers before (the blocks are final) and after (no rank writes
    its buffer again, e.g. the next iteration's encoding, while another still copies from it)."""
    n, r = comm.Get_size(), comm.Get_rank()
    if n == 1:
        return
    mine = buf.reshape(n, -1)
    arena.barrier(comm, waiter)
    for j in range(n):
        if j != r:
            arena.copy(mine[j], arena.peer(j, buf).reshape(n, -1)[j])
    arena.barrier(comm, waiter)


def _shared_arena(comm, nbytes, kind=SharedArena):
    """(arena or None, why not) for ``comm`` when all its processes share a node: ``kind``
    (SharedArena, or comm.ipc.DeviceArena) made over it."""
    if comm is None or comm.Get_size() == 1:
        return None, "one process"
    MPI = mpi_module()
    node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
    together = node.Get_size() == comm.Get_size()
    node.Free()
    if not comm.allreduce(int(together), op=MPI.MIN):
        return None, "its processes are on different nodes"
    return kind.create(comm, nbytes)


class Transport:
    """Base of the transports. A sum transport (``reduction`` "sum") defines
    ``sum(buf, wire, between=None, host=None)`` (in place, returns ``buf``; ``host``: a device
    buffer's host mirror, for a stage between nodes); the gather transport
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

    def reserve(self, nbytes, device=False):
        """Collective: set aside ``nbytes`` of node-shared wire memory per process (where the
        algorithm has a shared-memory stage and the node allows it). ``device`` (the wire
        buffers are on GPUs): device memory shared through CUDA IPC (comm/ipc.py) for the
        buffers of ``device_buffer``, so the intra-node stages run on the GPUs; where that
        cannot be had (``IPC_ENV``, a GPU pair without peer access), host memory as without
        ``device``, for the buffers of ``host_buffer``. Returns the arena or None;
        ``shared_reason`` says why not, or why not on the device."""
        if self._stage_comm() is None:
            self.shared_reason = f"the {self.name} schedule has no shared-memory stage"
            return None
        if _off(SHM_ENV):
            self.shared_reason = f"{SHM_ENV}={os.environ[SHM_ENV]}"
            return None
        self.close_arena()
        device_reason = None
        if device:
            if _off(IPC_ENV):
                device_reason = f"{IPC_ENV}={os.environ[IPC_ENV]}"
            else:
                self.arena, device_reason = _shared_arena(self._stage_comm(), nbytes,
                                                          DeviceArena)
        if self.arena is None:
            self.arena, self.shared_reason = _shared_arena(self._stage_comm(), nbytes)
            if device_reason and self.arena is not None:
                self.shared_reason = f"host memory, not the GPUs': {device_reason}"
        else:
            self.shared_reason = None           # on the GPUs: nothing to explain
        return self.arena

    def host_buffer(self, length, dtype, shared=True):
        """A zeroed wire buffer: from the node-shared host arena while it has room
        (``shared``), else ``backend.host_buffer`` (pinned on a GPU). The same calls in the same
        order on every process give the same offsets, which the shared stages rely on."""
        arena = self.arena if shared and self.arena is not None and \
            not self.arena.on_device else None
        out = arena.alloc(length, dtype) if arena is not None else None
        return out if out is not None else backend.host_buffer(length, dtype)

    def device_buffer(self, length, dtype):
        """A zeroed wire buffer in the device arena (``reserve(device=True)``), or None when
        there is none or it is full: the caller then stages through host memory."""
        if self.arena is None or not self.arena.on_device:
            return None
        return self.arena.alloc(length, dtype)

    def on_device(self, buf):
        """True when ``buf`` lies in the device arena: its sum runs on the GPUs."""
        return self.arena is not None and self.arena.on_device and self.arena.holds(buf)

    def _shared(self, buf):
        """Sum ``buf`` through the node memory? Device memory always (it has no other path);
        host memory from a few pages on (below, the message schedule's fixed cost is as low,
        and the shared stages' Python steps cost more)."""
        return self.arena is not None and self.arena.holds(buf) and \
            (self.arena.on_device or buf.nbytes >= SHARED_MIN_BYTES)

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

    def sum(self, buf, wire, between=None, host=None):
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
        self._scratch = Scratch()

    def _stage_comm(self):
        return self.comm

    def sum(self, buf, wire, between=None, host=None):
        if self.size == 1:
            return buf
        if self._shared(buf):
            reduce_scatter_shared(self.comm, self.arena, buf, wire, self.waiter)
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
        self._scratch = Scratch()

    @property
    def stages(self):
        return (self.local_size, self.nodes)

    def _stage_comm(self):
        return self.intra

    def sum(self, buf, wire, between=None, host=None):
        """``host``: for a ``buf`` in the device arena, its host mirror (same length), whose
        span of the node's piece carries it through the inter-node stage: only that 1/P' of
        the buffer crosses to host memory and back, and ``between`` sees host memory."""
        if self.size == 1:
            return buf
        w = self.waiter
        shared = self._shared(buf)
        if shared:
            piece = reduce_scatter_shared(self.intra, self.arena, buf, wire, w)
        else:
            piece = reduce_scatter_ordered(self.intra, buf, wire, self._scratch, w)
        if self.nodes > 1:
            staged = piece
            if shared:
                if host is None and self.arena.on_device:
                    raise ValueError("hierarchical sum of a device buffer: its host mirror "
                                     "(host=) carries the node's piece across nodes")
                mirror = buf if host is None else host
                staged = self.arena.stage(piece, mirror.reshape(self.local_size, -1)[
                    self.intra.Get_rank()])
            if between is not None:
                between(staged)
            reduce_scatter_ordered(self.inter, staged, wire, self._scratch, w)
            allgather_in_place(self.inter, staged, wire, w)
            if shared:
                self.arena.unstage(piece, staged)
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
        self._scratch = Scratch()

    def sum(self, buf, wire, between=None, host=None):
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
