"""comm/ipc.py: the device arena (CUDA IPC) on one process, its sums against the host's, and
what it answers without a GPU; on a GPU, or on the stand-in device (which fails on an access
no stream order makes safe). Its multi-process sums and its agreement: tests/comm/mpi
(prog_device_stage, prog_device_arena)."""
import numpy
import pytest

pytest.importorskip("mpi4py")

from caffe8.comm import fp8, ipc, ops  # noqa: E402
from caffe8.comm.collective import BLOCKING  # noqa: E402
from caffe8.comm.mpi import mpi_module  # noqa: E402
from caffe8.engine import backend  # noqa: E402


def test_every_host_sum_has_a_device_twin_in_the_kernel_table():
    for wire in ("fp8", "fp16", "fp32"):
        for rounding in ("nearest", "oyama"):
            local_sum = ops.local_sum(wire, rounding)
            assert ipc._DEVICE_SUMS[local_sum] in fp8.CUDA_KERNEL_SPECS
    with pytest.raises(ValueError, match="no device sum"):
        ipc.device_sum(lambda src, dst: None)


def test_without_a_gpu_every_process_gets_a_reason():
    if backend.on_gpu():
        pytest.skip("on a GPU")
    arena, reason = ipc.DeviceArena.create(mpi_module().COMM_SELF, 4096)
    assert arena is None and reason == "not on a GPU"


@pytest.mark.device
def test_alloc_aligned_zeroed_found_again_and_closed(device):
    arena, reason = ipc.DeviceArena.create(mpi_module().COMM_SELF, 10_000)
    assert reason is None and arena.on_device and arena.segment % ipc.ALIGN == 0
    a = arena.alloc(10, numpy.uint8)
    b = arena.alloc(7, numpy.float32)
    assert (b.data.ptr - a.data.ptr) == ipc.ALIGN and int((a == 0).sum()) == 10
    b[...] = device.arange(7, dtype=device.float32)
    device.cuda.get_current_stream().synchronize()   # the arena's stream is another one
    assert arena.peer(0, b).data.ptr == b.data.ptr           # one process: itself
    assert arena.holds(a) and arena.holds(b) and not arena.holds(device.zeros(3))
    assert not arena.holds(numpy.zeros(3)) and not arena.holds(b[::2])
    assert arena.alloc(arena.segment, numpy.uint8) is None
    host = backend.host_buffer(7, numpy.float32)
    assert numpy.array_equal(arena.stage(b, host), numpy.arange(7, dtype=numpy.float32))
    host[...] = 5
    arena.unstage(b, host)
    arena.barrier(mpi_module().COMM_SELF, BLOCKING)
    assert (device.asnumpy(b) == 5).all()
    arena.close()
    assert not arena.holds(a)


@pytest.mark.device
@pytest.mark.parametrize("wire,rounding", [("fp8", "nearest"), ("fp8", "oyama"),
                                           ("fp16", "nearest"), ("fp32", "nearest")])
def test_the_arena_sums_as_the_host_does(device, wire, rounding):
    rng = numpy.random.default_rng(4)
    dtype = ops.wire_op(wire, rounding).dtype
    if wire == "fp32":
        src = (rng.standard_normal(100_003) * 10.0 ** rng.integers(-44, 30, 100_003))
        dst = (rng.standard_normal(100_003) * 10.0 ** rng.integers(-44, 30, 100_003))
        src, dst = src.astype(numpy.float32), dst.astype(numpy.float32)   # subnormals too
    else:
        top = 256 if wire == "fp8" else 65536
        src = rng.integers(0, top, 100_003).astype(dtype)
        dst = rng.integers(0, top, 100_003).astype(dtype)
    arena, _ = ipc.DeviceArena.create(mpi_module().COMM_SELF, 1 << 20)
    d_src, d_dst = device.asarray(src), device.asarray(dst)
    device.cuda.get_current_stream().synchronize()   # written on this stream, summed on another
    arena.local_sum(ops.wire_op(wire, rounding))(d_src, d_dst)
    arena.stream.synchronize()
    ref = dst.copy()
    ops.local_sum(wire, rounding)(src, ref)
    got = device.asnumpy(d_dst)
    as_float = {"fp8": fp8.decode, "fp16": lambda c: c.view(numpy.float16),
                "fp32": lambda c: c}[wire]
    nan = numpy.isnan(as_float(ref))
    assert numpy.array_equal(numpy.isnan(as_float(got)), nan)
    assert numpy.array_equal(got[~nan], ref[~nan])
    arena.close()
