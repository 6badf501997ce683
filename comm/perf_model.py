"""The performance model: data-parallel iteration time and speedup from per-layer compute,
per-message latency + size / bandwidth, and communication hidden under the backward of the
layers still to come (Oyama et al.'s figure 7; the shape of the appendix model of Dettmers'
"8-bit approximations for parallelism in deep learning").

Units: seconds, bytes, elements. Inputs:

* ``LayerCost`` per layer in net order: forward and backward seconds of one process at its batch,
  and the element counts of its parameter tensors (weights and biases are separate tensors);
* ``Network``: latency α and bandwidth β inside a node (per process) and between nodes (the
  node's link, shared by its processes), the host-copy bandwidth (PCIe; infinite on the CPU) and
  the processes per node P';
* ``CodecCost``: bytes per element on the wire (4 / 2 / 1), the reduction op's rate (elements/s)
  and the encode+decode rate (elements/s, infinite for float32).

Schedules (per tensor of n elements, B = n·bytes):

* ``flat``: one ring allreduce over all P processes: 2(P−1) steps, each paced by the slowest
  hop (inter-node when P > P'), 2(P−1)/P·B over that hop, (P−1)/P·n elements reduced;
* ``hierarchical``: intra-node reduce-scatter over P' ((P'−1) steps,
  (P'−1)/P'·B), a ring allreduce of the 1/P' piece among the N = P/P' nodes — the P' processes
  of a node use its link at once, so each gets β_inter/P', which makes the inter-node term
  2(N−1)/N·B/β_inter — and an intra-node allgather.

Every exchanged tensor also pays encode + decode (n / convert rate) and a copy to and from the
host (2·B / host bandwidth). One process (P = 1) has no exchange at all (Oyama et al.'s baseline).

Iteration (``iteration_time``): forward, then backward from the last layer to the first. Without
overlap the exchanges run after the whole backward, one after another. With overlap (Oyama et al.'s
asynchronous mode, one communication thread) the exchange of layer l starts when its backward has
ended and the previous exchange is done; the iteration ends when both backward and the last
exchange are done, plus the update.

``serial_convert`` follows Oyama et al.'s implementation more closely ("reducing communication in
data-parallel deep learning with floating-point numbers smaller than single precision",
Algorithm 1): its conversion kernels run on the GPU, which the backward occupies, so each
tensor's encode + decode (n / convert rate) is added to the compute path right after its
backward instead of to the communication thread, which keeps the host copies and MPI.

The emulated cluster (``cluster_time``; scripts/cluster_bench.py: N nodes × P' processes, every
node a network namespace of *one* machine of C cores, joined by a tc-shaped link of R bit/s in
each direction; the nets' EmulatedCompute layers sleep and take no core). All processes do the
same work, so one is simulated (``simulate_threads``): its threads share C/(N·P') cores max-min
fairly (processor sharing), a sleep or a latency takes none. Inputs: the emulated per-layer
sleeps and tensor sizes, the measured one-process iteration T1 of the same side, per-collective
latency α, and host rates of one core (r_x, elements/s):

* host work of one process H = T1 − Σ sleeps. caffe8: its update part U(n) = n/r_update +
  n/r_finite per tensor; of the rest H_r = H − U(all) (clearing the diffs, the losses' forward
  sums and backward fills: one pass over every element each) a third falls in backward, per
  layer in proportion to its elements, just before the layer's sleep (Caffe's loss backward
  runs first), two thirds before forward. DDP: H_r = H − n/r_step, half of it in backward after
  each layer's sleep (AccumulateGrad materialising the gradients), half before forward;
* a transfer of B bytes over the node's link: wire time w = B / (R/8 · η), η = 1448/1514 (TCP
  payload per byte of frame that tc counts, MTU 1500), needing B / r_tcp CPU-seconds (all the
  CPU work of both ends per byte sent: the kernel's path through veth, bridge and token
  buckets, and the library's copies): it goes at the link's rate while its thread gets
  (B/r_tcp)/w of a core, slower in proportion with less (at 10 Gbit/s on two cores, the
  transfers are CPU-bound);
* caffe8's hierarchical sum of n elements of b bytes (``c8_collective_steps``): P' > 1: a
  barrier α_s and (P'−1)/P'·n/r_sum (shared-memory reduce-scatter); N > 1: n/P'/r_between
  (fp8's rescale; none with P' = 1, where the encode's scale holds it), then for the Alltoallv
  and the Allgather each α + a transfer of (N−1)/N·nb/P' bytes at R/P' (the node's P'
  processes share its link), between them
  (N−1)/N·n/P'/r_sum; P' > 1: a barrier and (P'−1)/P'·nb / r_copy (the allgather's copies);
* caffe8 synchronous: everything on the compute thread after backward, per tensor in ready
  order encode n/r_encode, the bucket sums, decode n/r_decode, the verdict's allreduce
  (⌈log2 P⌉ α), then the update: T1 + Σ (encode + sum + decode) + ⌈log2 P⌉ α with a core per
  process. Asynchronous (the CPU's 3-stage pipeline; the verdict's allreduce before backward):
  tensor k (last layer first, its tensors last first) is encoded by the encode thread once its
  layer's backward is done and the previous encode is, its bucket summed by the communication
  thread after the bucket's last encode and the previous bucket's sum, the tensor decoded and
  updated (the pipelined update: decode + U(n_k)) by the update thread after its bucket's sum
  and the previous update; the iteration ends when the compute thread's backward and the last
  update are done;
* PyTorch DDP (``ddp_cluster_programs``): buckets in gradient-ready order, the first closed at
  ≥ 1 MiB, the others at ≥ 25 MiB (DDP's rebuilt buckets), the rest last. Autograd thread: each
  gradient copied into its bucket (n/r_copy, the division folded in); with the fp16 hook the
  bucket's cast and division (m/r_encode) when it closes. Gloo thread, buckets in turn: 2(P−1)
  ring steps of α, one transfer of 2(P−1)/P · m·b bytes over the link (the ring's one node-
  crossing hop per node, N > 1) whose CPU also holds the ring's sum (P−1)/P · m/r_sum (gloo
  reduces a segment while the next is on the wire) and its bytes' TCP work, of which (P'−1)/P'
  goes over the node's loopback (r_loopback) and 1/P' over the link (r_tcp); fp16: m/r_decode
  back into the bucket. After
  backward and the last bucket: the copy back n/r_copy and the optimizer step n/r_step.

Not modelled: the fp8 quantile pass (a few ms per iteration) and fixed costs of small fp8
buckets, the ranks' skew at every collective (the slowest rank sets each step), the delay
before a woken thread gets a busy core (MPI moves data only inside the watchdog's polls, so a
transfer beside busy threads goes slower than its CPU share), the GIL, contention for memory
bandwidth beyond what the host rates were measured under, page faults of fresh arrays (DDP's
gradients after zero_grad, the fp16 hook's casts) beyond their measured rates, and gloo's
second worker thread (one here). studies/perf_model/validate.py's docstring gives the constants
and how the model does against the measured runs.

Predictions for a net of one's own: ``caffe8 perf_model`` (caffe8/tools/perf_model.py).
"""
import json
import math
import re
from dataclasses import dataclass, field

