"""mpiexec -n P python prog_killed.py

Rank 1 is killed (SIGKILL: no exception, no excepthook, no MPI_Abort) while every other rank
waits in a collective; the process manager must end the whole job with a non-zero status.
"""
import os
import signal

import numpy

from rankutil import start

world = start()
if world.rank == 1:
    os.kill(os.getpid(), signal.SIGKILL)
buf = numpy.zeros(4)
world.comm.Allreduce(buf.copy(), buf)   # never completes: rank 1 is gone
print("unreachable: the collective returned", flush=True)
