"""caffe8's fp8 gradient exchange as a PyTorch DDP communication hook.

Oyama, Nomura, Sato and Matsuoka, *Reducing communication in data-parallel deep learning with
floating-point numbers smaller than single precision*: each tensor's ratio D = ∇W / (|W| + ε) is
scaled by 57344 / q (q: a sampled Q-quantile of |D|, the MAX over ranks) and sent as fp8, the upper
byte of an IEEE half; the fp8 pieces are summed in a fixed rank order, node by node when nodes are
given. Two lines put it into a DistributedDataParallel script::

    state = caffe8.ddp.Fp8State()
    model.register_comm_hook(state, caffe8.ddp.fp8_hook)

Every step is caffe8's own: the fp8 codec (``comm.codecs``: the ratio, the quantile tracker and
its sample positions, the fused encode and decode kernels, the ×1/nodes between the two levels),
the fp8 sum kernel (``comm.ops.local_sum``) and the summation order of caffe8's explicit schedules
(``comm.allreduce.ordered_sum``). Only the transport is PyTorch's: each bucket moves in pieces
of at most ``chunk_bytes`` wire bytes; rank r gathers block r of every rank's piece (one gather
per root, each on a communicator of its own, so that all of them run at once), adds the blocks in
ascending rank order, and broadcasts its sum back — a reduce-scatter and all-gather, as caffe8's
``rsag``; with ``processes_per_node`` the two-level form of its ``hierarchical`` sum (inside each
node first, then one block per node across nodes). So the gradients DDP receives are bit for bit
those of caffe8's exchange (``comm: { codec: "fp8" }``) for the same gradients and weights, and
the same on every rank by construction: every step is elementwise, so neither the pieces nor the
block a rank sums change a bit.

Tensors with fewer than ``min_elements`` elements and those named in ``exclude`` travel as float32
(caffe8's fp32 codec: summed in the same rank order, divided by P after), in a buffer of their own.

CPU tensors are handed to the kernels as NumPy views of the bucket, the weights and the wire
buffers (no copies); CUDA tensors as CuPy arrays through DLPack (caffe8's fused CUDA kernels) on
a stream of the hook's own that waits for the gradients. The hook returns at once: a thread of
the state encodes each piece and posts its first gathers as soon as DDP hands the bucket over, and
finishes the pieces (sums, broadcasts, decodes) oldest first while later ones travel, on
communicators of its own (``torch.distributed.new_group``), so that its collectives never
interleave with DDP's and each communicator sees them in the same order on every rank; DDP waits
for the futures before the optimizer runs. gloo's ``all_to_all_single`` moved about half a
1 Gbit/s link's rate in each direction on the emulated cluster where one gather per root moves
nearly all of it (docs/PYTORCH.md). Works with any process group that has gather and broadcast
(gloo, NCCL, MPI), with
``no_sync`` (gradients accumulated over the skipped steps are exchanged at the next synchronised
one) and ``static_graph``.

torch is optional for caffe8: ``import caffe8`` never imports it, and without it this module
raises one ImportError that says how to install it.
"""
import atexit
import collections
import contextlib
import queue
import threading
import weakref

try:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
except ImportError:                                  # one line, not a traceback into torch
    raise ImportError("caffe8.ddp needs PyTorch, which is not installed here: "
                      "pip install 'caffe8[torch]' (or pip install torch)") from None

from caffe8.comm import fp8
from caffe8.comm import config as _config            # noqa: F401  (comm's choices in the schema)
from caffe8.comm.allreduce import ordered_sum
from caffe8.comm.codecs import Tensor, create_codec
from caffe8.comm.ops import ITEM_BYTES, local_sum, padded_length
from caffe8.engine import backend
from caffe8.engine.errors import CaffeError
from caffe8.engine.message import Message
from caffe8.engine.validate import validate

__all__ = ["Fp8State", "fp8_hook"]

