"""Device wire memory shared by a node's processes through CUDA IPC: the intra-node stage on the GPUs.

Host staging moves every GPU's whole wire buffer to pinned host memory and back, and sums the
node's buffers on the host. With a :class:`DeviceArena` the ranks of a node instead read each
other's device buffers where they lie: each process allocates one device segment (a plain
``cudaMalloc``, since an IPC handle names a whole allocation, not a piece of CuPy's pool), takes
its IPC handle, and the node's processes exchange the handles and open each other's segments
(``cudaIpcOpenMemHandle``, with peer access enabled lazily where the GPUs differ; two processes
on one GPU work as well). Buffers are allocated at the same offsets in every segment, as in the
host arena (comm/shm.py), whose protocol this one follows, so comm/allreduce.py's shared stages
run unchanged: rank l adds block l of every process's buffer in ascending rank order with the
device twin of the host sum (:func:`device_sum`: the same arithmetic, bit for bit), only that
block goes to host memory for the inter-node stage (``stage``/``unstage``), and the finished
blocks are copied device to device out of their owners' segments.

Ordering: every device step of the arena runs on its own non-blocking stream, and each barrier
first waits for that stream, then meets the node's other processes (an MPI barrier under the
caller's waiter, so a stalled process is named as for any collective): whatever a process wrote
before a barrier is complete before any process reads it after. The caller makes sure that its
encode into a buffer is complete before the first barrier of a sum (comm.exchange waits for the
encode's event).

If any step fails on any process (no GPU, a GPU that cannot reach another process's: the
processes exchange their GPUs' bus ids and ask ``deviceCanAccessPeer`` before any handle is
opened; an IPC refusal), every process of the node gets ``(None, reason)`` and the transports
stage through host memory.
"""
import time

import numpy

from caffe8.comm import fp8, ops
from caffe8.comm.collective import Scratch, collective
from caffe8.comm.mpi import mpi_module
from caffe8.comm.shm import round_up
from caffe8.engine import backend

ALIGN = 256                 # bytes: every buffer starts where cudaMalloc's own alignment would
CLOSE_TIMEOUT = 30.0        # seconds the close waits for the node before leaving its memory be
H2D, D2H, DEFAULT = 1, 2, 4         # cudaMemcpyKind (DEFAULT: any pair, unified addressing)

#: host sum (comm.ops) -> its device twin in comm.fp8's CUDA kernels
_DEVICE_SUMS = {ops.fp8_local_sum: "add_nearest", ops.fp8_oyama_local_sum: "add_oyama",
                ops.half_local_sum: "half_add", ops.float_local_sum: "float_add"}


def device_sum(local_sum):
    """``fn(src, dst)``: dst <- src + dst on CuPy arrays, the device twin of the host sum
    ``local_sum`` (a ``comm.ops.WireOp.local_sum``): one fused kernel with the same arithmetic
    (tests/comm/test_fp8.py compiles the kernels' text on the host and checks it), launched on
    the current stream."""
    if local_sum not in _DEVICE_SUMS:
        raise ValueError(f"comm.ipc: no device sum for {getattr(local_sum, '__name__', local_sum)}")
    kernel = fp8.cuda_kernel(_DEVICE_SUMS[local_sum])
    return lambda src, dst: kernel(src, dst, dst)


def copy_async(dst, src, nbytes, kind, stream):
    """cudaMemcpyAsync of ``nbytes`` from address ``src`` to ``dst`` on ``stream``
    (asynchronous to the host where the host side is pinned: backend.host_buffer)."""
    if nbytes:
        backend.cupy.cuda.runtime.memcpyAsync(dst, src, nbytes, kind, stream.ptr)


