"""The performance model (caffe8.comm.perf_model) against published and measured runs.

Usage (from the repository root; predictions for a net of one's own: ``caffe8 perf_model``)::

    # Oyama et al.'s CaffeNet weak scaling on TSUBAME-KFC/DL (figure 7: 192 GPUs, fp8 168x,
    # float 114x)
    python -m studies.perf_model.validate oyama --out docs/figures

    # figure 7 point by point (CaffeNet and GoogLeNet at 192 GPUs, float and fp8), with the
    # fp8 conversion on the GPU's compute path, and the sensitivity to single inputs
    python -m studies.perf_model.validate fig7 --out docs/figures

    # this machine: fit latency/per-element cost from a `caffe8 bench` CSV (2 ranks) and
    # predict the p = 2 runs of a weak_scaling.py output folder from their own per-layer times
    python -m studies.perf_model.validate local --bench runs/allreduce_2r.csv \
        --weak-dir runs/weak_gru

    # one measured run (e.g. studies/scaling/overlap_bench.py output) vs the model fed its own
    # per-layer times: timing logs rank 0's first, comma separated
    python -m studies.perf_model.validate check --model RUN/net.prototxt --codec fp8 --overlap \
        --bench runs/allreduce_2r.csv \
        --timing-logs RUN/timing.rep0.r0.jsonl,RUN/timing.rep0.r1.jsonl

    # the emulated cluster: every round == "all" row of a scripts/cluster_bench.py CSV
    # predicted from the link rate, the emulated net's sleeps and tensors, the row's measured
    # one-process time and the host rates (HOST_RATES, or --measure them here first)
    python -m studies.perf_model.validate cluster --csv docs/figures/cluster_bench.csv --out OUTDIR

``oyama`` states every input it uses; see ``TSUBAME`` and ``paper_inputs`` below.

``cluster``: the model is caffe8.comm.perf_model's module docstring ("The emulated cluster");
its inputs per row are the link rate, the net's emulated prototxt (EMULATED_NETS: sleeps and tensor sizes),
the row's measured one-process time (baseline_ms) and these constants, none fitted to an
iteration time and none per variant: HOST_RATES (host passes of one core, measured with
measure_host_rates; ``tcp``, the emulated link's CPU cost per byte, from one bucket's transfer in
a timing log, TCP_REFERENCE), HOST_CORES (2, physical), ALPHA_COLLECTIVE (0.22 ms per collective,
measured), ALPHA_SHARED (20 us, assumed), caffe8.comm.perf_model.TCP_PAYLOAD_EFFICIENCY (1448/1514,
physical), DDP's bucket sizes (1 MiB, then 25 MiB: PyTorch's) and comm.bucket_kb (1024 KiB).

Against docs/figures/cluster/caffenet_2x1.csv, googlenet_2x1.csv and caffenet_layouts.csv (38
points: CaffeNet 2x1 at 1 and 10 Gbit/s, GoogLeNet 2x1 at 10 Gbit/s, CaffeNet 2x1, 3x1, 4x1 and
2x2 at 10 Gbit/s; caffe8 fp32/fp16/fp8 sync and async, DDP fp32/fp16, mpi-fp32) 37 are within
15 %. Outside: mpi-fp32 at 10 Gbit/s, predicted 23 % low: a blocking MPI_Allreduce busy-polls
both cores, so the kernel's network work per byte costs it more CPU than caffe8's sleeping polls
(its own time implies tcp 0.83e9 instead of 1.08e9). The predictions lean low (caffe8 async 5 to
15 %; CaffeNet fp8 async at 1 Gbit/s -14.5 %, 2x2 fp32 async -14.7 %): not modelled are the
ranks' skew at every collective (the slowest rank sets each step), the delay before a woken
thread gets a busy core (MPI progresses only in the watchdog's polls, so a transfer beside
busy encode/update threads is slower than its CPU share: fp8's fc7 bucket at 1 Gbit/s takes 177
ms against 142 modelled), the GIL, and fixed costs of fp8's small buckets (several ms each).
"""
import argparse
import csv
import json
import os
import re
import sys

from caffe8.comm import perf_model as pm
from scripts._runs import label_axes, pyplot, save_figure

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MB = 1e6

# TSUBAME-KFC/DL (Oyama et al., Table 2 and section 4.1) and what the model assumes beside it.
TSUBAME = {
    "gpus_per_node": 8,          # paper: 4 Tesla K80 per node, each 2 GK210 GPUs
    "beta_inter": 7e9,           # paper: 4X FDR InfiniBand, 7 GB/s
    "alpha_inter": 2e-6,         # assumed: FDR MPI latency of a few microseconds
    "alpha_intra": 1e-6,         # assumed: shared-memory MPI latency
    # assumed: two Xeon E5-2620 v2 with DDR3 (~60 GB/s per node); a shared-memory transfer is
    # two copies (4 memory touches per byte) and the node's 8 processes copy at once
    "beta_intra": 60e9 / (8 * 4),
    # assumed from Dettmers' paper (section 2.3.2: ~7 GB/s PCIe with more than 2 GPUs in a machine);
    # the two GPUs of a K80 share one x16 link
    "beta_host": 6e9,
    "gpu_peak_flops": 8.74e12 / 2,  # paper: 8.74 TFLOP/s per K80 board = 2 GPUs
    "gpu_efficiency": 0.5,          # assumed: fraction of peak cuDNN reaches on CaffeNet
    "gpu_convert_rate": 5e9,        # assumed: fp8/half encode+decode on the GPU, elements/s
}
# The paper's figure 3 (16 nodes x 1 process, 256 M elements): fp8 3.21x float(MPI_SUM), 1.56x half.
PAPER_FIG3 = {"elements": 256e6, "nodes": 16, "fp8_vs_fp32": 3.21, "fp16_vs_fp8": 1.56}
FLOAT_SUM_RATE = 1e9   # assumed: MPI_SUM float adds per second of one process (memory bound)
# Published numbers the model is checked against.
PAPER_WEAK = {"procs": 192, "fp32": 114.0, "fp8": 168.0}         # figure 7, CaffeNet
PAPER_FB_SHARE_16_NODES = {"fp32": 0.0391, "fp8": 0.106}        # figure 5, synchronous
PAPER_2NODE_FP8_OVER_FP32_ASYNC = 2.67                           # figure 5, 2 nodes, async
# Figure 7, both nets at 192 GPUs (8 x 24 nodes), per-GPU batch 256 (CaffeNet) / 32 (GoogLeNet)
FIG7 = {("caffenet", "fp32"): 114.0, ("caffenet", "fp8"): 168.0,
        ("googlenet", "fp32"): 173.0, ("googlenet", "fp8"): 170.0}
FIG7_BATCH = {"caffenet": 256, "googlenet": 32}


# --- Oyama et al.'s CaffeNet ---------------------------------------------------------------------
def caffenet_shapes(path=None, crop=227):
    """({layer: [tensor sizes]}, {layer: forward MACs per sample}) of CaffeNet (or the net at
    ``path`` with ``crop`` x ``crop`` inputs), built at batch 1."""
    from caffe8.wiring import register_all
    from caffe8.engine.net import Net
    register_all()
    from caffe8.engine.net_graph import swap_data_layers
    from caffe8.engine.prototxt import parse_file
    path = path or os.path.join(REPO, "prototxt", "caffenet", "train_val.prototxt")
    model = swap_data_layers(parse_file(path), {"data": (1, 3, crop, crop), "label": (1,)})
    net = Net(model, phase="TRAIN")
    return pm.layer_params_from_net(net), pm.layer_macs_from_net(net)


