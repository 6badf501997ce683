"""``caffe8 train -solver S [-weights W | -snapshot S]``: Caffe's ``caffe train``.

The run is put together by ``caffe8.wiring`` (as pycaffe's solvers are); the tool adds its
flags: -level/-stage, the device, --tf32, --timing-log, signals and the progress bar. Under
``mpiexec -n P`` the ranks train data-parallel.
"""
import sys

from caffe8.engine.errors import CaffeError
from caffe8.tools import _run
from caffe8.tools._common import watched_terminal

NAME = "train"
HELP = "train a net from a solver prototxt"
GROUP = "training"
FILES = {"solver": "in", "snapshot": "in", "weights": "in-list", "timing_log": "out"}

_EFFECTS = ("stop", "snapshot", "none")


def add_arguments(p):
    p.add_argument("--solver", required=True, help="solver prototxt")
    p.add_argument("--snapshot", help="resume from a .solverstate or .solverstate.h5; "
                   "'latest': the newest complete model + state pair of the snapshot_prefix "
                   "(the one written last), or from scratch when it holds none (a requeued "
                   "job's first start); the log says which")
    p.add_argument("--weights", help="initialise from model file(s), comma separated")
    p.add_argument("--timing-log", "--timing_log", dest="timing_log",
                   help="per-layer timing, JSON lines (one record per iteration per rank)")
    p.add_argument("--sigint-effect", "--sigint_effect", dest="sigint_effect", default="stop",
                   choices=_EFFECTS, help="what SIGINT does (default: stop, with a snapshot)")
    p.add_argument("--sighup-effect", "--sighup_effect", dest="sighup_effect",
                   default="snapshot", choices=_EFFECTS,
                   help="what SIGHUP does (default: snapshot and go on)")
    _run.add_tf32(p)
    _run.add_state(p)
    _run.add_common(p)


def run(args):
    from caffe8.wiring import build_trainer, make_world, open_timing_log, read_solver
    world = make_world()
    log = _run.logger(args, world)
    sp = read_solver(args.solver)
    level, stages = _run.net_state(args)
    if level or stages:  # Caffe's tool: -level / -stage set the train net's state
        sp.train_state.level = level
        sp.train_state.stage = list(sp.train_state.stage) + stages
    # Caffe's tool: solver_mode GPU counts only when the file sets it (its default is GPU).
    _run.select_device(args.gpu, sp.solver_mode if sp.has("solver_mode") else None,
                       sp.device_id, world, log)
    _run.apply_tf32(args, log)
    if args.snapshot and args.weights:
        raise CaffeError("give either --snapshot or --weights, not both")
    timing = open_timing_log(args.timing_log, world) if args.timing_log else None
    trainer = build_trainer(args.solver, world=world, log=log, timing=timing, param=sp)
    install_signal_handlers(trainer, log, args.sigint_effect, args.sighup_effect)
    log("Starting Optimization")
    progress = _progress_bar(world, trainer)
    aborting = False
    try:
        trainer.solve(resume_file=args.snapshot, weights=args.weights, progress=progress)
    except BaseException as e:
        # Under MPI the dispatcher ends the whole job with MPI_Abort unless every rank failed
        # alike, which kills every process at once; closing first could wait on a collective
        # with ranks that are already gone.
        aborting = world.size > 1 and not _failed_alike(e)
        raise
    finally:
        if progress is not None:
            progress.close()
        if not aborting:
            trainer.close()  # joins the prefetch and communication threads before exit
        if timing is not None:
            timing.close()
    log("Optimization Done.")
    log.close()
    return 0


def _failed_alike(error):
    """True when every rank of the MPI job failed too (``comm.mpi.failure_agreed``)."""
    if not getattr(error, "shared", True) or not isinstance(error, (CaffeError,
                                                                   KeyboardInterrupt)):
        return False
    from caffe8.comm.mpi import failure_agreed
    return failure_agreed()


def install_signal_handlers(trainer, log, sigint_effect="stop", sighup_effect="snapshot"):
    """Caffe's -sigint_effect / -sighup_effect (defaults: SIGINT stops after the current
    iteration, with a snapshot; SIGHUP snapshots and goes on; "none" ignores the signal). The
    ranks agree on a request before acting, so mpiexec forwarding the signal to some ranks
    earlier than others is fine. A second SIGINT stops at once, whatever the effect."""
    import signal
    interrupts = []

    def act(effect, name):
        if effect == "none":
            log(f"{name} received; ignored (-{name.lower()}_effect none)")
        else:
            trainer.request(effect)

    def on_interrupt(signum, frame):
        interrupts.append(signum)
        if len(interrupts) > 1:
            raise KeyboardInterrupt
        act(sigint_effect, "SIGINT")

    signal.signal(signal.SIGINT, on_interrupt)
    if hasattr(signal, "SIGHUP"):
        signal.signal(signal.SIGHUP, lambda signum, frame: act(sighup_effect, "SIGHUP"))


def _progress_bar(world, trainer):
    """A tqdm bar on rank 0 beside the log, only where a person watches stdout
    (``_common.watched_terminal``: not in a notebook's ``!caffe8 train`` cell); the log's lines
    clear it before they are written (engine.glog)."""
    if world.rank != 0 or not watched_terminal(sys.stdout):
        return None
    from tqdm import tqdm
    return tqdm(total=trainer.param.max_iter, initial=trainer.iter, unit="iter", file=sys.stdout,
                dynamic_ncols=True, leave=False)
