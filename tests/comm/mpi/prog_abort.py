"""mpiexec -n P python prog_abort.py

Rank 1 raises while every other rank waits in a collective; the excepthook's MPI_Abort must end
the whole job with a non-zero status (the pytest side checks the status and the time).
"""
import numpy

from rankutil import start

world = start()
if world.rank == 1:
    raise RuntimeError("rank 1 fails on purpose")
buf = numpy.zeros(4)
world.comm.Allreduce(buf.copy(), buf)   # never completes: rank 1 is gone
print("unreachable: the collective returned", flush=True)
