"""Rank program: caffe8.ddp's hook against caffe8's own exchange, in the same processes.

Usage: mpiexec -n P python ddp_ranks.py CASE[,CASE...]   (P = 2 or 4)

Each rank joins MPI (caffe8's Exchange) and a gloo group (DDP) over the same P processes. For
the same weights and per-rank gradients (the model's loss is sum(w * g), so its gradient is g
bit for bit) the gradients DDP ends with after ``fp8_hook`` must be the bytes of caffe8's
``Exchange`` on a net of the same tensors. Cases:

flat       fp8 over all ranks (caffe8's rsag), 3 iterations, a new scale every 2; buckets in
           one piece and in pieces of 512 bytes (tensors cut across pieces, many in flight)
twolevel   nodes of P/2 ranks (caffe8's hierarchical sum with processes_per_node), both ways
contexts   (4 ranks) each tensor's own codec context reaches the step between the levels, in
           caffe8's Exchange and in the hook (a probe codec whose step depends on it)
nosync     two backward passes under no_sync, then one synchronised: the accumulated sum
exclude    named and small tensors in float32 (caffe8's fp32 codec), the rest in fp8
train      a DDP training run (static_graph) whose ranks end with bit-identical weights
slowrank   rank 0's backward sleeps between buckets, a new scale every iteration: the fast rank
           meets the scale's all-reduce while the slow one finishes pieces (they must not wait
           for each other)
cuda       the hook's CUDA side (caffe8.ddp._Cuda) on the stand-in device (tests/device_standin,
           put in place of CuPy before caffe8 is imported), CPU tensors standing for CUDA ones:
           flat (in one piece and in pieces of 512 bytes) and two-level, small tensors in
           float32, 3 changing steps, the bits of caffe8's exchange

Prints ``CASE: OK`` on rank 0 per case; any failed check aborts the job (non-zero exit).
"""
import hashlib
import os
import socket
import sys
from types import SimpleNamespace

import numpy

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

if "cuda" in sys.argv[1].split(","):
    from tests.device_standin import install
    install()
from caffe8.comm.mpi import get_world, install_excepthook  # noqa: E402

world = get_world()
install_excepthook(world)
P, rank = world.size, world.rank

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

from caffe8 import ddp  # noqa: E402
from caffe8.comm.config import parse_comm  # noqa: E402
from caffe8.comm.exchange import Exchange  # noqa: E402

torch.set_num_threads(1)
if rank == 0:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
else:
    port = None
port = world.comm.bcast(port)
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=P)

# sizes above the 1024 samples (sampled quantile), odd ones (padding), and small ones
SIZES = ((48, 47), (37,), (70, 80), (3,), (5, 9))
#: Fp8State.chunk_bytes: the default (every bucket of these tensors in one piece) and small
CHUNKS = (4 << 20, 512)


def tensors(step, scale=1.0, of=None):
    """Weights shared by every rank (|W| in 0.01..2) and the gradients of ``step`` of rank
    ``of`` (default this one)."""
    w_rng = numpy.random.default_rng(5)
    g_rng = numpy.random.default_rng([11, rank if of is None else of, step])
    weights = [(w_rng.uniform(0.01, 2.0, s) * w_rng.choice([-1, 1], s)).astype(numpy.float32)
               for s in SIZES]
    grads = [(g_rng.standard_normal(s) * scale * 10.0 ** g_rng.integers(-3, 2, s))
             .astype(numpy.float32) for s in SIZES]
    return weights, grads


class Linear(torch.nn.Module):
    """Parameters t0, t1, ... holding the weights; loss sum(t_i * g_i): the gradient is g."""

    def __init__(self, weights):
        super().__init__()
        for i, w in enumerate(weights):
            setattr(self, f"t{i}", torch.nn.Parameter(torch.from_numpy(w.copy())))

    def forward(self, grads):
        return sum((getattr(self, f"t{i}") * g).sum() for i, g in enumerate(grads))


