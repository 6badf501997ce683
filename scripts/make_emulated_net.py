#!/usr/bin/env python
"""Write prototxt/{caffenet,googlenet}_emulated/: a net's parameter tensors, emulated GPU compute.

Usage (from the repository root)::

    python -m scripts.make_emulated_net [--batch 256] [--out prototxt/caffenet_emulated]
    python -m scripts.make_emulated_net --net googlenet [--batch 32] \
        [--out prototxt/googlenet_emulated]

The CaffeNet net holds CaffeNet's 16 parameter tensors (60,965,224 parameters) in ``Parameter``
layers, in CaffeNet's layer order. Each tensor feeds a ``Reduction`` (SUM, loss weight 1), so every
tensor gets a gradient of ones every iteration at the cost of one pass over it. After each layer's
two tensors an in-place ``EmulatedCompute`` layer sleeps that layer's forward and backward time:
backward runs in reverse order, so layer L's gradients become ready (and its exchange can start)
only after L's emulated backward, with the later layers' exchanges already under way, as in
CaffeNet on a GPU. The DummyData layer carries only the per-process batch (for throughput
accounting by studies/scaling/weak_scaling.py); nothing reads it.

``--net googlenet`` writes the same for GoogLeNet: the 128 weight and bias tensors (13,378,280
parameters) of every Convolution and InnerProduct of prototxt/googlenet/train_val.prototxt's TRAIN
net, in its layer order, the two auxiliary classifiers (loss1/*, loss2/*) included where that net
has them, at Oyama et al.'s per-process GoogLeNet batch of 32. Shapes and multiply-adds come from
that net built by the engine at batch 1 with 224 x 224 inputs (multiply-adds by
caffe8.comm.perf_model.layer_macs_from_net, as studies/perf_model/validate.py counts them). The Parameter layers
are named "<layer>_w" and "<layer>_b" after GoogLeNet's own layer names, '/' kept: the engine
takes any quoted name, and HDF5 snapshots nest such names as groups and read them back.

Times: Oyama, Nomura, Sato and Matsuoka, "Reducing communication in data-parallel deep learning
with floating-point numbers smaller than single precision" (in Japanese), show their per-iteration
breakdowns only as bar charts, with no per-layer numbers. The times here are a roofline
estimate of one GK210 (half a Tesla K80, the paper's GPU): forward = 2 x MACs per sample x batch /
(4.37 TFLOP/s peak x 0.5 efficiency), backward = 2 x forward (weight and input gradients; the
first convolution computes no input gradient, so 1 x). For CaffeNet these are the per-layer
inputs of studies/perf_model/validate.py's TSUBAME-KFC/DL model (``oyama``); they scale linearly with the
batch, and the script prints them. ReLU, pooling, LRN, concatenation, dropout and the losses are
left out (no MACs). GoogLeNet gets the same rule and efficiency, which makes its emulated compute
lighter, relative to CaffeNet's, than on a real GPU (BVLC's timings give GoogLeNet 3.3 x
CaffeNet's time per image for 2.2 x its multiply-adds; studies/perf_model/validate.py's ``fig7`` scales
GoogLeNet by that ratio, CAFFE_PUBLISHED_S_PER_SAMPLE, instead).
"""
import argparse
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# CaffeNet (BVLC reference, two groups in conv2/4/5): weight and bias shapes in layer order.
CAFFENET_TENSORS = (
    ("conv1", (96, 3, 11, 11), (96,)),
    ("conv2", (256, 48, 5, 5), (256,)),
    ("conv3", (384, 256, 3, 3), (384,)),
    ("conv4", (384, 192, 3, 3), (384,)),
    ("conv5", (256, 192, 3, 3), (256,)),
    ("fc6", (4096, 9216), (4096,)),
    ("fc7", (4096, 4096), (4096,)),
    ("fc8", (1000, 4096), (1000,)),
)
CAFFENET_PARAMETERS = 60965224

# Forward MACs per 227x227 sample (output elements x kernel volume per group).
CAFFENET_MACS = {
    "conv1": 96 * 55 * 55 * 3 * 11 * 11,
    "conv2": 256 * 27 * 27 * 48 * 5 * 5,
    "conv3": 384 * 13 * 13 * 256 * 3 * 3,
    "conv4": 384 * 13 * 13 * 192 * 3 * 3,
    "conv5": 256 * 13 * 13 * 192 * 3 * 3,
    "fc6": 4096 * 9216,
    "fc7": 4096 * 4096,
    "fc8": 1000 * 4096,
}
GK210_PEAK_FLOPS = 8.74e12 / 2      # a Tesla K80 board is two GK210 GPUs
GK210_EFFICIENCY = 0.5              # assumed fraction of peak reached on CaffeNet's layers
REFERENCE_BATCH = 256               # Oyama et al.'s per-GPU CaffeNet batch

GOOGLENET_PROTOTXT = os.path.join(REPO, "prototxt", "googlenet", "train_val.prototxt")
GOOGLENET_CROP = 224                # the TRAIN net's crop_size
GOOGLENET_BATCH = 32                # Oyama et al.'s per-GPU GoogLeNet batch
GOOGLENET_PARAMETERS = 13378280

