"""comm/watchdog.py on one process: MPI requests complete in C without the GIL (the MPI
library's own MPI_Test, comm/csrc/kernels.c's c8_mpi_wait), in slices the watchdog can check
its deadline between; the request objects see the completion."""
import time
from types import SimpleNamespace

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


class _LateAnswers:
    """The control communicator of rank 1 of 2, whose rank 0 answers while rank 1 is off the
    CPU: the answer is there only once the clock has moved past the census' deadline."""

    def __init__(self, clock, answer_at, answer):
        self.clock, self.answer_at, self.answer = clock, answer_at, answer
        self.delivered = False

    def Isend(self, buf, dest, tag):
        return SimpleNamespace(Test=lambda: True, Cancel=lambda: None)

    def Iprobe(self, source, tag, status):
        if tag == 7102 and not self.delivered and self.clock[0] >= self.answer_at:
            status.source = 0
            return True
        return False

    def Recv(self, buf, source, tag):
        buf[:] = self.answer
        self.delivered = True


def test_a_census_counts_answers_that_came_while_this_rank_was_off_the_cpu(monkeypatch):
    """On a loaded machine the asking rank can sleep past its grace period while the busy rank
    answers (a slow snapshot under mpiexec -n 2 beside other work): the answer waiting in its
    queue is heard, not taken for a rank that does not answer."""
    from caffe8.comm import watchdog as wd
    clock = [100.0]
    monkeypatch.setattr(wd.time, "monotonic", lambda: clock[0])

    def descheduled(seconds):             # this rank off the CPU for 10 s
        clock[0] += 10.0
    monkeypatch.setattr(wd.time, "sleep", descheduled)
    dog = Watchdog.__new__(Watchdog)
    status = SimpleNamespace(source=None)
    status.Get_source = lambda: status.source
    dog.MPI = SimpleNamespace(ANY_SOURCE=-1, Status=lambda: status)
    dog.ctl = _LateAnswers(clock, answer_at=100.5, answer=[3, 7, 1])   # 1: writing a snapshot
    dog.rank, dog.size, dog.grace = 1, 2, 2.0
    dog.iteration, dog.started, dog.phase, dog._answers = 3, 7, 0, []
    heard = dog._census(lambda: False)
    assert heard == {0: (3, 7, 1)}
    assert not dog._stalled_ranks(heard)