def ddp_model(weights, **kw):
    # a small bucket cap: several buckets per iteration, rebuilt after the first
    return DDP(Linear(weights), bucket_cap_mb=0.01, **kw)


def caffe8_mean(comm_text, weights, grads_per_step):
    """caffe8's Exchange over the world: the mean gradient of each step, one tensor per layer."""
    bounds = numpy.cumsum([0] + [int(numpy.prod(s)) for s in SIZES])
    slices = [slice(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]
    net = SimpleNamespace(flat_data=numpy.concatenate([w.ravel() for w in weights]),
                          flat_diff=numpy.zeros(bounds[-1], numpy.float32),
                          layer_param_slices={i: [(i, sl)] for i, sl in enumerate(slices)},
                          layers=[SimpleNamespace(name=f"t{i}") for i in range(len(SIZES))])
    ex = Exchange(world, parse_comm(comm_text + ' async: false'), net)
    out = []
    for grads in grads_per_step:
        net.flat_diff[...] = numpy.concatenate([g.ravel() for g in grads])
        ex.on_start()
        for i in sorted(net.layer_param_slices, reverse=True):
            ex.on_backward(i)
        ex.on_gradients_ready()
        out.append(net.flat_diff.copy())
    ex.close()
    # MPI collectives can return on one rank before the others have their data: a rank that
    # went on into gloo calls would leave MPICH's progress to the others (tens of seconds)
    world.comm.Barrier()
    return out


def hook_mean(model, state, grads_per_step):
    """The gradients DDP ends with after each step's backward, flat in parameter order."""
    model.register_comm_hook(state, ddp.fp8_hook)
    out = []
    for grads in grads_per_step:
        model.zero_grad(set_to_none=False)
        model([torch.from_numpy(g) for g in grads]).backward()
        out.append(numpy.concatenate([p.grad.numpy().ravel() for p in model.parameters()]))
    return out


def same(a, b, what):
    assert len(a) == len(b)
    for step, (x, y) in enumerate(zip(a, b)):
        if not numpy.array_equal(x.view(numpy.uint32), y.view(numpy.uint32)):
            bad = numpy.flatnonzero(x.view(numpy.uint32) != y.view(numpy.uint32))
            raise AssertionError(f"{what}, step {step}: {bad.size} elements differ, first at "
                                 f"{bad[0]}: hook {x[bad[0]]!r}, caffe8 {y[bad[0]]!r}")


def case_flat():
    weights = tensors(0)[0]
    steps = [tensors(s)[1] for s in range(3)]
    ref = caffe8_mean('codec: "fp8" hierarchical: false quantile_interval: 2', weights, steps)
    for chunk in CHUNKS:
        model = ddp_model(weights)
        got = hook_mean(model, ddp.Fp8State(module=model, quantile_interval=2, chunk_bytes=chunk),
                        steps)
        same(got, ref, f"flat, pieces of {chunk} bytes")
    # lossy, but the mean: most elements near the float32 mean (fp8 keeps 2 mantissa bits;
    # ratios far above the quantile saturate)
    exact = numpy.mean([numpy.concatenate([g.ravel() for g in tensors(0, of=r)[1]])
                        for r in range(P)], axis=0)
    rel = numpy.abs(got[0] - exact) / numpy.abs(exact)
    assert not numpy.array_equal(got[0], exact)
    assert numpy.median(rel) < 0.2


def case_twolevel():
    ppn = P // 2
    weights = tensors(0)[0]
    steps = [tensors(s, scale=3.0)[1] for s in range(3)]
    ref = caffe8_mean(f'codec: "fp8" hierarchical: true processes_per_node: {ppn} '
                      f'quantile_interval: 2', weights, steps)
    flat = caffe8_mean('codec: "fp8" hierarchical: false quantile_interval: 2', weights, steps)
    for chunk in CHUNKS:
        model = ddp_model(weights)
        got = hook_mean(model, ddp.Fp8State(module=model, quantile_interval=2,
                                            processes_per_node=ppn, chunk_bytes=chunk), steps)
        same(got, ref, f"two-level, {ppn} per node, pieces of {chunk} bytes")
    if ppn > 1:      # the ×1/nodes between the levels rounds: not the flat sum's bits
        assert any(not numpy.array_equal(a, b) for a, b in zip(ref, flat))


def case_contexts():
    """Each tensor's own codec context reaches the step between the levels, in both front doors
    (4 ranks: two nodes of two). :class:`Probe` is float32 whose step multiplies each tensor's
    part by a power of two of that tensor's own, divided out again by its decode: exact, so the
    means are the float32 exchange's bits, tensor by tensor, unless a part is scaled with
    another tensor's context; and each call checks that its part lies in the wire span of the
    tensor whose context it got. Buckets of several tensors; the hook's pieces in one piece and
    of 512 bytes (tensors cut across pieces)."""
    from caffe8.comm.codecs import Float32Codec, register_codec
    bounds = numpy.cumsum([0] + [int(numpy.prod(s)) for s in SIZES])
    scales = {(int(a), int(b)): numpy.float32(2.0 ** (i + 1))
              for i, (a, b) in enumerate(zip(bounds[:-1], bounds[1:]))}

    @register_codec("probe")
    class Probe(Float32Codec):
        calls = []

        def encode(self, grad, t):
            wire, processes = super().encode(grad, t)
            return wire, SimpleNamespace(key=t.key, out=wire, processes=processes,
                                         scale=scales[t.key])

        def between_stages(self, part, ctx):
            lo, hi = ctx.out.ctypes.data, ctx.out.ctypes.data + ctx.out.nbytes
            Probe.calls.append((ctx.key, lo <= part.ctypes.data and
                                part.ctypes.data + part.nbytes <= hi))
            part *= ctx.scale

        def decode(self, wire, ctx, out):
            super().decode(wire / ctx.scale, ctx.processes, out)

    def check(got, ref, what):
        for (a, b), key in zip(zip(bounds[:-1], bounds[1:]), scales):
            same([g[a:b] for g in got], [r[a:b] for r in ref], f"{what}, tensor {key}")
        seen = {key for key, _ in Probe.calls}
        assert all(inside for _, inside in Probe.calls), f"{what}: a part had another's context"
        assert len(seen) > 1 and seen <= set(scales), f"{what}: {sorted(seen)}"
        del Probe.calls[:]

    assert P % 4 == 0, "two nodes of two or more ranks"
    weights = tensors(0)[0]
    steps = [tensors(s, scale=3.0)[1] for s in range(2)]
    text = f'hierarchical: true processes_per_node: {P // 2}'
    ref = caffe8_mean(f'codec: "fp32" {text}', weights, steps)
    assert not Probe.calls
    check(caffe8_mean(f'codec: "probe" {text}', weights, steps), ref, "caffe8's Exchange")
    for chunk in CHUNKS:
        model = ddp_model(weights)
        state = ddp.Fp8State(module=model, processes_per_node=P // 2, chunk_bytes=chunk,
                             min_elements=1 << 30)          # every tensor float32: the probe
        state.codecs["fp32"] = Probe(state.comm, state.rank)
        check(hook_mean(model, state, steps), ref, f"the hook, pieces of {chunk} bytes")
        state.close()


def case_nosync():
    weights = tensors(0)[0]
    micro = [tensors(s)[1] for s in range(3)]
    total = [(a + b) + c for a, b, c in zip(*micro)]        # autograd's accumulation order
    ref = caffe8_mean('codec: "fp8" hierarchical: false', weights, [total])
    model = ddp_model(weights)
    model.register_comm_hook(ddp.Fp8State(module=model), ddp.fp8_hook)
    model.zero_grad()
    with model.no_sync():
        for grads in micro[:2]:
            model([torch.from_numpy(g) for g in grads]).backward()
    model([torch.from_numpy(g) for g in micro[2]]).backward()
    same([numpy.concatenate([p.grad.numpy().ravel() for p in model.parameters()])], ref,
         "no_sync accumulation")


def case_exclude():
    weights = tensors(0)[0]
    steps = [tensors(s)[1] for s in range(2)]
    fp8 = caffe8_mean('codec: "fp8" hierarchical: false', weights, steps)
    fp32 = caffe8_mean('codec: "fp32" hierarchical: false', weights, steps)
    model = ddp_model(weights)
    state = ddp.Fp8State(module=model, exclude=["module.t2"], min_elements=40, chunk_bytes=256)
    got = hook_mean(model, state, steps)
    bounds = numpy.cumsum([0] + [int(numpy.prod(s)) for s in SIZES])
    as_float = [i == 2 or numpy.prod(s) < 40 for i, s in enumerate(SIZES)]
    assert as_float == [False, True, True, True, False]
    for step in range(2):
        ref = numpy.concatenate([(fp32 if f else fp8)[step][a:b] for f, a, b in
                                 zip(as_float, bounds[:-1], bounds[1:])])
        same([got[step]], [ref], "exclusions")
        assert not numpy.array_equal(fp8[step][bounds[1]:], fp32[step][bounds[1]:])


def case_train():
    torch.manual_seed(0)                               # the same initial weights everywhere
    net = torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.ReLU(), torch.nn.Linear(64, 5))
    start = [p.detach().clone() for p in net.parameters()]
    model = DDP(net, static_graph=True, bucket_cap_mb=0.002)
    model.register_comm_hook(ddp.Fp8State(), ddp.fp8_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    gen = torch.Generator().manual_seed(100 + rank)   # each rank its own data
    x, y = torch.randn(32, 20, generator=gen), torch.randint(0, 5, (32,), generator=gen)
    losses = []
    for _ in range(8):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in net.parameters()))
    digests = world.comm.allgather(digest.hexdigest())
    assert len(set(digests)) == 1, f"ranks differ after training: {digests}"
    assert all(not torch.equal(a, p) for a, p in zip(start, net.parameters()))
    assert losses[-1] < losses[0], losses