NETS = ("caffenet", "googlenet")
REFERENCE_BATCHES = {"caffenet": REFERENCE_BATCH, "googlenet": GOOGLENET_BATCH}
_TITLES = {"caffenet": "CaffeNet", "googlenet": "GoogLeNet"}
_GOOGLENET = []                     # googlenet_shapes(), built once


def googlenet_shapes():
    """(tensors, macs) of prototxt/googlenet/train_val.prototxt's TRAIN net, built by the engine
    at batch 1 with GOOGLENET_CROP inputs: tensors ((layer, weight shape, bias shape), ...) and
    macs {layer: forward multiply-adds per sample} (caffe8.comm.perf_model.layer_macs_from_net), both
    in layer order, for every layer with a weight blob (Convolution, InnerProduct)."""
    if not _GOOGLENET:
        from caffe8.wiring import register_all
        from caffe8.comm.perf_model import layer_macs_from_net
        from caffe8.engine.net import Net
        from caffe8.engine.net_graph import swap_data_layers
        from caffe8.engine.prototxt import parse_file
        register_all()
        crop = GOOGLENET_CROP
        model = swap_data_layers(parse_file(GOOGLENET_PROTOTXT),
                                 {"data": (1, 3, crop, crop), "label": (1,)})
        net = Net(model, phase="TRAIN")
        macs = layer_macs_from_net(net)
        tensors = []
        for layer in net.layers:
            if layer.name not in macs:
                if layer.blobs:
                    raise ValueError(f"GoogLeNet layer {layer.name!r} ({layer.type}) has "
                                     "parameters but no weight matrix to count MACs from")
                continue
            if len(layer.blobs) != 2:
                raise ValueError(f"GoogLeNet layer {layer.name!r} has {len(layer.blobs)} "
                                 "parameter tensors, expected a weight and a bias")
            tensors.append((layer.name, tuple(layer.blobs[0].shape), tuple(layer.blobs[1].shape)))
        _GOOGLENET.append((tuple(tensors), macs))
    return _GOOGLENET[0]


def _check_net(net):
    if net not in NETS:
        raise ValueError(f"unknown net {net!r}; one of {', '.join(NETS)}")


def net_tensors(net="caffenet"):
    """((layer, weight shape, bias shape), ...) of ``net`` in layer order."""
    _check_net(net)
    return CAFFENET_TENSORS if net == "caffenet" else googlenet_shapes()[0]


def net_macs(net="caffenet"):
    """{layer: forward multiply-adds per sample} of ``net`` in layer order."""
    _check_net(net)
    return CAFFENET_MACS if net == "caffenet" else googlenet_shapes()[1]


def layer_times_ms(batch, net="caffenet"):
    """{layer: (forward ms, backward ms)} of ``net`` at ``batch`` samples per process."""
    rate = GK210_PEAK_FLOPS * GK210_EFFICIENCY
    out = {}
    for k, (name, macs) in enumerate(net_macs(net).items()):
        fwd = 2.0 * macs * batch / rate * 1e3
        out[name] = (fwd, fwd * (1 if k == 0 else 2))
    return out


def _shape(dims, indent):
    return f"{indent}shape {{ {' '.join(f'dim: {d}' for d in dims)} }}"


def net_text(batch, net="caffenet"):
    times = layer_times_ms(batch, net)
    tensors = net_tensors(net)
    title = _TITLES[net]
    lines = [
        f"# Generated by scripts/make_emulated_net.py: {title}'s {2 * len(tensors)} parameter "
        "tensors with",
        f"# emulated GK210 compute at a per-process batch of {batch}. Do not edit; rerun the script.",
        f'name: "{title}Emulated"',
        'layer { name: "data" type: "DummyData" top: "data"',
        f"        dummy_data_param {{ shape {{ dim: {batch} dim: 1 }} }} }}",
        'layer { name: "silence_data" type: "Silence" bottom: "data" }',
    ]
    for name, w_shape, b_shape in tensors:
        fwd, bwd = times[name]
        for suffix, shape in (("w", w_shape), ("b", b_shape)):
            lines.append(f'layer {{ name: "{name}_{suffix}" type: "Parameter" '
                         f'top: "{name}_{suffix}"')
            lines.append(f"        parameter_param {{ {_shape(shape, '').strip()} }} }}")
        lines.append(f'layer {{ name: "{name}/emulate" type: "EmulatedCompute" '
                     f'bottom: "{name}_w" top: "{name}_w"')
        lines.append(f"        emulate_param {{ forward_ms: {fwd:.3f} backward_ms: {bwd:.3f} }} }}")
        for suffix in ("w", "b"):
            lines.append(f'layer {{ name: "{name}_{suffix}_sum" type: "Reduction" '
                         f'bottom: "{name}_{suffix}" top: "{name}_{suffix}_sum"')
            lines.append('        reduction_param { operation: SUM } loss_weight: 1 }')
    return "\n".join(lines) + "\n"