class DeviceArena:
    """One node's device wire memory: this process's segment (``alloc`` hands out buffers at the
    same offsets on every process) and the other processes' segments opened through CUDA IPC
    (``peer``). The protocol of comm.shm.SharedArena, on the GPUs."""
    on_device = True            # the sum of a buffer in it runs here, whatever its size

    def __init__(self, comm, own, segment, pointers, rank):
        cp = backend.cupy
        self._comm, self._own, self.segment, self.rank = comm, own, segment, rank
        self._pointers = pointers               # [process j's segment in this address space]
        self.size = len(pointers)
        self._device = cp.cuda.runtime.getDevice()
        self._next = 0
        self.stream = cp.cuda.Stream(non_blocking=True)
        self._scratch = Scratch(cp.empty)
        self._sums = {}

    @classmethod
    def create(cls, comm, nbytes):
        """Collective over ``comm`` (one node's processes): an arena with ``nbytes`` per process,
        or ``(None, reason)`` on every process when device memory cannot be shared.

        The processes first exchange their handles and their GPUs' PCI bus ids (an ordinal is
        only a name inside one process's CUDA_VISIBLE_DEVICES), and each asks CUDA whether its
        GPU reaches every other process's (``deviceCanAccessPeer``); only when every process
        can does any of them open a handle: an open that succeeds between GPUs without peer
        access would give addresses no kernel may touch."""
        size, rank = comm.Get_size(), comm.Get_rank()
        segment = round_up(max(int(nbytes), 1), ALIGN)
        cp = backend.cupy
        own = handle = bus = reason = None
        if cp is None or not backend.on_gpu():
            reason = "not on a GPU"
        else:
            try:
                bus = cp.cuda.runtime.deviceGetPCIBusId(cp.cuda.runtime.getDevice())
                own = cp.cuda.Memory(segment)               # cudaMalloc, not the pool
                cp.cuda.runtime.memset(own.ptr, 0, segment)
                cp.cuda.runtime.deviceSynchronize()
                handle = bytes(cp.cuda.runtime.ipcGetMemHandle(own.ptr))
            except Exception as exc:                        # CUDARuntimeError, MemoryError
                reason = f"{type(exc).__name__}: {exc}"
        peers = comm.allgather((handle, bus))
        if reason is None:
            reason = _peer_reason(cp, rank, [b for _, b in peers])
        pointers = [None] * size
        if _everyone(comm, reason):
            reason = _open(cp, rank, [h for h, _ in peers], own, pointers)
        if not _everyone(comm, reason):
            for j, p in enumerate(pointers):
                if p is not None and j != rank:
                    cp.cuda.runtime.ipcCloseMemHandle(p)
            comm.Barrier()              # no process frees its segment while another has it open
            reasons = [r for r in comm.allgather(reason) if r]
            return None, reasons[0] if reasons else "a process could not share its GPU memory"
        return cls(comm, own, segment, pointers, rank), None

    def _view(self, pointer, offset, length, dtype):
        cp = backend.cupy
        memory = cp.cuda.UnownedMemory(pointer, self.segment, self, self._device)
        return cp.ndarray((length,), dtype, cp.cuda.MemoryPointer(memory, offset))

    def alloc(self, length, dtype):
        """A zeroed buffer of ``length`` items in this process's segment, or None when full."""
        nbytes = int(length) * numpy.dtype(dtype).itemsize
        start = round_up(self._next, ALIGN)
        if self._pointers is None or start + nbytes > self.segment:
            return None
        self._next = start + nbytes
        return self._view(self._own.ptr, start, int(length), dtype)     # zeroed at creation

    def holds(self, buf):
        """True when ``buf`` is a contiguous CuPy array inside this process's segment."""
        cp = backend.cupy
        if self._pointers is None or cp is None or not isinstance(buf, cp.ndarray) or \
                not buf.flags.c_contiguous:
            return False
        off = buf.data.ptr - self._own.ptr
        return 0 <= off and off + buf.nbytes <= self.segment

    def peer(self, j, buf):
        """Process ``j``'s buffer at the offset ``buf`` has in this process's segment."""
        off = buf.data.ptr - self._own.ptr
        return self._view(self._pointers[j], off, buf.size, buf.dtype).reshape(buf.shape)

    def barrier(self, comm, waiter):
        """Every device step this process launched is complete, then all of the node's
        processes meet (an MPI barrier under ``waiter``)."""
        self.stream.synchronize()
        collective(waiter, "Barrier", comm)

    def scratch(self, length, dtype):
        """A private device buffer of ``length`` items (a running sum that must not live in
        another process's segment)."""
        return self._scratch.get(length, dtype)

    def local_sum(self, wire):
        """``fn(src, dst)``: dst <- src + dst in ``wire``'s format on this arena's stream."""
        add = self._sums.get(wire.local_sum)
        if add is None:
            kernel = device_sum(wire.local_sum)

            def add(src, dst):
                with self.stream:
                    kernel(src, dst)
            self._sums[wire.local_sum] = add
        return add

    def copy(self, dst, src):
        """dst <- src (contiguous device arrays, any of the node's GPUs) on this arena's stream."""
        copy_async(dst.data.ptr, src.data.ptr, src.nbytes, DEFAULT, self.stream)

    def stage(self, piece, host_piece):
        """The node's partial sum ``piece`` copied into ``host_piece`` (pinned host memory),
        waited for; returns ``host_piece`` for the inter-node stage."""
        copy_async(host_piece.ctypes.data, piece.data.ptr, piece.nbytes, D2H, self.stream)
        self.stream.synchronize()
        return host_piece

    def unstage(self, piece, staged):
        """The inter-node stage's result back into ``piece`` (complete at the next barrier)."""
        copy_async(piece.data.ptr, staged.ctypes.data, piece.nbytes, H2D, self.stream)

    def close(self):
        """Close the other processes' segments; free the own one once every process of the
        node has closed it (freeing memory another process still has open is undefined), or
        leave it to the process's end when the node does not meet within ``CLOSE_TIMEOUT``."""
        if self._pointers is None:
            return
        cp = backend.cupy
        self.stream.synchronize()
        for j, p in enumerate(self._pointers):
            if j != self.rank:
                cp.cuda.runtime.ipcCloseMemHandle(p)
        self._pointers = None
        request, deadline = self._comm.Ibarrier(), time.monotonic() + CLOSE_TIMEOUT
        while not request.Test():
            if time.monotonic() > deadline:
                return                  # a process is gone or stuck: keep the memory
            time.sleep(0.001)
        self._own = None