def codec_rates_from_fig3():
    """Reduction-op rates (elements/s) of half and fp8 that reproduce Oyama et al.'s figure 3 ratios
    under the ring model, given FLOAT_SUM_RATE and the 7 GB/s link (1 process per node)."""
    n, nodes, beta = PAPER_FIG3["elements"], PAPER_FIG3["nodes"], TSUBAME["beta_inter"]
    frac = (nodes - 1) / nodes

    def ring(b, rate):
        return 2 * frac * n * b / beta + frac * n / rate
    t32 = ring(4, FLOAT_SUM_RATE)
    t8 = t32 / PAPER_FIG3["fp8_vs_fp32"]
    t16 = t8 * PAPER_FIG3["fp16_vs_fp8"]
    r8 = frac * n / (t8 - 2 * frac * n * 1 / beta)
    r16 = frac * n / (t16 - 2 * frac * n * 2 / beta)
    return {"fp32": FLOAT_SUM_RATE, "fp16": r16, "fp8": r8}


# Whole-net GPU times that BVLC Caffe published for its own cuDNN build (the paper states no
# compute time), both measured in one session on one K40c at batch 128 (Caffe's GitHub issue
# "Caffe Timings for GoogleNet, VGG, AlexNet with cuDNN"): forward-backward 511.953 ms for
# CaffeNet (caffe_reference), 1688.8 ms for GoogLeNet. Only their ratio is used: GoogLeNet takes
# 3.30x CaffeNet's time per image for 2.25x its multiply-adds, so one efficiency per
# multiply-add cannot serve both nets.
CAFFE_PUBLISHED_S_PER_SAMPLE = {"caffenet": 0.511953 / 128, "googlenet": 1.6888 / 128}
# K40c (2880 CUDA cores) to one GK210 (2496) at the same 875 MHz boost clock.
K40_TO_GK210 = 2880 / 2496
# What newer cuDNN did to that kind of measurement: AlexNet forward-backward at batch 128 on a
# (Maxwell) Titan X went from 231 ms with cuDNN R2 to 81 ms with R4 (Chintala's convnet-benchmarks).
CUDNN_R2_TO_R4 = 231 / 81
# assumed: CaffeNet's rate on one GK210 under the paper's CUDA 8 / cuDNN, as a fraction of the
# boost peak (the one free number of `fig7`; see fig7_efficiency_band for the range it may take)
FIG7_GPU_EFFICIENCY = 0.70
_SHAPES = {}


def _net_shapes(name):
    """caffenet_shapes of prototxt/NAME/train_val.prototxt at the net's crop, built once."""
    if name not in _SHAPES:
        crop = {"caffenet": 227, "googlenet": 224}[name]
        _SHAPES[name] = caffenet_shapes(
            os.path.join(REPO, "prototxt", name, "train_val.prototxt"), crop)
    return _SHAPES[name]


def _mac_seconds_per_sample(name, efficiency):
    """Forward + backward seconds per sample from the net's multiply-adds at ``efficiency`` of
    the GK210 peak: 2 FLOP per MAC, backward twice the forward (once for the first layer)."""
    macs = _net_shapes(name)[1]
    flops = sum(2 * m * (2 if k == 0 else 3) for k, m in enumerate(macs.values()))
    return flops / (TSUBAME["gpu_peak_flops"] * efficiency)


def net_layers(name, batch, efficiency=FIG7_GPU_EFFICIENCY, per_mac=False):
    """LayerCosts of prototxt/NAME/train_val.prototxt at ``batch`` per GPU on TSUBAME's GK210.

    The net's time per sample is CaffeNet's (its multiply-adds at ``efficiency`` of the peak)
    times the net's published time per sample over CaffeNet's (CAFFE_PUBLISHED_S_PER_SAMPLE);
    ``per_mac``: the net's own multiply-adds at ``efficiency`` instead (one efficiency per
    multiply-add for every net). Split over the layers by caffe8.comm.perf_model.split_by_macs."""
    params, macs = _net_shapes(name)
    if per_mac:
        per_sample = _mac_seconds_per_sample(name, efficiency)
    else:
        per_sample = _mac_seconds_per_sample("caffenet", efficiency) * \
            CAFFE_PUBLISHED_S_PER_SAMPLE[name] / CAFFE_PUBLISHED_S_PER_SAMPLE["caffenet"]
    return pm.split_by_macs(macs, params, per_sample * batch)


def published_efficiency():
    """The efficiency at which CaffeNet's multiply-adds take Caffe's published K40c time, moved
    to one GK210: what BVLC's own (cuDNN v1 era) measurement would make of the free number."""
    published = CAFFE_PUBLISHED_S_PER_SAMPLE["caffenet"] * K40_TO_GK210
    return _mac_seconds_per_sample("caffenet", 1.0) / published


def fig7_speedups(layers, codecs, network, p=192):
    """{(net, codec): weak speedup at p} of figure 7's four points, conversion on the GPU."""
    return {(net, codec): pm.weak_speedup(layers[net], codecs[codec], network, p,
                                          "hierarchical", True, serial_convert=True)
            for net, codec in FIG7}


def fig7_efficiency_band(limit=15.0, grid=None):
    """(lowest, highest) efficiency on ``grid`` (0.20, 0.21, ... 1.00) at which every figure-7
    point is predicted within ``limit`` per cent, or None."""
    _, codecs, network = paper_inputs()
    grid = grid or [k / 100 for k in range(20, 101)]
    base = {n: net_layers(n, b, 1.0) for n, b in FIG7_BATCH.items()}
    ok = []
    for eff in grid:
        layers = {n: scaled(ls, 1.0 / eff) for n, ls in base.items()}
        s = fig7_speedups(layers, codecs, network)
        if all(abs(100 * (s[k] / FIG7[k] - 1)) <= limit for k in FIG7):
            ok.append(eff)
    return (min(ok), max(ok)) if ok else None


def fig7_points(out_dir=""):
    """Figure 7 at 192 GPUs, point by point (CaffeNet and GoogLeNet, float and fp8): the model
    (compute from net_layers, network and codecs from ``oyama``'s inputs, the fp8 conversion on
    the GPU's compute path) and the plain model (conversion on the communication thread), plus
    every point under single-input changes (sensitivity)."""
    _, codecs, network = paper_inputs()
    layers = {n: net_layers(n, b) for n, b in FIG7_BATCH.items()}
    p = 192

    def speedup(net, codec, serial, net_layers_=None, network_=None):
        return pm.weak_speedup(net_layers_ or layers[net], codecs[codec], network_ or network, p,
                               "hierarchical", True, serial_convert=serial)

    def t1_ms(ls):
        return 1e3 * sum(x.forward + x.backward for x in ls)

    rows = []
    for (net, codec), paper in FIG7.items():
        plain = speedup(net, codec, False)
        serial = speedup(net, codec, True)
        rows.append({"net": net, "codec": codec, "gpus": p, "batch_per_gpu": FIG7_BATCH[net],
                     "variant": "model", "paper": paper, "model_plain": plain,
                     "err_plain_pct": 100 * (plain / paper - 1), "model": serial,
                     "err_pct": 100 * (serial / paper - 1), "t1_ms": t1_ms(layers[net])})
    half_intra = pm.Network(network.alpha_intra, network.beta_intra / 2, network.alpha_inter,
                            network.beta_inter, network.processes_per_node, network.beta_host)
    half_host = pm.Network(network.alpha_intra, network.beta_intra, network.alpha_inter,
                           network.beta_inter, network.processes_per_node, network.beta_host / 2)
    pub = published_efficiency()
    for net, batch in FIG7_BATCH.items():
        for variant, kw in (
                ("one efficiency per multiply-add",
                 {"net_layers_": net_layers(net, batch, per_mac=True)}),
                ("GPU efficiency 0.50", {"net_layers_": net_layers(net, batch, 0.5)}),
                ("GPU efficiency 0.90", {"net_layers_": net_layers(net, batch, 0.9)}),
                (f"GPU efficiency {pub:.2f} (Caffe's K40c time)",
                 {"net_layers_": net_layers(net, batch, pub)}),
                (f"GPU efficiency {pub * CUDNN_R2_TO_R4:.2f} (K40c time / cuDNN R2-R4 gain)",
                 {"net_layers_": net_layers(net, batch, pub * CUDNN_R2_TO_R4)}),
                ("intra-node bandwidth / 2", {"network_": half_intra}),
                ("host copy bandwidth / 2", {"network_": half_host})):
            for codec in ("fp32", "fp8"):
                paper = FIG7[(net, codec)]
                v = speedup(net, codec, True, **kw)
                rows.append({"net": net, "codec": codec, "gpus": p,
                             "batch_per_gpu": batch, "variant": variant,
                             "paper": paper, "model_plain": "", "err_plain_pct": "", "model": v,
                             "err_pct": 100 * (v / paper - 1),
                             "t1_ms": t1_ms(kw.get("net_layers_", layers[net]))})
    curves = []
    for net in FIG7_BATCH:
        for codec in ("fp32", "fp8"):
            for q in (1, 2, 4, 8, 16, 32, 64, 96, 128, 192):
                curves.append({"net": net, "codec": codec, "p": q, "speedup": pm.weak_speedup(
                    layers[net], codecs[codec], network, q, "hierarchical", True,
                    serial_convert=True)})
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
        _write_rows(rows, os.path.join(out_dir, "perf_model_fig7_points.csv"))
        _plot_fig7([r for r in rows if r["variant"] == "model"], curves,
                   os.path.join(out_dir, "perf_model_fig7_points.png"))
    return rows


