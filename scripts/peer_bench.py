"""caffe8 against PyTorch on the same nets, interleaved in one run: forward, backward, total ms.

    python -m scripts.peer_bench [--nets lenet,caffenet,googlenet] [--rounds 5] [--iters 3]
                                 [--threads 2] [--batch lenet=64] [--csv runs/peer_bench.csv]
    python -m scripts.peer_bench --gpu [--nets caffenet,googlenet,gru]
    python -m scripts.peer_bench --threads 1 --clock cpu     # on a busy machine
    python -m scripts.peer_bench --isa avx2                  # both sides without AVX-512 kernels
    python -m scripts.peer_bench --emit runs/bench_nets      # the nets, for `caffe8 time`
    python -m scripts.peer_bench --profile --threads 1 --clock cpu --iters 3   # caffe8 per layer

CPU nets: LeNet b64, CaffeNet b16, GoogLeNet b8 (``--batch NET=N`` overrides); GPU nets
(``--gpu``, CuPy and CUDA): CaffeNet b256, GoogLeNet b128 and the GRU benchmark net. Each net
is the shipped ``train_val`` prototxt with its Data layer replaced by DummyData of the crop
size; the PyTorch model is generated from the caffe8 Net's own layer list (same graph, same
parameter shapes, caffe8's initial weights copied in, the same input batch): convolutions with
groups, Caffe's ceil-mode pooling, ``nn.LocalResponseNorm`` (Caffe's ACROSS_CHANNELS LRN with
size, alpha, beta, k), dropout, inner products, concatenations, weighted softmax losses
(GoogLeNet's auxiliary heads), ``nn.GRU`` for caffe8's GRU. Data layers are not timed on either
side (PyTorch gets a ready tensor).

Each side runs in its own worker process (spawned, so neither sees the other's thread pools:
OpenBLAS and OpenMP workers busy-wait after each call, and in one process they steal each
other's cores). A round runs ``--iters`` iterations of caffe8, then of PyTorch; the figures are
medians over ``--rounds`` rounds of the per-iteration mean, so load from other processes hits
both sides alike. Both sides use ``--threads`` threads (caffe8's OpenBLAS and NumPy's via
OPENBLAS_NUM_THREADS, set before either loads; ``torch.set_num_threads``). PyTorch is imported only in its worker and
only if installed; without it the script says so and exits with status 2.
CSV columns: net, batch, device, side, forward_ms, backward_ms, total_ms, ratio (caffe8 total /
PyTorch total, on the caffe8 row), cudnn_calls (caffe8's cuDNN calls per iteration,
``layers.cudnn.CALLS``; on the caffe8 row).
"""
import argparse
import csv
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CPU_NETS = {"lenet": 64, "caffenet": 16, "googlenet": 8}
GPU_NETS = {"caffenet": 256, "googlenet": 128, "gru": None}
PROTOTXT = {"lenet": "prototxt/lenet/train_val.prototxt",
            "caffenet": "prototxt/caffenet/train_val.prototxt",
            "googlenet": "prototxt/googlenet/train_val.prototxt",
            "gru": "prototxt/gru/gru_benchmark.prototxt"}
INPUT_SHAPE = {"lenet": (1, 28, 28), "caffenet": (3, 227, 227), "googlenet": (3, 224, 224)}
COLUMNS = ["net", "batch", "device", "side", "forward_ms", "backward_ms", "total_ms", "ratio",
           "cudnn_calls"]
