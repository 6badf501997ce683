"""caffe8's fp8 gradient exchange (Oyama, Nomura, Sato and Matsuoka) as a PyTorch DDP
communication hook (docs/PYTORCH.md): ``model.register_comm_hook(Fp8State(), fp8_hook)``.

The front door only: the hook, DDP's buckets as buffers (NumPy views of CPU tensors, CuPy arrays
of CUDA ones through DLPack on a stream of the hook's own), Fp8State's options, torch.distributed
as the transport. The exchange is the trainer's code (comm/pipeline.py, comm/allreduce.py's
levels, comm/pieces.py): DDP gets bit for bit the gradients of caffe8's exchange. ``import
caffe8`` never imports torch; without it this module raises one ImportError saying what to do.
"""
import atexit
import contextlib

try:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
except ImportError:                                  # one line, not a traceback into torch
    raise ImportError("caffe8.ddp needs PyTorch, which is not installed here: "
                      "pip install 'caffe8[torch]' (or pip install torch)") from None

from caffe8.comm import config as _config            # noqa: F401  (comm's choices in the schema)
from caffe8.comm.levels import RootedLevel, node_levels
from caffe8.comm.arithmetic import Device, Host
from caffe8.comm.codecs import create_codec
from caffe8.comm.pieces import Bucket, Pieces
from caffe8.engine import backend
from caffe8.engine.errors import CaffeError
from caffe8.engine.message import Message
from caffe8.engine.validate import validate

__all__ = ["Fp8State", "fp8_hook"]


def _whole(name, value, least, group=0):
    """``value``, an integer >= ``least`` (dividing ``group`` processes into equal nodes)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < least or \
            group and group % value:
        raise ValueError("caffe8.ddp.Fp8State: " + (
            f"{name}={value!r} does not divide the group's {group} processes into equal nodes"
            if group else f"{name} must be an integer >= {least}, got {value!r}"))
    return value


class Fp8State:
    """:func:`fp8_hook`'s settings (docs/PYTORCH.md), scales, communicators and thread. Construct
    it on every process at the same point, after ``init_process_group`` (it is collective)."""

    def __init__(self, process_group=None, quantile=None, epsilon=None, samples=None,
                 processes_per_node=None, rounding=None, min_elements=0, exclude=(),
                 quantile_interval=None, module=None, chunk_bytes=4 << 20):
        if not (dist.is_available() and dist.is_initialized()):
            raise RuntimeError("caffe8.ddp.Fp8State: torch.distributed is not initialised; call "
                               "torch.distributed.init_process_group first")
        comm = Message("CommParameter", "caffe8.ddp.Fp8State")
        comm.codec, comm.relative = "fp8", True
        for name, value in (("quantile", quantile), ("epsilon", epsilon), ("samples", samples),
                            ("quantile_interval", quantile_interval), ("rounding", rounding)):
            if value is not None:            # None: the comm block's default
                setattr(comm, name, value)
        try:
            self.comm = validate(comm, "Fp8State")   # the schema's ranges: "Fp8State.quantile: ..."
        except CaffeError as e:
            raise ValueError(f"caffe8.ddp.{e}") from None
        self.min_elements = _whole("min_elements", min_elements, 0)
        self.chunk_bytes = _whole("chunk_bytes", chunk_bytes, 1)
        group = process_group if process_group is not None else dist.group.WORLD
        ranks = sorted(dist.get_process_group_ranks(group))
        local = _whole("processes_per_node", len(ranks) if processes_per_node is None
                       else processes_per_node, 1, len(ranks))
        self.transport = _Torch(ranks, dist.get_backend(group), local)
        self.size, self.rank, self.stages = len(ranks), dist.get_rank(group), self.transport.stages
        self.codecs = {kind: create_codec(kind, self.comm, self.rank) for kind in ("fp8", "fp32")}
        self.pieces = Pieces(self.transport, self.codecs, self.chunk_bytes, "caffe8-ddp")
        self.iteration, self._next, self._keys = 0, 0, {}
        inner = module.module if isinstance(module, DistributedDataParallel) else module
        names = None if module is None else dict(inner.named_parameters())
        for p in (names or {}).values():     # numbered in the model's order, as caffe8's net
            self._key(p)
        self._float32 = {id(self._parameter(item, names)) for item in (
            [exclude] if isinstance(exclude, (str, torch.Tensor)) else exclude)}

    @staticmethod
    def _parameter(item, names):
        """The parameter ``exclude`` names by name or by identity."""
        if isinstance(item, torch.Tensor):
            return item
        if not isinstance(item, str):
            raise TypeError(f"caffe8.ddp.Fp8State: exclude takes parameter names or tensors, "
                            f"got {type(item).__name__}")
        if names is None:
            raise ValueError(f"caffe8.ddp.Fp8State: exclude names {item!r}: naming parameters "
                             f"needs module= (the model)")
        key = item[len("module."):] if item not in names and item.startswith("module.") else item
        if key not in names:
            raise ValueError(f"caffe8.ddp.Fp8State: exclude: the model has no parameter "
                             f"{item!r}; it has {', '.join(list(names)[:8])}"
                             f"{', ...' if len(names) > 8 else ''}")
        return names[key]

    def _key(self, p):
        """``p``'s key: caffe8's (start, stop) in a flat parameter buffer (``p`` held with it)."""
        if id(p) not in self._keys:
            self._keys[id(p)] = ((self._next, self._next + p.numel()), p)
            self._next += p.numel()
        return self._keys[id(p)][0]

    def _kind(self, p):
        return "fp32" if id(p) in self._float32 or p.numel() < self.min_elements else "fp8"

    def submit(self, bucket):
        """Queue DDP's ``bucket`` for the exchange; returns the future of its mean gradient."""
        buf = bucket.buffer()
        if buf.dtype != torch.float32:
            raise TypeError(f"caffe8.ddp.fp8_hook: the bucket holds {buf.dtype} gradients; the "
                            f"fp8 exchange takes float32 (keep the model's parameters float32)")
        job = _Job(bucket.index(), buf, self.iteration,
                   [(self._key(p), p, (g.data_ptr() - buf.data_ptr()) // 4, g.numel(),
                     self._kind(p)) for p, g in zip(bucket.parameters(), bucket.gradients())
                    if g.numel()])
        self.iteration += bucket.is_last()
        if buf.is_cuda:
            job.event = torch.cuda.Event()
            job.event.record(torch.cuda.current_stream(buf.device))
        self.transport.device = buf.device
        self.pieces.put(job)
        return job.future

    def close(self, timeout=None):
        """End the hook's thread (at most ``timeout`` s; True: ended) on every process before
        ``destroy_process_group()``; the exit closes a state left running."""
        return self.pieces.close(timeout)