def _plot_fig7(rows, curves, path):
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.3))
    for ax, net in zip(axes, FIG7_BATCH):
        for codec, color in (("fp32", "C0"), ("fp8", "C3")):
            pts = [c for c in curves if c["net"] == net and c["codec"] == codec]
            ax.plot([c["p"] for c in pts], [c["speedup"] for c in pts], "-", color=color,
                    label=f"model {codec}")
            r = [x for x in rows if x["net"] == net and x["codec"] == codec][0]
            ax.plot([r["gpus"]], [r["paper"]], "*", ms=12, color=color,
                    label=f"paper {codec}: {r['paper']:.0f}x (model {r['model']:.0f}x, "
                          f"{r['err_pct']:+.0f}%)")
        ax.plot([1, 192], [1, 192], color="grey", lw=0.8, ls="--")
        label_axes(ax, xlabel="GPUs (8 per node)", ylabel="weak-scaling speedup",
                   title=f"{net}, batch {FIG7_BATCH[net]} per GPU, TSUBAME-KFC/DL",
                   title_size=10, legend_size=7)
    save_figure(fig, path)


def paper_inputs():
    """(layers at batch 256 per GPU, codec costs, network) for CaffeNet on TSUBAME-KFC/DL.

    Per-layer GPU time: forward MACs × 2 FLOP × 256 samples / (peak × efficiency); backward
    twice the forward (gradients w.r.t. weights and inputs), conv1 once (no input gradient)."""
    params, macs = _net_shapes("caffenet")
    rate = TSUBAME["gpu_peak_flops"] * TSUBAME["gpu_efficiency"]
    layers = []
    for k, (name, m) in enumerate(macs.items()):
        fwd = 2 * m * 256 / rate
        layers.append(pm.LayerCost(name, fwd, fwd * (1 if k == 0 else 2), params[name]))
    rates = codec_rates_from_fig3()
    codecs = {c: pm.CodecCost(pm.CODEC_BYTES[c], rates[c],
                              pm.INF if c == "fp32" else TSUBAME["gpu_convert_rate"])
              for c in ("fp32", "fp16", "fp8")}
    network = pm.Network(TSUBAME["alpha_intra"], TSUBAME["beta_intra"], TSUBAME["alpha_inter"],
                         TSUBAME["beta_inter"], TSUBAME["gpus_per_node"], TSUBAME["beta_host"])
    return layers, codecs, network


def scaled(layers, factor):
    return [pm.LayerCost(x.name, x.forward * factor, x.backward * factor, x.tensors)
            for x in layers]


def oyama_validation(out_dir):
    layers, codecs, network = paper_inputs()
    t1 = sum(x.forward + x.backward for x in layers)
    lines = [f"CaffeNet: {sum(map(sum, (x.tensors for x in layers))) / 1e6:.2f} M parameters in "
             f"{sum(len(x.tensors) for x in layers)} tensors; predicted forward+backward at "
             f"batch 256 on one GK210: {t1 * 1e3:.0f} ms",
             "reduction rates from Oyama et al.'s figure 3 (elements/s): " + ", ".join(
                 f"{c} {codecs[c].reduce_rate / 1e9:.2f} G" for c in codecs)]
    rows = []
    procs = [1, 2, 4, 8, 16, 32, 64, 96, 128, 192]
    for codec in ("fp32", "fp16", "fp8"):
        for schedule in ("hierarchical", "flat"):
            for overlap in (False, True):
                for p in procs:
                    it = pm.iteration_time(layers, codecs[codec], network, p, schedule, overlap)
                    rows.append({"codec": codec, "schedule": schedule, "overlap": overlap,
                                 "p": p, "iteration_s": it["iteration"], "comm_s": it["comm"],
                                 "exposed_s": it["exposed"],
                                 "speedup": p * t1 / it["iteration"]})
    pick = {(r["codec"], r["schedule"], r["overlap"], r["p"]): r for r in rows}
    p = PAPER_WEAK["procs"]
    for codec in ("fp32", "fp8"):
        r = pick[(codec, "hierarchical", True, p)]
        err = (r["speedup"] - PAPER_WEAK[codec]) / PAPER_WEAK[codec]
        lines.append(f"weak scaling {p} GPUs, {codec}, hierarchical, overlapped: predicted "
                     f"{r['speedup']:.0f}x, paper {PAPER_WEAK[codec]:.0f}x ({100 * err:+.0f}%); "
                     f"comm {r['comm_s'] * 1e3:.0f} ms, exposed {r['exposed_s'] * 1e3:.0f} ms")
    ratio_pred = pick[("fp8", "hierarchical", True, p)]["speedup"] / \
        pick[("fp32", "hierarchical", True, p)]["speedup"]
    lines.append(f"fp8/float speedup ratio at {p}: predicted {ratio_pred:.2f}, paper "
                 f"{PAPER_WEAK['fp8'] / PAPER_WEAK['fp32']:.2f}")
    lines += _paper_breakdown_checks(layers, codecs, network)
    lines += _sensitivity(layers, codecs, network)
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
        _write_rows(rows, os.path.join(out_dir, "perf_model_oyama.csv"))
        _plot_oyama(rows, os.path.join(out_dir, "perf_model_oyama.png"))
    return lines


def _paper_breakdown_checks(layers, codecs, network):
    """Figure 5 (strong scaling, global batch 256): the model's fp8/float iteration ratio at 2
    nodes (async) and the ForwardBackward shares at 16 nodes (sync)."""
    out = []
    for nodes, overlap in ((2, True), (16, False)):
        p = nodes * TSUBAME["gpus_per_node"]
        # Global batch 256: each GPU computes 256/p samples (compute assumed linear in batch).
        small = scaled(layers, 1.0 / p)
        it = {c: pm.iteration_time(small, codecs[c], network, p, "hierarchical", overlap)
              for c in ("fp32", "fp8")}
        if overlap:
            out.append(f"figure 5, {nodes} nodes async: float/fp8 iteration ratio predicted "
                       f"{it['fp32']['iteration'] / it['fp8']['iteration']:.2f}, paper "
                       f"{PAPER_2NODE_FP8_OVER_FP32_ASYNC:.2f}")
        else:
            share = {c: it[c]["compute"] / it[c]["iteration"] for c in it}
            out.append(f"figure 5, {nodes} nodes sync: ForwardBackward share predicted float "
                       f"{100 * share['fp32']:.1f}% / fp8 {100 * share['fp8']:.1f}%, paper "
                       f"{100 * PAPER_FB_SHARE_16_NODES['fp32']:.2f}% / "
                       f"{100 * PAPER_FB_SHARE_16_NODES['fp8']:.1f}%; comm ratio float/fp8 "
                       f"predicted {it['fp32']['comm'] / it['fp8']['comm']:.2f}, paper (from the "
                       f"shares) {_paper_comm_ratio():.2f}")
    return out


