"""``caffe8 inspect MODEL``: build a net and print one line per layer.

    caffe8 inspect prototxt/caffenet/deploy.prototxt --phase TEST
    caffe8 inspect prototxt/caffenet/train_val.prototxt --data-shape data=2,3,227,227 --data-shape label=2

Each line: layer name, type, top shapes and parameter shapes; the last line is
``Total parameters: N`` (learnable parameters, shared ones counted once). ``--data-shape``
replaces the net's data layers by Input layers of the given shapes, so a train_val net can be
inspected without its data files.
"""
import argparse
import sys

from engine.errors import CaffeError


def _shape_arg(text):
    name, _, dims = text.partition("=")
    try:
        shape = tuple(int(d) for d in dims.split(",") if d.strip())
    except ValueError:
        shape = None
    if not name or not shape:
        raise argparse.ArgumentTypeError(f"expected NAME=d0,d1,..., got {text!r}")
    return name, shape


def _parser():
    ap = argparse.ArgumentParser(prog="caffe8 inspect", description="Print a net's layers, top "
                                 "shapes and parameter shapes.")
    ap.add_argument("model", help="net prototxt")
    ap.add_argument("--phase", default="TRAIN", choices=("TRAIN", "TEST"))
    ap.add_argument("--level", type=int, default=0)
    ap.add_argument("--stage", action="append", default=[], help="NetState stage (repeatable)")
    ap.add_argument("--data-shape", action="append", type=_shape_arg, default=[],
                    metavar="TOP=d0,d1,...", help="swap data layers for Input layers (repeatable)")
    return ap


def _fmt(shapes):
    return " ".join("x".join(str(d) for d in s) if s else "scalar" for s in shapes) or "-"


def describe(net):
    """Lines for ``net``: one per layer, then the parameter total."""
    rows = []
    for i, layer in enumerate(net.layers):
        tops = _fmt([b.shape for b in net.top_vecs[i]])
        params = _fmt([b.shape for b in layer.blobs])
        rows.append((layer.name, layer.type, tops, params))
    width = max((len(r[0]) for r in rows), default=4)
    lines = [f"{name:<{width}}  {typ:<16}  top {tops:<24}  params {params}"
             for name, typ, tops, params in rows]
    lines.append(f"Total parameters: {sum(b.count for b in net.learnable_params)}")
    return lines


def inspect_main(argv=None, out=None):
    """Run ``caffe8 inspect`` with ``argv``; returns the exit status (0, or 1 on a CaffeError)."""
    from caffe8.wiring import register_all
    from engine.net import Net
    from engine.net_graph import swap_data_layers
    register_all()
    from engine.prototxt import parse_file
    out = out or sys.stdout
    args = _parser().parse_args(argv)
    try:
        model = parse_file(args.model)
        if args.data_shape:
            model = swap_data_layers(model, dict(args.data_shape))
        net = Net(model, phase=args.phase, level=args.level, stages=args.stage)
    except CaffeError as e:
        print(f"caffe8 inspect: error: {e}", file=sys.stderr)
        return 1
    for line in describe(net):
        print(line, file=out)
    return 0


if __name__ == "__main__":
    sys.exit(inspect_main())
