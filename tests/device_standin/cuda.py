"""``cupy.cuda`` of the stand-in: devices, streams, events, memory and the runtime."""
from tests.device_standin import devices, ordering, runtime
from tests.device_standin.memory import (Memory, MemoryPointer, UnownedMemory,  # noqa: F401
                                         alloc, alloc_pinned_memory)
from tests.device_standin.ordering import Event, ExternalStream, Stream  # noqa: F401


class Device:
    """``cupy.cuda.Device(id)``: ``use()`` makes it the calling thread's current GPU."""

    def __init__(self, device=None):
        self.id = devices.current() if device is None else int(device)
        devices.check(self.id)
        self._before = []

    def use(self):
        devices.set_current(self.id)

    def __enter__(self):
        self._before.append(devices.current())
        devices.set_current(self.id)
        return self

    def __exit__(self, *exc):
        devices.set_current(self._before.pop())

    compute_capability = "90"

    @property
    def pci_bus_id(self):
        return devices.bus_id(self.id)

    def synchronize(self):
        runtime.deviceSynchronize()

    def __eq__(self, other):
        return isinstance(other, Device) and other.id == self.id

    def __hash__(self):
        return self.id


def get_current_stream(device_id=None):
    return ordering.current_stream()


def get_elapsed_time(start_event, end_event):
    return ordering.elapsed_ms(start_event, end_event)


def is_available():
    return runtime.getDeviceCount() > 0


class memory:
    """``cupy.cuda.memory``: what caffe8 names in it."""
    OutOfMemoryError = runtime.OutOfMemoryError
    Memory = Memory
    MemoryPointer = MemoryPointer
    UnownedMemory = UnownedMemory
    alloc = staticmethod(alloc)