def _paper_comm_ratio():
    """float/fp8 communication ratio implied by figure 5's ForwardBackward shares (same FB)."""
    s32, s8 = PAPER_FB_SHARE_16_NODES["fp32"], PAPER_FB_SHARE_16_NODES["fp8"]
    return (1 / s32 - 1) / (1 / s8 - 1)


def _sensitivity(layers, codecs, network):
    """Speedups at 192 when the assumed GPU efficiency is halved / raised by half."""
    out = []
    for eff in (0.25, 0.75):
        f = TSUBAME["gpu_efficiency"] / eff
        ls = scaled(layers, f)
        s = {c: pm.weak_speedup(ls, codecs[c], network, 192) for c in ("fp32", "fp8")}
        out.append(f"sensitivity: GPU efficiency {eff:.2f} -> 192-GPU speedup float "
                   f"{s['fp32']:.0f}x, fp8 {s['fp8']:.0f}x")
    return out


def _write_rows(rows, path):
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.items()})


def _plot_oyama(rows, path):
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for codec, color in (("fp32", "C0"), ("fp16", "C2"), ("fp8", "C3")):
        for overlap, style in ((True, "-"), (False, ":")):
            pts = [r for r in rows if r["codec"] == codec and r["schedule"] == "hierarchical"
                   and r["overlap"] == overlap]
            ax.plot([r["p"] for r in pts], [r["speedup"] for r in pts], style, color=color,
                    label=f"model {codec}{' overlapped' if overlap else ' sync'}")
    for codec, color in (("fp32", "C0"), ("fp8", "C3")):
        ax.plot([PAPER_WEAK["procs"]], [PAPER_WEAK[codec]], "*", ms=12, color=color,
                label=f"paper fig. 7 {codec}: {PAPER_WEAK[codec]:.0f}x")
    ax.plot([1, 192], [1, 192], color="grey", lw=0.8, ls="--", label="ideal")
    label_axes(ax, xlabel="GPUs (8 per node)", ylabel="weak-scaling speedup (batch 256 per GPU)",
               title="CaffeNet on TSUBAME-KFC/DL: perf model vs Oyama et al.", title_size=10,
               legend_size=7)
    save_figure(fig, path)


# --- this machine ----------------------------------------------------------------------------
def read_bench(path, column="min_seconds", processes=2):
    """{codec: [(elements, seconds)]} of a ``caffe8 bench`` CSV (OUT/allreduce_bench.csv)."""
    out = {}
    with open(path, encoding="utf-8") as f:
        for r in csv.DictReader(f):
            if int(r["processes"]) == processes:
                out.setdefault(r["codec"], []).append((int(r["elements"]), float(r[column])))
    return out


def measure_convert_rate(n=1 << 20, repeats=5):
    """fp8 encode+decode elements/s of this machine's kernels (the exchange's host path)."""
    import time
    import numpy
    from caffe8.comm import kernels
    x = numpy.random.default_rng(0).standard_normal(n).astype(numpy.float32)
    wire, back = numpy.empty(n, numpy.uint8), numpy.empty(n, numpy.float32)
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        kernels.encode_fp8(x, wire, 1.0)
        kernels.decode_fp8(wire, back, 1.0)
        best = min(best, time.perf_counter() - t)
    return n / best


def local_validation(bench_path, weak_dir, column="min_seconds"):
    """Predict the p = 2 runs of a weak-scaling folder from their own per-layer compute times and
    an (α, seconds/element) fit per codec of a 2-rank allreduce benchmark."""
    from caffe8.wiring import register_all
    from caffe8.engine.net import Net
    register_all()
    bench = read_bench(bench_path, column)
    fits = {c: pm.fit_alpha_beta(pts) for c, pts in bench.items()}
    convert = measure_convert_rate()
    lines = [f"fit t = a + s*n from {bench_path} ({column}, relative residuals): " + ", ".join(
        f"{c}: a={a * 1e6:.1f} us, s={s * 1e9:.3f} ns/elem" for c, (a, s) in fits.items()),
        f"fp8 encode+decode on this machine: {convert / 1e9:.2f} G elements/s"]
    for codec, pts in bench.items():
        # Held out: fit without the largest size, predict it.
        pts = sorted(pts)
        a, s = pm.fit_alpha_beta(pts[:-1])
        n, t = pts[-1]
        lines.append(f"held-out {codec} allreduce of {n} elements: predicted "
                     f"{(a + s * n) * 1e3:.3f} ms from the smaller sizes, measured "
                     f"{t * 1e3:.3f} ms ({100 * ((a + s * n) / t - 1):+.0f}%)")
    measured = {}
    with open(os.path.join(weak_dir, "weak_scaling.csv"), encoding="utf-8") as f:
        for r in csv.DictReader(f):
            measured[r["run_dir"]] = float(r["median_iter_s"])
    rows = []
    for run in sorted(measured):
        if not run.startswith("p2_"):
            continue
        _, codec, mode = run.split("_")
        folder = os.path.join(weak_dir, run)
        folder = folder if os.path.exists(os.path.join(folder, "net.prototxt")) else \
            os.path.join(folder, "rep0")
        params = pm.layer_params_from_net(Net(os.path.join(folder, "net.prototxt"), "TRAIN"))
        times, other = _median_layer_times(folder)
        layers = pm.build_layers(times, params)
        a, s = fits[codec]
        a = max(a, 0.0)   # a negative intercept is a fitting artefact (cache effects, load)
        b = pm.CODEC_BYTES[codec]
        # Fold the fitted cost into the model: 2 ranks in one node, ring of 2 = 2α + B/β.
        network = pm.Network(a / 2, b / s, a / 2, b / s, 2)
        cost = pm.CodecCost(b, pm.INF, pm.INF if codec == "fp32" else convert)
        it = pm.iteration_time(layers, cost, network, 2, "flat", mode == "async", update=other)
        err = (it["iteration"] - measured[run]) / measured[run]
        rows.append({"run": run, "predicted_s": it["iteration"], "measured_s": measured[run],
                     "rel_error": err, "compute_s": it["compute"], "comm_s": it["comm"]})
        lines.append(f"{run}: predicted {it['iteration'] * 1e3:.2f} ms (compute "
                     f"{it['compute'] * 1e3:.2f}, comm {it['comm'] * 1e3:.2f}), measured median "
                     f"{measured[run] * 1e3:.2f} ms ({100 * err:+.0f}%)")
    return lines, rows


