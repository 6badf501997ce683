"""comm/watchdog.py on one process: MPI requests complete in C without the GIL (the MPI
library's own MPI_Test, comm/csrc/kernels.c's c8_mpi_wait), in slices the watchdog can check
its deadline between; the request objects see the completion."""
import time

import numpy
import pytest

pytest.importorskip("mpi4py")

from caffe8.comm import kernels  # noqa: E402
from caffe8.comm.mpi import mpi_module  # noqa: E402
from caffe8.comm.watchdog import StallError, Watchdog, _mpi_test_address, _RequestWait  # noqa


@pytest.fixture
def mpi():
    MPI = mpi_module()
    if _mpi_test_address(MPI) is None:
        pytest.skip("no C kernels or no MPI_Test symbol: the watchdog polls from Python")
    return MPI


def test_a_request_waits_in_slices_and_completes_in_c(mpi):
    comm = mpi.COMM_SELF
    got = numpy.zeros(4, numpy.int64)
    recv = comm.Irecv(got, source=0, tag=5)
    block = _RequestWait(mpi, [recv], _mpi_test_address(mpi))
    t = time.monotonic()
    assert block(0.05) is False                         # nothing sent: one slice, then back
    assert time.monotonic() - t >= 0.05
    send = comm.Isend(numpy.arange(4, dtype=numpy.int64), dest=0, tag=5)
    assert _RequestWait(mpi, [send, recv], _mpi_test_address(mpi))(5.0) is True
    assert got.tolist() == [0, 1, 2, 3]
    assert recv == mpi.REQUEST_NULL and send == mpi.REQUEST_NULL   # mpi4py sees it done


def test_the_watchdog_completes_requests_and_ends_a_stalled_wait(mpi):
    comm = mpi.COMM_SELF
    lines = []
    dog = Watchdog(comm, timeout=1.0, log=lines.append, grace=0.2)
    got = numpy.zeros(3, numpy.float32)
    reqs = [comm.Irecv(got, source=0, tag=9), comm.Isend(numpy.ones(3, numpy.float32), 0, 9)]
    dog.wait(reqs)
    assert got.tolist() == [1, 1, 1] and dog.started == 1
    stuck = comm.Irecv(numpy.zeros(1), source=0, tag=11)     # never sent
    t = time.monotonic()
    with pytest.raises(StallError, match="the collective itself does not complete"):
        dog.wait(stuck)
    assert 1.0 <= time.monotonic() - t < 30 and any("warning: waiting" in l for l in lines)
    comm.Send(numpy.zeros(1), dest=0, tag=11)                # let the request finish
    stuck.Wait()
    dog.free()
    assert kernels.mpi_wait_function() is not None
