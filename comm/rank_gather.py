"""Allgather-type collectives for the comparison codecs (comm/dettmers.py, aps.py, strom.py).

The comparison codecs do not sum in their compressed form inside MPI: each rank gathers every
rank's payload and reduces the decoded values itself in rank order 0, 1, ..., P-1, so all ranks
get bit-identical sums whatever the MPI library's reduction order. ``comm`` is an mpi4py
communicator or None (one process: the "gather" is the local payload). Payloads are host NumPy
arrays; callers move device arrays with ``backend.to_numpy`` first.
"""
import numpy


def world_size(comm):
    """P: number of ranks of ``comm`` (1 when ``comm`` is None)."""
    return 1 if comm is None else comm.Get_size()


def allgather_equal(comm, payload):
    """Every rank's equal-length 1-D ``payload`` → array (P, n), row r from rank r."""
    payload = numpy.ascontiguousarray(payload).ravel()
    if comm is None:
        return payload[None, :].copy()
    out = numpy.empty((comm.Get_size(), payload.size), payload.dtype)
    comm.Allgather(payload, out)
    return out


def allgather_varying(comm, payload):
    """Every rank's 1-D ``payload`` (lengths may differ) → list of P arrays in rank order.

    Two collectives: Allgather of the int64 counts, then Allgatherv of the data into one buffer
    (displacements are the prefix sums of the counts).
    """
    payload = numpy.ascontiguousarray(payload).ravel()
    if comm is None:
        return [payload.copy()]
    counts = numpy.empty(comm.Get_size(), numpy.int64)
    comm.Allgather(numpy.array([payload.size], numpy.int64), counts)
    displs = numpy.concatenate(([0], numpy.cumsum(counts)[:-1]))
    data = numpy.empty(int(counts.sum()), payload.dtype)
    comm.Allgatherv(payload, [data, (counts.tolist(), displs.tolist())])
    return [data[d:d + c] for d, c in zip(displs, counts)]


def allreduce_max_int(comm, value):
    """MAX over ranks of one Python int (int64 on the wire)."""
    if comm is None:
        return int(value)
    out = numpy.empty(1, numpy.int64)
    from mpi4py import MPI          # only reached with a real communicator
    comm.Allreduce(numpy.array([value], numpy.int64), out, op=MPI.MAX)
    return int(out[0])
