"""``cupy.cuda.runtime`` of the stand-in: the CUDA runtime calls caffe8 makes, with CUDA's
arguments and errors (``CUDARuntimeError``, its status and name).

Copies (``memcpyAsync``, ``memcpy``) and ``memset`` are operations on a stream like any kernel
(ordering.Op): they check and record what they read and write. The copy's ``kind`` must say
where its pointers lie (``cudaMemcpyDefault`` takes any pair). A copy into pinned or registered
host memory lands when the host learns it is complete; into host memory the stand-in does not
know (pageable), it is synchronous, as CUDA makes it.
"""
import ctypes
import os

from tests.device_standin import devices, memory, ordering

INVALID_VALUE, MEMORY_ALLOCATION, INVALID_DEVICE = 1, 2, 101
INVALID_HANDLE, NOT_READY, HOST_NOT_REGISTERED, PEER_UNSUPPORTED = 400, 600, 713, 217
_NAMES = {INVALID_VALUE: "cudaErrorInvalidValue", MEMORY_ALLOCATION: "cudaErrorMemoryAllocation",
          INVALID_DEVICE: "cudaErrorInvalidDevice",
          INVALID_HANDLE: "cudaErrorInvalidResourceHandle", NOT_READY: "cudaErrorNotReady",
          HOST_NOT_REGISTERED: "cudaErrorHostMemoryNotRegistered",
          PEER_UNSUPPORTED: "cudaErrorPeerAccessUnsupported"}
memcpyHostToHost, memcpyHostToDevice, memcpyDeviceToHost = 0, 1, 2
memcpyDeviceToDevice, memcpyDefault = 3, 4
cudaIpcMemLazyEnablePeerAccess = 1


class CUDARuntimeError(RuntimeError):
    def __init__(self, status, detail=""):
        self.status = status
        super().__init__(f"{_NAMES.get(status, status)}: {detail}")


class OutOfMemoryError(MemoryError):
    """``cupy.cuda.memory.OutOfMemoryError``."""

    def __init__(self, size, total, limit=0):
        super().__init__(f"Out of memory allocating {size:,} bytes (stand-in device)")


def getDeviceCount():
    return len(devices.BUS_IDS)


def getDevice():
    return devices.current()


def setDevice(device):
    devices.set_current(int(device))


def deviceGetPCIBusId(device):
    return devices.bus_id(int(device))


def deviceCanAccessPeer(device, peer):
    return int(devices.can_access(devices.bus_id(int(device)), devices.bus_id(int(peer))))


def runtimeGetVersion():
    return 13000


def driverGetVersion():
    return 13000


def deviceSynchronize():
    with ordering.LOCK:
        for stream in ordering.STREAMS:
            ordering.merge_host(stream.position())


def _bus():
    return devices.bus_id(devices.current())


def memset(ptr, value, size):
    """cudaMemset: on the legacy default stream (asynchronous to the host for device memory)."""
    memsetAsync(ptr, value, size, 0)


def memsetAsync(ptr, value, size, stream):
    where = memory.span(int(ptr), int(size), _bus())
    if where is None or where[0].host:
        raise CUDARuntimeError(INVALID_VALUE, f"memset of {int(ptr):#x}: not device memory")
    ordering.Op("memset", ordering.Stream.from_ptr(stream)).access(writes=[where])
    where[0].write(where[1], bytes([int(value) & 0xFF]) * int(size))


def _kind_of(where):
    return "pageable" if where is None else "host" if where[0].host else "device"


