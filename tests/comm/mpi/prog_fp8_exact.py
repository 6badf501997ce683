"""mpiexec -n P python prog_fp8_exact.py PPN

The fp8 sums of the explicit schedules (hierarchical with PPN processes per node and with the
real node, rsag, ring) equal an ml_dtypes simulation of the same additions in the same order,
bit for bit, on every rank, with message buffers and with buffers in the node-shared arena
(rsag and hierarchical then sum through shared memory); the flat MPI_Allreduce gives identical
bytes on every rank. "staged": the host arena behind the device arena's staging protocol
(comm/ipc.py on a CPU): the hierarchical sum hands the node's piece to a separate host mirror
for the stage between nodes and back, the piece order and the between-step as on the GPUs.
"""
import sys
from types import SimpleNamespace

import numpy

from rankutil import fp8_add, from_fp8, random_fp8, ranks_agree, start, to_fp8, done

world = start()
from caffe8.comm.allreduce import create_transport  # noqa: E402  (after start(): sys.path)
from caffe8.comm.codecs import Fp8Codec  # noqa: E402
from caffe8.comm.config import parse_comm  # noqa: E402
from caffe8.comm.ops import padded_length, wire_op  # noqa: E402
from caffe8.comm.shm import CONTROL, SharedArena  # noqa: E402

P, rank, ppn = world.size, world.rank, int(sys.argv[1])
wire = wire_op("fp8")
n = padded_length(16 * 1031 * P + 5, wire.unit, P)   # above SHARED_MIN_BYTES
inputs = [random_fp8(numpy.random.default_rng([7, r]), n) for r in range(P)]


def chain(vectors):
    """((v0 + v1) + v2) + ... with the reference fp8 add."""
    acc = vectors[0]
    for v in vectors[1:]:
        acc = fp8_add(v, acc)
    return acc


def simulate_hierarchical(local):
    nodes = P // local
    partial = [chain(inputs[k * local:(k + 1) * local]) for k in range(nodes)]
    if nodes > 1:
        partial = [to_fp8(from_fp8(s) * numpy.float32(1.0 / nodes)) for s in partial]
    return chain(partial)


def simulate_ring():
    out = numpy.empty(n, numpy.uint8)
    size = n // P
    for c in range(P):
        block = slice(c * size, (c + 1) * size)
        out[block] = chain([inputs[(c + t) % P][block] for t in range(P)])
    return out


class Staged(SharedArena):
    """The device arena's staging on host memory: ``stage`` copies the node's piece into the
    host mirror's span and spoils the piece (as a device buffer would not hold the host's
    result), ``unstage`` copies the result back."""
    on_device = True

    def stage(self, piece, host_piece):
        assert host_piece.ctypes.data != piece.ctypes.data
        host_piece[...] = piece
        piece[...] = 0xEE
        return host_piece

    def unstage(self, piece, staged):
        piece[...] = staged


def check(name, ppn_arg, expected, shared=False):
    """One sum; ``shared``: the buffer from the transport's node-shared arena (after another
    buffer, so it does not start at the segment's beginning); "staged": that arena behind the
    device arena's protocol, the sum given a separate host mirror."""
    algo = create_transport(name, world.comm, ppn_arg)
    mirror = None
    if shared:
        arena = algo.reserve(3 * n + 256)
        if name in ("rsag", "hierarchical"):
            assert arena is not None, f"{name}: no shared arena ({algo.shared_reason})"
            algo.host_buffer(n + 3, numpy.uint8)[...] = 0x55    # a neighbour, left untouched
        buf = algo.host_buffer(n, numpy.uint8)
        buf[...] = inputs[rank]
        assert algo._shared(buf) == (arena is not None)
        if shared == "staged":
            arena.__class__ = Staged
            assert algo.on_device(buf)
            mirror = numpy.full(n, 0x33, numpy.uint8)
    else:
        buf = inputs[rank].copy()
    codec = Fp8Codec(parse_comm())
    nodes = algo.stages[1]
    seen = []

    def between(piece):
        seen.append(piece.ctypes.data)
        codec.between_stages(piece, SimpleNamespace(nodes=nodes))
    algo.sum(buf, wire, between, host=mirror)
    where = f"{name} ppn={ppn_arg} shared={shared}"
    if mirror is not None and nodes > 1:
        # the node's piece (block intra-rank of P') went through the mirror's own span only
        local = P // nodes
        own = mirror.reshape(local, -1)[rank % local]
        assert seen == [own.ctypes.data], f"{where}: between-step saw {seen}"
        assert numpy.array_equal(own, buf.reshape(local, -1)[rank % local]), where
        rest = numpy.delete(mirror.reshape(local, -1), rank % local, axis=0)
        assert (rest == 0x33).all(), f"{where}: the mirror outside the piece was written"
    assert ranks_agree(world, buf), f"{where}: ranks differ"
    if expected is not None:
        bad = numpy.flatnonzero(buf != expected)
        assert bad.size == 0, (f"{where}: {bad.size} of {n} differ from the "
                               f"simulation, first at {bad[:5]}: {buf[bad[:5]]} vs "
                               f"{expected[bad[:5]]}")
    if shared and algo.arena is not None:
        mine = algo.arena.views[algo.arena.rank]
        assert (mine[CONTROL:CONTROL + n + 3] == 0x55).all(), f"{where}: neighbour overwritten"
    del buf
    algo.free()


for shared in (False, True):
    check("hierarchical", ppn, simulate_hierarchical(ppn), shared)
    check("hierarchical", 0, simulate_hierarchical(P), shared)  # one real node: all share memory
    check("rsag", 0, chain(inputs), shared)
    check("ring", 0, simulate_ring(), shared)
    check("flat", 0, None, shared)
check("hierarchical", ppn, simulate_hierarchical(ppn), "staged")
check("hierarchical", 0, simulate_hierarchical(P), "staged")
check("rsag", 0, chain(inputs), "staged")
# GPU wire buffers asked for on a CPU: the host arena, and the reason the GPUs' was not had
algo = create_transport("hierarchical", world.comm, 0)
arena = algo.reserve(4096, device=True)
assert arena is not None and not arena.on_device, algo.shared_reason
assert algo.shared_reason == "host memory, not the GPUs': not on a GPU", algo.shared_reason
assert algo.device_buffer(16, numpy.uint8) is None
algo.free()
done(world, f"fp8 exact P={P} ppn={ppn}")
