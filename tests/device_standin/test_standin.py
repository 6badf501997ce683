"""The stand-in device itself: that it fails on the accesses a GPU leaves unordered and passes the
ordered ones, lands host copies only when the host waits, checks copy kinds and IPC handles, keeps
device arrays off the host, and runs a kernel's CUDA text. (Its processes sharing a segment:
tests/comm/mpi/prog_device_arena.py.)"""
import ctypes

import numpy
import pytest

from tests.device_standin import UnorderedAccess, memory, module, runtime

cp = module()


def _streams():
    return cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)


def test_a_read_needs_an_order_after_the_write():
    a, b = _streams()
    x = cp.zeros(100, cp.float32)
    cp.cuda.get_current_stream().synchronize()
    with a:
        x[10:20] = 1
    with b:
        with pytest.raises(UnorderedAccess, match=r"'setitem'.*writes \(\[40, 80\)\)"):
            x.sum()
        assert float(x[:10].sum()) == 0           # other bytes: no conflict
    b.wait_event(a.record())                     # an event orders it
    with b:
        assert float(x.sum()) == 10
    with a:
        x[...] = 2
    a.synchronize()                              # and so does the host's wait
    with b:
        assert float(x.sum()) == 200


def test_a_write_after_an_unfinished_read_fails():
    a, b = _streams()
    x = cp.ones(8, cp.float32)
    cp.cuda.get_current_stream().synchronize()
    with a:
        y = x * 2
    with b:
        with pytest.raises(UnorderedAccess, match="'multiply.__call__'"):
            x[...] = 0
        with pytest.raises(UnorderedAccess):     # its result is a's too
            y + 1
    a.synchronize()
    with b:
        x[...] = 0


def test_the_legacy_default_stream_orders_blocking_streams_only():
    x = cp.zeros(4, cp.float32)
    blocking, non_blocking = cp.cuda.Stream(), cp.cuda.Stream(non_blocking=True)
    x[...] = 3                                   # on the default stream
    with non_blocking:
        with pytest.raises(UnorderedAccess):
            x.sum()
    with blocking:
        assert float(x.sum()) == 12
    with blocking:
        x[...] = 4
    assert float(x.sum()) == 16                  # the default stream waits for blocking ones


def test_a_copy_into_pinned_memory_lands_when_the_host_waits():
    a, _ = _streams()
    x = cp.arange(6, dtype=cp.float32)
    cp.cuda.get_current_stream().synchronize()
    mem = cp.cuda.alloc_pinned_memory(24)
    host = numpy.frombuffer(mem, numpy.float32, 6)
    runtime.memcpyAsync(host.ctypes.data, x.data.ptr, 24, runtime.memcpyDeviceToHost, a.ptr)
    event = a.record()
    assert numpy.isnan(host).all()               # 0xFF bytes until the host knows
    event.synchronize()
    assert host.tolist() == [0, 1, 2, 3, 4, 5]
    with pytest.raises(runtime.CUDARuntimeError, match="cudaErrorInvalidValue"):
        runtime.memcpyAsync(x.data.ptr, host.ctypes.data, 24, runtime.memcpyDeviceToHost, a.ptr)
    page = numpy.zeros(6, numpy.float32)         # pageable: the copy is synchronous
    runtime.memcpyAsync(page.ctypes.data, x.data.ptr, 24, runtime.memcpyDefault, a.ptr)
    assert page.tolist() == [0, 1, 2, 3, 4, 5]


def test_a_copy_from_host_memory_with_a_copy_in_flight_into_it_fails():
    a, b = _streams()
    x = cp.arange(4, dtype=cp.float32)
    y = cp.zeros(4, cp.float32)
    cp.cuda.get_current_stream().synchronize()
    host = numpy.frombuffer(cp.cuda.alloc_pinned_memory(16), numpy.float32, 4)
    runtime.memcpyAsync(host.ctypes.data, x.data.ptr, 16, runtime.memcpyDeviceToHost, a.ptr)
    with pytest.raises(UnorderedAccess, match="pinned host memory"):
        runtime.memcpyAsync(y.data.ptr, host.ctypes.data, 16, runtime.memcpyHostToDevice, b.ptr)
    runtime.memcpyAsync(y.data.ptr, host.ctypes.data, 16, runtime.memcpyHostToDevice, a.ptr)
    assert cp.asnumpy(y, stream=a).tolist() == [0, 1, 2, 3]     # same stream: landed first


def test_device_arrays_stay_on_the_device():
    x = cp.arange(3, dtype=cp.float32)
    with pytest.raises(TypeError, match="Implicit conversion"):
        numpy.asarray(x)
    with pytest.raises(TypeError, match="host"):
        x + numpy.ones(3, numpy.float32)
    assert isinstance(x.max(), cp.ndarray) and x.max().shape == ()
    assert cp.get_array_module(x) is cp and cp.get_array_module(numpy.ones(2)) is numpy
    assert (x + numpy.float32(1)).get().tolist() == [1, 2, 3]
    view = x[1:]                                 # views share the memory
    view[...] = 7
    assert x.get().tolist() == [0, 7, 7] and view.data.ptr == x.data.ptr + 4
    assert numpy.isnan(cp.empty(2, cp.float32).get()).all()     # uninitialised: garbage


def test_ipc_handles_name_whole_cudamalloc_allocations_of_another_process():
    own = cp.cuda.Memory(1000)
    handle = runtime.ipcGetMemHandle(own.ptr)
    assert isinstance(handle, bytes) and len(handle) == 64
    with pytest.raises(runtime.CUDARuntimeError):
        runtime.ipcGetMemHandle(own.ptr + 16)
    with pytest.raises(runtime.CUDARuntimeError):
        runtime.ipcGetMemHandle(cp.zeros(4).data.ptr)
    with pytest.raises(runtime.CUDARuntimeError, match="its own"):
        runtime.ipcOpenMemHandle(handle)
    seg = memory.find(own.ptr)
    assert seg is not None and not seg.host
    raw = ctypes.string_at(own.ptr, 8)
    assert raw == b"\xff" * 8                    # cudaMalloc'd memory is uninitialised


def test_event_times_need_events_known_complete():
    a, _ = _streams()
    start = a.record()
    cp.ones(3).sum()
    with a:
        cp.ones(3, cp.float32) * 2
    end = a.record()
    with pytest.raises(runtime.CUDARuntimeError, match="NotReady"):
        cp.cuda.get_elapsed_time(start, end)
    end.synchronize()
    assert cp.cuda.get_elapsed_time(start, end) >= 0


def test_a_kernel_runs_its_cuda_text_broadcast_in_place_and_typed():
    k = cp.ElementwiseKernel("T x, float32 s", "T y", "y = x * (T)s + (T)i",
                             "standin_axpi", preamble="__device__ __forceinline__ int one() "
                                                      "{ return 1; }")
    x = cp.asarray(numpy.arange(5, dtype=numpy.float64))
    assert k(x, numpy.float32(0.5)).get().tolist() == [0, 1.5, 3, 4.5, 6]
    out = cp.zeros(5, cp.float64)
    assert k(x, numpy.float32(2), out) is out and out.get().tolist() == [0, 3, 6, 9, 12]
    k(out, numpy.float32(1), out)                # in place: reads, then writes its own bytes
    assert out.get().tolist() == [0, 4, 8, 12, 16]
    i32 = cp.asarray(numpy.array([7, 7], numpy.int32))
    assert k(i32, numpy.float32(3)).get().tolist() == [21, 22]
