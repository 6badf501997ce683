"""Rank program: a pycaffe script under mpiexec trains data parallel through caffe8.SGDSolver.

Usage (from a folder holding data/digits): mpiexec -n 2 python mpi_solver_prog.py SOLVER ITERS
Prints one line per rank: ``rank R iter I sha256 <hash of all learned parameters>``.
"""
import hashlib
import sys

import caffe8 as caffe

solver = caffe.SGDSolver(sys.argv[1])
solver.step(int(sys.argv[2]))
digest = hashlib.sha256()
for name, blobs in solver.net.params.items():
    for blob in blobs:
        digest.update(blob.data.tobytes())
from mpi4py import MPI  # noqa: E402  (already initialised by the solver)
print(f"rank {MPI.COMM_WORLD.Get_rank()} iter {solver.iter} sha256 {digest.hexdigest()}",
      flush=True)
solver.close()