def _median_layer_times(folder):
    """Rank-0 per-layer medians of every repeat's timing log in ``folder`` (or its rep*/), and
    the median 'Other' split (update etc.)."""
    import glob
    logs = sorted(glob.glob(os.path.join(os.path.dirname(folder), "rep*", "timing.r0.jsonl"))) \
        if os.path.basename(folder).startswith("rep") else []
    logs = logs or [os.path.join(folder, "timing.r0.jsonl")]
    merged = os.path.join(folder, ".merged_r0.jsonl")
    others = []
    with open(merged, "w", encoding="utf-8") as out:
        for path in logs:
            with open(path, encoding="utf-8") as f:
                for line in f:
                    if line.strip():
                        rec = json.loads(line)
                        others.append(rec["split"]["Other"])
                        out.write(line if line.endswith("\n") else line + "\n")
    times = pm.layer_times_from_timing_log(merged, skip=5)
    os.remove(merged)
    others.sort()
    return times, others[len(others) // 2]


def check_run(logs, model, bench_path, codec, overlap, p, skip=10, column="min_seconds"):
    """Predict one measured run from its own rank-0 per-layer compute times, its median 'Other'
    (update and unattributed time) and an allreduce-bench fit; returns a result dict.

    ``logs``: the run's timing logs (rank 0's first). Measured iteration = median over
    iterations >= ``skip`` of the slowest rank's wall; measured exchange work = median of rank
    0's per-layer encode + quantile + comm + decode, summed."""
    from caffe8.wiring import register_all
    from caffe8.engine.net import Net
    register_all()
    a, s = pm.fit_alpha_beta(read_bench(bench_path, column)[codec])
    a = max(a, 0.0)
    b = pm.CODEC_BYTES[codec]
    network = pm.Network(a / 2, b / s, a / 2, b / s, p)
    cost = pm.CodecCost(b, pm.INF, pm.INF if codec == "fp32" else measure_convert_rate())
    walls, work, others = {}, [], []
    for path in logs:
        with open(path, encoding="utf-8") as f:
            for rec in (json.loads(line) for line in f if line.strip()):
                if rec["iteration"] < skip:
                    continue
                # One job = the logs that differ only in the rank suffix (".r<k>.jsonl").
                key = (re.sub(r"\.r\d+\.jsonl$", "", path), rec["iteration"])
                walls[key] = max(walls.get(key, 0.0), rec["wall"])
                if rec["rank"] == 0:
                    others.append(rec["split"]["Other"])
                    work.append(sum(x[k] for x in rec["layers"]
                                    for k in ("encode", "quantile", "comm", "decode")))
    times = pm.layer_times_from_timing_log(logs[0], skip)
    layers = pm.build_layers(times, pm.layer_params_from_net(Net(model, "TRAIN")))
    it = pm.iteration_time(layers, cost, network, p, "flat", overlap, _median(others))
    measured = _median(list(walls.values()))
    return {"codec": codec, "overlap": overlap, "predicted_s": it["iteration"],
            "measured_s": measured, "rel_error": it["iteration"] / measured - 1,
            "predicted_comm_s": it["comm"], "measured_comm_s": _median(work),
            "compute_s": it["compute"]}


def _median(values):
    v = sorted(values)
    return v[len(v) // 2] if len(v) % 2 else 0.5 * (v[len(v) // 2 - 1] + v[len(v) // 2])


# --- the emulated cluster (scripts/cluster_bench.py) -----------------------------------------
EMULATED_NETS = {"caffenet": os.path.join(REPO, "prototxt", "caffenet_emulated", "train.prototxt"),
                 "googlenet": os.path.join(REPO, "prototxt", "googlenet_emulated",
                                           "train.prototxt")}
# Host rates of one core, elements/s (``copy_bytes``, ``tcp``, ``loopback``: bytes/s), measured
# on the machine that ran the emulated cluster (2-core AMD EPYC VM, idle, 2026-11-25 03:05 UTC,
# after the runs of docs/figures/cluster/) by measure_host_rates(copies=2): one copy of the
# passes per core at once, as the two processes of a 2x1 job run them, on the emulated nets'
# data (gradients all ones, weights all alike), 2^24 elements, best of 5 per copy, median of the
# copies; ``loopback`` by measure_tcp_rate, ``gloo_fp16_sum`` by measure_gloo_half_sum; each the
# median of three such measurements (which spread by up to 25 %). ``tcp``: TCP_REFERENCE below.
HOST_RATES = {
    "fp32_encode": 1.87e9,    # copy of the gradient into the wire buffer
    "fp32_decode": 2.78e9,    # wire / P into the gradient
    "fp32_sum": 2.65e9,       # numpy add (the explicit schedule's float sum)
    "fp16_encode": 0.95e9,    # comm.kernels.encode_half (grad / P to float16 bits)
    "fp16_decode": 1.65e9,    # comm.kernels.decode_half
    "fp16_sum": 5.18e9,       # comm.kernels.half_sum
    "fp8_encode": 1.95e9,     # comm.kernels.encode_ratio_fp8
    "fp8_decode": 2.55e9,     # comm.kernels.decode_ratio_fp8
    "fp8_between": 1.81e9,    # comm.kernels.fp8_map (the between-stage rescale, P' > 1)
    "fp8_sum": 6.35e9,        # comm.kernels.fp8_sum
    "update": 1.07e9,         # solvers.native.sgd_momentum
    "finite": 6.22e9,         # solvers.native.all_finite
    "copy_bytes": 7.47e9,     # memcpy (shared-memory allgather)
    "tcp": 1.083e9,           # bytes sent per CPU-second over the emulated link (TCP_REFERENCE)
    "loopback": 3.63e9,       # bytes one CPU-second moves between two processes over loopback
    "ddp_copy": 2e9,          # torch.mul(grad, 1/P, out=bucket): DDP's copy into the bucket
    "ddp_fp16_encode": 0.772e9,# the fp16 hook's bucket.to(float16).div_(P) (a fresh tensor)
    "ddp_fp16_decode": 3.03e9,# the hook's copy of the fp16 result back into the bucket
    "ddp_step": 0.942e9,      # torch.optim.SGD(momentum).step()
    "gloo_fp32_sum": 2.65e9,  # gloo's float sum: a compiled loop, taken at numpy add's rate
    "gloo_fp16_sum": 0.459e9, # gloo's float16 sum (element by element through float)
}
# Cores of the machine that ran the emulated cluster and HOST_RATES (physical; --cores, or this
# machine's with --measure).
HOST_CORES = 2
# The emulated link's CPU cost per byte (HOST_RATES' "tcp") cannot be measured here without the
# cluster. It is measured from a timing log of the cluster: the transfer of the largest bucket
# in a synchronous float32 run, where nothing else runs beside it and each process has one
# core: CaffeNet 2x1 at 10 Gbit/s (the c8-fp32-sync 2x1 run of
# docs/figures/cluster/caffenet_layouts.csv, runs/cluster/caffenet/10gbit/2x1/c8-fp32-sync/
# timing.r*.jsonl): fc6's bucket, 37.75 M elements (151 MB sent per process), comm 147.04 ms,
# median over 2 ranks x 4 iterations (138 to 160 ms), where the link alone takes 126 ms:
# CPU-bound. tcp_rate_from_sum turns it into 1.083e9 bytes sent per CPU-second (3.4 times the
# loopback's cost per byte). That run's fc6 bucket is the only use of the cluster's logs: no
# iteration time is fitted. The other synchronous runs' logs imply 0.91 to 1.15e9 (fp32 on 3x1,
# 4x1 and 2x2, fp8 on 2x1, 3x1 and 4x1); cluster_bench's mpi-fp32 reference (a blocking
# MPI_Allreduce, whose busy polling holds the cores the kernel's network work needs) implies
# 0.83e9 (tcp_rate_from_mpi_reference; printed by the cluster command when a CSV has the row).
TCP_REFERENCE = {"elements": 37752832, "seconds": 0.14704, "codec": "fp32", "nodes": 2,
                 "ppn": 1}

# Per collective call (MPI Alltoallv or Allgather of caffe8's sum; one step of gloo's ring):
# measured as half the median comm time of CaffeNet's bias tensors (96 to 4096 elements, whose
# bytes take microseconds) in the timing logs of synchronous 2x1 runs that summed each tensor
# by itself (before comm.bucket_kb): 0.35 to 0.8 ms per tensor, median 0.45 ms.
ALPHA_COLLECTIVE = 0.22e-3
# Barrier of the shared-memory stages (P' > 1), assumed: a few polls of node-shared counters
# (two per bucket: about a millisecond per iteration in all).
ALPHA_SHARED = 20e-6
VARIANT = re.compile(r"^(?:c8-(fp32|fp16|fp8)-(sync|async)|ddp-(fp32|fp16|fp8)|(mpi)-fp32)$")
#: cluster_bench's variants the model has no cost for (left out of the comparison, named)
UNMODELLED = re.compile(r"^ddp-(?:bf16|powersgd\d+|fp8h|none)$")


def emulated_layers(path, narrow=1):
    """LayerCosts of an emulated net prototxt: one per EmulatedCompute layer, with its
    forward/backward sleep and the Parameter tensors since the previous one (element counts;
    narrowed as cluster_bench --narrow does); tensors after the last get a layer of no
    compute."""
    import math
    from caffe8.engine.prototxt import parse_file
    from scripts.make_emulated_net import read_groups, scale_net
    net, _ = scale_net(parse_file(path), 1.0, narrow)
    layers = [pm.LayerCost(name, fwd / 1e3, bwd / 1e3, [math.prod(s) for s in shapes])
              for name, shapes, fwd, bwd in read_groups(net)]
    if not layers:
        raise ValueError(f"{path}: no EmulatedCompute or Parameter layers")
    return layers


def cluster_costs(rates, cores, rate_bps, ppn):
    """(caffe8 codecs, DDP codecs, HostCost, DdpCost, Network) from host ``rates`` (HOST_RATES'
    keys), the machine's ``cores`` and the link's ``rate_bps`` (bits/s, each direction)."""
    c8 = {c: pm.CodecCost(pm.CODEC_BYTES[c], rates[f"{c}_sum"],
                          encode_rate=rates[f"{c}_encode"], decode_rate=rates[f"{c}_decode"],
                          between_rate=rates["fp8_between"] if c == "fp8" else pm.INF)
          for c in ("fp32", "fp16", "fp8")}
    ddp = {"fp32": pm.CodecCost(4, rates["gloo_fp32_sum"]),
           "fp16": pm.CodecCost(2, rates["gloo_fp16_sum"], encode_rate=rates["ddp_fp16_encode"],
                                decode_rate=rates["ddp_fp16_decode"]),
           # caffe8.ddp.fp8_hook over all ranks: caffe8's fused encode in the hook, its fp8 sum
           # and decode, the bytes of a ring (all-to-all, then all-gather), gloo's latencies
           "fp8": pm.CodecCost(1, rates["fp8_sum"], encode_rate=rates["fp8_encode"],
                               decode_rate=rates["fp8_decode"])}
    host = pm.HostCost(cores, rates["tcp"], rates["copy_bytes"], rates["update"], rates["finite"],
                       rates["loopback"])
    network = pm.Network(ALPHA_SHARED, rates["copy_bytes"], ALPHA_COLLECTIVE,
                         rate_bps / 8 * pm.TCP_PAYLOAD_EFFICIENCY, ppn)
    return c8, ddp, host, pm.DdpCost(rates["ddp_copy"]), network


def row_cores(row, cores):
    """The cores a row's processes had in its (undilated) time: with a time dilation above 1
    (cluster_bench --dilation) one each, as caffe8.cluster's CPU caps give them; else the
    machine's ``cores``, shared by all."""
    return int(row["nodes"]) * int(row["ppn"]) if float(row.get("dilation") or 1) > 1 else cores


def predict_cluster_row(row, layers, rates, cores, bucket_kb=1024, link_share=1.0):
    """Predicted seconds per iteration of one cluster_bench.py CSV row (caffe8's buckets of
    ``bucket_kb`` KiB, comm.bucket_kb's default); ``layers``: the row's net as it ran (narrowed
    as the row says), ``link_share``: the share of the named link rate it ran at (the narrowed
    parameters' share)."""
    from caffe8.cluster import parse_rate
    m = VARIANT.match(row["variant"])
    if not m:
        raise ValueError(f"unknown variant {row['variant']!r} (c8-<fp32|fp16|fp8>-<sync|async>, "
                         f"ddp-fp32, ddp-fp16, mpi-fp32)")
    nodes, ppn = int(row["nodes"]), int(row["ppn"])
    cores = row_cores(row, cores)
    c8, ddp, host, ddp_cost, network = cluster_costs(rates, cores,
                                                     parse_rate(row["rate"]) * link_share, ppn)
    t1 = float(row["baseline_ms"]) / 1e3
    if m.group(3):
        return pm.cluster_time(layers, ddp[m.group(3)], network, host, nodes, ppn, t1, "ddp",
                               ddp_cost, rates["ddp_step"])
    if m.group(4):
        return pm.cluster_time(layers, c8["fp32"], network, host, nodes, ppn, t1, "mpi")
    return pm.cluster_time(layers, c8[m.group(1)], network, host, nodes, ppn, t1, m.group(2),
                           bucket_bytes=1024.0 * bucket_kb)


def tcp_rate_from_sum(elements, seconds, codec, nodes, ppn, rates=None, cores=HOST_CORES):
    """HOST_RATES' "tcp" from one measured caffe8 sum of ``elements`` that took ``seconds``
    (a bucket's comm in a timing log) with nothing else running, assumed CPU-bound: the bytes
    each process sends over the link / (its core share × the time left after the latency
    steps, the sums and the shared-memory stages of c8_collective_steps)."""
    rates = dict(HOST_RATES, **(rates or {}))
    c8, _, host, _, network = cluster_costs(dict(rates, tcp=pm.INF), cores, pm.INF, ppn)
    steps = pm.c8_collective_steps(elements, c8[codec], network, host, nodes, ppn)
    other = sum(x[1] for x in steps if x[0] in ("cpu", "idle"))
    sent = 2 * (nodes - 1) / nodes * elements * pm.CODEC_BYTES[codec] / ppn
    cpu = min(1.0, cores / (nodes * ppn)) * (seconds - other)
    if nodes < 2 or cpu <= 0:
        raise ValueError("tcp_rate_from_sum needs a sum over 2 or more nodes that took longer "
                         "than its latencies and sums")
    return sent / cpu


def tcp_rate_from_mpi_reference(row, layers, rates=None, cores=HOST_CORES):
    """The "tcp" that makes the model of an mpi-fp32 ``row`` take its measured iter_ms
    (CPU-bound: bytes crossing the link per process / (its core share × (iter_ms − the
    latency steps) − the sum's time)); ``layers``: the row's net (emulated_layers)."""
    import math
    from caffe8.cluster import parse_rate
    rates = dict(HOST_RATES, **(rates or {}))
    nodes, ppn = int(row["nodes"]), int(row["ppn"])
    p = nodes * ppn
    c8, _, _, _, network = cluster_costs(rates, cores, parse_rate(row["rate"]), ppn)
    n = sum(m for x in layers for m in x.tensors)
    crossing = 2 * (nodes - 1) / nodes * 4 * n
    busy = float(row["iter_ms"]) / 1e3 - 2 * math.ceil(math.log2(p)) * network.alpha_inter
    cpu = min(1.0, cores / p) * busy - (p - 1) / p * n / c8["fp32"].reduce_rate
    if row["variant"] != "mpi-fp32" or nodes < 2 or cpu <= 0 or \
            busy <= ppn * crossing / network.beta_inter:
        raise ValueError("the reference must be an mpi-fp32 row on 2 or more nodes whose time "
                         "exceeds the link's (CPU-bound)")
    return crossing / cpu


def cluster_validation(csv_paths, out_dir, rates=None, cores=None, nets=None, limit=15.0,
                       bucket_kb=1024):
    """Every ``round == "all"`` row of cluster_bench.py CSVs (a path or a list) with
    ``predicted_ms`` and ``error_pct``; writes OUT_DIR/cluster_model.csv (the columns of all
    the CSVs). Returns (rows, table lines)."""
    rates = dict(HOST_RATES, **(rates or {}))
    cores = cores or HOST_CORES
    paths = dict(EMULATED_NETS, **(nets or {}))
    measured = []
    for csv_path in [csv_paths] if isinstance(csv_paths, str) else csv_paths:
        with open(csv_path, encoding="utf-8") as f:
            measured += [r for r in csv.DictReader(f) if r["round"] == "all"]
    if not measured:
        raise ValueError(f"{', '.join(csv_paths)}: no rows with round == 'all'")
    layers, rows, unmodelled = {}, [], []
    for r in measured:
        if UNMODELLED.match(r["variant"]):      # e.g. the DDP hooks of caffe8.ddp, PowerSGD
            unmodelled.append(r["variant"])
            continue
        if r["net"] not in paths:
            raise ValueError(f"{csv_path}: net {r['net']!r} has no emulated prototxt "
                             f"(known: {', '.join(sorted(paths))}; --net NAME=PATH)")
        narrow = int(float(r.get("narrow") or 1))
        key = (r["net"], narrow)
        if key not in layers:
            layers[key] = emulated_layers(paths[r["net"]], narrow)
            full = sum(m for x in emulated_layers(paths[r["net"]]) for m in x.tensors)
            layers[key, "share"] = sum(m for x in layers[key] for m in x.tensors) / full
        predicted = 1e3 * predict_cluster_row(r, layers[key], rates, cores, bucket_kb,
                                              layers[key, "share"])
        got = float(r["iter_ms"])
        rows.append(dict(r, predicted_ms=round(predicted, 3),
                         error_pct=round(100 * (predicted / got - 1), 2)))
    lines = [f"{'net':9s} {'layout':6s} {'rate':7s} {'k':>4s} {'variant':14s} {'measured':>9s} "
             f"{'predicted':>9s} {'error':>7s}"]
    for r in rows:
        flag = "" if abs(r["error_pct"]) <= limit else f"  outside {limit:g} %"
        lines.append(f"{r['net']:9s} {r['layout']:6s} {r['rate']:7s} "
                     f"{float(r.get('dilation') or 1):4g} {r['variant']:14s} "
                     f"{float(r['iter_ms']):9.1f} {r['predicted_ms']:9.1f} "
                     f"{r['error_pct']:+6.1f}%{flag}")
    from caffe8.cluster import parse_rate
    refs = [r for r in rows if r["variant"] == "mpi-fp32" and int(r["nodes"]) > 1
            and int(float(r.get("narrow") or 1)) == 1 and float(r.get("dilation") or 1) == 1]
    for r in refs:       # the reference transfers at their highest rate (CPU-bound)
        if parse_rate(r["rate"]) < max(parse_rate(q["rate"]) for q in refs
                                       if (q["net"], q["layout"]) == (r["net"], r["layout"])):
            continue
        try:
            implied = tcp_rate_from_mpi_reference(r, layers[r["net"], 1], rates, cores)
        except ValueError:
            continue
        lines.append(f"{r['net']} {r['layout']} {r['rate']} mpi-fp32 implies tcp "
                     f"{implied / 1e9:.4g}e9 B/s (used: {rates['tcp'] / 1e9:.4g}e9)")
    inside = sum(abs(r["error_pct"]) <= limit for r in rows)
    lines.append(f"{inside} of {len(rows)} points within {limit:g} % ({cores:g} cores)")
    if unmodelled:
        lines.append(f"not modelled: {', '.join(dict.fromkeys(unmodelled))} "
                     f"({len(unmodelled)} points)")
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
        fields = list(dict.fromkeys(k for r in rows for k in r))
        _write_rows([{k: r.get(k, "") for k in fields} for r in rows],
                    os.path.join(out_dir, "cluster_model.csv"))
    return rows, lines


def _best_rate(fn, n, repeats):
    import time
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return n / best


def _host_passes(n, repeats):
    """{HOST_RATES key: rate} of this process's passes over n elements (emulated-net data)."""
    import numpy
    from caffe8.comm import kernels
    from caffe8.solvers import native
    g, w = numpy.ones(n, numpy.float32), numpy.full(n, -0.05, numpy.float32)
    h, f = numpy.zeros(n, numpy.float32), numpy.empty(n, numpy.float32)
    u8, u8b = numpy.empty(n, numpy.uint8), numpy.empty(n, numpy.uint8)
    u16, u16b = numpy.empty(n, numpy.uint16), numpy.empty(n, numpy.uint16)
    kernels.encode_ratio_fp8(g, w, 1e-8, 1000.0, u8)
    u8b[...] = u8

    kernels.encode_half(g, u16, 2.0)
    u16b[...] = u16
    table = numpy.arange(256, dtype=numpy.uint8)     # fp8's between-stage map (any table)
    out = {
        "fp8_encode": lambda: kernels.encode_ratio_fp8(g, w, 1e-8, 1000.0, u8),
        "fp8_decode": lambda: kernels.decode_ratio_fp8(u8, w, 1e-8, 1e-3, f),
        "fp8_between": lambda: kernels.fp8_map(table, u8),
        "fp8_sum": lambda: kernels.fp8_sum(u8b, u8),
        "fp16_encode": lambda: kernels.encode_half(g, u16, 2.0),
        "fp16_decode": lambda: kernels.decode_half(u16, f),
        "fp16_sum": lambda: kernels.half_sum(u16b, u16),
        "fp32_encode": lambda: f.__setitem__(Ellipsis, g),
        "fp32_decode": lambda: numpy.divide(g, numpy.float32(2), out=f),
        "fp32_sum": lambda: numpy.add(g, f, out=f),
        "update": lambda: native.sgd_momentum(w, f, h, 0.0, 0.9),
        "finite": lambda: native.all_finite(g),
    }
    rates = {k: _best_rate(fn, n, repeats) for k, fn in out.items()}
    rates["copy_bytes"] = 4 * rates["fp32_encode"]
    rates["gloo_fp32_sum"] = rates["fp32_sum"]
    try:
        import torch
    except ImportError:
        return rates
    torch.set_num_threads(1)
    tg, buf = torch.ones(n), torch.empty(n)
    half = torch.ones(n, dtype=torch.float16)
    p = torch.nn.Parameter(torch.zeros(n))
    p.grad = tg.clone()
    opt = torch.optim.SGD([p], lr=0.01, momentum=0.9)
    rates.update({
        "ddp_copy": _best_rate(lambda: torch.mul(tg, 0.5, out=buf), n, repeats),
        "ddp_fp16_encode": _best_rate(lambda: buf.to(torch.float16).div_(2), n, repeats),
        "ddp_fp16_decode": _best_rate(lambda: buf.copy_(half), n, repeats),
        "ddp_step": _best_rate(opt.step, n, repeats)})
    return rates


def measure_host_rates(copies=1, n=1 << 24, repeats=5):
    """HOST_RATES' per-element keys measured here: ``copies`` processes run the passes at once
    (one per core, as the processes of a job do), median over them of each one's best of
    ``repeats``; keys whose pass cannot run here (PyTorch absent) are left out."""
    import multiprocessing
    import statistics
    if copies <= 1:
        return _host_passes(n, repeats)
    with multiprocessing.get_context("fork").Pool(copies) as pool:
        results = pool.starmap(_host_passes, [(n, repeats)] * copies)
    return {k: statistics.median(r[k] for r in results) for k in results[0]}


def measure_tcp_rate(nbytes=1 << 28, chunk=1 << 20):
    """Bytes per CPU-second of a TCP transfer between two threads over loopback: the sending
    and the receiving copies and the kernel's protocol work together (process CPU time)."""
    import socket
    import threading
    import time
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)

    def receive():
        conn, _ = srv.accept()
        view, got = memoryview(bytearray(chunk)), 0
        while got < nbytes:
            got += conn.recv_into(view)
        conn.close()
    thread = threading.Thread(target=receive)
    thread.start()
    sender = socket.create_connection(srv.getsockname())
    data, cpu = bytes(chunk), time.process_time()
    for _ in range(nbytes // chunk):
        sender.sendall(data)
    sender.close()
    thread.join()
    srv.close()
    return nbytes / (time.process_time() - cpu)


def measure_gloo_half_sum(n=1 << 23, repeats=5):
    """gloo's float16 sum, elements/s: two gloo ranks (threads of this process) allreduce n
    float16 and n/2 float32 elements (the same bytes); the difference is the extra time of
    summing n/2 float16 elements over n/4 float32 ones (at HOST_RATES' gloo_fp32_sum)."""
    import datetime
    import tempfile
    import threading
    import time
    import torch
    import torch.distributed as dist
    store_path = tempfile.mktemp(prefix="perf_model_gloo_")
    times = {}

    def rank(r):
        pg = dist.ProcessGroupGloo(dist.FileStore(store_path, 2), r, 2,
                                   datetime.timedelta(seconds=60))
        for dtype, m in ((torch.float32, n // 2), (torch.float16, n)):
            x = torch.ones(m, dtype=dtype)
            best = float("inf")
            for _ in range(repeats):
                t = time.perf_counter()
                pg.allreduce([x]).wait()
                best = min(best, time.perf_counter() - t)
            times[(r, dtype)] = best
    threads = [threading.Thread(target=rank, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    extra = min(times[(r, torch.float16)] - times[(r, torch.float32)] for r in (0, 1))
    extra += n / 4 / HOST_RATES["gloo_fp32_sum"]
    return n / 2 / extra


def build_parser():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("oyama",
                       help="CaffeNet on TSUBAME-KFC/DL vs Oyama et al.'s published numbers")
    s.add_argument("--out", default="", help="folder for perf_model_oyama.csv/.png")
    f7 = sub.add_parser("fig7", help="figure 7's four 192-GPU points, error per point")
    f7.add_argument("--out", default="", help="folder for perf_model_fig7_points.csv/.png")
    lo = sub.add_parser("local", help="this machine: allreduce bench fit vs weak-scaling runs")
    lo.add_argument("--bench", required=True,
                    help="caffe8 bench CSV (OUT/allreduce_bench.csv, 2 ranks)")
    lo.add_argument("--weak-dir", required=True, help="weak_scaling.py output folder")
    lo.add_argument("--column", default="min_seconds", choices=("min_seconds", "median_seconds"))
    lo.add_argument("--csv")
    c = sub.add_parser("check", help="one measured run vs the model fed its own layer times")
    c.add_argument("--timing-logs", required=True, help="comma-separated, rank 0's first")
    c.add_argument("--model", required=True, help="the run's net prototxt")
    c.add_argument("--bench", required=True,
                   help="caffe8 bench CSV (OUT/allreduce_bench.csv, same P)")
    c.add_argument("--codec", default="fp8")
    c.add_argument("--overlap", action="store_true", help="the run used comm.async true")
    c.add_argument("--processes", type=int, default=2)
    c.add_argument("--skip", type=int, default=10)
    cl = sub.add_parser("cluster", help="scripts/cluster_bench.py CSV: predicted vs measured")
    cl.add_argument("--csv", required=True, action="append",
                    help="cluster_bench.py CSV (rows round == all); repeat for several")
    cl.add_argument("--out", default="", help="folder for cluster_model.csv")
    cl.add_argument("--cores", type=float, default=None,
                    help=f"cores of the machine that ran the cluster (default {HOST_CORES}, "
                         f"this machine's with --measure)")
    cl.add_argument("--rate", action="append", default=[], type=_rate_arg, metavar="KEY=VALUE",
                    help="override one of HOST_RATES (elements/s; copy_bytes, tcp: bytes/s)")
    cl.add_argument("--measure", action="store_true",
                    help="measure the host rates here first (one copy per core, ~10 s)")
    cl.add_argument("--net", action="append", default=[], type=_rate_arg, metavar="NAME=PATH",
                    help="emulated prototxt of a net (default caffenet, googlenet)")
    cl.add_argument("--bucket-kb", type=float, default=1024,
                    help="caffe8's comm.bucket_kb of the runs (default 1024)")
    return ap


def _rate_arg(text):
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    try:
        return key, float(value)
    except ValueError:
        return key, value


def cluster_main(args):
    rates = {}
    if args.measure:
        args.cores = args.cores or os.cpu_count()
        rates = measure_host_rates(copies=int(args.cores))
        rates["loopback"] = measure_tcp_rate()
        try:
            rates["gloo_fp16_sum"] = measure_gloo_half_sum()
        except ImportError:
            pass
        print("measured host rates: " + ", ".join(f"{k} {v / 1e9:.3g}G"
                                                  for k, v in sorted(rates.items())))
    for key, value in args.rate:
        if key not in HOST_RATES or not isinstance(value, float):
            raise SystemExit(f"studies.perf_model.validate cluster: error: --rate {key}={value}: expected one "
                             f"of {', '.join(HOST_RATES)} with a number")
        rates[key] = value
    nets = dict(args.net)
    _, lines = cluster_validation(args.csv, args.out, rates, args.cores, nets,
                                  bucket_kb=args.bucket_kb)
    print("\n".join(lines))
    if args.out:
        print(f"wrote {os.path.join(args.out, 'cluster_model.csv')}")
    return 0


def main(argv=None):
    args = build_parser().parse_args(argv)
    if args.cmd == "fig7":
        for r in fig7_points(args.out):
            plain = (f"plain model {r['model_plain']:.0f}x ({r['err_plain_pct']:+.1f}%) | "
                     if r["variant"] == "model" else "")
            print(f"{r['net']:9s} {r['codec']:4s} {r['variant']:26s} paper {r['paper']:.0f}x | "
                  f"{plain}model {r['model']:.0f}x ({r['err_pct']:+.1f}%); T1 {r['t1_ms']:.0f} ms")
        band = fig7_efficiency_band()
        print(f"GPU efficiency {FIG7_GPU_EFFICIENCY:.2f} of the GK210 peak on CaffeNet (assumed); "
              f"all four points within 15 % for " + (f"{band[0]:.2f} to {band[1]:.2f}" if band
                                                      else "no efficiency in 0.20-1.00") +
              f"; Caffe's published K40c time would be {published_efficiency():.2f}, "
              f"{published_efficiency() * CUDNN_R2_TO_R4:.2f} with the cuDNN R2-R4 gain")
        return 0
    if args.cmd == "cluster":
        return cluster_main(args)
    if args.cmd == "oyama":
        print("\n".join(oyama_validation(args.out)))
        return 0
    if args.cmd == "check":
        r = check_run(args.timing_logs.split(","), args.model, args.bench, args.codec,
                      args.overlap, args.processes, args.skip)
        print(f"{r['codec']} {'async' if r['overlap'] else 'sync'}: iteration predicted "
              f"{r['predicted_s'] * 1e3:.2f} ms, measured {r['measured_s'] * 1e3:.2f} ms "
              f"({100 * r['rel_error']:+.0f}%); exchange work predicted "
              f"{r['predicted_comm_s'] * 1e3:.2f} ms, measured {r['measured_comm_s'] * 1e3:.2f} ms;"
              f" compute {r['compute_s'] * 1e3:.2f} ms")
        return 0
    lines, rows = local_validation(args.bench, args.weak_dir, args.column)
    print("\n".join(lines))
    if args.csv and rows:
        _write_rows(rows, args.csv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