_RUN_SETTINGS = [
    "max_iter: 20",
    "display: 20",
    "snapshot: 0",
]


def solver_text(net="caffenet"):
    _check_net(net)
    if net == "googlenet":
        return "\n".join([
            "# GoogLeNet's quick SGD settings (prototxt/googlenet/quick_solver.prototxt) on the",
            "# emulated net, but weight_decay 0: the losses are linear, and the decay pass over",
            "# 13.4 M weights is CPU time a GPU run would not spend on the host. The poly",
            "# schedule runs out at max_iter. No test settings: the emulated net has nothing to",
            "# test. The comm block is Oyama et al.'s fp8 exchange with no float32 warm-up;",
            "# studies/scaling/weak_scaling.py overrides codec, async, processes_per_node and max_iter",
            "# in its copies.",
            'net: "train.prototxt"',
            "base_lr: 0.01",
            'lr_policy: "poly"',
            "power: 0.5",
            "momentum: 0.9",
            "weight_decay: 0",
            *_RUN_SETTINGS,
            'snapshot_prefix: "runs/googlenet_emulated/googlenet_emulated"',
            "solver_mode: CPU",
            "random_seed: 1",
            'comm { codec: "fp8" relative: true hierarchical: true }',
        ]) + "\n"
    return "\n".join([
        "# CaffeNet's SGD settings (BVLC solver) on the emulated net, but weight_decay 0: the",
        "# losses are linear, and the decay pass over 61 M weights is CPU time a GPU run would",
        "# not spend on the host. The comm block is Oyama et al.'s fp8 exchange with no float32",
        "# warm-up; studies/scaling/weak_scaling.py overrides codec, async, processes_per_node and",
        "# max_iter in its copies.",
        'net: "train.prototxt"',
        "base_lr: 0.01",
        'lr_policy: "step"',
        "gamma: 0.1",
        "stepsize: 100000",
        "momentum: 0.9",
        "weight_decay: 0",
        *_RUN_SETTINGS,
        'snapshot_prefix: "runs/caffenet_emulated/caffenet_emulated"',
        "solver_mode: CPU",
        "random_seed: 1",
        'comm { codec: "fp8" relative: true hierarchical: true }',
    ]) + "\n"


def read_groups(net):
    """[(name, [tensor shape, ...], forward ms, backward ms)] of a parsed emulated NetParameter:
    one entry per EmulatedCompute layer with the Parameter tensors since the previous one, in
    net order; tensors after the last get an entry "tail" of no compute. The one reader of the
    format written here (scripts/cluster_bench.py's DDP side, studies/perf_model/validate.py's model)."""
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
    return groups


def scale_net(net, dilation=1.0, narrow=1):
    """A copy of a parsed emulated NetParameter for a dilated, narrowed run: every
    EmulatedCompute time multiplied by ``dilation`` (caffe8.cluster's time dilation) and every
    Parameter tensor's first axis divided by ``narrow`` (rounded, at least 1), so that many
    processes fit in memory; returns (net, the narrowed parameter count / the original). A run
    that narrows divides its link rate by the same ratio, which keeps the bytes sent per
    millisecond of compute, the figure that decides the exchange's cost, as they were."""
    out = net.copy()
    before = after = 0
    for layer in out.layer:
        if layer.type == "Parameter":
            dims = layer.parameter_param.shape.dim
            n = 1
            for d in dims:
                n *= int(d)
            before += n
            if narrow > 1 and len(dims):
                dims[0] = max(1, int(round(int(dims[0]) / narrow)))
            m = 1
            for d in dims:
                m *= int(d)
            after += m
        elif layer.type == "EmulatedCompute" and dilation != 1:
            e = layer.emulate_param
            e.forward_ms = float(e.forward_ms) * dilation
            e.backward_ms = float(e.backward_ms) * dilation
    return out, (after / before if before else 1.0)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--net", choices=NETS, default="caffenet")
    ap.add_argument("--batch", type=int, default=None,
                    help="per-process batch (default: 256 for caffenet, 32 for googlenet); "
                         "emulated times scale linearly with it")
    ap.add_argument("--out", default=None,
                    help="output folder (default: prototxt/NET_emulated)")
    args = ap.parse_args(argv)
    batch = REFERENCE_BATCHES[args.net] if args.batch is None else args.batch
    out = args.out or os.path.join(REPO, "prototxt", f"{args.net}_emulated")
    if batch < 1:
        ap.error("--batch must be >= 1")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "train.prototxt"), "w", encoding="utf-8") as f:
        f.write(net_text(batch, args.net))
    with open(os.path.join(out, "solver.prototxt"), "w", encoding="utf-8") as f:
        f.write(solver_text(args.net))
    times = layer_times_ms(batch, args.net)
    width = max(6, *(len(name) for name in times))
    for name, (fwd, bwd) in times.items():
        print(f"{name:{width}s} forward {fwd:8.3f} ms  backward {bwd:8.3f} ms")
    print(f"{'total':{width}s} forward {sum(t[0] for t in times.values()):8.3f} ms  backward "
          f"{sum(t[1] for t in times.values()):8.3f} ms  (batch {batch})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
