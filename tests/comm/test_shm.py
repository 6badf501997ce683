"""comm/shm.py: the node-shared arena on one process (COMM_SELF): allocation, offsets, cleanup,
and the reasons it gives when shared memory cannot be had."""
import os

import numpy
import pytest

pytest.importorskip("mpi4py")

from caffe8.comm import shm  # noqa: E402
from caffe8.comm.mpi import mpi_module  # noqa: E402


@pytest.fixture
def self_comm():
    return mpi_module().COMM_SELF


def test_alloc_aligned_zeroed_and_found_again(self_comm):
    if not os.path.isdir(shm.SHM_DIR):
        pytest.skip("no /dev/shm")
    arena, reason = shm.SharedArena.create(self_comm, 1000)
    assert reason is None and arena.segment % 4096 == 0 and arena.segment >= 1000
    a = arena.alloc(10, numpy.uint8)
    b = arena.alloc(7, numpy.float32)
    assert (a == 0).all() and (b == 0).all() and b.dtype == numpy.float32
    offsets = [x.__array_interface__["data"][0] - arena.views[0].__array_interface__["data"][0]
               for x in (a, b)]
    assert offsets == [64, 128]      # after the barrier counter; each on its own cache line
    b[...] = numpy.arange(7)
    assert numpy.array_equal(arena.peer(0, b), numpy.arange(7))     # one process: itself
    assert arena.holds(a) and arena.holds(b) and not arena.holds(numpy.zeros(3))
    assert not arena.holds(b[::2])                  # not contiguous
    assert arena.alloc(arena.segment, numpy.uint8) is None          # no room left
    arena.close()
    assert not arena.holds(a)


def test_no_file_is_left_behind(self_comm):
    if not os.path.isdir(shm.SHM_DIR):
        pytest.skip("no /dev/shm")
    before = set(os.listdir(shm.SHM_DIR)) if os.path.isdir(shm.SHM_DIR) else set()
    arena, _ = shm.SharedArena.create(self_comm, 1 << 20)
    after = set(os.listdir(shm.SHM_DIR)) if os.path.isdir(shm.SHM_DIR) else set()
    assert not {f for f in after - before if f.startswith("caffe8-")}   # unlinked once mapped
    assert arena is not None
    if arena is not None:
        arena.views[0][:] = 1                      # the pages are there (fallocate reserved them)
        arena.close()


def test_missing_directory_gives_a_reason(self_comm, monkeypatch, tmp_path):
    monkeypatch.setattr(shm, "SHM_DIR", str(tmp_path / "absent"))
    arena, reason = shm.SharedArena.create(self_comm, 4096)
    assert arena is None and "absent" in reason


def test_too_large_for_the_filesystem_gives_a_reason(self_comm):
    if not os.path.isdir(shm.SHM_DIR):
        pytest.skip("no /dev/shm")
    st = os.statvfs(shm.SHM_DIR)
    arena, reason = shm.SharedArena.create(self_comm, st.f_frsize * st.f_blocks * 2)
    assert arena is None and "No space" in reason


def caffe8_files():
    return {f for f in os.listdir(shm.SHM_DIR) if f.startswith("caffe8-")} \
        if os.path.isdir(shm.SHM_DIR) else set()


def test_a_segment_that_cannot_be_pinned_gives_a_reason(self_comm, monkeypatch):
    """On a GPU the own segment is page-locked; if the driver refuses, no arena (on every
    process, since the outcome is agreed), the reason says why, and no file stays behind."""
    def refuse(array):
        raise RuntimeError("cudaErrorHostMemoryAlreadyRegistered")
    before = caffe8_files()
    monkeypatch.setattr(shm.backend, "pin_host", refuse)
    arena, reason = shm.SharedArena.create(self_comm, 4096)
    assert arena is None and "cudaErrorHostMemoryAlreadyRegistered" in reason
    assert caffe8_files() <= before


def test_an_error_during_agreement_still_removes_the_file(self_comm, monkeypatch):
    """The shared file is unlinked even when the agreement itself fails."""
    class Failing:
        def __getattr__(self, name):
            return getattr(self_comm, name)

        def allreduce(self, *args, **kwargs):
            raise RuntimeError("the job is going down")
    before = caffe8_files()
    with pytest.raises(RuntimeError):
        shm.SharedArena.create(Failing(), 4096)
    assert caffe8_files() <= before


def _counters(n):
    """n barrier counters one segment (4096 bytes) apart, the futex word after the first."""
    mapping = numpy.zeros(n * 4096 // 8, numpy.uint64)
    base = mapping.ctypes.data
    return mapping, base, base + shm.FUTEX


def test_the_barrier_sleeps_on_the_futex_without_the_gil_and_wakes_at_the_arrival():
    """Process 1 has arrived, process 0 arrives later from another thread: the waiter returns
    at that arrival, long before its timeout. The switch interval is raised to 5 s, so a waiter
    that held the GIL (a poll in Python) would keep the arriving thread from running for that
    long."""
    import sys
    import threading
    import time
    from caffe8.comm import kernels
    functions = kernels.shm_barrier_functions()
    if functions is None:
        pytest.skip("no C kernels: the barrier is MPI's")
    arrive, wait = functions
    mapping, base, futex = _counters(2)
    arrive(base + 4096, 1, futex)                                 # process 1: epoch 1
    assert wait(base, 4096, 2, 1, futex, int(0.05e9)) == 0        # process 0 is not there
    result = {}

    def waiter():
        t = time.monotonic()
        result["done"] = wait(base, 4096, 2, 1, futex, int(3e9))
        result["seconds"] = time.monotonic() - t

    before = sys.getswitchinterval()
    sys.setswitchinterval(5.0)
    try:
        thread = threading.Thread(target=waiter)
        thread.start()
        time.sleep(0.2)
        arrive(base, 1, futex)                                    # process 0 arrives
        thread.join(10)
    finally:
        sys.setswitchinterval(before)
    assert result["done"] == 1 and 0.15 < result["seconds"] < 2.0
    assert mapping[0] == mapping[4096 // 8] == 1 and mapping.view(numpy.uint32)[2] == 2
