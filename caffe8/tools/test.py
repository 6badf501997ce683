"""``caffe8 test -model M -weights W -iterations N``: Caffe's ``caffe test``: score a model,
logging each batch's outputs and their means (``engine.tester.run_test``); under ``mpiexec``
the batches are spread over the ranks."""
from caffe8.tools import _run

NAME = "test"
HELP = "score a model"
GROUP = "training"
FILES = {"model": "in", "weights": "in"}


def add_arguments(p):
    p.add_argument("--model", required=True, help="net prototxt")
    p.add_argument("--weights", required=True, help="model file to score")
    p.add_argument("--iterations", type=int, default=50)
    _run.add_state(p)
    _run.add_common(p)


def run(args):
    from caffe8.engine.tester import run_test
    world, log, model = _run.start(args)
    log(f"Copying layers from {args.weights}")
    run_test(model, args.weights, args.iterations, world, log)
    return 0