from caffe8.comm.codecs import CODECS
from caffe8.comm.ops import WIRE_DTYPES

INF = float("inf")


@dataclass(frozen=True)
class Network:
    """Latencies (s per message step) and bandwidths (bytes/s); see the module docstring."""
    alpha_intra: float
    beta_intra: float
    alpha_inter: float
    beta_inter: float
    processes_per_node: int = 1
    beta_host: float = INF


@dataclass(frozen=True)
class CodecCost:
    """Wire bytes per element, reduction op rate and encode+decode rate (elements/s).

    The emulated-cluster model (``cluster_time``) takes the host passes one at a time, each at
    one core's rate (elements/s): ``encode_rate`` (gradient to wire), ``decode_rate`` (wire to
    the mean gradient) and ``between_rate`` (fp8's rescale between the intra- and inter-node
    stages: a decode and an encode)."""
    bytes_per_element: float
    reduce_rate: float = INF
    convert_rate: float = INF
    encode_rate: float = INF
    decode_rate: float = INF
    between_rate: float = INF


@dataclass
class LayerCost:
    """One layer: forward/backward seconds and the element counts of its parameter tensors."""
    name: str
    forward: float = 0.0
    backward: float = 0.0
    tensors: list = field(default_factory=list)


#: wire bytes per element of each codec the transport sums (the registry's; a gather codec's
#: payload depends on its data)
CODEC_BYTES = {name: WIRE_DTYPES[codec.wire_name].itemsize for name, codec in CODECS.items()
               if codec.reduction == "sum"}


