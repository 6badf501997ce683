"""The stand-in's memory: device allocations, the segments CUDA IPC shares (named shared memory),
pinned and registered host memory, and the map from an address to its region.

A device pointer is a host address here, so ``memcpyAsync``'s pointers, CuPy's
``MemoryPointer.ptr`` and NumPy's ``ctypes.data`` mean what they mean on a GPU with unified
addressing. Each region records the GPU it lies on (host memory: none) and a
:class:`~tests.device_standin.ordering.Log` of its accesses in flight.

* ``cupy.empty`` and the other array constructors take private memory (CuPy's pool), filled with
  0xFF where CuPy's memory is uninitialised;
* ``cupy.cuda.Memory(n)`` (a plain ``cudaMalloc``, the kind ``ipcGetMemHandle`` names) is a file
  in /dev/shm: a header with every mapping process's pid, their host knowledge (``done``) and
  the shared access log, then the data. ``ipcOpenMemHandle`` maps it in another process;
* ``alloc_pinned_memory`` and ``hostRegister`` make host regions: device copies into them
  land when the host learns they are complete (ordering.defer_write).
Segments left by killed processes are removed the next time the stand-in is imported.
"""
import bisect
import ctypes
import glob
import mmap
import os
import weakref

import numpy

from tests.device_standin import devices, ordering

