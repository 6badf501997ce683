"""The stand-in's GPUs: which this process sees, which of them reach each other's memory, the
current one of each thread, and the faults a test asks for.

``CAFFE8_STANDIN_GPUS``: the PCI bus ids of the GPUs this process sees, in ordinal order
(default one GPU, ``0000:01:00.0``); processes of one node that see the same ids share those
GPUs, as under one ``CUDA_VISIBLE_DEVICES``. ``CAFFE8_STANDIN_NO_PEER``: ``all``, or pairs
``A/B`` (comma-separated bus ids) of GPUs without peer access. Both are read when the stand-in
is imported; a test may change :data:`BUS_IDS` and :data:`NO_PEER` directly.

:data:`FAULTS` holds the names of the calls that fail in this process from now on: ``malloc``
(``cupy.cuda.Memory`` runs out of memory) and ``ipc_open`` (``ipcOpenMemHandle`` is refused),
so that one rank of a job can fail where the others succeed.
"""
import os
import threading

BUS_IDS = [b.strip() for b in os.environ.get("CAFFE8_STANDIN_GPUS", "0000:01:00.0").split(",")
           if b.strip()]
_peers = os.environ.get("CAFFE8_STANDIN_NO_PEER", "").strip()
#: "all", or a set of frozenset({bus, bus}) pairs without peer access
NO_PEER = "all" if _peers == "all" else {frozenset(p.split("/")) for p in _peers.split(",")
                                          if "/" in p}
FAULTS = set()

_local = threading.local()


def current():
    """The ordinal of the calling thread's current GPU (CUDA's is per thread, 0 at first)."""
    return getattr(_local, "device", 0)


def set_current(ordinal):
    check(ordinal)
    _local.device = ordinal


def check(ordinal):
    if not 0 <= ordinal < len(BUS_IDS):
        from tests.device_standin.runtime import CUDARuntimeError, INVALID_DEVICE
        raise CUDARuntimeError(INVALID_DEVICE, f"no GPU {ordinal}: the stand-in has "
                                               f"{len(BUS_IDS)}")


def bus_id(ordinal):
    check(ordinal)
    return BUS_IDS[ordinal]


def can_access(bus, peer_bus):
    """True when the GPU ``bus`` reaches memory on ``peer_bus`` (itself always)."""
    if bus == peer_bus:
        return True
    return NO_PEER != "all" and frozenset((bus, peer_bus)) not in NO_PEER