# --- collectives -----------------------------------------------------------------------------
def ring_allreduce_time(n, nbytes, p, alpha, beta, reduce_rate):
    """Reduce-scatter + allgather ring over ``p`` processes: 2(p−1)α + 2(p−1)/p·B/β +
    (p−1)/p·n/r. Zero for p = 1."""
    if p <= 1:
        return 0.0
    return 2 * (p - 1) * alpha + 2 * (p - 1) / p * nbytes / beta + (p - 1) / p * n / reduce_rate


def _split(p, network):
    """(P', N): processes per node (at most p) and nodes."""
    ppn = max(1, min(network.processes_per_node, p))
    if p % ppn:
        raise ValueError(f"processes_per_node {ppn} does not divide P = {p}")
    return ppn, p // ppn


def flat_time(n, codec, network, p):
    """One ring allreduce over all p processes, paced by its slowest hop."""
    ppn, nodes = _split(p, network)
    if nodes == 1:
        alpha, beta = network.alpha_intra, network.beta_intra
    else:
        alpha = max(network.alpha_intra, network.alpha_inter)
        beta = min(network.beta_intra, network.beta_inter)
    return ring_allreduce_time(n, n * codec.bytes_per_element, p, alpha, beta, codec.reduce_rate)


def hierarchical_time(n, codec, network, p):
    """Intra-node reduce-scatter, inter-node ring allreduce of the 1/P' piece, allgather."""
    ppn, nodes = _split(p, network)
    nbytes = n * codec.bytes_per_element
    frac = (ppn - 1) / ppn
    intra = 2 * (ppn - 1) * network.alpha_intra + 2 * frac * nbytes / network.beta_intra \
        + frac * n / codec.reduce_rate
    # The node's P' processes share its link: each gets beta_inter / P'.
    inter = ring_allreduce_time(n / ppn, nbytes / ppn, nodes, network.alpha_inter,
                                network.beta_inter / ppn, codec.reduce_rate)
    return intra + inter


SCHEDULES = {"flat": flat_time, "hierarchical": hierarchical_time}


def exchange_time(n, codec, network, p, schedule="hierarchical"):
    """Seconds to exchange one tensor of ``n`` elements on ``p`` processes (0 for p = 1):
    encode + decode, host copies both ways, and the collective."""
    if p <= 1 or n == 0:
        return 0.0
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {sorted(SCHEDULES)}, got {schedule!r}")
    nbytes = n * codec.bytes_per_element
    return (n / codec.convert_rate + 2 * nbytes / network.beta_host
            + SCHEDULES[schedule](n, codec, network, p))


# --- the iteration ---------------------------------------------------------------------------
def iteration_time(layers, codec, network, p, schedule="hierarchical", overlap=True, update=0.0,
                   serial_convert=False):
    """Predicted seconds of one iteration and its parts.

    Returns a dict: ``iteration``, ``compute`` (forward + backward + update), ``comm`` (sum of
    the exchanges), ``exposed`` (iteration − compute: the communication not hidden).
    ``serial_convert``: see the module docstring (the conversion then counts as exposed).
    """
    forward = sum(layer.forward for layer in layers)
    t = comm_free = forward
    comm_total = 0.0
    for layer in reversed(layers):
        t += layer.backward
        c = sum(exchange_time(n, codec, network, p, schedule) for n in layer.tensors)
        if serial_convert and p > 1:
            convert = sum(n / codec.convert_rate for n in layer.tensors)
            t += convert
            c -= convert
        comm_total += c
        if c and overlap:
            comm_free = max(t, comm_free) + c
        elif c:
            t += c
    end = max(t, comm_free) + update
    compute = forward + sum(layer.backward for layer in layers) + update
    return {"iteration": end, "compute": compute, "comm": comm_total, "exposed": end - compute}


def weak_speedup(layers, codec, network, p, schedule="hierarchical", overlap=True, update=0.0,
                 serial_convert=False):
    """Samples/s on p processes over samples/s on one (fixed per-process batch): p·T1/Tp."""
    t1 = iteration_time(layers, codec, network, 1, schedule, overlap, update)["iteration"]
    tp = iteration_time(layers, codec, network, p, schedule, overlap, update,
                        serial_convert)["iteration"]
    return p * t1 / tp


