#!/usr/bin/env python
"""caffe8 against PyTorch DDP on an emulated cluster: the same work over the same shaped link.

Usage (as root, from the repository root; PyTorch only needed for the ``ddp-*`` variants)::

    python -m scripts.cluster_bench --nets caffenet --layouts 2x1 --rates 1gbit,10gbit \\
        --variants c8-fp32-sync,c8-fp32-async,c8-fp16-async,c8-fp8-async,ddp-fp32,ddp-fp16 \\
        --iters 12 --skip 4 --rounds 2 --out runs/cluster --csv docs/figures/cluster_bench.csv

    # caffe8's hook against DDP's own exchanges (docs/PYTORCH.md):
    python -m scripts.cluster_bench --nets caffenet,googlenet --layouts 2x1,2x2 \\
        --variants ddp-fp32,ddp-fp16,ddp-bf16,ddp-powersgd1,ddp-powersgd4,ddp-fp8,ddp-fp8h \\
        --rates 1gbit,10gbit --iters 12 --skip 4 --rounds 2 --csv runs/cluster/hooks.csv

For every link rate and node count it brings up an emulated cluster (``caffe8.cluster``, what
``caffe8 cluster`` runs: network namespaces behind a ``tc``-shaped switch), and then,
``--rounds`` times, runs every (net, layout, variant) in turn — interleaved, so a change in the
machine's load hits every variant alike. Layout ``NxP`` is N nodes of P processes.

Nets: ``caffenet`` and ``googlenet`` are the emulated ones (prototxt/*_emulated: the real
tensors, GPU-like compute that sleeps); ``lenet`` is BVLC's LeNet with real compute on the host
(its data layers become inputs of zeros on both sides, one BLAS / intra-op thread a process).

caffe8 variants ``c8-<codec>-<sync|async>`` train the net's solver with that ``comm`` block
(``mpiexec`` across the nodes, one timing log per rank). DDP variants run
``python -m scripts.cluster_bench --ddp-worker`` under the same mpiexec: PyTorch's
DistributedDataParallel with gloo over the same link (``GLOO_SOCKET_IFNAME=eth0``), one
intra-op thread per process as torchrun sets it, with the exchange ``ddp-<hook>``:

``ddp-fp32``        DDP's own allreduce (no hook)
``ddp-fp16``, ``ddp-bf16``  PyTorch's fp16_compress_hook / bf16_compress_hook
``ddp-powersgd1``, ``ddp-powersgd4``  PowerSGD of rank 1 / 4 with error feedback and the
                    documented warm start (Q of the last iteration), compressing from
                    iteration 2 (PyTorch's minimum with warm start): keep ``--skip`` >= 2
``ddp-fp8``         caffe8.ddp.fp8_hook summing over all ranks at once
``ddp-fp8h``        caffe8.ddp.fp8_hook in two levels, nodes of the layout's P processes
``ddp-none``        no exchange at all (PyTorch's debugging noop_hook): DDP's compute floor,
                    which no exchange can beat

(the hooks are registered by examples/pytorch_ddp_fashion_mnist.py's ``register_hook``, the
one place that knows them). Both sides do the same work: the DDP model is built from the same
prototxt (the emulated nets: the same parameter tensors, the same per-layer sleeping
forward/backward times in the same order, the same sum losses, so every gradient is a nonzero
1; LeNet: the same layers; SGD with the solver's lr, momentum and weight decay).

A point's time per iteration is the median over ranks' slowest and iterations after ``--skip``
(caffe8: the timing log's ``wall``, which covers clearing diffs, forward/backward, exchange and
update; DDP: ``zero_grad`` to the end of ``step``). "Exposed communication" is that minus the same
side's one-process time of the same net (run once per round on node 0 with no exchange at
all): what the exchange adds to an iteration. The link's byte counter is read
every 50 ms during a run (``link_mb``: megabytes node 0 sent per measured iteration, between
the first measured iteration's start and the last one's end, from the timing records' start
times).

Writes ``--csv`` (one row per point and round, and the medians over rounds as ``round = all``)
and a PNG beside it (per-iteration time and exposed communication per variant); with more than
one process count, also ``<csv>_weak.csv`` / ``.png`` (weak scaling: speedup over the
one-process run against the processes, the form of Oyama et al.'s figure 7) or, with
``--global-batch G`` (strong scaling: P processes share a batch of G, each one's emulated compute
its share), ``<csv>_strong.csv`` / ``.png`` (time per iteration against the processes).

More processes than cores (``--dilation auto``; caffe8.cluster's time dilation): each node is
capped at ppn/k cores, the links and the emulated compute run k times slower, and every time is
reported divided by k, that of nodes with a core per process. ``--narrow W`` divides the
emulated tensors' first axes by W and the link's rate by the share left, so that 16 processes fit
in memory with the bytes per millisecond of compute unchanged. ``mpi-fp32`` is the
reference transfer: one plain MPI_Allreduce of all the net's float32 gradients per iteration.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from studies._runs import label_axes, pyplot, save_figure

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)

NETS = {"caffenet": "prototxt/caffenet_emulated/solver.prototxt",
        "googlenet": "prototxt/googlenet_emulated/solver.prototxt",
        "lenet": "prototxt/lenet/solver.prototxt"}
# LeNet runs its real compute on the host: its data layers become inputs of these shapes
# (zeros on both sides: the same arithmetic, no data files), one BLAS / intra-op thread a process
LENET_INPUTS = {"data": (64, 1, 28, 28), "label": (64,)}
REAL_COMPUTE_ENV = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
FIELDS = ("net", "layout", "nodes", "ppn", "rate", "variant", "round", "iterations",
          "iter_ms", "exposed_ms", "baseline_ms", "comm_ms", "transfer_ms", "link_mb",
          "link_use", "load_1min", "dilation", "narrow", "global_batch")


# --- the DDP side ------------------------------------------------------------------------------
def emulated_layers(solver_path, dilation=1.0, narrow=1):
    """[(name, [tensor shapes], forward ms, backward ms)] of an emulated net (Parameter layers
    grouped by the EmulatedCompute that follows them; times x ``dilation``, tensors narrowed by
    ``narrow``: make_emulated_net.scale_net), and the solver's (lr, momentum, weight decay)."""
    from studies._runs import load_train_net
    from scripts.make_emulated_net import read_groups, scale_net
    solver, net = load_train_net(solver_path)
    net, _ = scale_net(net, dilation, narrow)
    return read_groups(net), (float(solver.base_lr), float(solver.momentum),
                              float(solver.weight_decay))


