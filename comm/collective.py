"""The collective helpers every transport and the node-shared memory use.

Every collective goes through :func:`collective` with a ``waiter``: a ``comm.watchdog.Watchdog``
in training, which starts the nonblocking form and completes it with a deadline (a stalled rank
then ends the job with its name instead of a hang), or ``BLOCKING``, which makes the plain
blocking call (the benchmark's path, exactly MPICH's blocking algorithms). All ranks of a job use
the same kind, as MPI requires (a blocking collective never matches a nonblocking one).

:func:`max_over` is the MAX agreement of floats (the fp8 codec's range, the APS exponent);
:func:`bit_identical` whether every rank holds the same bytes (the consistency check);
:class:`Scratch` the receive and running-sum buffer a transport or node memory keeps.
"""
import hashlib
import os

import numpy

from caffe8.comm.mpi import mpi_module
from caffe8.engine import backend


class _Blocking:
    """The waiter outside training: blocking calls, no deadline."""

    def wait(self, requests):
        mpi_module().Request.Waitall(requests if isinstance(requests, list) else [requests])

    def wait_until(self, done):
        polls = 0
        while not done():
            polls += 1
            if polls % 16 == 0:     # more processes than cores: let the awaited one run
                os.sched_yield()

    def wait_blocking(self, block):
        """Return once ``block(seconds)`` (a wait of at most that long, without the GIL) says
        it is done."""
        while not block(1.0):
            pass


BLOCKING = _Blocking()


class Scratch:
    """A reusable buffer (``empty``: numpy.empty, or cupy.empty for device memory): fresh
    allocations of tens of MB cost page faults on every call."""

    def __init__(self, empty=numpy.empty):
        self._empty = empty
        self._buf = empty(0, numpy.uint8)

    def get(self, n, dtype):
        """``n`` items of ``dtype`` (contents undefined)."""
        nbytes = int(n) * numpy.dtype(dtype).itemsize
        if self._buf.size < nbytes:
            self._buf = self._empty(nbytes, numpy.uint8)
        return self._buf[:nbytes].view(dtype)


def collective(waiter, name, comm, *args):
    """``comm.<name>(*args)`` with ``BLOCKING``; else ``comm.I<name>(*args)`` completed by
    ``waiter`` (e.g. ``collective(w, "Allgather", comm, send, recv)``)."""
    if waiter is BLOCKING:
        getattr(comm, name)(*args)
    else:
        waiter.wait(getattr(comm, "I" + name.lower())(*args))


def in_place():
    """MPI_IN_PLACE."""
    return mpi_module().IN_PLACE


def max_over(comm, value, waiter=BLOCKING):
    """The maximum of the float ``value`` over ``comm`` (identical on every rank; ``value`` when
    ``comm`` is None or of one process); of each float of a list ``value`` in one collective,
    as a list."""
    many = isinstance(value, (list, tuple))
    buf = numpy.array(value if many else [value], numpy.float64)
    if comm is not None and comm.Get_size() > 1 and buf.size:
        collective(waiter, "Allreduce", comm, in_place(), buf, mpi_module().MAX)
    return buf.tolist() if many else float(buf[0])


def bit_identical(world, arrays):
    """True on every rank when every rank holds bit-identical ``arrays`` (an array or a list of
    arrays, host or device): each rank hashes the raw bytes (SHA-256) and the digests are
    allgathered (``world.allgather_bytes``: under the watchdog in training), so the answer is
    the same on every rank."""
    if not isinstance(arrays, (list, tuple)):
        arrays = [arrays]
    h = hashlib.sha256()
    for a in arrays:
        h.update(numpy.ascontiguousarray(backend.to_numpy(a)).tobytes())
    if world.size == 1:
        return True
    return len(set(world.allgather_bytes(h.digest()))) == 1