#: wall: what a user waits; cpu: CPU seconds of the whole process (all its threads), which
#: leaves out time spent descheduled by other load (on a busy machine, with --threads 1, it
#: approximates the wall time of an idle one; with more threads it also counts busy-waiting)
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nets", help="comma-separated subset of the nets (default: all)")
    p.add_argument("--batch", action="append", default=[], metavar="NET=N",
                   help="batch size of one net")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--iters", type=int, default=3, help="timed iterations per side per round")
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--gpu", action="store_true")
    p.add_argument("--clock", choices=sorted(CLOCKS), default="wall")
    p.add_argument("--isa", choices=("native", "avx2"), default="native",
                   help="avx2: cap both sides at AVX2 (PyTorch's ATen/oneDNN kernels, caffe8's "
                        "OpenBLAS at Haswell), a like-for-like comparison on an AVX-512 CPU")
    p.add_argument("--csv", default=os.path.join("runs", "peer_bench.csv"))
    p.add_argument("--layers", action="store_true", help="with --profile: every layer, too")
    p.add_argument("--profile", action="store_true",
                   help="only caffe8, in this process: per-layer and per-type forward/backward "
                        "ms over --iters iterations (the engine and layers first on sys.path, so "
                        "PYTHONPATH=<another checkout> profiles that code)")
    p.add_argument("--emit", metavar="DIR",
                   help="only write each net's benchmark prototxt (NET_bBATCH.prototxt, for "
                        "`caffe8 time`) into DIR")
    args = p.parse_args(argv)
    table = GPU_NETS if args.gpu else CPU_NETS
    args.net_list = args.nets.split(",") if args.nets else list(table)
    args.batches = dict(table)
    for item in args.batch:
        name, _, n = item.partition("=")
        args.batches[name] = int(n)
    for name in args.net_list:
        if name not in table:
            p.error(f"unknown net {name!r} for {'--gpu' if args.gpu else 'CPU'}; "
                    f"choose from {', '.join(table)}")
    if args.rounds < 1 or args.iters < 1:
        p.error("--rounds and --iters must be >= 1")
    return args


# --- the caffe8 side ------------------------------------------------------------------------------
def benchmark_net_param(name, batch):
    """The net's NetParameter: Data layers swapped for DummyData (gaussian data, labels 1)."""
    from caffe8.engine.prototxt import parse_file, parse_text
    net = parse_file(os.path.join(ROOT, PROTOTXT[name]))
    if name == "gru":
        if batch:
            net.layer[0].sequence_data_param.batch_size = batch
        return net
    c, h, w = INPUT_SHAPE[name]
    dummy = parse_text(f'''layer {{ name: "data" type: "DummyData" top: "data" top: "label"
        dummy_data_param {{ data_filler {{ type: "gaussian" std: 1 }}
                            data_filler {{ type: "constant" value: 1 }}
                            shape {{ dim: {batch} dim: {c} dim: {h} dim: {w} }}
                            shape {{ dim: {batch} }} }} }}''').layer[0]
    net.layer = [dummy] + [layer for layer in net.layer if layer.type != "Data"]
    return net


class Caffe8Runner:
    """Times caffe8's layers (not the data layers) as ``caffe8 time`` does."""

    def __init__(self, net, sync, clock=time.perf_counter):
        self.net, self.sync, self.clock = net, sync, clock
        net.forward()
        net.backward()
        self.compute = [i for i, layer in enumerate(net.layers) if not layer.is_data]

    def step(self):
        net = self.net
        t0 = self.clock()
        for i in self.compute:
            net.layers[i].reshape(net.bottom_vecs[i], net.top_vecs[i])
            net.layers[i].forward(net.bottom_vecs[i], net.top_vecs[i])
        self.sync()
        t1 = self.clock()
        for i in reversed(self.compute):
            if net.layer_need_backward[i]:
                net.layers[i].backward(net.top_vecs[i], net.bottom_need_backward[i],
                                       net.bottom_vecs[i])
        self.sync()
        return t1 - t0, self.clock() - t1


