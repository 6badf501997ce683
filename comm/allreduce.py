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

from caffe8.comm.arithmetic import HOST
from caffe8.comm.collective import BLOCKING, Scratch, collective, in_place, max_over
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


class Level:
    """One level of an ordered sum: ``count`` processes, this one at ``index``. Block j of a
    span belongs to the level's process j: :meth:`reduce_scatter` hands each process the blocks
    of its index from every process (the transport's moves: ``post``, then ``gathered``) and
    adds them in ascending rank into its own block; :meth:`allgather` copies every finished
    block to every process. Subclasses move the bytes (MPI messages, node-shared memory,
    caffe8.ddp's torch.distributed); the order of the additions is this class's alone."""
    index, count = 0, 1

    def post(self, span, wire):
        """Start moving the blocks of ``span`` (block j to the level's process j); returns what
        :meth:`gathered` takes. A transport whose moves are asynchronous can post them early
        (``ordered_levels(..., posted=)``)."""
        raise NotImplementedError

    def gathered(self, span, posted):
        """Block ``index`` of every process of the level, in rank order, this process's own
        (the block of ``span``) at ``index``: the moves of ``posted`` complete."""
        raise NotImplementedError

    def release(self, posted):
        """The receive buffers of ``posted`` are free again."""

    def reduce_scatter(self, span, wire, arith=HOST, posted=None):
        """This process's block of ``span`` becomes the sum of every process's, added in
        ascending rank ((x0 + x1) + x2) + ... with ``arith``'s sum of ``wire``; returns it (a
        view of ``span``)."""
        own = span.reshape(self.count, -1)[self.index]
        if self.count == 1:
            return own
        if posted is None:
            posted = self.post(span, wire)
        terms = [arith.array(t) for t in self.gathered(span, posted)]
        _ordered_chain(terms, self.index, arith.local_sum(wire))
        self.release(posted)
        return own

    def hand_on(self, own, span, host):
        """Where the next level sums this level's block ``own``: ``own`` itself (a node-shared
        device arena: its host mirror's span, ``host`` or ``span``)."""
        return own

    def take_back(self, own, staged):
        """The next level's result ``staged`` back into ``own`` (after :meth:`hand_on`)."""

    def allgather(self, span, wire):
        """Every process's finished block of ``span`` copied to all processes of the level."""
        raise NotImplementedError


def ordered_levels(levels, buf, wire, between=None, host=None, arith=HOST, posted=None):
    """Sum ``buf`` in place over ``levels`` (comm/allreduce.py's rsag: one level; the
    hierarchical sum: inside the node, then across nodes): each level adds the blocks of its
    index in ascending rank (:meth:`Level.reduce_scatter`) and the next level works on the
    block it owns; ``between(block)`` (an array of ``arith``) runs on the first level's block
    when another level follows (fp8: x1/nodes, tensor by tensor); then the levels' allgathers
    in reverse. Every element is added on exactly one process, in one order, so every process
    ends with the same bytes. ``host``: the host mirror of a device ``buf`` (``hand_on``);
    ``posted``: the first level's moves, already posted (``Level.post``)."""
    down, span = [], buf
    for depth, level in enumerate(levels):
        own = level.reduce_scatter(span, wire, arith, posted if depth == 0 else None)
        staged = own
        if depth + 1 < len(levels):
            staged = level.hand_on(own, span, host)
            if depth == 0 and between is not None:
                between(arith.array(staged))
        down.append((level, span, own, staged))
        span = staged
    for depth, (level, span, own, staged) in reversed(list(enumerate(down))):
        if depth + 1 < len(levels):
            level.take_back(own, staged)
        level.allgather(span, wire)
    return buf


class RootedLevel(Level):
    """A level moved by rooted collectives, for a transport that has them asynchronously
    (caffe8.ddp's torch.distributed): block j of every process gathered at process j, one
    gather per root, all posted at once, and the finished blocks broadcast back from their
    roots; receive buffers kept for the next span of the same shape. A subclass gives
    ``gather(j, block, rows)`` (``rows``: the receive rows at root j, None elsewhere) and
    ``broadcast(j, block)``, each returning a handle to ``wait()`` for, and
    ``empty_like(span)``."""

    def __init__(self, count, index):
        self.count, self.index, self._receive = count, index, {}

    def post(self, span, wire):
        free = self._receive.setdefault(self._shape(span), [])
        scratch = free.pop() if free else self.empty_like(span)
        rows = list(scratch.reshape(self.count, -1))
        return scratch, [self.gather(j, block, rows if j == self.index else None)
                         for j, block in enumerate(span.reshape(self.count, -1))]

    def gathered(self, span, posted):
        for handle in posted[1]:
            handle.wait()
        rows = list(posted[0].reshape(self.count, -1))
        rows[self.index] = span.reshape(self.count, -1)[self.index]
        return rows

    def release(self, posted):
        self._receive[self._shape(posted[0])].append(posted[0])

    @staticmethod
    def _shape(span):
        return span.dtype, len(span), getattr(span, "device", None)

    def allgather(self, span, wire):
        for handle in [self.broadcast(j, block)
                       for j, block in enumerate(span.reshape(self.count, -1))]:
            handle.wait()


def node_levels(ranks, local):
    """The levels of a sum over ``ranks`` in nodes of ``local`` consecutive ranks, each as its
    disjoint lists of ranks: inside each node, then across the nodes among the ranks of one
    local index (comm.mpi.node_comms' layout with ``processes_per_node``); a level of one
    process is none."""
    nodes = len(ranks) // local
    levels = [[ranks[n * local:(n + 1) * local] for n in range(nodes)],
              [ranks[i::local] for i in range(local)]]
    return [level for level in levels if len(level[0]) > 1]


