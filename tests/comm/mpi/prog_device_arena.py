"""mpiexec -n P python prog_device_arena.py CASE[,CASE...]      (the stand-in device; any P >= 2)

comm/ipc.py's agreement on the stand-in device (tests/device_standin): every process of the node
gets the arena, or every process gets ``(None, reason)`` and its exchange stages through host
memory with the bits of ``CAFFE8_IPC=0``. Rank r uses GPU r % 2 where the case has two. Cases:

twogpus    two GPUs with peer access: one arena across them; the exchange gives the host bits
nopeer     two GPUs without peer access: every process falls back, naming the pair, before any
           process opens a handle (the stand-in's opens succeed whatever the peer access, as
           CUDA's may: an access through such a mapping is what fails)
invisible  each process sees only its own GPU (its own CUDA_VISIBLE_DEVICES): the others' are
           not visible to it, so no arena
refused    process 1's IPC opens are refused: every process falls back and closes what it opened
nomemory   process 1 cannot allocate its segment: every process falls back

Prints ``CASE: OK`` on rank 0 per case; any failed check aborts the job.
"""
import os
import sys

import numpy

from fakenet import FakeNet, iterate, make_tensors
from rankutil import done, ranks_agree, start

world = start(standin=True)
from caffe8.comm.config import parse_comm  # noqa: E402
from caffe8.comm.exchange import Exchange  # noqa: E402
from caffe8.comm.ipc import DeviceArena  # noqa: E402
from caffe8.engine import backend  # noqa: E402
from tests.device_standin import devices, runtime  # noqa: E402

P, rank = world.size, world.rank
A, B = "0000:01:00.0", "0000:41:00.0"
opens = []
_open = runtime.ipcOpenMemHandle
runtime.ipcOpenMemHandle = lambda handle, flags=1: opens.append(1) or _open(handle, flags)


def setup(case):
    """This process's view of the node's GPUs for ``case``; returns the ordinal it uses."""
    devices.FAULTS.clear()
    devices.NO_PEER = set()
    devices.BUS_IDS = [A, B]
    if case == "nopeer":
        devices.NO_PEER = {frozenset((A, B))}
    elif case == "invisible":
        devices.BUS_IDS = [(A, B)[rank % 2]]
        return 0
    elif case == "refused" and rank == 1:
        devices.FAULTS.add("ipc_open")
    elif case == "nomemory" and rank == 1:
        devices.FAULTS.add("malloc")
    return rank % 2


def exchange(ipc):
    """3 iterations of an fp8 exchange (rsag: one node) on changing gradients: the means."""
    os.environ["CAFFE8_IPC"] = "1" if ipc else "0"
    cp = backend.cupy
    net = FakeNet(*make_tensors(rank))
    net.flat_diff, net.flat_data = cp.asarray(net.flat_diff), cp.asarray(net.flat_data)
    ex = Exchange(world, parse_comm('codec: "fp8" bucket_kb: 4 hierarchical: false'), net)
    summary = ex.shared_memory_summary()[0]
    out = []
    for step in range(3):
        net.flat_diff[...] = cp.asarray(numpy.concatenate(make_tensors(rank, step=step)[0]))
        iterate(ex, net)
        out.append(cp.asnumpy(net.flat_diff))
    ex.close()
    return summary, out


EXPECT = {"twogpus": None,
          "nopeer": f"no peer access from GPU {A} (process 0) to GPU {B} (process 1)",
          "invisible": f"process 1's GPU {B} is not visible to process 0",
          "refused": "process 0's segment: CUDARuntimeError",
          "nomemory": "OutOfMemoryError"}

for case in sys.argv[1].split(","):
    backend.use_gpu(setup(case))
    del opens[:]
    arena, reason = DeviceArena.create(world.comm, 4096)
    reasons = world.comm.allgather(reason)
    assert len(set(reasons)) == 1, f"{case}: the processes disagree: {reasons}"
    if EXPECT[case] is None:
        assert arena is not None and reason is None, f"{case}: {reason}"
        arena.close()
    else:
        assert arena is None and EXPECT[case] in reason, f"{case}: {reason!r}"
        if case in ("nopeer", "invisible"):
            assert not opens, f"{case}: {len(opens)} handles opened before the peer check"
    summary, device = exchange(ipc=True)
    _, host = exchange(ipc=False)
    on_gpus = "CUDA IPC" in summary
    assert on_gpus == (EXPECT[case] is None), f"{case}: {summary}"
    if not on_gpus:
        assert "host memory, not the GPUs': " in summary and EXPECT[case] in summary, summary
    for step, (h, d) in enumerate(zip(host, device)):
        assert numpy.array_equal(h.view(numpy.uint32), d.view(numpy.uint32)), \
            f"{case} step {step}: the device arena's means differ from host staging"
        assert ranks_agree(world, d), f"{case} step {step}: ranks differ"
    backend.use_cpu()
    done(world, case)