def case_close():
    """close() ends the state's thread; the exit's handler ends the threads of states left
    running and drops the hook's communicators, after which a new state makes its own."""
    from caffe8.comm.pieces import RUNNING
    weights = tensors(0)[0]
    steps = [tensors(s)[1] for s in range(2)]
    ref = caffe8_mean('codec: "fp8" hierarchical: false', weights, steps)
    states = []
    for _ in range(2):
        model = ddp_model(weights)
        states.append(ddp.Fp8State(module=model))
        same(hook_mean(model, states[-1], steps), ref, "a state's exchange")
        assert states[-1].pieces._thread.is_alive() and states[-1].pieces in RUNNING
    closed, left = states
    thread = closed.pieces._thread
    assert closed.close() and closed.close()           # the second: nothing left to end
    assert not thread.is_alive() and not closed.pieces.running and closed.pieces not in RUNNING
    assert left.pieces._thread.is_alive() and ddp._MADE
    thread = left.pieces._thread
    ddp._at_exit()
    assert not thread.is_alive() and not RUNNING and not ddp._MADE
    model = ddp_model(weights)                         # new communicators, the same result
    state = ddp.Fp8State(module=model)
    same(hook_mean(model, state, steps), ref, "a state after the exit handler")
    assert state.close()


def case_slowrank():
    import time

    class Slow(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.view_as(x)

        @staticmethod
        def backward(ctx, g):
            if rank == 0:
                time.sleep(0.05)
            return g

    class Sleepy(torch.nn.Module):
        def forward(self, x):
            return Slow.apply(x)

    torch.manual_seed(0)
    net = torch.nn.Sequential(*[m for _ in range(4) for m in (torch.nn.Linear(40, 40), Sleepy())])
    model = DDP(net, bucket_cap_mb=0.005)
    model.register_comm_hook(ddp.Fp8State(quantile_interval=1, chunk_bytes=512), ddp.fp8_hook)
    x = torch.randn(8, 40, generator=torch.Generator().manual_seed(rank))
    for _ in range(4):
        model.zero_grad()
        model(x).square().sum().backward()
    digest = hashlib.sha256(b"".join(p.grad.numpy().tobytes() for p in net.parameters()))
    digests = world.comm.allgather(digest.hexdigest())
    sums = world.comm.allgather([float(p.grad.double().abs().sum()) for p in net.parameters()])
    assert len(set(digests)) == 1, sums


def case_cuda():
    import contextlib
    from caffe8.comm.arithmetic import Device
    from caffe8.engine import backend
    from tests.device_standin import ordering

    class StandinCuda(ddp._Cuda):
        """_Cuda with its torch.cuda parts on the stand-in: its stream, the contexts that make
        it current, the wait for the gradients' event (CPU tensors: none). The arrays (DLPack),
        the sums, the between-stages step and the codec's kernels are the hook's own."""
        made = 0

        def __init__(self, dev):
            Device.__init__(self)
            self.dev, self.cupy = dev, backend.cupy
            self.stream = self.cupy.cuda.Stream(non_blocking=True)
            StandinCuda.made += 1

        @contextlib.contextmanager
        def on_thread(self):
            with self.cupy.cuda.Device(0), self.stream:
                yield

        def wait(self, event):
            assert event is None

    side = ddp._Job.side
    ddp._Job.side = lambda job: StandinCuda(job.buf.device)
    try:
        weights = tensors(0)[0]
        steps = [tensors(s, scale=3.0)[1] for s in range(3)]
        # tensors under 40 elements travel as float32 (the fp32 codec on the device, torch's
        # sum): the reference takes them from caffe8's fp32 exchange
        small = numpy.concatenate([numpy.full(int(numpy.prod(s)), numpy.prod(s) < 40)
                                   for s in SIZES])
        for ppn, chunks in ((None, CHUNKS), (P // 2, CHUNKS[1:])):
            text = 'codec: "fp8" quantile_interval: 2 hierarchical: ' + \
                (f"true processes_per_node: {ppn}" if ppn else "false")
            ref = [numpy.where(small, b, a) for a, b in zip(
                caffe8_mean(text, weights, steps),
                caffe8_mean(text.replace('"fp8"', '"fp32"'), weights, steps))]
            for chunk in chunks:
                model = ddp_model(weights)
                state = ddp.Fp8State(module=model, quantile_interval=2, chunk_bytes=chunk,
                                     processes_per_node=ppn, min_elements=40)
                got = hook_mean(model, state, steps)
                state.close()
                same(got, ref, f"CUDA side on the stand-in, {ppn or P} per node, pieces of "
                               f"{chunk} bytes")
    finally:
        ddp._Job.side = side
    ran = set(ordering._OPS.values())
    assert StandinCuda.made and {"kernel caffe8_fp8_encode_ratio_nearest",
                                 "kernel caffe8_fp8_add_nearest",
                                 "kernel caffe8_fp8_decode_ratio"} <= ran, sorted(ran)


CASES = {"flat": case_flat, "twolevel": case_twolevel, "contexts": case_contexts,
         "nosync": case_nosync,
         "exclude": case_exclude, "train": case_train, "slowrank": case_slowrank,
         "close": case_close, "cuda": case_cuda}

for name in sys.argv[1].split(","):
    CASES[name]()
    world.comm.Barrier()
    if rank == 0:
        print(f"{name}: OK", flush=True)
dist.destroy_process_group()
