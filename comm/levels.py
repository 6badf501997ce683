"""The ordered sum in levels: the one order of every addition of the explicit schedules, for
every transport that moves their bytes (comm/allreduce.py's rsag and hierarchical sum over MPI,
caffe8.ddp's over torch.distributed).

A :class:`Level` is a set of processes, this one at ``index`` of ``count``; block j of a span
belongs to its process j. Its reduce-scatter hands each process the blocks of its index from
every process (the transport's moves) and adds them in ascending rank, ((x0 + x1) + x2) + ...,
into its own block (:func:`_ordered_chain`), so each element is summed on exactly one process,
in one known order (the tests' NumPy simulation repeats it); its allgather copies the finished
blocks back. :func:`ordered_levels` runs the levels one inside the other (rsag: one level; the
hierarchical sum: inside the node, then across nodes) with the codec's step between them.
The moves: :class:`MessageLevel` (MPI messages), :class:`SharedLevel` (node-shared host or
device memory, comm/shm.py and comm/ipc.py: the other processes' blocks read where they lie,
with barriers instead of messages), :class:`RootedLevel` (rooted collectives posted
asynchronously: one gather and one broadcast per root); :func:`node_levels` gives the
hierarchy's levels as lists of ranks.
"""
import abc

from caffe8.comm.arithmetic import HOST
from caffe8.comm.collective import BLOCKING, collective, in_place


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


class Level(abc.ABC):
    """One level of an ordered sum: ``count`` processes, this one at ``index``. Block j of a
    span belongs to the level's process j: :meth:`reduce_scatter` adds every process's block of
    its index in ascending rank into its own block; :meth:`allgather` copies every finished
    block to every process. Subclasses move the bytes (:class:`MovedLevel`: MPI messages,
    caffe8.ddp's torch.distributed; :class:`SharedLevel`: node-shared memory); the order of the
    additions is :func:`_ordered_chain`'s alone."""
    index, count = 0, 1

    @abc.abstractmethod
    def reduce_scatter(self, span, wire, arith=HOST, posted=None):
        """This process's block of ``span`` becomes the sum of every process's, added in
        ascending rank ((x0 + x1) + x2) + ... with ``arith``'s sum of ``wire``; returns it (a
        view of ``span``). ``posted``: :meth:`MovedLevel.post`'s moves, already under way."""

    def hand_on(self, own, span, host):
        """Where the next level sums this level's block ``own``: ``own`` itself (a node-shared
        device arena: its host mirror's span, ``host`` or ``span``)."""
        return own

    def take_back(self, own, staged):
        """The next level's result ``staged`` back into ``own`` (after :meth:`hand_on`)."""

    @abc.abstractmethod
    def allgather(self, span, wire):
        """Every process's finished block of ``span`` copied to all processes of the level."""


class MovedLevel(Level):
    """A level whose blocks travel between the processes: :meth:`post` starts moving them,
    :meth:`gathered` completes the moves; the reduce-scatter then adds what arrived."""

    @abc.abstractmethod
    def post(self, span, wire):
        """Start moving the blocks of ``span`` (block j to the level's process j); returns what
        :meth:`gathered` takes. A transport whose moves are asynchronous can post them early
        (``ordered_levels(..., posted=)``)."""

    @abc.abstractmethod
    def gathered(self, span, posted):
        """Block ``index`` of every process of the level, in rank order, this process's own
        (the block of ``span``) at ``index``: the moves of ``posted`` complete."""

    def release(self, posted):
        """The receive buffers of ``posted`` are free again."""

    def reduce_scatter(self, span, wire, arith=HOST, posted=None):
        own = span.reshape(self.count, -1)[self.index]
        if self.count == 1:
            return own
        if posted is None:
            posted = self.post(span, wire)
        terms = [arith.array(t) for t in self.gathered(span, posted)]
        _ordered_chain(terms, self.index, arith.local_sum(wire))
        self.release(posted)
        return own


def ordered_levels(levels, buf, wire, between=None, host=None, arith=HOST, posted=None):
    """Sum ``buf`` in place over ``levels`` (comm/allreduce.py's rsag: one level; the
    hierarchical sum: inside the node, then across nodes): each level adds the blocks of its
    index in ascending rank (:meth:`Level.reduce_scatter`) and the next level works on the
    block it owns; ``between(block)`` (an array of ``arith``) runs on the first level's block
    when another level follows (fp8: x1/nodes, tensor by tensor); then the levels' allgathers
    in reverse. Every element is added on exactly one process, in one order, so every process
    ends with the same bytes. ``host``: the host mirror of a device ``buf`` (``hand_on``);
    ``posted``: the first level's moves, already posted (``MovedLevel.post``)."""
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


class RootedLevel(MovedLevel):
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


class MessageLevel(MovedLevel):
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
