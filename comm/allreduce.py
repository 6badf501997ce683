"""Transports: how the ranks reduce one tensor's payload. Sums (flat, rsag, hierarchical, ring)
and a gather (the codecs that reduce on every rank themselves). The rule that picks one per codec
is ``comm.config.transport_name``.

Every sum transport sums a 1-D numpy wire buffer in place across the processes of its communicator
with a :class:`comm.ops.WireOp`. The buffer length must be a multiple of ``wire.unit * P``
(``comm.ops.padded_length``). Every rank ends with bit-identical results: in the explicit
schedules each element is summed on exactly one rank, in ascending rank order, and then copied
to the others (allgather), so no rank ever adds the same numbers in another order: rsag and the
hierarchical sum are comm/levels.py's ordered sum in one and two levels, the ring its own.

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

from caffe8.comm.collective import BLOCKING, Scratch, collective, in_place, max_over
from caffe8.comm.ipc import DeviceArena
from caffe8.comm.levels import MessageLevel, SharedLevel, ordered_levels
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
