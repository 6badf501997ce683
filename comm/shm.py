"""Node-shared wire buffers: the processes of one node map one shared file, one segment each.

With the wire buffers of a node's processes in one shared mapping, the intra-node reduce-scatter
reads the other processes' blocks where they lie and adds them into its own block, and the
allgather copies the finished blocks straight out of their owners' segments: no message copies
(MPICH hands large intra-node messages over with one copy per transfer, or two through its
8 KiB cells) and no receive buffer. The additions stay in the ascending rank order of the
message-based schedule, so the sums are the same bytes.

The file lives in ``/dev/shm`` only until every process has mapped it: the node's first process
creates it and sets its size, every process opens it and reserves its own segment's pages with
``posix_fallocate`` — so each segment lies on its owner's NUMA node (tmpfs allocates a page under
the memory policy of the process that allocates it, local by default), and a full ``/dev/shm``
is ENOSPC at once rather than SIGBUS on first touch — and it is unlinked as soon as all agree
they have it mapped: a job that dies later leaves nothing behind. If any step fails on any process (no /dev/shm, too small, permissions), every process of
the node gets ``None`` with the reason and the transports keep using messages.

The stages synchronise through the mapping as well: each process's first cache line is its
barrier counter (C atomics with release/acquire ordering, comm/csrc/kernels.c), and the first
segment's control line also holds the node's futex word, which every arrival bumps and wakes: a
waiting process spins briefly, then sleeps on the futex in C, without the GIL, in slices under
the collective watchdog, so a stalled process is named as for any collective and the compute
thread is never held up by a poll — a barrier costs a cache-line transfer instead of an MPI
round trip.

On a GPU the own segment is page-locked (``backend.pin_host``) so the asynchronous device
copies into and out of it run as they do with pinned buffers.

The arena is one of two node memories with the same protocol (comm/allreduce.py's shared stages
use only it): ``holds``, ``peer``, ``barrier``, ``alloc``, ``scratch`` (a private running-sum
buffer), ``local_sum(wire)`` and ``copy`` (the arithmetic and copies, host or device),
``stage``/``unstage`` (the node's piece to and from host memory around the inter-node stage:
here the piece already is host memory) and ``close``. The other is comm/ipc.py's device
arena (CUDA IPC), whose stages run on the GPUs.
"""
import mmap
import os
import secrets

import numpy

from caffe8.comm import kernels
from caffe8.comm.collective import Scratch, collective
from caffe8.comm.mpi import mpi_module
from caffe8.engine import backend

SHM_DIR = "/dev/shm"
ALIGN = 64          # bytes: every buffer starts on a cache line
CONTROL = 64        # bytes at the start of each segment: the process's barrier counter (and,
FUTEX = 8           # in the first segment, at this offset, the node's futex word)


def round_up(n, to):
    return (n + to - 1) // to * to


def _address(a):
    return a.__array_interface__["data"][0]


