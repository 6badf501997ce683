#!/usr/bin/env python
"""caffe8 against PyTorch DDP on an emulated cluster: the same work over the same shaped link.

Usage (as root, from the repository root; PyTorch only needed for the ``ddp-*`` variants)::

    python scripts/cluster_bench.py --nets caffenet --layouts 2x1 --rates 1gbit,10gbit \\
        --variants c8-fp32-sync,c8-fp32-async,c8-fp16-async,c8-fp8-async,ddp-fp32,ddp-fp16 \\
        --iters 12 --skip 4 --rounds 2 --out runs/cluster --csv docs/figures/cluster_bench.csv

For every link rate and node count it brings up an emulated cluster (scripts/emulated_cluster.py:
network namespaces behind a ``tc``-shaped switch), and then, ``--rounds`` times, runs every
(net, layout, variant) in turn — interleaved, so a change in the machine's load hits every
variant alike. Layout ``NxP`` is N nodes of P processes.

caffe8 variants ``c8-<codec>-<sync|async>`` train the net's solver with that ``comm`` block
(``mpiexec`` across the nodes, one timing log per rank). DDP variants run
``scripts/cluster_bench.py --ddp-worker`` under the same mpiexec: PyTorch's
DistributedDataParallel with gloo over the same link (``GLOO_SOCKET_IFNAME=eth0``), plain
(``ddp-fp32``) or with the fp16 compression hook (``ddp-fp16``), one intra-op thread per process
as torchrun sets it. Both sides do the same work: the DDP model is built from the same prototxt
(the emulated nets: the same parameter tensors, the same per-layer sleeping forward/backward
times in the same order, the same sum losses; SGD with the solver's lr and momentum).

A point's time per iteration is the median over ranks' slowest and iterations after ``--skip``
(caffe8: the timing log's ``wall``, which covers clearing diffs, forward/backward, exchange and
update; DDP: ``zero_grad`` to the end of ``step``). "Exposed communication" is that minus the same
side's one-process time of the same net (``--baseline``, run once per round on node 0 with no
exchange at all): what the exchange adds to an iteration. The link's byte counters are read
before and after every run (``link_mb``: megabytes node 0 sent per iteration).

Writes ``--csv`` (one row per point and round, and the medians over rounds as ``round = all``)
and a PNG beside it (per-iteration time and exposed communication per variant).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path[:0] = [p for p in (HERE, REPO) if p not in sys.path]

NETS = {"caffenet": "prototxt/caffenet_emulated/solver.prototxt",
        "googlenet": "prototxt/googlenet_emulated/solver.prototxt"}
FIELDS = ("net", "layout", "nodes", "ppn", "rate", "variant", "round", "iterations",
          "iter_ms", "exposed_ms", "baseline_ms", "comm_ms", "link_mb", "load_1min")


# --- the DDP side ------------------------------------------------------------------------------
def emulated_layers(solver_path):
    """[(name, [tensor shapes], forward ms, backward ms)] of an emulated net (Parameter layers
    grouped by the EmulatedCompute that follows them), and the solver's (lr, momentum)."""
    from _runs import load_train_net
    solver, net = load_train_net(solver_path)
    groups, pending = [], []
    for layer in net.layer:
        if layer.type == "Parameter":
            pending.append(tuple(int(d) for d in layer.parameter_param.shape.dim))
        elif layer.type == "EmulatedCompute":
            e = layer.emulate_param
            groups.append((layer.name, pending, float(e.forward_ms), float(e.backward_ms)))
            pending = []
    if pending:
        groups.append(("tail", pending, 0.0, 0.0))
    return groups, (float(solver.base_lr), float(solver.momentum))