class _Job(Bucket):
    """One bucket handed over by DDP: ``given`` [(key, parameter, offset, length, kind)]."""

    def __init__(self, index, buf, iteration, given):
        super().__init__((index, buf.device), iteration,
                         torch.futures.Future(devices=[buf.device] if buf.is_cuda else None), buf)
        self.buf, self.given = buf, given

    def side(self):
        """CUDA tensors' (ddp_ranks.py's 'cuda' case: on the stand-in device), or CPU ones'."""
        return _Cuda(self.buf.device) if self.buf.is_cuda else _Host()

    def tensors(self, side):
        grads = side.array(self.buf)
        return [(key, side.array(p.detach()).reshape(-1), grads[start:start + n], kind)
                for key, p, start, n, kind in self.given]

    def zeros(self, length, dtype):
        return torch.zeros(length, dtype=getattr(torch, dtype.name), device=self.buf.device)


class _Level(RootedLevel):
    """A level over ``lists`` (disjoint lists of global ranks): a gather and a broadcast
    communicator per root, so that the transfers to and from all roots run at once."""
    empty_like = staticmethod(torch.empty_like)

    def __init__(self, lists, rank, backend):
        self.ranks = next(ranks for ranks in lists if rank in ranks)
        super().__init__(len(self.ranks), self.ranks.index(rank))
        self.gathers, self.broadcasts = (
            [dist.new_subgroups_by_enumeration(lists, backend=backend)[0] for _ in self.ranks]
            for _ in range(2))

    def gather(self, j, block, rows):
        return dist.gather(block, rows, dst=self.ranks[j], group=self.gathers[j], async_op=True)

    def broadcast(self, j, block):
        return dist.broadcast(block, src=self.ranks[j], group=self.broadcasts[j], async_op=True)


class _Torch:
    """torch.distributed as the pipeline's transport: the agreement's all-reduce and the levels
    (comm.levels.node_levels) on communicators of the hook's own, never DDP's."""

    def __init__(self, ranks, backend, local):
        self.size, self.stages, self.device = len(ranks), (local, len(ranks) // local), None
        self.group = _communicators(("all", backend, tuple(ranks)),
                                    lambda: dist.new_group(ranks, backend=backend))
        self.levels = [_communicators(("level", backend, tuple(map(tuple, level))),
                                      lambda level=level: _Level(level, dist.get_rank(), backend))
                       for level in node_levels(ranks, local)]

    def maxima(self, values):
        values = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(values, op=dist.ReduceOp.MAX, group=self.group)
        return values.tolist()


class _Host(Host):
    """CPU tensors as NumPy views (no copies)."""

    @staticmethod
    def array(t):
        return t.numpy()


class _Cuda(Device):
    """CUDA tensors as CuPy arrays through DLPack, on a stream of the hook's own."""

    def __init__(self, dev):
        super().__init__()
        if backend.cupy is None:
            raise ImportError("caffe8.ddp: CUDA gradients need CuPy (caffe8[cuda12] or [cuda13])")
        self.dev, self.cupy, self.stream = dev, backend.cupy, torch.cuda.Stream(dev)

    @contextlib.contextmanager
    def on_thread(self):                     # torch and CuPy on the hook's stream
        with torch.cuda.device(self.dev), torch.cuda.stream(self.stream), \
                self.cupy.cuda.Device(self.dev.index), \
                self.cupy.cuda.ExternalStream(self.stream.cuda_stream):
            yield

    def wait(self, event):
        self.stream.wait_event(event)

    def array(self, t):
        return self.cupy.from_dlpack(t)


#: communicators made for one state, kept for the next of the same ranks (as every process must)
_MADE = {}


@atexit.register
def _at_exit():
    """End the states' threads (10 s each at most: a peer may be gone), then drop the
    communicators while the interpreter is whole (in its teardown gloo's threads can abort)."""
    Pieces.close_all(10.0)
    _MADE.clear()


def _communicators(key, make):
    """``make()`` once per ``key`` in this process (and default process group)."""
    world = dist.group.WORLD
    if key not in _MADE or _MADE[key][0] is not world:
        _MADE[key] = (world, make())
    return _MADE[key][1]


def fp8_hook(state, bucket):
    """DDP communication hook (``model.register_comm_hook(state, fp8_hook)``, ``state`` an
    :class:`Fp8State`): the mean of ``bucket``'s gradients by caffe8's fp8 exchange."""
    if not isinstance(state, Fp8State):
        raise TypeError(f"caffe8.ddp.fp8_hook: the state must be a caffe8.ddp.Fp8State, got "
                        f"{type(state).__name__}")
    return state.submit(bucket)