# --- the PyTorch side: a graph built from the caffe8 Net -------------------------------------------
class TorchRunner:
    """The caffe8 Net's layer graph in PyTorch, caffe8's parameters and input batch copied in."""

    def __init__(self, net, torch, device, sync, clock=time.perf_counter):
        self.torch, self.device, self.sync, self.clock = torch, device, sync, clock
        from caffe8.engine.backend import to_numpy
        self.inputs, self.ops, self.params = {}, [], []
        for i, layer in enumerate(net.layers):
            if layer.is_data:
                for name, blob in zip(net.top_names[i], net.top_vecs[i]):
                    self.inputs[name] = torch.from_numpy(to_numpy(blob.data).copy()).to(device)
                continue
            params = [torch.nn.Parameter(torch.from_numpy(to_numpy(b.data).copy()).to(device))
                      for b in layer.blobs]
            self.params += params
            weights = net.layer_loss_weights[i]
            self.ops.append((net.bottom_names[i], net.top_names[i], weights,
                             self._op(layer, params, net.bottom_vecs[i], net.top_vecs[i])))
        self.expected_shapes = {n: tuple(b.data.shape) for n, b in net.blobs.items()}

    def _op(self, layer, params, bottom, top):
        """fn(list of input tensors) -> list of output tensors, for one caffe8 layer."""
        torch, F = self.torch, self.torch.nn.functional
        kind = layer.type
        if kind == "Convolution":
            w, b = params[0], (params[1] if len(params) > 1 else None)
            return lambda xs: [F.conv2d(x, w, b, tuple(layer.stride), tuple(layer.pad),
                                        tuple(layer.dilation), layer.group) for x in xs]
        if kind == "Pooling":
            return self._pool(layer, F)
        if kind == "LRN":
            if layer.region != "ACROSS_CHANNELS":
                raise ValueError(f"{layer.name}: only ACROSS_CHANNELS LRN has a PyTorch twin")
            lrn = torch.nn.LocalResponseNorm(layer.size, layer.alpha_over_n * layer.size,
                                             layer.beta, layer.k)
            return lambda xs: [lrn(xs[0])]
        if kind == "ReLU":
            return lambda xs: [F.leaky_relu(xs[0], layer.slope) if layer.slope else F.relu(xs[0])]
        if kind == "Dropout":
            return lambda xs: [F.dropout(xs[0], layer.ratio, training=layer.phase == "TRAIN")]
        if kind == "InnerProduct":
            w, b = params[0], (params[1] if len(params) > 1 else None)
            wt = (lambda: w.t()) if layer.transpose else (lambda: w)
            return lambda xs: [F.linear(xs[0].flatten(layer.axis), wt(), b)]
        if kind == "Concat":
            return lambda xs: [torch.cat(xs, dim=layer.axis)]
        if kind == "Split":
            return lambda xs: [xs[0]] * len(top)
        if kind == "SoftmaxWithLoss":
            ignore = -100 if layer.ignore_label is None else layer.ignore_label
            return lambda xs: [F.cross_entropy(
                _class_second(xs[0], layer.axis),
                xs[1].reshape(xs[0].shape[:layer.axis] + xs[0].shape[layer.axis + 1:]).long(),
                ignore_index=ignore)]
        if kind == "GRU":
            return self._gru(layer, params, bottom)
        raise ValueError(f"{layer.name}: no PyTorch twin for layer type {kind}")

    def _pool(self, layer, F):
        k, s, p = layer.k, tuple(layer.stride), tuple(layer.pad)
        if layer.method == "MAX":
            return lambda xs: [F.max_pool2d(xs[0], k, s, p, ceil_mode=layer.ceil_mode)]
        if layer.method == "AVE":
            return lambda xs: [F.avg_pool2d(xs[0], k, s, p, ceil_mode=layer.ceil_mode,
                                            count_include_pad=True)]
        raise ValueError(f"{layer.name}: no PyTorch twin for {layer.method} pooling")

    def _gru(self, layer, params, bottom):
        torch = self.torch
        d = bottom[0].count // (bottom[0].shape[0] * bottom[0].shape[1])
        gru = torch.nn.GRU(d, params[1].shape[1]).to(self.device)
        with torch.no_grad():            # caffe8's GRU uses PyTorch's layout (see layers/gru.py)
            gru.weight_ih_l0.copy_(params[0])
            gru.weight_hh_l0.copy_(params[1])
            gru.bias_ih_l0.copy_(params[2][0])
            gru.bias_hh_l0.copy_(params[2][1])
        self.params += list(gru.parameters())
        return lambda xs: [gru(xs[0].flatten(2))[0]]

    def check_shapes(self):
        """Run once and compare every blob's shape with caffe8's; raise on a mismatch."""
        for name, shape in self._forward().items():
            if tuple(shape.shape) != self.expected_shapes[name]:
                raise RuntimeError(f"PyTorch twin: blob {name} has shape {tuple(shape.shape)}, "
                                   f"caffe8 {self.expected_shapes[name]}")

    def _forward(self):
        blobs = dict(self.inputs)
        self.loss = 0
        for bottoms, tops, weights, fn in self.ops:
            outs = fn([blobs[b] for b in bottoms])
            for name, out, w in zip(tops, outs, weights):
                blobs[name] = out
                if w:
                    self.loss = self.loss + w * out.sum()
        return blobs

    def step(self):
        for p in self.params:
            p.grad = None                # PyTorch's zero_grad(set_to_none=True), not timed
        t0 = self.clock()
        self._forward()
        self.sync()
        t1 = self.clock()
        self.loss.backward()
        self.sync()
        return t1 - t0, self.clock() - t1


