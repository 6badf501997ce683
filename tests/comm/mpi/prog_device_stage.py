"""mpiexec -n P python prog_device_stage.py PPN [standin]

On a GPU (every rank uses device 0), or with ``standin`` on the stand-in device
(tests/device_standin: CUDA IPC as named shared memory, and every stream order checked).

The intra-node stage on the GPUs (comm/ipc.py): an exchange of a net on the GPU sums its buckets
in the node's device arena (CUDA IPC; processes on one GPU share it as well) and gives the bits
of the same exchange staged through host memory (``CAFFE8_IPC=0``), over 3 iterations on changing
gradients, for fp8 (asynchronous after a float32 warm-up step), fp16 and fp32, asynchronous
and synchronous, through the hierarchical sum with PPN processes a node (the node's piece
crosses nodes through its host mirror) and the one-node reduce-scatter (rsag); every rank ends
with the same bytes. The start-up line names
the arena without a stale reason, on one node the device buckets have no pinned host mirror
(the stand-in counts pinned memory), and the timing (of the synchronous runs) records no D2H
or H2D for them.
"""
import os
import re
import sys

import numpy

from fakenet import FakeNet, iterate, make_tensors
from rankutil import done, ranks_agree, start

STANDIN = sys.argv[2:] == ["standin"]
world = start(standin=STANDIN)
from caffe8.comm.config import parse_comm  # noqa: E402
from caffe8.comm.exchange import Exchange  # noqa: E402
from caffe8.engine import backend  # noqa: E402

backend.use_gpu(0)
cp = backend.cupy
P, rank, ppn = world.size, world.rank, int(sys.argv[1])


def pinned_bytes():
    """Pinned host memory this process holds (the stand-in counts it; 0 on a GPU)."""
    if not STANDIN:
        return 0
    from tests.device_standin import memory
    return memory.STATS["pinned_live"]


def run(codec, asynchronous, hierarchical, ipc):
    """3 steps of one exchange; the asynchronous fp8 one starts with a float32 warm-up step
    (its buffers private, staged through host memory, then the arena's)."""
    os.environ["CAFFE8_IPC"] = "1" if ipc else "0"
    net = FakeNet(*make_tensors(rank))
    net.flat_diff, net.flat_data = cp.asarray(net.flat_diff), cp.asarray(net.flat_data)
    warmup = int(codec == "fp8" and asynchronous)
    text = (f'codec: "{codec}" async: {str(asynchronous).lower()} bucket_kb: 4 '
            f'hierarchical: {str(hierarchical).lower()} processes_per_node: {ppn} '
            f'warmup_fp32_iters: {warmup}')
    pinned = pinned_bytes()
    # timed (CUDA events read after each iteration: host waits of their own) only when
    # synchronous, so that the asynchronous runs check every ordering the exchange makes itself
    ex = Exchange(world, parse_comm(text), net, timed=not asynchronous)
    pinned = pinned_bytes() - pinned
    buckets = ex.reductions[codec]
    transport = buckets.pipeline.transport
    devices = [d for _, d in buckets.buffers]
    summary = ex.shared_memory_summary()
    assert devices and all(transport.on_device(d) for d in devices) == ipc, summary
    if ipc:             # the line says what the buffers are, and no stale reason after it
        assert re.fullmatch(r"\w+: node-shared GPU wire buffers \(CUDA IPC, [\d.]+ MiB per "
                            r"process\)", summary[0]), summary
    else:
        assert summary[0].endswith("; host memory, not the GPUs': CAFFE8_IPC=0"), summary
    one_node = transport.stages[1] == 1
    if ipc and one_node and STANDIN:    # summed on the GPUs, nothing crosses nodes: no mirror
        warm = sum(h.nbytes for name, r in ex.reductions.items() if name != codec
                   for h, _ in r.buffers)
        assert pinned == warm, f"{pinned - warm} bytes of pinned host memory for device buckets"
    out = []
    for step in range(3):
        net.flat_diff[...] = cp.asarray(numpy.concatenate(make_tensors(rank, step=step)[0]))
        iterate(ex, net)
        cp.cuda.get_current_stream().synchronize()
        out.append(cp.asnumpy(net.flat_diff))
        copies = [(t["d2h"], t["h2d"]) for t in ex.timings.layers.values()]
        # device buckets make no copy: their D2H/H2D are no event gaps, host staging's are
        assert asynchronous or (all(d == h == 0 for d, h in copies) if ipc else
                                all(d > 0 and h > 0 for d, h in copies)), copies
    ex.close()
    return out


for codec in ("fp8", "fp16", "fp32"):
    for asynchronous in (True, False):
        for hierarchical in (True, False):
            where = f"{codec} async={asynchronous} hierarchical={hierarchical}"
            host = run(codec, asynchronous, hierarchical, ipc=False)
            device = run(codec, asynchronous, hierarchical, ipc=True)
            for step, (h, d) in enumerate(zip(host, device)):
                bad = numpy.flatnonzero(h.view(numpy.uint32) != d.view(numpy.uint32))
                assert bad.size == 0, f"{where} step {step}: {bad.size} differ, first {bad[:5]}"
                assert ranks_agree(world, d), f"{where} step {step}: ranks differ"
done(world, f"device stage P={P} ppn={ppn}")