def memcpyAsync(dst, src, size, kind, stream):
    """cudaMemcpyAsync of ``size`` bytes on the stream of pointer ``stream``."""
    size = int(size)
    if size == 0:
        return
    bus = _bus()
    d, s = memory.span(int(dst), size, bus), memory.span(int(src), size, bus)
    where = (_kind_of(s), _kind_of(d))
    allowed = {memcpyHostToDevice: {("host", "device"), ("pageable", "device")},
               memcpyDeviceToHost: {("device", "host"), ("device", "pageable")},
               memcpyDeviceToDevice: {("device", "device")},
               memcpyHostToHost: {("host", "host"), ("pageable", "host"), ("host", "pageable"),
                                  ("pageable", "pageable")}}
    if kind != memcpyDefault and where not in allowed.get(kind, ()):
        raise CUDARuntimeError(INVALID_VALUE, f"memcpy kind {kind} from {where[0]} to "
                                              f"{where[1]} memory")
    op = ordering.Op(f"memcpy {where[0]} to {where[1]}", ordering.Stream.from_ptr(stream))
    op.access(reads=[s] if s else [], writes=[d] if d else [])
    data = s[0].read(s[1], s[2]) if s else _read_pageable(int(src), size)
    if d is None:
        _write_pageable(int(dst), data)
        ordering.merge_host(op.stream.position())        # to pageable memory: synchronous
    elif d[0].host:
        ordering.defer_write(d[0], d[1], data, op)
    else:
        d[0].write(d[1], data)


def memcpy(dst, src, size, kind):
    """cudaMemcpy: on the legacy default stream, and the host waits for it."""
    memcpyAsync(dst, src, size, kind, 0)
    ordering.Stream.null.synchronize()


def _read_pageable(address, size):
    return ctypes.string_at(address, size)


def _write_pageable(address, data):
    ctypes.memmove(address, data, len(data))


# --- IPC ------------------------------------------------------------------------------------
_HANDLE_TAG = b"c8standin:"
_opened = {}                    # address -> Segment opened here


def ipcGetMemHandle(ptr):
    """The 64-byte handle of the ``cudaMalloc`` allocation that starts at ``ptr`` (CUDA names
    whole allocations: a pointer into CuPy's pool, or into an allocation, is refused here)."""
    segment = memory.segment_at(int(ptr))
    if segment is None or not segment.owner:
        raise CUDARuntimeError(INVALID_VALUE, f"{int(ptr):#x} does not start a cudaMalloc "
                                              f"allocation of this process")
    return (_HANDLE_TAG + segment.name.encode()).ljust(64, b"\0")


def ipcOpenMemHandle(handle, flags=cudaIpcMemLazyEnablePeerAccess):
    """Map another process's segment here; returns its address. Refused for this process's own
    handle (as CUDA refuses it) and when the test set the ``ipc_open`` fault. The mapping opens
    whatever the GPUs' peer access: an access through it from a GPU that cannot reach the
    segment's fails (memory.span)."""
    handle = bytes(handle)
    if not handle.startswith(_HANDLE_TAG):
        raise CUDARuntimeError(INVALID_VALUE, "not an IPC memory handle")
    if "ipc_open" in devices.FAULTS:
        raise CUDARuntimeError(INVALID_HANDLE, "the test refused this process's IPC opens")
    name = handle[len(_HANDLE_TAG):].rstrip(b"\0").decode()
    if name.split("-")[2] == str(os.getpid()):
        raise CUDARuntimeError(INVALID_VALUE, "a process cannot open its own IPC handle")
    segment = memory.Segment.open(name)
    _opened[segment.ptr] = segment
    return segment.ptr


def ipcCloseMemHandle(ptr):
    """Unmap a segment opened here: every access this process made through it must be known
    complete (a close with copies in flight frees memory under them)."""
    segment = _opened.pop(int(ptr), None)
    if segment is None:
        raise CUDARuntimeError(INVALID_VALUE, f"{int(ptr):#x} was not opened here")
    busy = segment.region.log.in_flight(segment.slot)
    if len(busy):
        raise ordering.UnorderedAccess(
            f"stand-in device: ipcCloseMemHandle of {segment.region.label} with "
            f"{len(busy)} of this process's accesses to it not known to be complete (stream "
            f"{int(busy[0][4])}, operation {int(busy[0][5])})")
    segment.close()


def hostRegister(ptr, size, flags):
    memory.host_register(ptr, size)


def hostUnregister(ptr):
    memory.host_unregister(ptr)


def memGetInfo():
    return 1 << 34, 1 << 34