def _class_second(x, axis):
    """Scores with the class axis moved to 1, as cross_entropy wants."""
    return x if axis == 1 else x.movedim(axis, 1)


# --- driver: one worker process per side, rounds alternating ----------------------------------------
def _worker(side, name, batch, gpu, clock_name, conn):
    """Build one side's net, then answer each "run N" with N (forward, backward) seconds."""
    from caffe8.engine import backend
    from caffe8.engine.net import Net
    from caffe8 import layers  # noqa: F401  (registers the layer types)
    if gpu:
        backend.use_gpu(0)
    backend.seed(1)                      # both sides build the same initial weights and input
    net = Net(benchmark_net_param(name, batch), phase="TRAIN")
    clock = CLOCKS[clock_name]
    if side == "caffe8":
        sync = (lambda: backend.cupy.cuda.Stream.null.synchronize()) if gpu else (lambda: None)
        runner = Caffe8Runner(net, sync, clock)
    else:
        import torch
        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
        # TF32 as caffe8's side has it (CAFFE8_TF32): PyTorch's cuDNN would allow it by default
        torch.backends.cuda.matmul.allow_tf32 = backend.tf32_enabled()
        torch.backends.cudnn.allow_tf32 = backend.tf32_enabled()
        torch.manual_seed(1)
        for i, layer in enumerate(net.layers):
            if layer.is_data:
                layer.forward(net.bottom_vecs[i], net.top_vecs[i])
        runner = TorchRunner(net, torch, "cuda" if gpu else "cpu",
                             torch.cuda.synchronize if gpu else (lambda: None), clock)
        runner.check_shapes()
        runner.step()                    # warm-up (allocator, oneDNN primitives)
    batch_size = net.blobs[net.top_names[0][0]].shape[1 if name == "gru" else 0]
    conn.send(("ready", batch_size))
    from caffe8.layers import cudnn
    while True:
        n = conn.recv()
        if n is None:
            return
        before = sum(cudnn.CALLS.values())
        steps = [runner.step() for _ in range(n)]
        conn.send((steps, (sum(cudnn.CALLS.values()) - before) / n))