#: Fp8State's arguments that are fields of caffe8's comm block (engine/proto/caffe.proto holds
#: their defaults and allowed ranges); ``None`` takes the block's default
_COMM_FIELDS = ("quantile", "epsilon", "samples", "quantile_interval", "rounding")


def _comm_block(values):
    """The comm block of the fp8 codec with ``values`` set (checked against the schema, errors
    naming ``Fp8State.<argument>``)."""
    comm = Message("CommParameter", "caffe8.ddp.Fp8State")
    comm.codec, comm.relative = "fp8", True
    for name, value in values.items():
        if value is not None:
            setattr(comm, name, value)
    try:
        return validate(comm, "Fp8State")
    except CaffeError as e:                      # "Fp8State.quantile: ... allowed range ..."
        raise ValueError(f"caffe8.ddp.{e}") from None


class Fp8State:
    """The state of :func:`fp8_hook`: settings, the fp8 codec's per-tensor scales, the hook's
    communicators and its thread.

    ``process_group``: the group DDP reduces over (default: every process). ``quantile``,
    ``epsilon``, ``samples``, ``quantile_interval``, ``rounding``: the fp8 codec's settings, named
    and defaulted as the fields of caffe8's ``comm`` block (0.95, 1e-5, 1024 samples, a new q
    every 100 iterations, ``"nearest"``). ``processes_per_node``: None sums over all ranks at once
    (caffe8's ``rsag``); an integer P' makes nodes of P' consecutive ranks and sums in two levels
    (caffe8's ``hierarchical``), e.g. ``int(os.environ["LOCAL_WORLD_SIZE"])`` under torchrun.
    ``min_elements``: tensors with fewer elements travel as float32. ``exclude``: parameters
    (tensors) or parameter names (with ``module``) that travel as float32. ``chunk_bytes``: the
    wire bytes of one piece of a bucket (4 MiB): a bucket's pieces are encoded, sent, summed
    and decoded one after the other, so the first is on the link while the next is encoded.

    ``module``: the model (the DDP wrapper or the module it wraps), needed to name parameters in
    ``exclude``; it also numbers the parameters as caffe8 numbers a net's (their offsets in the
    model's parameter order), so that a net built the same way in caffe8 draws the same quantile
    samples. Without it parameters are numbered in the order the hook first meets them, which is
    the same on every rank.

    Construct it on every process of the job at the same point (it creates the hook's own
    communicators, a collective call), after ``init_process_group``.
    """

    def __init__(self, process_group=None, quantile=None, epsilon=None, samples=None,
                 processes_per_node=None, rounding=None, min_elements=0, exclude=(),
                 quantile_interval=None, module=None, chunk_bytes=4 << 20):
        if not (dist.is_available() and dist.is_initialized()):
            raise RuntimeError("caffe8.ddp.Fp8State: torch.distributed is not initialised; call "
                               "torch.distributed.init_process_group first")
        self.comm = _comm_block(dict(zip(_COMM_FIELDS, (quantile, epsilon, samples,
                                                        quantile_interval, rounding))))
        if isinstance(min_elements, bool) or not isinstance(min_elements, int) or \
                min_elements < 0:
            raise ValueError(f"caffe8.ddp.Fp8State: min_elements must be an integer >= 0, got "
                             f"{min_elements!r}")
        self.min_elements = min_elements
        if isinstance(chunk_bytes, bool) or not isinstance(chunk_bytes, int) or chunk_bytes < 1:
            raise ValueError(f"caffe8.ddp.Fp8State: chunk_bytes must be an integer >= 1, got "
                             f"{chunk_bytes!r}")
        self.chunk_bytes = chunk_bytes
        group = process_group if process_group is not None else dist.group.WORLD
        self.ranks = sorted(dist.get_process_group_ranks(group))
        self.size = len(self.ranks)
        self.rank = dist.get_rank(group)
        self.backend = dist.get_backend(group)
        self.nodes, self.local = self._node_layout(processes_per_node)
        # the hook's own communicators: its collectives never meet DDP's on one group
        self.group = _communicators(("all", self.backend, tuple(self.ranks)),
                                    lambda: dist.new_group(self.ranks, backend=self.backend))
        if processes_per_node is None:
            lists = [[self.ranks]]
        else:                                # inside each node, then across the nodes
            lists = [[self.ranks[n * self.local:(n + 1) * self.local] for n in range(self.nodes)],
                     [self.ranks[i::self.local] for i in range(self.local)]]
        mine = dist.get_rank()
        self.levels = [_communicators(("level", self.backend, tuple(map(tuple, level))),
                                      lambda level=level: _Level(level, mine, self.backend))
                       for level in lists if len(level[0]) > 1]
        #: (addends before the ×1/nodes, after): caffe8's ``Transport.stages``
        self.stages = (self.local, self.nodes) if processes_per_node is not None else \
            (self.size, 1)
        self.codecs = {"fp8": create_codec("fp8", self.comm, self.rank),
                       "fp32": create_codec("fp32", self.comm, self.rank)}
        self.iteration = 0
        self._keys, self._held, self._next = {}, [], 0
        names = self._number(module)
        self._float32 = self._excluded(exclude, names)
        self._buffers = {}
        self._queue = None
        self._thread = None
        self._failed = None

    def _node_layout(self, ppn):
        """(nodes, processes per node) for ``processes_per_node``."""
        if ppn is None:
            return 1, self.size
        if isinstance(ppn, bool) or not isinstance(ppn, int) or ppn < 1 or self.size % ppn:
            raise ValueError(f"caffe8.ddp.Fp8State: processes_per_node={ppn!r} does not divide "
                             f"the group's {self.size} processes into equal nodes")
        return self.size // ppn, ppn

    def _number(self, module):
        """Number ``module``'s parameters in its order (caffe8's flat-buffer offsets); returns
        {name: parameter}."""
        if module is None:
            return None
        inner = module.module if isinstance(module, DistributedDataParallel) else module
        names = dict(inner.named_parameters())
        for p in names.values():
            self._key(p)
        return names

    def _excluded(self, exclude, names):
        """ids of the parameters that travel as float32 by name or by identity."""
        if isinstance(exclude, (str, torch.Tensor)):
            exclude = [exclude]
        out = set()
        for item in exclude:
            if isinstance(item, torch.Tensor):
                out.add(id(item))
                continue
            if not isinstance(item, str):
                raise TypeError(f"caffe8.ddp.Fp8State: exclude takes parameter names or "
                                f"tensors, got {type(item).__name__}")
            if names is None:
                raise ValueError(f"caffe8.ddp.Fp8State: exclude names {item!r}: naming "
                                 f"parameters needs module= (the model)")
            key = item[len("module."):] if item not in names and \
                item.startswith("module.") else item
            if key not in names:
                raise ValueError(f"caffe8.ddp.Fp8State: exclude: the model has no parameter "
                                 f"{item!r}; it has {', '.join(list(names)[:8])}"
                                 f"{', ...' if len(names) > 8 else ''}")
            out.add(id(names[key]))
        return out

    def _key(self, p):
        """The tensor's key (caffe8's (start, stop) in a flat parameter buffer), made on first
        sight."""
        key = self._keys.get(id(p))
        if key is None:
            key = self._keys[id(p)] = (self._next, self._next + p.numel())
            self._next += p.numel()
            self._held.append(p)                # its id stays its own while we hold it
        return key

    def _kind(self, p):
        return "fp32" if id(p) in self._float32 or p.numel() < self.min_elements else "fp8"

    # --- the hook's side (DDP's thread) ---------------------------------------------------
    def submit(self, bucket):
        """Queue ``bucket`` for the exchange; returns the future of its mean gradient."""
        buf = bucket.buffer()
        if buf.dtype != torch.float32:
            raise TypeError(f"caffe8.ddp.fp8_hook: the bucket holds {buf.dtype} gradients; the "
                            f"fp8 exchange takes float32 (keep the model's parameters float32)")
        base = buf.data_ptr()
        tensors = [(self._key(p), p, (g.data_ptr() - base) // 4, g.numel(), self._kind(p))
                   for p, g in zip(bucket.parameters(), bucket.gradients()) if g.numel()]
        iteration = self.iteration
        if bucket.is_last():
            self.iteration += 1
        future = torch.futures.Future(devices=[buf.device] if buf.is_cuda else None)
        if self.size == 1:                       # nothing to exchange: the gradients are exact
            future.set_result(buf)
            return future
        event = None
        if buf.is_cuda:
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(buf.device))
        if self._thread is None:
            self._queue = queue.Queue()
            self._thread = threading.Thread(target=self._serve, name="caffe8-ddp", daemon=True)
            self._thread.start()
            _RUNNING.add(self)
        self._queue.put(_Job(bucket.index(), buf, tensors, iteration, event, future))
        return future

    def close(self, timeout=None):
        """End the hook's thread (after the buckets already queued), waiting at most ``timeout``
        seconds (None: until it ends). Call it on every process before
        ``torch.distributed.destroy_process_group()``; a state left running is closed when the
        interpreter exits (see :func:`_at_exit`). Returns True when no thread is left."""
        thread = self._thread
        if thread is not None:
            self._queue.put(None)
            thread.join(timeout)
            if thread.is_alive():
                return False
            self._thread = None
            _RUNNING.discard(self)
        return True

    # --- the exchange (the state's thread) --------------------------------------------------
    def _serve(self):
        """Buckets in DDP's order, each cut into pieces of at most ``chunk_bytes`` wire bytes.
        A piece is encoded and its first gathers posted as soon as its bucket arrives; pieces
        are finished (summed, broadcast back, decoded) oldest first, ``_AHEAD`` behind the
        newest, and all of them whenever no bucket waits: so one piece's encode and transfers
        overlap the others', and every communicator sees its collectives in the same order on
        every rank (pieces start in order and finish in order)."""
        device, pending = None, collections.deque()
        with contextlib.ExitStack() as scope:
            while True:
                while pending and self._queue.empty():
                    self._finish(pending, device)
                job = self._queue.get()
                if job is None:
                    self._drain(pending, device)
                    return
                if self._failed is not None:
                    job.fail(RuntimeError(f"caffe8.ddp: an earlier bucket's exchange failed: "
                                          f"{self._failed}"))
                    continue
                try:
                    if device is None:
                        device = _device_for(job.buf)
                        scope.enter_context(device.on_thread())
                    device.wait(job.event)
                    for piece in self._start(device, job, pending):
                        pending.append(piece)
                        while len(pending) > _AHEAD:
                            self._finish(pending, device)
                except BaseException as exc:    # surfaces in DDP's backward on this rank
                    self._fail(exc, job, pending)

    def _fail(self, exc, job, pending):
        self._failed = f"{type(exc).__name__}: {exc}"
        for j in {id(p.job): p.job for p in pending}.values():
            j.fail(exc)
        pending.clear()
        job.fail(exc)

    def _drain(self, pending, device):
        while pending:
            self._finish(pending, device)

    def _finish(self, pending, device):
        piece = pending.popleft()
        try:
            piece.finish(self, device)
        except BaseException as exc:
            self._fail(exc, piece.job, pending)

    def _start(self, device, job, pending):
        """Encode ``job``'s bucket piece by piece, posting each piece's first gathers; yields
        the pieces (:class:`_Piece`) in order, each as soon as it is on its way. The scale's
        agreement blocks on one all-reduce: the ``pending`` pieces are finished first, or a
        rank waiting in it and another waiting for this one's later transfers of a pending
        piece would wait for each other forever."""
        grads = device.array(job.buf)
        plan = []
        for kind in ("fp8", "fp32"):
            mine = [t for t in job.tensors if t[4] == kind]
            if not mine:
                continue
            codec = self.codecs[kind]
            wire = self._wire(job.index, kind, sum(n for _, _, _, n, _ in mine), job.buf.device)
            spans, at = [], 0
            for key, p, start, n, _ in mine:
                spans.append((at, key, device.array(p.detach()).reshape(-1),
                              grads[start:start + n]))
                at += n
            self._agree(codec, [(Tensor(key, w, job.iteration, self.size, self.stages), g)
                                for _, key, w, g in spans], job.buf.device,
                        lambda: self._drain(pending, device))
            plan.append((kind, codec, wire, spans, self._piece_length(wire)))
        job.pieces = sum(-(-wire.numel() // step) for _, _, wire, _, step in plan)
        for kind, codec, wire, spans, step in plan:
            codes = device.array(wire)
            for a in range(0, wire.numel(), step):
                piece = _Piece(job, kind, codec, wire[a:a + step])
                for at, key, w, g in spans:
                    lo, hi = max(a, at), min(a + step, at + w.size)
                    if lo < hi:
                        t = Tensor(key, w[lo - at:hi - at], job.iteration, self.size,
                                   self.stages, codes[lo:hi])
                        out = g[lo - at:hi - at]
                        piece.decodes.append((t.out, codec.encode(out, t)[1], out))
                piece.scratch = self._scratch(0, piece.wire)
                piece.gathers = self.levels[0].gather(piece.wire, piece.scratch)
                yield piece

    def _piece_length(self, wire):
        """Wire elements per piece: ``chunk_bytes`` rounded down to whole items per process."""
        unit = (ITEM_BYTES if wire.dtype == torch.uint8 else 1) * self.size
        return max(unit, self.chunk_bytes // wire.element_size() // unit * unit)

    def _scratch(self, depth, span):
        """A receive buffer for the gathers of ``span`` at level ``depth`` (level 0: one per
        piece in flight, returned by :meth:`_Piece.finish`; deeper levels: one at a time)."""
        key = (depth, span.dtype, span.numel(), span.device)
        free = self._buffers.setdefault(key, [])
        return free.pop() if free else torch.empty_like(span)

    def _give_back(self, depth, scratch):
        self._buffers[(depth, scratch.dtype, scratch.numel(), scratch.device)].append(scratch)

    def _wire(self, index, kind, n, dev):
        """Bucket ``index``'s zero-padded wire buffer of ``kind``, kept from one iteration to the
        next (each encode writes only its tensors' spans; the padding stays zero)."""
        dtype, unit = (torch.uint8, ITEM_BYTES) if kind == "fp8" else (torch.float32, 1)
        length = padded_length(n, unit, self.size)
        wire = self._buffers.get((index, kind))
        if wire is None or wire.numel() != length or wire.device != dev:
            wire = self._buffers[(index, kind)] = torch.zeros(length, dtype=dtype, device=dev)
        return wire

    def _agree(self, codec, trips, dev, drain):
        """The codec's statistic of the tensors due for a new scale, MAX over the group in one
        all-reduce (caffe8 agrees per tensor: the same maxima), after ``drain()``."""
        due = [(t, codec.device_stat(g, t)) for t, g in trips]
        due = [(t, codec.host_stat(stat)) for t, stat in due if stat is not None]
        if not due:
            return
        drain()
        values = torch.tensor([v for _, v in due], dtype=torch.float64, device=dev)
        dist.all_reduce(values, op=dist.ReduceOp.MAX, group=self.group)
        for (t, _), value in zip(due, values.tolist()):
            codec.agree(t, value)


#: pieces whose first gathers are posted while the oldest one is being finished
_AHEAD = 2
#: communicators made for one state, kept for the next of the same ranks: a process makes each
#: once however many states it builds (tests, a model re-wrapped), as every process must
_MADE = {}
#: the states whose thread runs
_RUNNING = weakref.WeakSet()
#: seconds the exit waits for a state's thread, then leaves it (a peer gone mid-exchange must not
#: hang the exit)
_EXIT_WAIT = 10.0


@atexit.register
def _at_exit():
    """End the states' threads and drop the hook's communicators while the interpreter is whole.
    Left to the interpreter's teardown, a communicator (its gloo threads, the tensors its works
    held) is destroyed after Python stopped running threads, and the process can abort at exit
    ("terminate called without an active exception") after a training that went right."""
    for state in list(_RUNNING):
        state.close(_EXIT_WAIT)
    _MADE.clear()


def _communicators(key, make):
    """``make()`` the first time ``key`` is asked for in this process (and after the default
    process group was replaced), the same object after."""
    world = dist.group.WORLD
    if key not in _MADE or _MADE[key][0] is not world:
        _MADE[key] = (world, make())
    return _MADE[key][1]


class _Job:
    """One bucket handed over by DDP: its buffer, tensors, future and unfinished pieces."""

    def __init__(self, index, buf, tensors, iteration, event, future):
        self.index, self.buf, self.tensors = index, buf, tensors
        self.iteration, self.event, self.future = iteration, event, future
        self.pieces = 0

    def done_one(self):
        self.pieces -= 1
        if self.pieces == 0:
            self.future.set_result(self.buf)

    def fail(self, exc):
        if not self.future.done():
            self.future.set_exception(exc)


class _Level:
    """One level of the sum over ``lists`` (disjoint lists of global ranks, together every
    rank; this process is in one of them, at ``index``): a gather communicator and a broadcast
    communicator per root, so that the transfers to and from different roots run at once, each
    on connections of its own (gloo's all-to-all moves about half a link's rate in both
    directions where one gather per root moves the whole, docs/PYTORCH.md)."""

    def __init__(self, lists, rank, backend):
        mine = next(ranks for ranks in lists if rank in ranks)
        self.ranks, self.index, self.count = mine, mine.index(rank), len(mine)
        self.gathers = [dist.new_subgroups_by_enumeration(lists, backend=backend)[0]
                        for _ in mine]
        self.broadcasts = [dist.new_subgroups_by_enumeration(lists, backend=backend)[0]
                           for _ in mine]

    def rows(self, span):
        return span.view(self.count, -1)

    def gather(self, span, scratch):
        """Post the gathers of ``span``'s blocks: block j of every process to process j of
        the level, into ``scratch`` (rows in rank order) on process j. Returns the works."""
        rows = list(self.rows(scratch))
        return [dist.gather(block, rows if j == self.index else None, dst=self.ranks[j],
                            group=self.gathers[j], async_op=True)
                for j, block in enumerate(self.rows(span))]

    def broadcast(self, span):
        """Post block j of ``span`` from process j to the level's others, for every j."""
        return [dist.broadcast(block, src=self.ranks[j], group=self.broadcasts[j],
                               async_op=True)
                for j, block in enumerate(self.rows(span))]


class _Piece:
    """A span of one bucket's wire buffer on its way: encoded, gathered level by level, summed
    in ascending rank order, broadcast back and decoded into the bucket."""

    def __init__(self, job, kind, codec, wire):
        self.job, self.kind, self.codec, self.wire = job, kind, codec, wire
        self.decodes = []             # (wire span, codec context, gradient span)
        self.scratch = None           # the first level's receive buffer…
        self.gathers = None           # …and its works, posted at the start

    def finish(self, state, device):
        add = device.local_sum(self.kind, self.codec.rounding if self.kind == "fp8"
                               else "nearest")
        spans, span, works, scratch = [], self.wire, self.gathers, self.scratch
        for depth, level in enumerate(state.levels):
            if depth:
                scratch = state._scratch(depth, span)
                works = level.gather(span, scratch)
            for work in works:
                work.wait()
            mine = level.rows(span)[level.index]
            mine.copy_(device.ordered_sum(level.rows(scratch), add))
            state._give_back(depth, scratch)
            if depth == 0 and len(state.levels) == 2 and self.codec.between_stages is not None:
                device.between(self.codec, mine, self.decodes[0][1])
            spans.append((level, span))
            span = mine
        for level, span in reversed(spans):
            for work in level.broadcast(span):
                work.wait()
        for codes, ctx, out in self.decodes:
            self.codec.decode(codes, ctx, out)
        self.job.done_one()


class _Host:
    """CPU tensors as NumPy views (no copies), summed by caffe8's C kernels."""

    @staticmethod
    def on_thread():
        return contextlib.nullcontext()

    @staticmethod
    def wait(event):
        pass

    @staticmethod
    def array(t):
        return t.numpy()

    @staticmethod
    def local_sum(kind, rounding):
        return local_sum(kind, rounding)

    @staticmethod
    def ordered_sum(rows, add):
        ordered_sum([row.numpy() for row in rows], add)
        return rows[0]

    @staticmethod
    def between(codec, piece, ctx):
        codec.between_stages(piece.numpy(), ctx)


_HOST = _Host()


class _Cuda:
    """CUDA tensors as CuPy arrays through DLPack (caffe8's fused CUDA kernels), on a stream of
    the hook's own that starts after the bucket's gradients are ready."""

    def __init__(self, dev):
        self.dev = dev
        self.cupy = backend.cupy
        if self.cupy is None:
            raise ImportError("caffe8.ddp: CUDA gradients need CuPy (pip install "
                              "'caffe8[cuda12]' or 'caffe8[cuda13]')")
        self.stream = torch.cuda.Stream(dev)

    @contextlib.contextmanager
    def on_thread(self):
        """Torch and CuPy on the hook's stream of this device (for the thread's life)."""
        with torch.cuda.device(self.dev), torch.cuda.stream(self.stream), \
                self.cupy.cuda.Device(self.dev.index), \
                self.cupy.cuda.ExternalStream(self.stream.cuda_stream):
            yield

    def wait(self, event):
        """The hook's stream waits for ``event`` (a bucket's gradients ready)."""
        self.stream.wait_event(event)

    def array(self, t):
        return self.cupy.from_dlpack(t)

    def local_sum(self, kind, rounding):
        if kind == "fp8":
            sum_rounding = "oyama" if rounding == "oyama" else "nearest"

            def add(src, dst):
                into = self.cupy.from_dlpack(dst)
                into[...] = fp8.add(self.cupy.from_dlpack(src), into, sum_rounding)
            return add
        # float32 through torch: IEEE sums with subnormals, as the host's (CuPy flushes them)
        return lambda src, dst: dst.add_(src)

    @staticmethod
    def ordered_sum(rows, add):
        ordered_sum(list(rows), add)
        return rows[0]

    @staticmethod
    def between(codec, piece, ctx):
        """×1/nodes through the codec's host table: one small round trip of the node's piece."""
        host = piece.cpu().numpy()
        codec.between_stages(host, ctx)
        piece.copy_(torch.from_numpy(host))


def _device_for(buf):
    """The device side of a bucket's tensors: :class:`_Cuda` for CUDA tensors, else the host's.
    (tests/caffe8/ddp_ranks.py's 'cuda' case runs the CUDA side on the stand-in device.)"""
    return _Cuda(buf.device) if buf.is_cuda else _HOST


def fp8_hook(state, bucket):
    """DDP communication hook: the mean of ``bucket``'s gradients over ``state``'s process group
    by caffe8's fp8 exchange (module docstring). Register with
    ``model.register_comm_hook(state, fp8_hook)``; ``state`` is an :class:`Fp8State`."""
    if not isinstance(state, Fp8State):
        raise TypeError(f"caffe8.ddp.fp8_hook: the state must be a caffe8.ddp.Fp8State, got "
                        f"{type(state).__name__}")
    return state.submit(bucket)
