"""``caffe8 perf_model``: predicted iteration time and weak-scaling speedup of a net on P
processes, from its per-layer times on one process (caffe8.comm.perf_model).

``caffe8 perf_model --model NET (--timing-log F.jsonl | --caffe-time F.txt) --procs 2,4,8``:
parameter tensors from the net as built for TRAIN (``--data-shape`` swaps its data layers for
inputs, so no data is needed), forward/backward seconds per layer from a ``caffe8 train
--timing-log`` file (the iterations after ``--skip``, median) or a saved ``caffe8 time`` / Caffe
``caffe time`` output, and the network and codec rates given as flags. Prints one line per
codec and P (iteration, exchange, exposed exchange, speedup) and writes them to ``--csv``.
The model and its validation against Oyama et al.'s figure 7 and measured runs:
studies/perf_model/README.md.
"""
import argparse

NAME = "perf_model"
HELP = "predict iteration time and speedup on P processes from one process's layer times"
GROUP = "cluster"


def _procs(text):
    try:
        procs = [int(p) for p in text.split(",") if p.strip()]
    except ValueError:
        procs = []
    if not procs or min(procs) < 1:
        raise argparse.ArgumentTypeError(f"expected process counts like 1,2,4, got {text!r}")
    return procs


def add_arguments(p):
    from caffe8.comm.perf_model import INF, SCHEDULES
    from caffe8.tools.inspect import add_data_shape
    p.add_argument("--model", required=True, help="net prototxt (parameter sizes)")
    add_data_shape(p, "swap data layers for Input (no data needed)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--timing-log", help="caffe8 train --timing-log file (JSON lines)")
    src.add_argument("--caffe-time", help="saved output of `caffe8 time` / `caffe time`")
    p.add_argument("--skip", type=int, default=1, help="timing-log warm-up iterations to drop")
    p.add_argument("--procs", type=_procs, default=[1, 2, 4, 8], help="process counts")
    p.add_argument("--codecs", default="fp32,fp16,fp8", help="comma separated")
    p.add_argument("--schedule", choices=sorted(SCHEDULES), default="hierarchical")
    p.add_argument("--no-overlap", dest="overlap", action="store_false",
                   help="the exchange after the whole backward (comm.async false)")
    p.add_argument("--processes-per-node", type=int, default=1)
    p.add_argument("--alpha-intra", type=float, default=2e-6, help="s per message step")
    p.add_argument("--beta-intra", type=float, default=5e9, help="bytes/s per process")
    p.add_argument("--alpha-inter", type=float, default=5e-6)
    p.add_argument("--beta-inter", type=float, default=1.25e9, help="bytes/s of a node's link")
    p.add_argument("--beta-host", type=float, default=INF, help="D2H/H2D bytes/s (GPU)")
    p.add_argument("--reduce-rate", type=float, default=INF, help="reduction elements/s")
    p.add_argument("--convert-rate", type=float, default=INF, help="encode+decode elements/s")
    p.add_argument("--update", type=float, default=0.0, help="update seconds per iteration")
    p.add_argument("--csv", help="write the predictions here")


def _layers(args):
    from caffe8.comm import perf_model as pm
    from caffe8.engine.net import Net
    from caffe8.engine.net_graph import swap_data_layers
    from caffe8.engine.prototxt import parse_file
    from caffe8.wiring import register_all
    register_all()
    model = parse_file(args.model)
    if args.data_shape:
        model = swap_data_layers(model, dict(args.data_shape))
    params = pm.layer_params_from_net(Net(model, phase="TRAIN"))
    if args.timing_log:
        times = pm.layer_times_from_timing_log(args.timing_log, args.skip)
    else:
        with open(args.caffe_time, encoding="utf-8") as f:
            times = pm.layer_times_from_caffe_time(f)
    return pm.build_layers(times, params)


def run(args):
    import csv
    from caffe8.comm import perf_model as pm
    from caffe8.engine.errors import CaffeError
    codecs = [c for c in args.codecs.split(",") if c]
    unknown = sorted(set(codecs) - set(pm.CODEC_BYTES))
    if unknown:
        raise CaffeError(f"--codecs: {', '.join(unknown)} not modelled (choose from "
                         f"{', '.join(pm.CODEC_BYTES)})")
    try:
        rows = _predict(args, codecs)
    except (OSError, ValueError) as e:  # a missing file, no records, P not a node multiple
        raise CaffeError(f"perf_model: {e}") from None
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    return 0


def _predict(args, codecs):
    from caffe8.comm import perf_model as pm
    layers = _layers(args)
    network = pm.Network(args.alpha_intra, args.beta_intra, args.alpha_inter, args.beta_inter,
                         args.processes_per_node, args.beta_host)
    rows = []
    for codec in codecs:
        cost = pm.CodecCost(pm.CODEC_BYTES[codec], args.reduce_rate,
                            pm.INF if codec == "fp32" else args.convert_rate)
        for p in args.procs:
            it = pm.iteration_time(layers, cost, network, p, args.schedule, args.overlap,
                                   args.update)
            speedup = pm.weak_speedup(layers, cost, network, p, args.schedule, args.overlap,
                                      args.update)
            rows.append({"codec": codec, "p": p, "iteration_s": it["iteration"],
                         "comm_s": it["comm"], "exposed_s": it["exposed"], "speedup": speedup})
            print(f"{codec:5s} p={p:4d}  iteration {it['iteration'] * 1e3:9.3f} ms  comm "
                  f"{it['comm'] * 1e3:8.3f} ms  exposed {it['exposed'] * 1e3:8.3f} ms  "
                  f"speedup {speedup:.2f}")
    return rows
