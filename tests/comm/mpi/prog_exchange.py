"""mpiexec -n 4 python prog_exchange.py

Node communicators (emulated, shared-memory, uneven -> error on every rank), one layer's
future touching only its layer's tensors, the float32 warm-up iterations, repeatable fp8 bits,
and the consistency check.
"""
import numpy

from fakenet import FakeNet, iterate, make_tensors
from rankutil import start, done

world = start()
from caffe8.comm.config import parse_comm  # noqa: E402
from caffe8.comm.exchange import Exchange  # noqa: E402
from caffe8.comm.mpi import node_comms  # noqa: E402
from caffe8.engine.errors import CaffeError  # noqa: E402

P, rank = world.size, world.rank
assert P == 4, "written for 4 ranks"

intra, inter = node_comms(world.comm, 2)          # nodes {0,1} {2,3}
assert intra.allgather(rank) == [rank - rank % 2, rank - rank % 2 + 1]
assert inter.allgather(rank) == [rank % 2, rank % 2 + 2]
intra, inter = node_comms(world.comm, 0)          # one machine: one node of 4
assert intra.Get_size() == 4 and inter.Get_size() == 1
try:
    node_comms(world.comm, 3)
    raise AssertionError("4 ranks in nodes of 3 must be refused")
except CaffeError as err:
    assert "do not divide evenly" in str(err), err

# layer 2's future averages its two tensors and leaves the others alone
grads, w = make_tensors(rank)
net = FakeNet(grads, w)
ex = Exchange(world, parse_comm('codec: "fp32" processes_per_node: 2 async: false bucket_kb: 0'),
              net)
before = net.flat_diff.copy()
ex.run_now([ex.launch(2)])            # layer 2 alone: with bucket_kb 0 it is its own bucket
touched = numpy.zeros(net.flat_diff.size, bool)
for _, sl in net.layer_param_slices[2]:
    touched[sl] = True
all_grads = numpy.mean([numpy.concatenate(make_tensors(r)[0]) for r in range(P)], axis=0)
assert numpy.array_equal(net.flat_diff[~touched], before[~touched])
assert numpy.allclose(net.flat_diff[touched], all_grads[touched], rtol=1e-6, atol=1e-7)

# warm-up: iteration 0 is float32 (MPI_SUM: its summation order may change from call to call,
# so compare with the mean at float32 precision), iteration 1 is fp8 (errors of 2^-3 scale)
net = FakeNet(*make_tensors(rank))
ex = Exchange(world, parse_comm('codec: "fp8" warmup_fp32_iters: 1 processes_per_node: 2'), net)
iterate(ex, net)
assert numpy.allclose(net.flat_diff, all_grads, rtol=1e-6, atol=1e-7), "warm-up is not float32"
net.flat_diff[...] = FakeNet(*make_tensors(rank)).flat_diff
iterate(ex, net)
err = numpy.abs(net.flat_diff - all_grads)
assert ex.iteration == 2 and 1e-3 < err.max() < 0.25, err.max()
# iteration 2 reuses the wire buffers (padding must still be zero) and the same q: the fixed
# summation order makes it repeat iteration 1 bit for bit
second = net.flat_diff.copy()
net.flat_diff[...] = FakeNet(*make_tensors(rank)).flat_diff
iterate(ex, net)
assert numpy.array_equal(net.flat_diff, second), "fp8 exchange is not repeatable"
# the fp8 wire buffers came from the hierarchical sum's node-shared arena (processes of an
# emulated node share this machine's memory), so its intra-node stages ran in shared memory
hier = ex.transports["hierarchical"]
assert hier.arena is not None, hier.shared_reason
fp8_buffers = [host for host, _ in ex.reductions[ex.codec.name].buffers]
assert fp8_buffers and all(hier.arena.holds(b) for b in fp8_buffers)
# the float32 warm-up's buffers are private (the arena is sized for the configured codec only)
assert hier.arena.segment < sum(b.nbytes for b in fp8_buffers) + 4096 + 64 * len(fp8_buffers)
warm = [host for host, _ in ex.reductions[ex.fp32.name].buffers]
assert not any(hier.arena.holds(b) for b in warm)
assert any("hierarchical: node-shared" in line for line in ex.shared_memory_summary())

# consistency_check: all ranks agree, then rank 0 flips one weight and every rank sees it
assert ex.consistency_check() is True
assert ex.consistency_check([net.flat_data, net.flat_diff]) is True
if rank == 0:
    net.flat_data[17] = numpy.nextafter(net.flat_data[17], numpy.float32(9))
assert ex.consistency_check() is False
ex.close()
done(world, "exchange")
