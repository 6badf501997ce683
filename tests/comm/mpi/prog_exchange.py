"""mpiexec -n 4 python prog_exchange.py

Node communicators (emulated, shared-memory, uneven -> error on every rank), exchange_layer
touching only its layer's tensors, the float32 warm-up iterations, and checksum_check.
"""
from types import SimpleNamespace

import numpy

from fakenet import FakeNet, make_tensors
from rankutil import start, done

world = start()
from comm.exchange import GradientExchange  # noqa: E402
from comm.mpi import node_comms  # noqa: E402
from engine.errors import CaffeError  # noqa: E402

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

# exchange_layer(2) averages layer 2's two tensors and leaves the others alone
grads, w = make_tensors(rank)
net = FakeNet(grads, w)
ex = GradientExchange(world, SimpleNamespace(codec="fp32", processes_per_node=2), net)
before = net.flat_diff.copy()
ex.exchange_layer(2)
touched = numpy.zeros(net.flat_diff.size, bool)
for _, sl in net.layer_param_slices[2]:
    touched[sl] = True
all_grads = numpy.mean([numpy.concatenate(make_tensors(r)[0]) for r in range(P)], axis=0)
assert numpy.array_equal(net.flat_diff[~touched], before[~touched])
ex.exchange_tensor(slice(5, 5))                   # an empty tensor is a no-op, not a hang
assert numpy.allclose(net.flat_diff[touched], all_grads[touched], rtol=1e-6, atol=1e-7)

# warm-up: iteration 0 is float32 (MPI_SUM: its summation order may change from call to call,
# so compare with the mean at float32 precision), iteration 1 is fp8 (errors of 2^-3 scale)
net = FakeNet(*make_tensors(rank))
ex = GradientExchange(world, SimpleNamespace(codec="fp8", warmup_fp32_iters=1,
                                             processes_per_node=2), net)
ex.exchange_all()
assert numpy.allclose(net.flat_diff, all_grads, rtol=1e-6, atol=1e-7), "warm-up is not float32"
net.flat_diff[...] = FakeNet(*make_tensors(rank)).flat_diff
ex.exchange_all()
err = numpy.abs(net.flat_diff - all_grads)
assert ex.iteration == 2 and 1e-3 < err.max() < 0.25, err.max()
# iteration 2 reuses the wire buffers (padding must still be zero) and the same q: the fixed
# summation order makes it repeat iteration 1 bit for bit
second = net.flat_diff.copy()
net.flat_diff[...] = FakeNet(*make_tensors(rank)).flat_diff
ex.exchange_all()
assert numpy.array_equal(net.flat_diff, second), "fp8 exchange is not repeatable"

# checksum_check: all ranks agree, then rank 0 flips one weight and every rank sees it
assert ex.checksum_check() is True
assert ex.checksum_check([net.flat_data, net.flat_diff]) is True
if rank == 0:
    net.flat_data[17] = numpy.nextafter(net.flat_data[17], numpy.float32(9))
assert ex.checksum_check() is False
done(world, "exchange")