ALIGN = 512                              # CuPy's pool rounds allocations to 512 bytes
SHM_DIR = "/dev/shm"
PREFIX = "caffe8-standin-"
SLOTS = 16                               # processes that may map one segment
_RECORDS = 4096                          # accesses in flight a segment's log holds
_HEADER_INTS = 8 + SLOTS + SLOTS * ordering.MAX_STREAMS + 1 + _RECORDS * ordering.FIELDS
HEADER_BYTES = -(-_HEADER_INTS * 8 // mmap.PAGESIZE) * mmap.PAGESIZE
_MAGIC = 0xCAFFE8

#: pinned host memory of this process: bytes alive now, and allocated in all
STATS = {"pinned_live": 0, "pinned_total": 0}


class Region:
    """``size`` bytes at address ``start``: on GPU ``device`` (a bus id) or host memory."""

    def __init__(self, start, size, device, log, label):
        self.start, self.size, self.device, self.log, self.label = start, size, device, log, label
        self.host = device is None

    def write(self, lo, data):
        ctypes.memmove(self.start + lo, data, len(data))

    def read(self, lo, hi):
        return ctypes.string_at(self.start + lo, hi - lo)


_starts, _regions = [], []
_segments = weakref.WeakValueDictionary()       # address of its data -> Segment mapped here


def register(region):
    with ordering.LOCK:             # threads allocate, and finalizers free, at any time
        i = bisect.bisect_left(_starts, region.start)
        if (i < len(_regions) and _regions[i].start < region.start + region.size) or \
                (i > 0 and _regions[i - 1].start + _regions[i - 1].size > region.start):
            raise RuntimeError(f"stand-in device: {region.label} overlaps a known region")
        _starts.insert(i, region.start)
        _regions.insert(i, region)


def unregister(region):
    with ordering.LOCK:
        i = bisect.bisect_left(_starts, region.start)
        if i < len(_regions) and _regions[i] is region:
            del _starts[i], _regions[i]


def find(address):
    """The region holding ``address``, or None (host memory the stand-in does not know)."""
    with ordering.LOCK:
        i = bisect.bisect_right(_starts, address) - 1
        if i >= 0 and address < _regions[i].start + _regions[i].size:
            return _regions[i]
        return None


def span(address, nbytes, device_bus):
    """(region, lo, hi) of ``nbytes`` at ``address`` accessed from GPU ``device_bus``, or None
    for host memory the stand-in does not track. Raises when the bytes leave their region or
    the GPU cannot reach them."""
    region = find(address)
    if region is None:
        return None
    lo = address - region.start
    if lo + nbytes > region.size:
        raise RuntimeError(f"stand-in device: {nbytes} bytes at offset {lo} run past the end of "
                           f"{region.label} ({region.size} bytes)")
    if not region.host and not devices.can_access(device_bus, region.device):
        raise RuntimeError(f"stand-in device: GPU {device_bus} reads or writes {region.label} "
                           f"on GPU {region.device} without peer access between them (an "
                           f"illegal address on a device)")
    return region, lo, lo + max(nbytes, 0)


def segment_at(address):
    """The segment whose data starts at ``address`` (mapped here), or None."""
    return _segments.get(address)


def view(address, shape, dtype, strides=None):
    """A NumPy view of the memory at ``address`` (which must lie inside a known region)."""
    dtype = numpy.dtype(dtype)
    shape = tuple(int(s) for s in shape)
    count = int(numpy.prod(shape, dtype=numpy.int64))
    strides = _c_strides(shape, dtype.itemsize) if strides is None else tuple(strides)
    if count == 0:
        return numpy.empty(shape, dtype)
    extent = sum((n - 1) * s for n, s in zip(shape, strides)) + dtype.itemsize
    region = find(address)
    if region is None or address + extent > region.start + region.size or \
            min(((n - 1) * s for n, s in zip(shape, strides)), default=0) < 0:
        raise RuntimeError(f"stand-in device: no known memory holds {extent} bytes at "
                           f"{address:#x}")
    raw = (ctypes.c_ubyte * extent).from_address(address)
    first = numpy.frombuffer(raw, numpy.uint8)[:dtype.itemsize].view(dtype)
    return numpy.lib.stride_tricks.as_strided(first, shape, strides)


def _c_strides(shape, itemsize):
    strides, step = [], itemsize
    for n in reversed(shape):
        strides.append(step)
        step *= max(n, 1)
    return tuple(reversed(strides))


# --- device memory ------------------------------------------------------------------------------
class PoolMemory:
    """Device memory from CuPy's pool: private to this process, 0xFF until written."""

    def __init__(self, nbytes, device_id=None):
        self.device_id = devices.current() if device_id is None else device_id
        self.size = int(nbytes)
        self._buf = numpy.full(max(self.size, 1) + ALIGN, 0xFF, numpy.uint8)
        self.ptr = self._buf.ctypes.data + (-self._buf.ctypes.data) % ALIGN
        region = Region(self.ptr, max(self.size, 1), devices.bus_id(self.device_id),
                        ordering.Log.private(), f"a device array of {self.size} bytes")
        register(region)
        weakref.finalize(self, unregister, region)


class Segment:
    """``cudaMalloc``'d memory that CUDA IPC can share: a file in /dev/shm (header, then data)
    mapped by its owner (:meth:`create`) and by the processes that open its handle
    (:meth:`open`)."""

    def __init__(self, path, fd, owner):
        self.path, self.fd, self.owner = path, fd, owner
        self.mm = mmap.mmap(fd, 0)
        ints = numpy.frombuffer(self.mm, numpy.int64, _HEADER_INTS)
        self.meta = ints[:8]                             # magic, size, owner pid, bus id (2)
        self.pids = ints[8:8 + SLOTS]
        at = 8 + SLOTS
        self.done = ints[at:at + SLOTS * ordering.MAX_STREAMS].reshape(SLOTS, -1)
        at += SLOTS * ordering.MAX_STREAMS
        self.count = ints[at:at + 1]
        self.table = ints[at + 1:].reshape(_RECORDS, ordering.FIELDS)
        base = ctypes.c_char.from_buffer(self.mm)
        self.ptr = ctypes.addressof(base) + HEADER_BYTES
        del base
        self.region = None

    @classmethod
    def create(cls, size, bus):
        n = getattr(cls, "_made", 0)
        cls._made = n + 1
        path = os.path.join(SHM_DIR, f"{PREFIX}{os.getpid()}-{n}")
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        os.ftruncate(fd, HEADER_BYTES + max(size, 1))
        seg = cls(path, fd, owner=True)
        seg.meta[:] = (_MAGIC, size, os.getpid(), *_bus_ints(bus), 0, 0, 0)
        seg.mm[HEADER_BYTES:] = b"\xff" * max(size, 1)      # uninitialised, as cudaMalloc's
        seg._map(slot=0)
        return seg

    @classmethod
    def open(cls, name):
        path = os.path.join(SHM_DIR, name)
        fd = os.open(path, os.O_RDWR)
        seg = cls(path, fd, owner=False)
        if seg.meta[0] != _MAGIC:
            raise ValueError(f"{path} is not a stand-in segment")
        with _file_lock(fd):
            free = [i for i in range(SLOTS) if seg.pids[i] == 0]
            if not free:
                raise RuntimeError(f"stand-in device: more than {SLOTS} processes map {path}")
            slot = free[0]
            seg.pids[slot] = os.getpid()
        seg._map(slot)
        return seg

    def _map(self, slot):
        self.pids[slot] = os.getpid()
        self.slot = slot
        self.size = int(self.meta[1])
        bus = _bus_text(self.meta[3:5])
        log = ordering.Log(self.table, self.count, self.done, self.pids, slot, self.fd)
        what = "its own IPC segment" if self.owner else \
            f"the IPC segment of process {int(self.meta[2])}"
        self.region = Region(self.ptr, max(self.size, 1), bus, log,
                             f"{what} ({self.size} bytes)")
        register(self.region)
        _segments[self.ptr] = self
        ordering._SHARED.add(log)
        log.publish()

    @property
    def name(self):
        return os.path.basename(self.path)

    def close(self):
        """Unmap from this process's view (the mapping stays until the object goes: views made
        from it keep valid memory, but any access through them fails, as after
        ``ipcCloseMemHandle``)."""
        if self.region is not None:
            _segments.pop(self.ptr, None)
            unregister(self.region)
            ordering._SHARED.discard(self.region.log)
            self.region.log.forget(self.slot)
            self.region = None
        if self.owner:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass


class _file_lock:
    def __init__(self, fd):
        self.fd = fd

    def __enter__(self):
        import fcntl
        fcntl.lockf(self.fd, fcntl.LOCK_EX)

    def __exit__(self, *exc):
        import fcntl
        fcntl.lockf(self.fd, fcntl.LOCK_UN)


def _bus_ints(bus):
    raw = bus.encode().ljust(16, b"\0")[:16]
    return tuple(int.from_bytes(raw[i:i + 8], "little", signed=True) for i in (0, 8))


def _bus_text(ints):
    raw = b"".join(int(i).to_bytes(8, "little", signed=True) for i in ints)
    return raw.rstrip(b"\0").decode()


class Memory:
    """``cupy.cuda.Memory(size)``: cudaMalloc on the current GPU (a :class:`Segment`)."""

    def __init__(self, size):
        if "malloc" in devices.FAULTS:
            from tests.device_standin.runtime import OutOfMemoryError
            raise OutOfMemoryError(size, 0, 0)
        self.device_id = devices.current()
        self.segment = Segment.create(int(size), devices.bus_id(self.device_id))
        self.ptr, self.size = self.segment.ptr, int(size)
        weakref.finalize(self, self.segment.close)


class UnownedMemory:
    """Memory at ``ptr`` that another object owns (``owner`` is kept alive)."""

    def __init__(self, ptr, size, owner, device_id=None):
        self.ptr, self.size, self.owner = int(ptr), int(size), owner
        self.device_id = devices.current() if device_id is None else device_id


class MemoryPointer:
    """``mem`` at ``offset``: what a CuPy array's ``data`` is."""

    def __init__(self, mem, offset):
        self.mem, self.offset = mem, int(offset)
        self.ptr = mem.ptr + self.offset
        self.device_id = mem.device_id

    def __add__(self, n):
        return MemoryPointer(self.mem, self.offset + int(n))


def alloc(nbytes):
    return MemoryPointer(PoolMemory(nbytes), 0)


class AdoptedMemory:
    """Host memory taken as device memory of the current GPU (a CPU tensor's, through DLPack,
    standing for a CUDA tensor): the stand-in checks its own operations on it; the tensor's
    library's operations it does not see. Alive while an array uses it; ``covers``: adopted
    memories it replaced (their arrays find it by address), each of which keeps it alive."""

    def __init__(self, start, size, covers):
        self.ptr, self.size, self.device_id = start, size, devices.current()
        self.covers = covers
        for old in covers:
            old.successor = self
        region = Region(start, size, devices.bus_id(self.device_id), ordering.Log.private(),
                        f"a tensor's memory of {size} bytes (through DLPack)")
        region.adopted = weakref.ref(self)
        register(region)
        weakref.finalize(self, unregister, region)


def adopt(address, nbytes):
    """The adopted memory holding ``nbytes`` at ``address``: the one already there, or one made
    over it and every adopted memory it overlaps."""
    with ordering.LOCK:
        hi = address + max(int(nbytes), 1)
        here = find(address)
        if here is not None and hi <= here.start + here.size and hasattr(here, "adopted"):
            return here.adopted()
        i = bisect.bisect_right(_starts, address) - 1
        overlapping = [r for r in _regions[max(i, 0):] if r.start < hi and
                       r.start + r.size > address]
        if any(not hasattr(r, "adopted") for r in overlapping):
            raise RuntimeError(f"stand-in device: adopting {nbytes} bytes at {address:#x} "
                               f"would overlap memory the stand-in allocated")
        for r in overlapping:
            unregister(r)
        lo = min([address] + [r.start for r in overlapping])
        top = max([hi] + [r.start + r.size for r in overlapping])
        return AdoptedMemory(lo, top - lo, [r.adopted() for r in overlapping])


# --- host memory --------------------------------------------------------------------------------
def alloc_pinned_memory(nbytes):
    """Page-locked host memory: a zeroed ctypes buffer (NumPy's ``frombuffer`` takes it), known
    to the stand-in as a host region while it lives."""
    buf = (ctypes.c_ubyte * max(int(nbytes), 1))()
    buf.ptr, buf.size = ctypes.addressof(buf), int(nbytes)
    region = Region(buf.ptr, max(int(nbytes), 1), None, ordering.Log.private(),
                    f"pinned host memory of {int(nbytes)} bytes")
    register(region)
    STATS["pinned_live"] += int(nbytes)
    STATS["pinned_total"] += int(nbytes)
    weakref.finalize(buf, _free_pinned, region, int(nbytes))
    return buf


def _free_pinned(region, nbytes):
    unregister(region)
    STATS["pinned_live"] -= nbytes


_registered = {}


def host_register(ptr, size):
    region = Region(int(ptr), int(size), None, ordering.Log.private(),
                    f"registered host memory of {int(size)} bytes")
    register(region)
    _registered[int(ptr)] = region


def host_unregister(ptr):
    region = _registered.pop(int(ptr), None)
    if region is None:
        from tests.device_standin.runtime import CUDARuntimeError, HOST_NOT_REGISTERED
        raise CUDARuntimeError(HOST_NOT_REGISTERED, f"{int(ptr):#x} is not registered")
    unregister(region)


def remove_stale_segments():
    """Delete the segment files of processes that no longer run (a killed job's)."""
    for path in glob.glob(os.path.join(SHM_DIR, PREFIX + "*")):
        try:
            pid = int(os.path.basename(path)[len(PREFIX):].split("-")[0])
            os.kill(pid, 0)
        except ProcessLookupError:
            try:
                os.unlink(path)
            except OSError:
                pass
        except (ValueError, PermissionError):
            pass