class SharedArena:
    """One node's shared wire memory: ``views[j]`` is process j's segment (uint8), this process
    allocates its buffers from its own with :meth:`alloc` (in the same order on every process,
    so a buffer sits at the same offset in every segment) and finds a peer's copy with
    :meth:`peer`."""
    on_device = False           # host memory: any buffer size is worth the shared stages only
                                # from comm.allreduce.SHARED_MIN_BYTES on

    def __init__(self, mapping, segment, size, rank):
        self._mapping = mapping
        whole = numpy.frombuffer(mapping, numpy.uint8)
        self.views = [whole[j * segment:(j + 1) * segment] for j in range(size)]
        self.segment, self.size, self.rank = segment, size, rank
        self._own = _address(self.views[rank])
        self._base = _address(whole)
        self._next = CONTROL                # the first cache line holds the barrier counter
        self._epoch = 0
        self._counters = kernels.shm_barrier_functions()    # None: no C library, MPI barriers
        self._futex = self._base + FUTEX
        self._scratch = Scratch()
        self._unpin = backend.pin_host(self.views[rank])

    @classmethod
    def create(cls, comm, nbytes):
        """Collective over ``comm`` (one node's processes): an arena with ``nbytes`` per
        process, or ``(None, reason)`` on every process when shared memory is not to be had."""
        size, rank = comm.Get_size(), comm.Get_rank()
        segment = round_up(CONTROL + max(int(nbytes), 1), mmap.PAGESIZE)
        total = segment * size
        path = reason = None
        fd = -1
        if rank == 0:
            path = os.path.join(SHM_DIR, f"caffe8-{os.getpid()}-{secrets.token_hex(6)}")
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
                os.ftruncate(fd, total)
            except OSError as exc:
                reason = f"{path}: {exc}"
                if fd >= 0:
                    os.close(fd)
                    os.unlink(path)
                fd, path = -1, None
        path, reason = comm.bcast((path, reason), root=0)
        if path is None:
            return None, reason
        arena = None
        try:
            if rank != 0:
                fd = os.open(path, os.O_RDWR)
            # the own segment's pages, allocated by this process: on its NUMA node
            os.posix_fallocate(fd, rank * segment, segment)
            mapping = mmap.mmap(fd, total, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            try:
                arena = cls(mapping, segment, size, rank)     # pins the own segment on a GPU
            except Exception as exc:                        # e.g. cudaHostRegister refused
                reason = f"{path}: {exc}"                   # (the mapping goes with its views)
        except (OSError, AttributeError) as exc:        # AttributeError: no posix_fallocate
            reason = f"{path}: {exc}"
        finally:
            if fd >= 0:
                os.close(fd)
        MPI = mpi_module()
        try:
            everyone = comm.allreduce(0 if arena is None else 1, op=MPI.MIN)
        finally:                    # whatever happened, the name goes once all have mapped it
            if rank == 0:
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    pass
        if not everyone:
            if arena is not None:
                arena.close()
            reasons = [r for r in comm.allgather(reason) if r]
            return None, reasons[0] if reasons else "a process could not map the shared file"
        return arena, None

    def barrier(self, comm, waiter):
        """All of the node's processes reach this point (every write before it is seen by all
        after it). Through the counters in shared memory — a release store of this process's
        epoch, acquire loads of the others', no message — waited for on the node's futex, in C
        without the GIL, under ``waiter`` (the watchdog's deadline in training); ``comm``'s MPI
        barrier when the C kernels are missing."""
        if self._counters is None:
            collective(waiter, "Barrier", comm)
            return
        arrive, wait = self._counters
        self._epoch += 1
        epoch, base, stride, n, futex = self._epoch, self._base, self.segment, self.size, \
            self._futex
        arrive(self._own, epoch, futex)
        waiter.wait_blocking(lambda seconds: wait(base, stride, n, epoch, futex,
                                                  int(seconds * 1e9)))

    def alloc(self, length, dtype):
        """A zeroed buffer of ``length`` items in this process's segment, or None when full."""
        nbytes = int(length) * numpy.dtype(dtype).itemsize
        start = round_up(self._next, ALIGN)
        if start + nbytes > self.segment:
            return None
        self._next = start + nbytes
        out = self.views[self.rank][start:start + nbytes].view(dtype)
        out[...] = 0
        return out

    def scratch(self, length, dtype):
        """A private buffer of ``length`` items (contents undefined): a running sum that must
        not live in another process's segment."""
        return self._scratch.get(length, dtype)

    @staticmethod
    def local_sum(wire):
        """``fn(src, dst)``: dst <- src + dst in ``wire``'s format (comm.ops.WireOp)."""
        return wire.local_sum

    @staticmethod
    def copy(dst, src):
        dst[...] = src

    @staticmethod
    def stage(piece, host_piece):
        """The node's partial sum ``piece`` as host memory for the inter-node stage: here it
        is host memory already (``host_piece`` is the same span)."""
        return piece

    @staticmethod
    def unstage(piece, staged):
        """The inter-node stage's result back into ``piece``: nothing to copy here."""

    def holds(self, buf):
        """True when ``buf`` is a contiguous buffer inside this process's segment."""
        if self.views is None or not buf.flags.c_contiguous:
            return False
        off = _address(buf) - self._own
        return 0 <= off and off + buf.nbytes <= self.segment

    def peer(self, j, buf):
        """Process ``j``'s buffer at the offset ``buf`` has in this process's segment."""
        off = _address(buf) - self._own
        return self.views[j][off:off + buf.nbytes].view(buf.dtype).reshape(buf.shape)

    def close(self):
        """Unpin and unmap (buffers handed out must no longer be used)."""
        if self.views is None:
            return
        self._unpin()
        self.views = None
        try:
            self._mapping.close()
        except BufferError:     # a caller still holds a buffer: the mapping goes with it
            pass