def bench_one(name, batch, args, log):
    """Median forward / backward / total ms of each side over the rounds (two CSV rows)."""
    import multiprocessing
    ctx = multiprocessing.get_context("spawn")   # no framework state shared with the parent
    workers = {}
    for side in ("caffe8", "pytorch"):
        mine, theirs = ctx.Pipe()
        proc = ctx.Process(target=_worker, args=(side, name, batch, args.gpu, args.clock, theirs))
        proc.start()
        workers[side] = (proc, mine)
    try:
        sizes = {side: _expect_ready(side, conn) for side, (_, conn) in workers.items()}
        times = {"caffe8": [], "pytorch": []}
        calls = 0.0
        for r in range(args.rounds):
            for side, (_, conn) in workers.items():
                time.sleep(0.2)          # the idle side's BLAS / OpenMP threads stop spinning
                conn.send(args.iters)
                steps, side_calls = conn.recv()
                calls = side_calls if side == "caffe8" else calls
                times[side].append((sum(f for f, _ in steps) * 1000 / len(steps),
                                    sum(b for _, b in steps) * 1000 / len(steps)))
            log(f"  round {r + 1}: caffe8 {sum(times['caffe8'][-1]):.1f} ms, "
                f"pytorch {sum(times['pytorch'][-1]):.1f} ms")
    finally:
        for proc, conn in workers.values():
            if proc.is_alive():
                try:
                    conn.send(None)
                except OSError:
                    pass
            proc.join(timeout=30)
    rows = []
    for side in ("caffe8", "pytorch"):
        rows.append({"net": name, "batch": sizes[side], "device": "cuda" if args.gpu else "cpu",
                     "side": side,
                     "forward_ms": round(statistics.median(t[0] for t in times[side]), 3),
                     "backward_ms": round(statistics.median(t[1] for t in times[side]), 3),
                     "total_ms": round(statistics.median(sum(t) for t in times[side]), 3),
                     "ratio": "", "cudnn_calls": ""})
    rows[0]["ratio"] = round(rows[0]["total_ms"] / rows[1]["total_ms"], 3)
    rows[0]["cudnn_calls"] = round(calls, 1)
    return rows


def _expect_ready(side, conn):
    try:
        tag, batch_size = conn.recv()
    except EOFError:
        raise SystemExit(f"peer_bench: the {side} worker died while building its net") from None
    return batch_size


def emit_prototxts(args):
    """Write the benchmark nets as prototxt files (the DummyData versions ``caffe8 time`` reads)."""
    from caffe8.engine.prototxt import to_text
    os.makedirs(args.emit, exist_ok=True)
    for name in args.net_list:
        path = os.path.join(args.emit, f"{name}_b{args.batches[name]}.prototxt")
        with open(path, "w", encoding="utf-8") as f:
            f.write(to_text(benchmark_net_param(name, args.batches[name])))
        print(path)
    return 0


