"""The job a process belongs to, as the training loop sees it.

The loop needs a handful of collectives (broadcast rank 0's weights, agree on a flag, average
test outputs, gather per-rank resume state). They are methods of a *world* object so that the
ground floor never imports MPI: :class:`SingleProcessWorld` is the trivial world of a run
without ``mpiexec``; ``comm.mpi.World`` provides the same methods over mpi4py.

Protocol: ``rank``, ``size``, ``local_rank`` (rank among the processes of this node),
``local_size`` (the processes of this node),
``barrier()``, ``bcast(obj, root=0)``, ``gather(obj, root=0)`` (list on root, None elsewhere),
``bcast_array(host_array, root=0)`` (in place), ``allreduce_sum_array(host_array)`` (in place),
``allreduce_or(int)``, ``allgather_bytes(bytes)`` (list in rank order), ``abort(code)``. Over
MPI every one of them completes under the collective watchdog when the run has one.
"""
import os


class SingleProcessWorld:
    """Rank 0 of 1: every collective is the identity."""

    rank, size, local_rank, local_size = 0, 1, 0, 1
    comm = None

    def barrier(self):
        pass

    def bcast(self, obj, root=0):
        return obj

    def gather(self, obj, root=0):
        return [obj]

    def bcast_array(self, array, root=0):
        pass

    def allreduce_sum_array(self, array):
        pass

    def allreduce_or(self, value):
        return int(value)

    def allgather_bytes(self, data):
        return [data]

    def abort(self, code=1):
        os._exit(code)

    def __repr__(self):
        return "SingleProcessWorld()"