def _example():
    """examples/pytorch_ddp_fashion_mnist.py as a module: its LeNet and hook registration."""
    import importlib.util
    path = os.path.join(REPO, "examples", "pytorch_ddp_fashion_mnist.py")
    spec = importlib.util.spec_from_file_location("pytorch_ddp_fashion_mnist", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _torch_lenet(torch):
    """BVLC's LeNet (prototxt/lenet/train_val.prototxt) in PyTorch: the same layers and shapes."""
    return _example().lenet()


def emulated_module(torch, groups):
    """An emulated net of ``groups`` (:func:`emulated_layers`) in PyTorch: one parameter per
    tensor (zeros, as caffe8's Parameter layers), and per group an autograd function that
    passes its tensors through, sleeping the group's forward time in forward and its backward
    time in backward (the GIL released, as a GPU kernel leaves the host free); the loss is the
    sum of every tensor, so every gradient is 1 — caffe8's Reduction SUM losses."""
    from caffe8.layers.emulate import sleep_ms       # the EmulatedCompute layer's own sleep

    class Emulate(torch.autograd.Function):
        @staticmethod
        def forward(ctx, times, *tensors):
            ctx.backward_ms = times[1]
            sleep_ms(times[0])
            return tuple(t.view_as(t) for t in tensors)

        @staticmethod
        def backward(ctx, *grads):
            sleep_ms(ctx.backward_ms)
            return (None,) + grads

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.tensors = torch.nn.ParameterList(
                [torch.nn.Parameter(torch.zeros(shape)) for _, shapes, _, _ in groups
                 for shape in shapes])

        def forward(self, x):
            loss, k = x.sum() * 0, 0
            for _, shapes, fwd, bwd in groups:
                outs = Emulate.apply((fwd, bwd), *self.tensors[k:k + len(shapes)])
                k += len(shapes)
                for t in outs:
                    loss = loss + t.sum()
            return loss

    return Net()


#: ddp variant -> (examples' hook name, extra arguments of register_hook)
DDP_HOOKS = {"fp32": ("fp32", {}), "fp16": ("fp16", {}), "bf16": ("bf16", {}),
             "powersgd1": ("powersgd", {"powersgd_rank": 1}),
             "powersgd4": ("powersgd", {"powersgd_rank": 4}),
             "fp8": ("fp8", {}), "fp8h": ("fp8", {"two_level": True}), "none": (None, {})}


def register_ddp_hook(model, variant, ppn):
    """Put ``ddp-<variant>``'s exchange on the DDP ``model`` (examples' register_hook)."""
    hook, extra = DDP_HOOKS[variant]
    if hook is None:                         # headroom: the gradients stay each rank's own
        from torch.distributed.algorithms.ddp_comm_hooks.debugging_hooks import noop_hook
        return model.register_comm_hook(None, noop_hook)
    extra = dict(extra)
    ppn = ppn if extra.pop("two_level", False) else None
    return _example().register_hook(model, hook, processes_per_node=ppn, **extra)


def ddp_worker(args):
    """One DDP process (rank and size from mpiexec's PMI variables): train, print JSON on rank 0."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    rank, size = int(os.environ["PMI_RANK"]), int(os.environ["PMI_SIZE"])
    torch.set_num_threads(1)                 # torchrun's default with several processes a node
    dist.init_process_group("gloo", init_method=f"tcp://{args.master}:29517", rank=rank,
                            world_size=size)
    groups, (lr, momentum, weight_decay) = emulated_layers(args.solver, args.time_scale,
                                                           args.narrow)
    if _real_compute(args.solver):
        net = _torch_lenet(torch)
        x = torch.zeros(LENET_INPUTS["data"])
        y = torch.zeros(LENET_INPUTS["label"], dtype=torch.long)
        loss_fn = torch.nn.CrossEntropyLoss()
        forward = lambda m: loss_fn(m(x), y)  # noqa: E731
    else:
        net = emulated_module(torch, groups)
        x = torch.zeros(1)
        forward = lambda m: m(x)  # noqa: E731
    model = DDP(net) if size > 1 else net
    state = None
    if size > 1:
        state = register_ddp_hook(model, parse_variant(args.variant)[1], args.ppn)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum,
                          weight_decay=weight_decay)
    walls, starts = [], []
    for _ in range(args.iters):
        starts.append(time.time())
        t0 = time.perf_counter()
        opt.zero_grad()
        forward(model).backward()
        opt.step()
        walls.append(time.perf_counter() - t0)
    gathered = [None] * size
    dist.all_gather_object(gathered, walls) if size > 1 else gathered.__setitem__(0, walls)
    if rank == 0:
        print("DDP-RESULT " + json.dumps({"walls": [max(w) for w in zip(*gathered)],
                                          "starts": starts}), flush=True)
    if size > 1:
        if hasattr(state, "close"):           # caffe8's hook: its thread ends before the groups
            state.close()
        dist.destroy_process_group()
    _example().exit_without_teardown(0)


def mpi_worker(args):
    """The reference transfer: a plain blocking MPI_Allreduce (MPI_SUM, in place) of the net's
    float32 gradients as one vector, with caffe8's MPICH settings (comm.mpi.apply_settings),
    after a barrier each time; prints JSON on rank 0 as the DDP worker does."""
    import numpy
    from caffe8.comm.mpi import apply_settings, mpi_module
    apply_settings()
    MPI = mpi_module()
    comm = MPI.COMM_WORLD
    groups, _ = emulated_layers(args.solver, 1.0, args.narrow)
    n = sum(int(numpy.prod(shape)) for _, shapes, _, _ in groups for shape in shapes)
    buf = numpy.ones(n, numpy.float32)
    walls, starts = [], []
    for _ in range(args.iters):
        comm.Barrier()
        starts.append(time.time())
        t0 = time.perf_counter()
        comm.Allreduce(MPI.IN_PLACE, buf, MPI.SUM)
        walls.append(comm.allreduce(time.perf_counter() - t0, op=MPI.MAX))
    if comm.Get_rank() == 0:
        print("DDP-RESULT " + json.dumps({"walls": walls, "starts": starts}), flush=True)
    return 0


# --- one run -----------------------------------------------------------------------------------
def parse_layout(text):
    nodes, _, ppn = text.lower().partition("x")
    try:
        n, p = int(nodes), int(ppn or 1)
    except ValueError:
        raise SystemExit(f"cluster_bench: error: --layouts {text!r}: expected NxP, e.g. 2x1")
    if n < 1 or p < 1:
        raise SystemExit(f"cluster_bench: error: --layouts {text!r}: N and P must be >= 1")
    return n, p


def parse_variant(text):
    """"c8-fp8-async" → ("caffe8", "fp8", True); "ddp-fp16" → ("ddp", "fp16", None)."""
    parts = text.split("-")
    if parts[0] == "ddp" and len(parts) == 2 and parts[1] in DDP_HOOKS:
        return "ddp", parts[1], None
    if text == "mpi-fp32":
        return "mpi", "fp32", None
    if parts[0] == "c8" and len(parts) == 3 and parts[2] in ("sync", "async"):
        return "caffe8", parts[1], parts[2] == "async"
    raise SystemExit(f"cluster_bench: error: unknown variant {text!r} (c8-<codec>-<sync|async>, "
                     f"{', '.join('ddp-' + v for v in DDP_HOOKS)}, mpi-fp32)")


def run_caffe8(cluster, args, solver, run_dir, codec, asynchronous, nodes, ppn,
               time_scale=1.0):
    """Train on the cluster (the emulated times x ``time_scale``: the dilation, and in a strong
    scaling sweep the per-process batch's share); return (per-iteration seconds, exposed comm
    split seconds)."""
    from studies import _runs
    p = nodes * ppn
    solver_copy = _runs.write_run_prototxts(solver, run_dir, _net_batch(solver), codec,
                                            asynchronous, ppn if p > 1 else 0, args.iters,
                                            comm_extra=_runs.comm_settings(args.comm_set),
                                            transform=_transform(solver, time_scale,
                                                                 args.narrow))
    logs = [os.path.join(run_dir, f"timing.r{r}.jsonl") for r in range(p)]
    for path in logs:
        if os.path.exists(path):
            os.remove(path)
    argv = []
    for r in range(p):
        argv += ([":"] if r else []) + ["-n", "1", args.python, "-m", "caffe8.cli", "train",
                                        "--solver", solver_copy, "--timing-log", logs[r]]
    # MPMD form: the argv after mpiexec's own options; cluster.run puts "-n P" first, so drop it.
    rc = _cluster_run(cluster, argv, ppn, os.path.join(run_dir, "train.log"),
                      args.timeout * cluster.dilation, mpmd=True, nodes=nodes,
                      real=_real_compute(solver))
    if rc != 0:
        raise RuntimeError(f"caffe8 run failed (rc {rc}); see {run_dir}/train.log")
    records = [rec for path in logs for rec in _runs.read_timing_log(path)]
    walls = _runs.iteration_walls(records, args.skip)
    comm = {}
    for rec in records:
        if rec["iteration"] >= args.skip:
            it = rec["iteration"]
            comm[it] = max(comm.get(it, 0.0), rec["split"]["Communication"])
    mine = sorted((r for r in records if r["rank"] == 0 and r["iteration"] >= args.skip),
                  key=lambda r: r["iteration"])
    window = (mine[0]["start"], mine[-1]["start"] + mine[-1]["wall"], len(mine))
    # the transfers alone (per-layer "comm": the reductions, without encode and decode)
    wire = statistics.median(sum(layer["comm"] for layer in r["layers"]) for r in mine)
    return [walls[i] for i in sorted(walls)], (statistics.median(comm.values()), wire), window


def run_ddp(cluster, args, solver, run_dir, variant, nodes, ppn, time_scale=1.0):
    """A DDP run (or, for ``mpi-fp32``, the MPI_Allreduce reference): the workers' timings
    (the emulated times x ``time_scale``, as run_caffe8's)."""
    os.makedirs(run_dir, exist_ok=True)
    log = os.path.join(run_dir, "ddp.log")
    worker = "--mpi-worker" if variant == "mpi-fp32" else "--ddp-worker"
    argv = [args.python, "-m", "scripts.cluster_bench", worker, "--variant", variant,
            "--solver", solver, "--iters", str(args.iters), "--master", cluster.address(0),
            "--ppn", str(ppn), "--time-scale", repr(time_scale), "--narrow", str(args.narrow)]
    rc = _cluster_run(cluster, argv, ppn, log, args.timeout * cluster.dilation, nodes=nodes,
                      real=_real_compute(solver))
    with open(log, encoding="utf-8", errors="replace") as f:
        lines = [ln for ln in f if ln.startswith("DDP-RESULT ")]
    if rc != 0 or not lines:
        raise RuntimeError(f"DDP run failed (rc {rc}); see {log}")
    result = json.loads(lines[-1].split(" ", 1)[1])
    walls, starts = result["walls"][args.skip:], result["starts"][args.skip:]
    transfer = statistics.median(walls) if variant == "mpi-fp32" else 0.0
    return walls, (0.0, transfer), (starts[0], starts[-1] + walls[-1], len(walls))


class LinkSampler:
    """Node 0's link counter (bytes sent), read every ``period`` seconds while a job runs, from
    ``/proc/<pid>/net/dev`` of a process inside the node's namespace (a file read: no process
    is started per sample, so sampling costs the job nothing measurable)."""

    def __init__(self, cluster, period=0.05):
        import threading
        self.cluster, self.period, self.samples = cluster, period, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _pid(self):
        out = subprocess.run(["ip", "netns", "pids", self.cluster.ns(0)], capture_output=True,
                             text=True).stdout.split()
        return out[0] if out else None

    def _read(self, pid):
        from caffe8.cluster import IFACE
        with open(f"/proc/{pid}/net/dev", encoding="ascii") as f:
            for line in f:
                name, _, rest = line.partition(":")
                if name.strip() == IFACE:
                    return int(rest.split()[8])         # transmit bytes
        return None

    def _run(self):
        pid = None
        while not self._stop.wait(self.period):
            try:
                pid = pid or self._pid()
                value = self._read(pid) if pid else None
            except OSError:
                pid, value = None, None
            if value is not None:
                self.samples.append((time.time(), value))

    def _read_interface(self):
        """The counter read from outside the namespace (``ip -n``): still there when the job's
        processes have all left it."""
        import json
        from caffe8.cluster import IFACE
        out = subprocess.run(["ip", "-n", self.cluster.ns(0), "-j", "-s", "link", "show", IFACE],
                             capture_output=True, text=True)
        try:
            return int(json.loads(out.stdout)[0]["stats64"]["tx"]["bytes"])
        except (ValueError, LookupError, TypeError):
            return None

    def stop(self):
        """Stop sampling, with one last sample: a job that leaves as soon as its last iteration
        ends can be gone before the next periodic read."""
        self._stop.set()
        self._thread.join()
        value = self._read_interface()
        if value is not None:
            self.samples.append((time.time(), value))

    def sent(self, start, end):
        """Bytes sent between the epoch times ``start`` and ``end`` (linear between samples);
        None when the samples do not cover that window."""
        import numpy
        if len(self.samples) < 2 or self.samples[0][0] > start or self.samples[-1][0] < end:
            return None
        t, v = numpy.array(self.samples, dtype=float).T
        return float(numpy.interp(end, t, v) - numpy.interp(start, t, v))


def _cluster_run(cluster, argv, ppn, log, timeout, mpmd=False, nodes=None, real=False):
    """Run on the first ``nodes`` nodes of ``cluster`` (the one-process baseline: node 0), output
    to ``log``; the exit status, or None when the job ran past ``timeout`` and was killed."""
    from caffe8.cluster import ClusterError, EmulatedCluster
    sub = cluster
    if nodes is not None and nodes != cluster.nodes:
        sub = EmulatedCluster(nodes, cluster.rate, cluster.delay, cluster.prefix, cluster.subnet,
                              jitter=cluster.jitter, loss=cluster.loss,
                              dilation=cluster.dilation, cpu_groups=cluster.cpu is not None)
    with open(log, "w", encoding="utf-8") as out:
        try:
            return sub.run(argv, ppn, timeout, env=REAL_COMPUTE_ENV if real else None,
                           stdout=out, mpmd=mpmd, cwd=REPO,
                           process_env={**os.environ, "PYTHONPATH": REPO})
        except ClusterError as e:
            out.write(f"cluster_bench: {e}\n")
            return None


def _real_compute(solver):
    return os.path.abspath(solver) == os.path.join(REPO, NETS["lenet"])


def _transform(solver, dilation, narrow):
    """The train-net transform of a run: a real-compute net's data layers become inputs; an
    emulated net's times are dilated and its tensors narrowed (make_emulated_net.scale_net)."""
    if not _real_compute(solver):
        from scripts.make_emulated_net import scale_net
        return lambda net: scale_net(net, dilation, narrow)[0]
    from caffe8.engine.net_graph import swap_data_layers
    return lambda net: swap_data_layers(net, LENET_INPUTS)


def narrowed_share(solver, narrow):
    """The narrowed net's parameter count over the net's (1 for a real-compute net)."""
    if _real_compute(solver) or narrow == 1:
        return 1.0
    from studies._runs import load_train_net
    from scripts.make_emulated_net import scale_net
    return scale_net(load_train_net(solver)[1], 1.0, narrow)[1]


def batch_share(args, solver, processes):
    """Strong scaling (--global-batch G): the emulated times' factor for ``processes`` sharing G,
    (G / processes) / the net's own per-process batch (compute is linear in the batch); weak
    scaling (no --global-batch): 1."""
    if not args.global_batch:
        return 1.0
    return args.global_batch / processes / _net_batch(solver)


def layout_dilation(args, processes):
    """The run's time dilation: --dilation, or for ``auto`` the smallest sound one for
    ``processes`` here (caffe8.cluster.dilation_needed)."""
    from caffe8.cluster import dilation_needed
    if args.dilation == "auto":
        return max(dilation_needed(processes), args.min_dilation)
    return float(args.dilation)


def _net_batch(solver):
    from studies import _runs
    if _real_compute(solver):
        return LENET_INPUTS["data"][0]
    return _runs.net_batch_size(_runs.load_train_net(solver)[1])


# --- the sweep ---------------------------------------------------------------------------------
def sweep(args):
    from caffe8.cluster import EmulatedCluster
    layouts = [parse_layout(t) for t in args.layouts.split(",")]
    variants = [(v, parse_variant(v)) for v in args.variants.split(",")]
    if any(kind == "ddp" for _, (kind, _, _) in variants):
        try:
            import torch  # noqa: F401
        except ImportError:
            raise SystemExit("cluster_bench: error: the ddp-* variants need PyTorch "
                             "(pip install torch); leave them out to run caffe8 alone")
    rows = []
    max_nodes = max(n for n, _ in layouts)
    for rate in args.rates.split(","):
        with EmulatedCluster(max_nodes, rate, args.delay, args.prefix, cpu_groups=True) \
                as cluster:
            for rnd in range(args.rounds):
                for net in args.nets.split(","):
                    rows += _round(cluster, args, net, rate, rnd, layouts, variants)
                    _write(rows, args.csv)
    return rows


def _label(net):
    """A folder name for ``net``: its name, or for a solver path the folder holding it."""
    return net if net in NETS else os.path.basename(os.path.dirname(os.path.abspath(net)))


def _round(cluster, args, net, rate, rnd, layouts, variants):
    solver = os.path.join(REPO, NETS.get(net, net))
    rows, base = [], {}
    from caffe8.cluster import parse_rate
    # narrowed tensors travel a link narrowed alike (make_emulated_net.scale_net)
    link_bps = parse_rate(rate) * narrowed_share(solver, args.narrow)

    def shape(processes):
        """Reshape the cluster for a run of ``processes``: (dilation, emulated time factor)."""
        cluster.reshape(layout_dilation(args, processes), f"{link_bps:.0f}bit")
        return cluster.dilation, cluster.dilation * batch_share(args, solver, processes)

    for side in sorted({kind for _, (kind, _, _) in variants} - {"mpi"}):
        d = os.path.join(args.out, _label(net), f"base_{side}")
        k, scale = shape(1)
        walls = (run_caffe8(cluster, args, solver, d, "fp32", False, 1, 1, scale)
                 if side == "caffe8" else run_ddp(cluster, args, solver, d, "ddp-fp32", 1, 1,
                                                  scale))[0]
        base[side] = statistics.median(walls) / k
        print(f"[{rate} round {rnd}] {net} 1 process {side}: {base[side] * 1e3:.1f} ms",
              flush=True)
    for nodes, ppn in layouts:
        for name, (kind, codec, asynchronous) in variants:
            run_dir = os.path.join(args.out, _label(net), rate, f"{nodes}x{ppn}", name)
            load = os.getloadavg()[0]
            k, scale = shape(nodes * ppn)
            sampler = LinkSampler(cluster)
            try:
                walls, comm, window = (
                    run_caffe8(cluster, args, solver, run_dir, codec, asynchronous, nodes, ppn,
                               scale)
                    if kind == "caffe8" else run_ddp(cluster, args, solver, run_dir, name, nodes,
                                                     ppn, scale))
            except RuntimeError as e:
                print(f"FAILED {net} {rate} {nodes}x{ppn} {name}: {e}", file=sys.stderr)
                continue
            finally:
                sampler.stop()
            sent = sampler.sent(window[0], window[1])
            # times undilated (divided by k): those of nodes with a core per process
            it = statistics.median(walls) / k
            # exposed: beyond the one-process run's time (strong scaling: its P-th part)
            ideal = base.get(kind, it) / (nodes * ppn if args.global_batch else 1)
            row = {"net": net, "layout": f"{nodes}x{ppn}", "nodes": nodes, "ppn": ppn,
                   "rate": rate, "variant": name, "round": rnd, "iterations": len(walls),
                   "iter_ms": it * 1e3, "exposed_ms": (it - ideal) * 1e3,
                   "baseline_ms": base.get(kind, 0.0) * 1e3, "comm_ms": comm[0] / k * 1e3,
                   "transfer_ms": comm[1] / k * 1e3,
                   "link_mb": float("nan") if sent is None else sent / 1e6 / window[2],
                   "load_1min": load, "dilation": k, "narrow": args.narrow,
                   "global_batch": args.global_batch}
            # the link's use by the transfers: bytes node 0 sent per iteration over the wire time
            # they would take at the link's (narrowed) rate, divided by the measured transfer time
            wire_s = row["link_mb"] * 8e6 / link_bps
            row["link_use"] = wire_s / (comm[1] / k) if comm[1] > 0 else float("nan")
            rows.append(row)
            print(f"[{rate} round {rnd}] {net} {nodes}x{ppn} {name:14s} {it * 1e3:8.1f} ms/iter "
                  f"exposed {row['exposed_ms']:7.1f} ms  link {row['link_mb']:7.1f} MB/iter",
                  flush=True)
    return rows


def summarise(rows):
    """Medians over rounds, one row per point (round = "all")."""
    points = {}
    for r in rows:
        if r["round"] != "all":
            points.setdefault((r["net"], r["layout"], r["rate"], r["variant"]), []).append(r)
    out = []
    for pts in points.values():
        row = dict(pts[0], round="all", iterations=sum(p["iterations"] for p in pts))
        for k in ("iter_ms", "exposed_ms", "baseline_ms", "comm_ms", "transfer_ms", "link_mb",
                  "link_use", "load_1min"):
            row[k] = statistics.median(p[k] for p in pts)
        out.append(row)
    return out


def _write(rows, path):
    from studies import _runs
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    _runs.write_rows(rows + summarise(rows), FIELDS, path)


def plot(rows, path):
    plt = pyplot()
    summary = summarise(rows)
    panels = sorted({(r["net"], r["layout"], r["rate"]) for r in summary})
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 4), squeeze=False)
    for ax, (net, layout, rate) in zip(axes[0], panels):
        pts = [r for r in summary if (r["net"], r["layout"], r["rate"]) == (net, layout, rate)]
        names = [r["variant"] for r in pts]
        ax.bar(names, [r["iter_ms"] for r in pts], color="lightsteelblue", label="iteration")
        ax.bar(names, [max(r["exposed_ms"], 0) for r in pts], color="indianred",
               label="exposed communication")
        ax.set_title(f"{net} {layout} @ {rate}")
        ax.set_ylabel("ms per iteration")
        ax.tick_params(axis="x", rotation=60)
        ax.legend(fontsize=7)
    save_figure(fig, path)


