"""``caffe8 time -model M -iterations N``: Caffe's ``caffe time``: each layer's forward and
backward milliseconds (``engine.tester.run_time``). ``--data-shape TOP=d0,d1,...`` times a net
without its data: its data layers become Input layers of those shapes, as ``caffe8 inspect``
derives them."""
from caffe8.tools import _run

NAME = "time"
HELP = "per-layer forward/backward timing"
GROUP = "training"
FILES = {"model": "in"}


def add_arguments(p):
    from caffe8.tools.inspect import add_data_shape
    p.add_argument("--model", required=True, help="net prototxt")
    p.add_argument("--iterations", type=int, default=50)
    p.add_argument("--phase", default="TRAIN", choices=["TRAIN", "TEST"])
    add_data_shape(p, "time without the data: the data layer whose top this is becomes an "
                   "Input layer of this shape (repeatable; its label follows the batch)")
    _run.add_tf32(p)
    _run.add_state(p)
    _run.add_common(p)


def run(args):
    from caffe8.engine.tester import run_time
    _, log, model = _run.start(args)
    _run.apply_tf32(args, log)
    if args.data_shape:  # data layers become Input layers of their shapes, as inspect's
        from caffe8.engine.prototxt import parse_file
        from caffe8.tools.inspect import resolve_data_layers
        model = resolve_data_layers(parse_file(model) if isinstance(model, str) else model,
                                    dict(args.data_shape))
    run_time(model, args.iterations, log, phase=args.phase)
    return 0