class MessageLevel(Level):
    """A level over an MPI communicator: one Alltoallv hands each process the blocks of its
    index (no self block: nothing is copied locally), an in-place Allgather hands the finished
    blocks back (the explicit order, rather than whatever MPICH's reduce-scatter picks)."""

    def __init__(self, comm, waiter, scratch):
        self.comm, self.waiter, self.scratch = comm, waiter, scratch
        self.count, self.index = comm.Get_size(), comm.Get_rank()

    def post(self, span, wire):
        n, r = self.count, self.index
        blocks = span.reshape(n, -1)
        size = blocks.shape[1]
        items = wire.items(size)
        recv = self.scratch.get((n - 1) * size, wire.dtype).reshape(n - 1, size)
        counts = [items] * n
        counts[r] = 0
        sdispls = [j * items for j in range(n)]
        rdispls = [(j - (j > r)) * items for j in range(n)]   # peer j -> row j (j < r) or j-1
        rdispls[r] = 0
        collective(self.waiter, "Alltoallv", self.comm, [span, (counts, sdispls), wire.datatype],
                   [recv, (counts, rdispls), wire.datatype])
        return [recv[j - (j > r)] if j != r else blocks[r] for j in range(n)]

    def gathered(self, span, posted):
        return posted

    def allgather(self, span, wire):
        allgather_in_place(self.comm, span, wire, self.waiter)


class SharedLevel(Level):
    """A level whose processes share the wire buffers' memory (a node: comm/shm.py's host
    arena, comm/ipc.py's device arena): the same chain of additions, reading the other
    processes' blocks where they lie (``reduce_scatter_shared``), and the finished blocks
    copied out of their owners' memory; a device arena hands the node's block to the next
    level through the buffer's host mirror."""

    def __init__(self, comm, arena, waiter):
        self.comm, self.arena, self.waiter = comm, arena, waiter
        self.count, self.index = comm.Get_size(), comm.Get_rank()

    def reduce_scatter(self, span, wire, arith=HOST, posted=None):
        return reduce_scatter_shared(self.comm, self.arena, span, wire, self.waiter)

    def hand_on(self, own, span, host):
        if host is None and self.arena.on_device:
            raise ValueError("hierarchical sum of a device buffer: its host mirror (host=) "
                             "carries the node's piece across nodes")
        mirror = span if host is None else host
        return self.arena.stage(own, mirror.reshape(self.count, -1)[self.index])

    def take_back(self, own, staged):
        self.arena.unstage(own, staged)

    def allgather(self, span, wire):
        allgather_shared(self.comm, self.arena, span, self.waiter)


def allgather_in_place(comm, buf, wire, waiter=BLOCKING):
    """Every rank's block ``rank`` of ``buf`` copied to all ranks (MPI_IN_PLACE allgather)."""
    n = comm.Get_size()
    if n == 1:
        return
    items = wire.items(buf.size) // n
    collective(waiter, "Allgather", comm, in_place(), [buf, items, wire.datatype])


def reduce_scatter_shared(comm, arena, buf, wire, waiter=BLOCKING):
    """:meth:`MessageLevel.reduce_scatter` on a buffer in ``arena`` (``comm``'s node memory: shared
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

    def maxima(self, values):
        """The MAX over the processes of each float of ``values``, in one collective: the
        codecs' agreement (comm.pipeline.Pipeline.agree)."""
        return max_over(self.comm, values, self.waiter)

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
    """Explicit reduce-scatter (Alltoallv + ordered local sum) then Allgather over all P ranks:
    :func:`ordered_levels` in one level, by messages or in the node-shared arena.

    Each rank adds only 1/P of the vector, P-1 times, instead of the whole vector log2(P) times.
    """

    def __init__(self, comm, processes_per_node=0, waiter=BLOCKING):
        super().__init__(comm, processes_per_node, waiter)
        self._messages = MessageLevel(comm, waiter, Scratch()) if comm is not None else None

    def _stage_comm(self):
        return self.comm

    def sum(self, buf, wire, between=None, host=None):
        if self.size == 1:
            return buf
        level = SharedLevel(self.comm, self.arena, self.waiter) if self._shared(buf) else \
            self._messages
        return ordered_levels([level], buf, wire)


@register_transport("hierarchical")
class HierarchicalAllreduce(Transport):
    """Oyama et al.'s Algorithm 1, lines 16-23.

    1. intra-node reduce-scatter: local rank l owns piece l (1/P') and adds the P' pieces of
       its node in local-rank order;
    2. ``between(piece)`` (fp8: divide by the number of nodes; with one process per node there
       is no intra-node stage and no step between, the codec folds it into its encode);
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
            scratch = Scratch()
            self._levels = (MessageLevel(self.intra, waiter, scratch),
                            MessageLevel(self.inter, waiter, scratch))

    @property
    def stages(self):
        return (self.local_size, self.nodes)

    def _stage_comm(self):
        return self.intra

    def sum(self, buf, wire, between=None, host=None):
        """:func:`ordered_levels` inside the node (by messages or in the node-shared arena),
        then across nodes. ``host``: for a ``buf`` in the device arena, its host mirror (same
        length), whose span of the node's piece carries it through the inter-node stage: only
        that 1/P' of the buffer crosses to host memory and back, and ``between`` sees host
        memory."""
        if self.size == 1:
            return buf
        intra, inter = self._levels
        if self._shared(buf):
            intra = SharedLevel(self.intra, self.arena, self.waiter)
        # a level of one process is none (one process per node: no step between levels,
        # as the codec knows from ``stages``; caffe8.ddp's levels alike)
        return ordered_levels([level for level in (intra, inter) if level.count > 1], buf,
                              wire, between, host)

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