SCALING_FIELDS = ("net", "rate", "variant", "layout", "processes", "iter_ms", "samples_s",
                  "speedup", "efficiency")


def scaling(rows):
    """Weak and strong scaling points of a sweep's rows (medians over rounds), against the
    same side's one-process run (no exchange; P = 1 rows of each variant are that run).

    Weak (no --global-batch): the per-process batch B is fixed, so P processes do P times the
    work; speedup = P x T1 / T_P (Oyama et al.'s figure 7), efficiency = T1 / T_P. Strong
    (--global-batch G): P processes share G; speedup = T1(G) / T_P, efficiency = speedup / P."""
    out = []
    for r in summarise(rows):
        if not r["baseline_ms"]:                       # (mpi-fp32 has no one-process run)
            continue
        g = int(float(r.get("global_batch") or 0))
        batch = g or _net_batch(os.path.join(REPO, NETS.get(r["net"], r["net"])))
        base = r["baseline_ms"]
        p = r["nodes"] * r["ppn"]
        for layout, procs, it in (("1x1", 1, base), (r["layout"], p, r["iter_ms"])):
            speedup = base / it if g else procs * base / it
            out.append({"net": r["net"], "rate": r["rate"], "variant": r["variant"],
                        "layout": layout, "processes": procs, "iter_ms": it,
                        "samples_s": (batch if g else batch * procs) / it * 1e3,
                        "speedup": speedup, "efficiency": speedup / procs})
    unique = {(o["net"], o["rate"], o["variant"], o["layout"]): o for o in out}
    return sorted(unique.values(),
                  key=lambda o: (o["net"], o["rate"], o["variant"], o["processes"], o["layout"]))