# --- inputs from caffe8 files ----------------------------------------------------------------
def layer_params_from_net(net):
    """{layer name: [element count of each parameter tensor it owns]} of a built engine Net,
    in net order; shared parameters are counted once, at their owner."""
    out = {}
    for net_id, (i, k) in enumerate(net.param_layer_indices):
        if net.param_owners[net_id] is not None:
            continue
        layer = net.layers[i]
        out.setdefault(layer.name, []).append(int(layer.blobs[k].count))
    return out


def layer_macs_from_net(net):
    """{layer name: multiply-adds per sample of its forward} for layers with a weight blob
    (Convolution, InnerProduct, ...): top count per sample × weight count / weight.shape[0]
    (= C/g·kh·kw for a convolution, K for an inner product)."""
    out = {}
    for i, layer in enumerate(net.layers):
        if not layer.blobs or not net.top_vecs[i] or len(layer.blobs[0].shape) < 2:
            continue
        top = net.top_vecs[i][0]
        per_sample = top.count // max(top.shape[0], 1)
        w = layer.blobs[0]
        out[layer.name] = per_sample * (w.count // w.shape[0])
    return out


def layer_times_from_timing_log(path, skip=1, rank=0):
    """[(name, forward s, backward s)] in net order: per-layer medians over the iterations
    >= ``skip`` of one rank in a caffe8 timing log (docs/timing_schema.json)."""
    per_layer, order = {}, []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            rec = json.loads(line)
            if rec["iteration"] < skip or rec.get("rank", 0) != rank:
                continue
            for layer in rec["layers"]:
                if layer["name"] not in per_layer:
                    per_layer[layer["name"]] = ([], [])
                    order.append(layer["name"])
                per_layer[layer["name"]][0].append(layer["forward"])
                per_layer[layer["name"]][1].append(layer["backward"])
    if not order:
        raise ValueError(f"{path}: no timing records of rank {rank} at iteration >= {skip}")
    return [(name, _median(per_layer[name][0]), _median(per_layer[name][1])) for name in order]


_TIME_LINE = re.compile(r"\]\s*(\S+)\s+(forward|backward): ([-+0-9.eE]+) ms\.")


def layer_times_from_caffe_time(lines):
    """[(name, forward s, backward s)] from ``caffe8 time`` (or Caffe's ``caffe time``) output:
    the "Average time per layer" lines ``<name>\\tforward: X ms.`` / ``backward: Y ms.``."""
    times, order = {}, []
    for line in lines:
        m = _TIME_LINE.search(line)
        if m:
            if m.group(1) not in times:
                times[m.group(1)] = [0.0, 0.0]
                order.append(m.group(1))
            times[m.group(1)][m.group(2) == "backward"] = float(m.group(3)) / 1000.0
    return [(name, times[name][0], times[name][1]) for name in order]


def split_by_macs(macs, params, seconds):
    """LayerCosts whose forward + backward add up to ``seconds`` (one process, one iteration),
    split in proportion to each layer's forward multiply-adds ``macs`` ({layer: MACs}, net
    order). A layer's backward costs twice its forward (gradients w.r.t. weights and inputs),
    except the first layer's, which computes no input gradient and costs once its forward.

    Used where only a whole-net time is known (a published per-iteration timing): the net's
    measured speed then sets the total and the multiply-adds only say where in the backward
    the time falls, which decides what an exchange can hide under."""
    names = list(macs)
    weights = [macs[name] * (2 if k == 0 else 3) for k, name in enumerate(names)]
    total = sum(weights)
    if total <= 0 or seconds < 0:
        raise ValueError(f"split_by_macs needs positive multiply-adds and seconds >= 0, got "
                         f"{total} MACs and {seconds} s")
    out = []
    for k, name in enumerate(names):
        fwd = seconds * macs[name] / total
        out.append(LayerCost(name, fwd, fwd * (1 if k == 0 else 2), list(params.get(name, []))))
    return out


def build_layers(times, params):
    """LayerCosts from [(name, fwd, bwd)] and {name: [tensor sizes]} (a layer without timing,
    e.g. with sizes only, gets zero compute)."""
    layers = [LayerCost(name, fwd, bwd, list(params.get(name, []))) for name, fwd, bwd in times]
    seen = {layer.name for layer in layers}
    layers += [LayerCost(name, 0.0, 0.0, list(sizes)) for name, sizes in params.items()
               if name not in seen]
    return layers


def _median(values):
    v = sorted(values)
    mid = len(v) // 2
    return v[mid] if len(v) % 2 else 0.5 * (v[mid - 1] + v[mid])


def fit_alpha_beta(points):
    """(α, seconds per element) of t = α + s·n from [(n, t)] (≥ 2 distinct n), least squares on
    the relative residual (α + s·n − t)/t, so that small and large sizes count alike."""
    # Weighted normal equations with weights 1/t².
    sw = sx = sxx = sy = sxy = 0.0
    for x, y in points:
        w = 1.0 / (y * y)
        sw, sx, sxx, sy, sxy = sw + w, sx + w * x, sxx + w * x * x, sy + w * y, sxy + w * x * y
    det = sw * sxx - sx * sx
    if det <= 0 or len({x for x, _ in points}) < 2:
        raise ValueError("fit_alpha_beta needs at least two different sizes")
    return (sxx * sy - sx * sxy) / det, (sw * sxy - sx * sy) / det


# --- the emulated cluster: host work shared by threads and processes -------------------------
# Payload bytes per byte that tc's token bucket counts on the emulated cluster's veth links: a
# TCP segment of MSS 1448 bytes (MTU 1500 less 20 bytes of IP and 32 of TCP header with
# timestamps) travels in a 1514-byte frame (14 bytes of Ethernet header), and tc counts frames.
TCP_PAYLOAD_EFFICIENCY = 1448 / 1514


@dataclass(frozen=True)
class HostCost:
    """The machine that runs every emulated node, and one process's per-element host passes.

    ``cores``: cores of the machine, shared by all processes of all emulated nodes (their
    emulated compute sleeps and takes none); ``tcp_rate``: bytes a process sends (and as many
    received) per CPU-second over the emulated link, all the CPU work of both ends counted
    (the kernel's TCP path through the node's veth, the bridge and the token buckets, and the
    communication library's copies); ``loopback_rate``: the same between two processes of one
    node over TCP on its loopback (gloo's intra-node ring hops); ``copy_rate``: bytes/s of a
    memory copy (the shared-memory stages); rates of one core in elements/s: ``update_rate``
    (the SGD momentum step), ``finite_rate`` (the NaN/Inf test of the pipelined update)."""
    cores: float = INF
    tcp_rate: float = INF
    copy_rate: float = INF
    update_rate: float = INF
    finite_rate: float = INF
    loopback_rate: float = INF


@dataclass(frozen=True)
class DdpCost:
    """PyTorch DDP's own host pass and bucket sizes: each gradient is copied into its bucket when
    it is ready (with the division by P folded in: ``at::mul_out``; the fp16 hook copies and
    casts/divides itself, its codec's ``encode_rate``) and copied back after the allreduce, both
    at ``copy_rate`` (elements/s of one core); the first bucket holds ``first`` bytes, the
    others ``cap`` (a bucket closes once it holds at least its limit, DDP's rule)."""
    copy_rate: float = INF
    first: float = float(1 << 20)
    cap: float = float(25 << 20)


def _water_fill(capacity, demands):
    """Max-min fair shares of ``capacity`` cores among threads wanting ``demands`` cores."""
    alloc = [0.0] * len(demands)
    left = [k for k, d in enumerate(demands) if d > 0]
    cap = capacity
    while left:
        share = cap / len(left)
        small = [k for k in left if demands[k] <= share]
        if not small:
            for k in left:
                alloc[k] = share
            break
        for k in small:
            alloc[k] = demands[k]
            cap -= demands[k]
        left = [k for k in left if k not in small]
    return alloc


def simulate_threads(threads, cores):
    """Finish time of every thread of one process whose threads share ``cores`` cores.

    ``threads``: {name: [step, ...]}, each thread running its steps in order from time 0:

    * ``("cpu", s)``: ``s`` seconds of work for one core;
    * ``("idle", s)``: ``s`` seconds that take no core (a sleep, a latency);
    * ``("xfer", w, c)``: a transfer, ``w`` seconds at the link's rate that needs ``c``
      CPU-seconds in all (the kernel's copies): it goes at the link's rate while it gets
      ``c / w`` of a core, slower in proportion with less;
    * ``("await", event)`` waits until some thread has passed ``("signal", event)``.

    Cores go to the running steps max-min fairly (processor sharing: a ``cpu`` step wants one
    core, a transfer ``min(1, c / w)``). Returns ({thread: finish s}, {event: time s})."""
    names = list(threads)
    pos = {n: 0 for n in names}
    left = {n: None for n in names}      # remaining of the current step, in its own unit
    events, finish, t = {}, {}, 0.0
    while True:
        _pass_instant_steps(threads, names, pos, left, events, finish, t)
        running = [n for n in names if left[n] is not None]
        if not running:
            if len(finish) < len(names):
                stuck = {n: threads[n][pos[n]] for n in names if n not in finish}
                raise ValueError(f"threads wait for events never signalled: {stuck}")
            return finish, events
        steps = [threads[n][pos[n]] for n in running]
        demands = [1.0 if s[0] == "cpu" else
                   (min(1.0, s[2] / s[1]) if s[1] > 0 else 1.0) if s[0] == "xfer" else 0.0
                   for s in steps]
        rates = []
        for s, a in zip(steps, _water_fill(cores, demands)):
            if s[0] == "cpu":
                rates.append(a)                          # CPU-seconds per second
            elif s[0] == "idle":
                rates.append(1.0)
            else:                                        # fraction of the transfer per second
                rates.append(min(1.0 / s[1] if s[1] > 0 else INF, a / s[2] if s[2] > 0 else INF))
        if not any(r > 0 for r in rates):
            raise ValueError("no core for the running steps (cores must be > 0)")
        dt, first = min((left[n] / r, k) for k, (n, r) in enumerate(zip(running, rates)) if r > 0)
        t += dt
        for k, (n, r) in enumerate(zip(running, rates)):
            left[n] = 0.0 if k == first else left[n] - r * dt
            if left[n] <= 1e-12:
                left[n] = None
                pos[n] += 1


def _pass_instant_steps(threads, names, pos, left, events, finish, t):
    """Signals, satisfied awaits and empty steps at time ``t``; starts the next timed steps."""
    moved = True
    while moved:
        moved = False
        for n in names:
            steps = threads[n]
            while pos[n] < len(steps) and left[n] is None:
                step = steps[pos[n]]
                if step[0] == "signal":
                    events.setdefault(step[1], t)
                elif step[0] == "await":
                    if step[1] not in events:
                        break
                elif step[0] in ("cpu", "idle"):
                    if step[1] > 0:
                        left[n] = step[1]
                        break
                elif step[0] == "xfer":
                    if step[1] > 0 or step[2] > 0:
                        left[n] = 1.0
                        break
                else:
                    raise ValueError(f"unknown step {step!r}")
                pos[n] += 1
                moved = True
            if pos[n] == len(steps) and n not in finish:
                finish[n] = t


def exchange_order(layers):
    """[(layer index, elements)] of every tensor in the order backward makes them ready: the
    layers from the last, each layer's tensors from its last (Parameter layers run backward in
    reverse order too)."""
    return [(i, n) for i in reversed(range(len(layers)))
            for n in reversed(layers[i].tensors) if n]


def _host_split(layers, t1, end_work):
    """(rest, total elements): the one-process host work ``t1`` − the layers' compute −
    ``end_work`` (clamped at 0), and the elements of all tensors."""
    compute = sum(x.forward + x.backward for x in layers)
    return max(0.0, t1 - compute - end_work), sum(n for x in layers for n in x.tensors)


def c8_collective_steps(n, codec, network, host, nodes, ppn):
    """Thread steps (see simulate_threads) of caffe8's hierarchical sum of one ``n``-element
    tensor on the CPU: intra-node reduce-scatter in shared memory (a barrier, then each process
    adds its 1/P' piece of the P' addends), fp8's between-stage rescale of that piece, the
    inter-node Alltoallv and ordered sum, and Allgather of the piece (each a collective of
    latency α_inter; the node's link is shared by its P' processes, each moving 1/P' of the
    bytes), and the intra-node allgather (a barrier, then copies)."""
    steps = []
    b = n * codec.bytes_per_element
    if ppn > 1:
        steps += [("idle", network.alpha_intra),
                  ("cpu", (ppn - 1) / ppn * n / codec.reduce_rate)]
    if nodes > 1:
        frac = (nodes - 1) / nodes
        piece, piece_bytes = n / ppn, b / ppn
        wire = frac * piece_bytes / (network.beta_inter / ppn)
        cpu = frac * piece_bytes / host.tcp_rate
        # fp8's rescale by 1/N between the stages; with one process per node it is folded
        # into the encode's scale (comm.codecs.Fp8Codec), no pass
        steps += [("cpu", piece / codec.between_rate if ppn > 1 else 0.0),
                  ("idle", network.alpha_inter), ("xfer", wire, cpu),
                  ("cpu", frac * piece / codec.reduce_rate),
                  ("idle", network.alpha_inter), ("xfer", wire, cpu)]
    if ppn > 1:
        steps += [("idle", network.alpha_intra),
                  ("cpu", (ppn - 1) / ppn * b / host.copy_rate)]
    return steps


def c8_cluster_programs(layers, codec, network, host, nodes, ppn, t1, asynchronous=True,
                        bucket_bytes=float(1 << 20), backward_host_share=1 / 3):
    """The threads of one caffe8 process on the emulated cluster (see cluster_time): tensors
    summed in buckets of ``bucket_bytes`` wire bytes (comm.bucket_kb · 1024)."""
    update = lambda n: n / host.update_rate + n / host.finite_rate  # noqa: E731
    order = exchange_order(layers)
    total = sum(n for _, n in order)
    rest, _ = _host_split(layers, t1, update(total))
    buckets = gradient_buckets(layers, bucket_bytes, bucket_bytes, codec.bytes_per_element)
    bucket_of, first = [], 0
    for b, (last, _) in enumerate(buckets):
        bucket_of += [b] * (last + 1 - first)
        first = last + 1
    fwd = [("cpu", (1 - backward_host_share) * rest)] + [("idle", x.forward) for x in layers]
    bwd = []
    for i in reversed(range(len(layers))):
        share = sum(layers[i].tensors) / total if total else 0.0
        bwd += [("cpu", backward_host_share * rest * share), ("idle", layers[i].backward),
                ("signal", ("ready", i))]
    # the iteration's verdict (NaN/Inf, requests): an allreduce of one int, log2(P) steps, after
    # the exchange (sync), or before backward for the pipelined update (async)
    flags = [("idle", math.ceil(math.log2(nodes * ppn)) * network.alpha_inter)]
    if not asynchronous:
        tail = [("cpu", sum(n for _, n in order) / codec.encode_rate)]
        for _, m in buckets:
            tail += c8_collective_steps(m, codec, network, host, nodes, ppn)
        tail += [("cpu", total / codec.decode_rate)] + flags + [("cpu", update(total))]
        return {"compute": fwd + bwd + tail}
    fwd += flags
    encode, comm, upd = [], [], []
    for k, (i, n) in enumerate(order):
        encode += [("await", ("ready", i)), ("cpu", n / codec.encode_rate),
                   ("signal", ("encoded", k))]
        upd += [("await", ("summed", bucket_of[k])), ("cpu", n / codec.decode_rate + update(n))]
    for b, (last, m) in enumerate(buckets):
        comm += [("await", ("encoded", last))] + \
            c8_collective_steps(m, codec, network, host, nodes, ppn) + [("signal", ("summed", b))]
    upd += [("signal", "updated")]
    return {"compute": fwd + bwd + [("await", "updated")], "encode": encode, "comm": comm,
            "update": upd}


def gradient_buckets(layers, first, cap, bytes_per_element=4):
    """Tensors grouped into buckets in gradient-ready order (``exchange_order``): [(position in
    that order of the bucket's last tensor, elements)]. A bucket closes once it holds at least
    its limit in bytes (``first`` for the first bucket, ``cap`` after: PyTorch DDP's rebuilt
    buckets, and caffe8's comm.bucket_kb with ``first = cap``; 0: every tensor alone); the
    tensors left form the last bucket."""
    out, size, limit = [], 0, first
    order = exchange_order(layers)
    for k, (_, n) in enumerate(order):
        size += n
        if size * bytes_per_element >= limit:
            out.append((k, size))
            size, limit = 0, cap
    if size:
        out.append((len(order) - 1, size))
    return out


def ddp_cluster_programs(layers, codec, network, host, ddp, nodes, ppn, t1, step_rate,
                         backward_host_share=1 / 2):
    """The threads of one PyTorch DDP process on the emulated cluster (see cluster_time)."""
    p = nodes * ppn
    order = exchange_order(layers)
    total = sum(n for _, n in order)
    rest, _ = _host_split(layers, t1, total / step_rate)
    buckets = gradient_buckets(layers, ddp.first, ddp.cap)
    closes = {k: b for b, (k, _) in enumerate(buckets)}
    hooked = codec.bytes_per_element != 4           # the fp16 hook: cast and divide itself
    main = [("cpu", (1 - backward_host_share) * rest)] + [("idle", x.forward) for x in layers]
    k = 0
    for i in reversed(range(len(layers))):
        main += [("idle", layers[i].backward)]
        for n in reversed(layers[i].tensors):
            if not n:
                continue
            main += [("cpu", backward_host_share * rest * n / total),
                     ("cpu", n / ddp.copy_rate)]
            if k in closes:
                b = closes[k]
                m = buckets[b][1]
                main += [("cpu", m / codec.encode_rate if hooked else 0.0),
                         ("signal", ("bucket", b))]
            k += 1
    main += [("await", "reduced"), ("cpu", total / ddp.copy_rate + total / step_rate)]
    gloo = []
    frac = (p - 1) / p
    for b, (_, m) in enumerate(buckets):
        nbytes = m * codec.bytes_per_element
        wire = 2 * frac * nbytes / network.beta_inter if nodes > 1 else 0.0
        # the ring's hops: P'−1 of a node's P' over its loopback, one over the link
        per_byte = (ppn - 1) / ppn / host.loopback_rate + 1 / ppn / host.tcp_rate \
            if nodes > 1 else 1 / host.loopback_rate
        cpu = 2 * frac * nbytes * per_byte + frac * m / codec.reduce_rate
        gloo += [("await", ("bucket", b)), ("idle", 2 * (p - 1) * network.alpha_inter),
                 ("xfer", wire, cpu), ("cpu", m / codec.decode_rate if hooked else 0.0)]
    gloo += [("signal", "reduced")]
    return {"main": main, "gloo": gloo}


def mpi_allreduce_program(layers, codec, network, host, nodes, ppn):
    """One blocking MPI_Allreduce of all gradients as one vector (cluster_bench.py's "mpi-fp32"
    reference; no compute): MPICH's recursive halving and doubling over P = N·P' node-contiguous
    ranks. The steps at distance ≥ P' cross nodes and move B(N−1)/N per process each way, the
    node's P' processes through one link: wire P'·2(N−1)/N·B / R; each process adds
    (P−1)/P·n elements; 2·log2(P) steps of latency α."""
    p = nodes * ppn
    n = sum(m for _, m in exchange_order(layers))
    nbytes = n * codec.bytes_per_element
    crossing = 2 * (nodes - 1) / nodes * nbytes
    wire = ppn * crossing / network.beta_inter if nodes > 1 else 0.0
    cpu = crossing / host.tcp_rate + (p - 1) / p * n / codec.reduce_rate
    return {"main": [("idle", 2 * math.ceil(math.log2(p)) * network.alpha_inter),
                     ("xfer", wire, cpu)]}


def cluster_time(layers, codec, network, host, nodes, ppn, t1, variant="async", ddp=None,
                 step_rate=INF, bucket_bytes=float(1 << 20)):
    """Predicted seconds per iteration of one job on the emulated cluster (``nodes`` × ``ppn``
    processes on one machine of ``host.cores`` cores); ``t1``: the measured one-process
    iteration of the same side. ``variant``: "sync" or "async" (caffe8), "ddp" (PyTorch DDP,
    ``ddp`` and the optimizer's ``step_rate`` elements/s), "mpi" (one MPI_Allreduce of all the
    gradients, no compute: ``t1`` unused). ``bucket_bytes``: caffe8's bucket
    limit in wire bytes (comm.bucket_kb, 1024 KiB by default). One process: ``t1``."""
    if nodes * ppn <= 1:
        return t1
    if variant == "ddp":
        programs = ddp_cluster_programs(layers, codec, network, host, ddp, nodes, ppn, t1,
                                        step_rate)
        main = "main"
    elif variant == "mpi":
        programs, main = mpi_allreduce_program(layers, codec, network, host, nodes, ppn), "main"
    elif variant in ("sync", "async"):
        programs = c8_cluster_programs(layers, codec, network, host, nodes, ppn, t1,
                                       variant == "async", bucket_bytes)
        main = "compute"
    else:
        raise ValueError(f"variant must be sync, async, ddp or mpi, got {variant!r}")
    finish, _ = simulate_threads(programs, host.cores / (nodes * ppn))
    return finish[main]