def ddp_worker(args):
    """One DDP process (rank and size from mpiexec's PMI variables): train, print JSON on rank 0."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    rank, size = int(os.environ["PMI_RANK"]), int(os.environ["PMI_SIZE"])
    torch.set_num_threads(1)                 # torchrun's default with several processes a node
    dist.init_process_group("gloo", init_method=f"tcp://{args.master}:29517", rank=rank,
                            world_size=size)
    groups, (lr, momentum) = emulated_layers(args.solver)

    def sleep_ms(ms):
        end = time.perf_counter() + ms / 1e3
        while time.perf_counter() < end:
            time.sleep(max(0.0, end - time.perf_counter()))

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

    model = DDP(Net()) if size > 1 else Net()
    if args.variant == "ddp-fp16" and size > 1:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        model.register_comm_hook(None, default_hooks.fp16_compress_hook)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    x = torch.zeros(1)
    walls = []
    for _ in range(args.iters):
        t0 = time.perf_counter()
        opt.zero_grad()
        model(x).backward()
        opt.step()
        walls.append(time.perf_counter() - t0)
    gathered = [None] * size
    dist.all_gather_object(gathered, walls) if size > 1 else gathered.__setitem__(0, walls)
    if rank == 0:
        print("DDP-RESULT " + json.dumps([max(w) for w in zip(*gathered)]), flush=True)
    if size > 1:
        dist.destroy_process_group()
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
    if parts[0] == "ddp" and len(parts) == 2 and parts[1] in ("fp32", "fp16"):
        return "ddp", parts[1], None
    if parts[0] == "c8" and len(parts) == 3 and parts[2] in ("sync", "async"):
        return "caffe8", parts[1], parts[2] == "async"
    raise SystemExit(f"cluster_bench: error: unknown variant {text!r} (c8-<codec>-<sync|async>, "
                     f"ddp-fp32, ddp-fp16)")


def run_caffe8(cluster, args, solver, run_dir, codec, asynchronous, nodes, ppn):
    """Train on the cluster; return (per-iteration seconds, exposed comm split seconds)."""
    import _runs
    p = nodes * ppn
    solver_copy = _runs.write_run_prototxts(solver, run_dir, _net_batch(solver), codec,
                                            asynchronous, ppn if p > 1 else 0, args.iters,
                                            comm_extra=_runs.comm_settings(args.comm_set))
    logs = [os.path.join(run_dir, f"timing.r{r}.jsonl") for r in range(p)]
    for path in logs:
        if os.path.exists(path):
            os.remove(path)
    argv = []
    for r in range(p):
        argv += ([":"] if r else []) + ["-n", "1", args.python, "-m", "caffe8.cli", "train",
                                        "--solver", solver_copy, "--timing-log", logs[r]]
    # MPMD form: the argv after mpiexec's own options; cluster.run puts "-n P" first, so drop it.
    rc = _cluster_run(cluster, argv, ppn, os.path.join(run_dir, "train.log"), args.timeout,
                      mpmd=True, nodes=nodes)
    if rc != 0:
        raise RuntimeError(f"caffe8 run failed (rc {rc}); see {run_dir}/train.log")
    records = [rec for path in logs for rec in _runs.read_timing_log(path)]
    walls = _runs.iteration_walls(records, args.skip)
    comm = {}
    for rec in records:
        if rec["iteration"] >= args.skip:
            it = rec["iteration"]
            comm[it] = max(comm.get(it, 0.0), rec["split"]["Communication"])
    return [walls[i] for i in sorted(walls)], statistics.median(comm.values())


def run_ddp(cluster, args, solver, run_dir, variant, nodes, ppn):
    os.makedirs(run_dir, exist_ok=True)
    log = os.path.join(run_dir, "ddp.log")
    argv = [args.python, os.path.abspath(__file__), "--ddp-worker", "--variant", variant,
            "--solver", solver, "--iters", str(args.iters), "--master", cluster.address(0)]
    rc = _cluster_run(cluster, argv, ppn, log, args.timeout, nodes=nodes)
    with open(log, encoding="utf-8", errors="replace") as f:
        lines = [ln for ln in f if ln.startswith("DDP-RESULT ")]
    if rc != 0 or not lines:
        raise RuntimeError(f"DDP run failed (rc {rc}); see {log}")
    return json.loads(lines[-1].split(" ", 1)[1])[args.skip:], 0.0


def _cluster_run(cluster, argv, ppn, log, timeout, mpmd=False, nodes=None):
    """Run on the first ``nodes`` nodes of ``cluster`` (the one-process baseline: node 0)."""
    from emulated_cluster import EmulatedCluster
    sub = cluster
    if nodes is not None and nodes != cluster.nodes:
        sub = EmulatedCluster(nodes, cluster.rate, cluster.delay, cluster.prefix, cluster.subnet)
        sub.launcher = cluster.launcher
    cmd = sub.mpiexec_argv(argv, ppn)
    if mpmd:                   # mpiexec ... -n P <argv> → mpiexec ... <MPMD argv>
        k = cmd.index("-n", cmd.index("-hosts"))
        del cmd[k:k + 2]
    with open(log, "w", encoding="utf-8") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=REPO,
                                env={**os.environ, "PYTHONPATH": REPO}, start_new_session=True)
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, 9)
                proc.wait()
            for i in range(cluster.nodes):
                cluster._kill_all(cluster.ns(i))


def _net_batch(solver):
    import _runs
    return _runs.net_batch_size(_runs.load_train_net(solver)[1])


# --- the sweep ---------------------------------------------------------------------------------
def sweep(args):
    from emulated_cluster import EmulatedCluster
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
        with EmulatedCluster(max_nodes, rate, args.delay, args.prefix) as cluster:
            for rnd in range(args.rounds):
                for net in args.nets.split(","):
                    rows += _round(cluster, args, net, rate, rnd, layouts, variants)
                    _write(rows, args.csv)
    return rows


def _round(cluster, args, net, rate, rnd, layouts, variants):
    solver = os.path.join(REPO, NETS.get(net, net))
    rows, base = [], {}
    for side in sorted({kind for _, (kind, _, _) in variants}):
        d = os.path.join(args.out, net, f"base_{side}")
        walls, _ = (run_caffe8(cluster, args, solver, d, "fp32", False, 1, 1) if side == "caffe8"
                    else run_ddp(cluster, args, solver, d, "ddp-fp32", 1, 1))
        base[side] = statistics.median(walls)
        print(f"[{rate} round {rnd}] {net} 1 process {side}: {base[side] * 1e3:.1f} ms",
              flush=True)
    for nodes, ppn in layouts:
        for name, (kind, codec, asynchronous) in variants:
            run_dir = os.path.join(args.out, net, rate, f"{nodes}x{ppn}", name)
            load = os.getloadavg()[0]
            before = cluster.counters()[cluster.host(0)]["tx_bytes"]
            try:
                walls, comm = (run_caffe8(cluster, args, solver, run_dir, codec, asynchronous,
                                          nodes, ppn) if kind == "caffe8"
                               else run_ddp(cluster, args, solver, run_dir, name, nodes, ppn))
            except RuntimeError as e:
                print(f"FAILED {net} {rate} {nodes}x{ppn} {name}: {e}", file=sys.stderr)
                continue
            sent = cluster.counters()[cluster.host(0)]["tx_bytes"] - before
            it = statistics.median(walls)
            row = {"net": net, "layout": f"{nodes}x{ppn}", "nodes": nodes, "ppn": ppn,
                   "rate": rate, "variant": name, "round": rnd, "iterations": len(walls),
                   "iter_ms": it * 1e3, "exposed_ms": (it - base[kind]) * 1e3,
                   "baseline_ms": base[kind] * 1e3, "comm_ms": comm * 1e3,
                   "link_mb": sent / 1e6 / args.iters, "load_1min": load}
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
        for k in ("iter_ms", "exposed_ms", "baseline_ms", "comm_ms", "link_mb", "load_1min"):
            row[k] = statistics.median(p[k] for p in pts)
        out.append(row)
    return out


def _write(rows, path):
    import _runs
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    _runs.write_rows(rows + summarise(rows), FIELDS, path)


def plot(rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
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
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nets", default="caffenet", help="caffenet, googlenet or a solver path")
    ap.add_argument("--layouts", default="2x1", help="NODESxPROCESSES,... e.g. 2x1,2x2,4x1")
    ap.add_argument("--rates", default="1gbit,10gbit", help="link rates (tc units)")
    ap.add_argument("--delay", default="", help="one-way delay per link end (netem)")
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
    ap.add_argument("--variant", help=argparse.SUPPRESS)
    ap.add_argument("--solver", help=argparse.SUPPRESS)
    ap.add_argument("--master", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.ddp_worker:
        return ddp_worker(args)
    if args.iters <= args.skip:
        ap.error("--iters must exceed --skip")
    from emulated_cluster import ClusterError, available
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
    for r in summarise(rows):
        print(f"{r['net']} {r['layout']} {r['rate']:7s} {r['variant']:14s} "
              f"{r['iter_ms']:8.1f} ms/iter  exposed {r['exposed_ms']:7.1f} ms")
    print(f"wrote {args.csv} and {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
