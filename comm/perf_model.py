"""Predictive model of data-parallel iteration time and speedup (Oyama et al.'s figure 7; the shape of
the appendix model of Dettmers' "8-bit approximations for parallelism in deep learning": per-layer compute, per-message latency + size / bandwidth,
and communication hidden under the backward of the layers still to come).

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
"""
import json
import re
from dataclasses import dataclass, field

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
    """Wire bytes per element, reduction op rate and encode+decode rate (elements/s)."""
    bytes_per_element: float
    reduce_rate: float = INF
    convert_rate: float = INF


@dataclass
class LayerCost:
    """One layer: forward/backward seconds and the element counts of its parameter tensors."""
    name: str
    forward: float = 0.0
    backward: float = 0.0
    tensors: list = field(default_factory=list)


CODEC_BYTES = {"fp32": 4, "fp16": 2, "fp8": 1}


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