def plot_scaling(points, path, strong=False):
    """Speedup against processes, a line per variant over the layouts of one process a node
    (the form of Oyama et al.'s figure 7), layouts of several a node as open markers; strong
    scaling: time per iteration instead of speedup."""
    plt = pyplot()
    panels = sorted({(p["net"], p["rate"]) for p in points})
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4), squeeze=False)
    key = "iter_ms" if strong else "speedup"
    for ax, (net, rate) in zip(axes[0], panels):
        for i, variant in enumerate(sorted({p["variant"] for p in points})):
            pts = [p for p in points if (p["net"], p["rate"], p["variant"]) == (net, rate, variant)]
            line = sorted((p for p in pts if p["layout"].endswith("x1")),
                          key=lambda p: p["processes"])
            color = f"C{i}"
            if len(line) > 1:
                ax.plot([p["processes"] for p in line], [p[key] for p in line], marker="o",
                        color=color, linestyle="--" if "fp8" in variant else "-", label=variant)
            for p in pts:
                if not p["layout"].endswith("x1"):
                    ax.plot([p["processes"]], [p[key]], marker="s", fillstyle="none",
                            color=color, linestyle="none")
        top = max(p["processes"] for p in points)
        if not strong:
            ax.plot([1, top], [1, top], ":", color="grey", label="ideal")
        label_axes(ax, xlabel="processes (squares: 2 a node)",
                   ylabel="ms per iteration" if strong else "speedup vs 1 process",
                   title=f"{'strong' if strong else 'weak'} scaling, {net} @ {rate}",
                   legend_size=7)
    save_figure(fig, path)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nets", default="caffenet",
                    help="caffenet, googlenet (emulated compute), lenet (real compute) or a "
                         "solver path")
    ap.add_argument("--layouts", default="2x1", help="NODESxPROCESSES,... e.g. 2x1,2x2,4x1")
    ap.add_argument("--rates", default="1gbit,10gbit", help="link rates (tc units)")
    ap.add_argument("--delay", default="", help="one-way delay per link end (netem)")
    ap.add_argument("--dilation", default="1",
                    help="time dilation k (caffe8.cluster): each node capped at ppn/k cores, "
                         "links and emulated compute k times slower, times reported divided "
                         "by k; 'auto': per layout, the smallest sound k for its processes on "
                         "this machine's cores")
    ap.add_argument("--min-dilation", type=float, default=1.0,
                    help="with --dilation auto, at least this factor (a factor above 1 also "
                         "divides the machine's scheduling delays by it)")
    ap.add_argument("--global-batch", type=int, default=0,
                    help="strong scaling: a fixed global batch, divided among the processes "
                         "(emulated nets: compute scaled by each process's share of it); "
                         "default: weak scaling, the net's per-process batch")
    ap.add_argument("--narrow", type=int, default=1,
                    help="emulated nets: divide every tensor's first axis by this and the link "
                         "rate by the same share (many processes in memory; the bytes per ms "
                         "of compute unchanged)")
    ap.add_argument("--variants", default="c8-fp32-sync,c8-fp32-async,c8-fp8-async,ddp-fp32,"
                                          "ddp-fp16")
    ap.add_argument("--iters", type=int, default=12, help="iterations per run")
    ap.add_argument("--skip", type=int, default=4, help="warm-up iterations not counted")
    ap.add_argument("--rounds", type=int, default=2, help="interleaved rounds")
    ap.add_argument("--out", default=os.path.join(REPO, "runs", "cluster"))
    ap.add_argument("--csv", default=os.path.join(REPO, "runs", "cluster", "cluster_bench.csv"))
    ap.add_argument("--comm-set", default="",
                    help="more comm block fields for the caffe8 runs, FIELD=VALUE,...")
    ap.add_argument("--prefix", default="c8b", help="namespace prefix of the cluster")
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--python", default=sys.executable)
    # the DDP worker (started by the benchmark itself under mpiexec)
    ap.add_argument("--ddp-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--mpi-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--variant", help=argparse.SUPPRESS)
    ap.add_argument("--solver", help=argparse.SUPPRESS)
    ap.add_argument("--master", help=argparse.SUPPRESS)
    ap.add_argument("--ppn", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--time-scale", type=float, default=1.0, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.ddp_worker:
        return ddp_worker(args)
    if args.mpi_worker:
        return mpi_worker(args)
    if args.iters <= args.skip:
        ap.error("--iters must exceed --skip")
    if args.dilation != "auto":
        try:
            if not 1 <= float(args.dilation) <= 1000:
                raise ValueError
        except ValueError:
            ap.error(f"--dilation {args.dilation!r}: expected 'auto' or a factor from 1 to 1000")
    if args.narrow < 1:
        ap.error("--narrow must be >= 1")
    if args.global_batch < 0 or (args.global_batch and "lenet" in args.nets.split(",")):
        ap.error("--global-batch: a positive batch, for the emulated nets only (LeNet's real "
                 "compute keeps its batch)")
    from caffe8.cluster import ClusterError, available
    ok, why = available()
    if not ok:
        print(f"cluster_bench: error: {why}", file=sys.stderr)
        return 1
    print(f"load average {os.getloadavg()[0]:.2f}; {os.cpu_count()} cores", flush=True)
    try:
        rows = sweep(args)
    except ClusterError as e:
        print(f"cluster_bench: error: {e}", file=sys.stderr)
        return 1
    png = os.path.splitext(args.csv)[0] + ".png"
    plot(rows, png)
    points = scaling(rows)
    if len({p["processes"] for p in points}) > 2:
        from studies import _runs
        kind = "strong" if args.global_batch else "weak"
        stem = os.path.splitext(args.csv)[0] + "_" + kind
        _runs.write_rows(points, SCALING_FIELDS, stem + ".csv")
        plot_scaling(points, stem + ".png", strong=bool(args.global_batch))
        print(f"wrote {stem}.csv and {stem}.png")
    for r in summarise(rows):
        print(f"{r['net']} {r['layout']} {r['rate']:7s} {r['variant']:14s} "
              f"{r['iter_ms']:8.1f} ms/iter  exposed {r['exposed_ms']:7.1f} ms")
    print(f"wrote {args.csv} and {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