def profile(args):
    """Per-layer times of caffe8 alone (the loop of ``caffe8 time``, data layers left out). With
    ``--gpu`` each layer's time ends with a device synchronisation, and a second loop without
    them splits the iteration into the host's launch time and the wall time to the last kernel:
    a launch time close to the wall time means the host (Python, CuPy) is the bottleneck."""
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
        os.environ[var] = str(args.threads)
    sys.path.append(ROOT)                # after PYTHONPATH: another checkout's code may come first
    from caffe8.engine import backend
    from caffe8.engine.net import Net
    from caffe8 import layers  # noqa: F401
    from caffe8.layers.cudnn_conv import chosen_algorithms
    clock = CLOCKS[args.clock]
    if args.gpu:
        backend.use_gpu(0)
        sync = backend.cupy.cuda.Stream.null.synchronize
    else:
        def sync():
            pass
    for name in args.net_list:
        backend.seed(1)
        net = Net(benchmark_net_param(name, args.batches[name]), phase="TRAIN")
        net.forward()
        net.backward()
        sync()
        n = len(net.layers)
        fwd, bwd = [0.0] * n, [0.0] * n
        for _ in range(args.iters):
            for i, layer in enumerate(net.layers):
                if not layer.is_data:
                    t = clock()
                    layer.reshape(net.bottom_vecs[i], net.top_vecs[i])
                    layer.forward(net.bottom_vecs[i], net.top_vecs[i])
                    sync()
                    fwd[i] += clock() - t
            for i in reversed(range(n)):
                if not net.layers[i].is_data and net.layer_need_backward[i]:
                    t = clock()
                    net.layers[i].backward(net.top_vecs[i], net.bottom_need_backward[i],
                                           net.bottom_vecs[i])
                    sync()
                    bwd[i] += clock() - t
        scale = 1000.0 / args.iters
        print(f"{name} b{args.batches[name]} ({'GPU' if args.gpu else f'{args.threads} threads'}, "
              f"{args.clock} clock, {args.iters} iterations, code from "
              f"{os.path.dirname(os.path.dirname(layers.__file__))})")
        by_type = {}
        for i, layer in enumerate(net.layers):
            f, b = fwd[i] * scale, bwd[i] * scale
            if args.layers:          # cuDNN's algorithms: operation=algo/math type
                algos = " ".join(f"{op}={a}/m{m}"
                                 for op, (a, _, m) in sorted(chosen_algorithms(layer).items()))
                print(f"  {layer.name:28s} {layer.type:16s} {f:9.2f} {b:9.2f}"
                      + (f"  {algos}" if algos else ""))
            t = by_type.setdefault(layer.type, [0.0, 0.0])
            t[0] += f
            t[1] += b
        print(f"  {'type':16s} {'forward':>9s} {'backward':>9s}")
        for kind, (f, b) in sorted(by_type.items(), key=lambda kv: -sum(kv[1])):
            print(f"  {kind:16s} {f:9.2f} {b:9.2f}")
        print(f"  {'total':16s} {sum(fwd) * scale:9.2f} {sum(bwd) * scale:9.2f}   "
              f"= {(sum(fwd) + sum(bwd)) * scale:.2f} ms")
        if args.gpu:
            runner = Caffe8Runner(net, lambda: None, clock)
            launch, wall = [], []
            for _ in range(args.iters):
                sync()
                t0 = clock()
                runner.step()
                launch.append(clock() - t0)
                sync()
                wall.append(clock() - t0)
            print(f"  without per-layer synchronisation: host launch "
                  f"{statistics.median(launch) * 1e3:.2f} ms, wall "
                  f"{statistics.median(wall) * 1e3:.2f} ms per iteration (medians)")
    return 0


def main(argv=None):
    args = parse_args(argv)
    if args.emit:
        return emit_prototxts(args)
    if args.profile:
        return profile(args)
    import importlib.util
    if importlib.util.find_spec("torch") is None:
        print("peer_bench: PyTorch is not installed; nothing to compare against", file=sys.stderr)
        return 2
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(args.threads)  # inherited by the workers before NumPy / torch load
    if args.isa == "avx2":           # PyTorch's ATen and oneDNN kernels, caffe8's GEMM: AVX2
        os.environ["ATEN_CPU_CAPABILITY"] = "avx2"
        os.environ["ONEDNN_MAX_CPU_ISA"] = "AVX2"
        os.environ.setdefault("CAFFE8_OPENBLAS_CORETYPE", "Haswell")
    coretype = os.environ.get("CAFFE8_OPENBLAS_CORETYPE", "auto")
    rows = []
    for name in args.net_list:
        print(f"{name} (batch {args.batches[name]}, {args.threads} threads, "
              f"caffe8's OpenBLAS core {coretype}, PyTorch ISA {args.isa}, {args.clock} clock):",
              flush=True)
        rows += bench_one(name, args.batches[name], args, lambda s: print(s, flush=True))
    print(f"\n{'net':10s} {'batch':>5s} {'side':8s} {'forward':>10s} {'backward':>10s} "
          f"{'total':>10s} {'ratio':>6s}")
    for r in rows:
        print(f"{r['net']:10s} {r['batch']:5d} {r['side']:8s} {r['forward_ms']:10.2f} "
              f"{r['backward_ms']:10.2f} {r['total_ms']:10.2f} {r['ratio']!s:>6s}")
    if args.csv:
        os.makedirs(os.path.dirname(os.path.abspath(args.csv)), exist_ok=True)
        with open(args.csv, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=COLUMNS)
            writer.writeheader()
            writer.writerows(rows)
        print(f"wrote {args.csv}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