def _everyone(comm, reason):
    """Collective: True when no process of ``comm`` has a ``reason`` against the arena."""
    return bool(comm.allreduce(0 if reason else 1, op=mpi_module().MIN))


def _peer_reason(cp, rank, buses):
    """Why this process's GPU cannot reach every other process's GPU (bus ids ``buses``, in
    rank order), or None. Processes on one GPU need no peer access."""
    runtime = cp.cuda.runtime
    mine, here = buses[rank], runtime.getDevice()
    visible = None
    for j, bus in enumerate(buses):
        if bus is None or bus == mine:
            continue
        if visible is None:
            visible = {runtime.deviceGetPCIBusId(d): d for d in range(runtime.getDeviceCount())}
        if bus not in visible:
            return (f"process {j}'s GPU {bus} is not visible to process {rank} (its "
                    f"CUDA_VISIBLE_DEVICES)")
        if not runtime.deviceCanAccessPeer(here, visible[bus]):
            return f"no peer access from GPU {mine} (process {rank}) to GPU {bus} (process {j})"
    return None


def _open(cp, rank, handles, own, pointers):
    """Open every other process's segment into ``pointers`` (this process's own at its rank);
    returns why one could not be opened, or None."""
    for j, handle in enumerate(handles):
        if j == rank:
            pointers[j] = own.ptr
            continue
        try:
            pointers[j] = cp.cuda.runtime.ipcOpenMemHandle(handle)
        except Exception as exc:
            return f"process {j}'s segment: {type(exc).__name__}: {exc}"
    return None
