"""``caffe8`` command line: train | test | time | inspect | bench, like Caffe's ``caffe`` tool.

Run under ``mpiexec -n P`` for data-parallel training; without mpiexec (or with one process)
caffe8 never imports mpi4py, so the single-process path works with no MPI installed.
"""
import argparse
import os
import sys

from engine.errors import CaffeError

_MPI_SIZE_VARS = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MPI_LOCALNRANKS", "PMIX_SIZE")


def launched_by_mpiexec():
    """True when a process manager started several ranks (so MPI must be initialised)."""
    for var in _MPI_SIZE_VARS:
        try:
            if int(os.environ.get(var, "1")) > 1:
                return True
        except ValueError:
            pass
    return False


def make_world():
    """The MPI world under mpiexec, else a single-process world (no mpi4py import)."""
    if not launched_by_mpiexec():
        from engine.world import SingleProcessWorld
        return SingleProcessWorld()
    from comm.mpi import get_world, install_excepthook
    world = get_world()
    install_excepthook(world)
    return world


def select_device(gpu, solver_mode, device_id, world, log):
    """One GPU per process: ``--gpu N`` (or solver_mode GPU) → device N + local rank."""
    from engine import backend
    want = gpu is not None or solver_mode == "GPU"
    if not want:
        return
    if not backend.gpu_available():
        if gpu is not None:
            raise CaffeError(f"--gpu {gpu} given but no CUDA GPU / CuPy is available")
        log("solver_mode is GPU but no CUDA GPU / CuPy is available; running on the CPU")
        return
    try:
        base = int(gpu) if gpu is not None else device_id
    except ValueError:
        raise CaffeError(f"--gpu {gpu}: give one device id; each process uses id + its local rank") from None
    local = getattr(world, "local_rank", 0)
    count = backend.cupy.cuda.runtime.getDeviceCount()
    backend.use_gpu((base + local) % count)


def _logger(args, world):
    from engine.glog import GLog
    return GLog(getattr(args, "log", None), enabled=(world.rank == 0))


def cmd_train(args):
    from caffe8.wiring import build_trainer
    from engine.prototxt import parse_file
    world = make_world()
    log = _logger(args, world)
    sp = parse_file(args.solver, "SolverParameter")
    # Caffe's tool: solver_mode GPU counts only when the file sets it (its default is GPU).
    select_device(args.gpu, sp.solver_mode if sp.has("solver_mode") else None, sp.device_id, world, log)
    if args.snapshot and args.weights:
        raise CaffeError("give either --snapshot or --weights, not both")
    timing = None
    if args.timing_log:
        from engine.timing import TimingLog
        if world.rank == 0:  # rank 0 truncates; then every rank appends its own records
            timing = TimingLog(args.timing_log, world.rank, truncate=True)
        if world.size > 1:
            world.comm.Barrier()
        if world.rank != 0:
            timing = TimingLog(args.timing_log, world.rank, truncate=False)
    _prepare_bundled_data(args.solver, sp, world, log)
    trainer = build_trainer(args.solver, world=world, log=log, timing=timing, param=sp)
    if timing is not None:
        timing.attach(trainer)
    _install_signal_handlers(trainer, log)
    log("Starting Optimization")
    progress = _progress_bar(world, trainer)
    aborting = False
    try:
        trainer.solve(resume_file=args.snapshot, weights=args.weights, progress=progress)
    except BaseException:
        # Under MPI main() ends the whole job with MPI_Abort, which kills every process at
        # once; closing first could wait on a collective with ranks that are already gone.
        aborting = world.size > 1
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


def _install_signal_handlers(trainer, log):
    """Caffe's defaults: SIGINT stops after the current iteration (with a snapshot), SIGHUP
    snapshots and goes on. The ranks agree on a request before acting, so mpiexec forwarding
    the signal to some ranks earlier than others is fine. A second SIGINT stops at once."""
    import signal
    interrupts = []

    def on_interrupt(signum, frame):
        interrupts.append(signum)
        if len(interrupts) > 1:
            raise KeyboardInterrupt
        trainer.request("stop")

    signal.signal(signal.SIGINT, on_interrupt)
    if hasattr(signal, "SIGHUP"):
        signal.signal(signal.SIGHUP, lambda signum, frame: trainer.request("snapshot"))


def _progress_bar(world, trainer):
    """A tqdm bar on rank 0 beside the log, only when stdout is a terminal."""
    if world.rank != 0 or not sys.stdout.isatty():
        return None
    from tqdm import tqdm
    return tqdm(total=trainer.param.max_iter, initial=trainer.iter, unit="iter", file=sys.stdout,
                dynamic_ncols=True, leave=False)


def _uses_digits(solver_path, solver_param):
    """True when the solver's nets read the bundled digits data (data/digits/...)."""
    from engine.prototxt import to_text
    from engine.trainer import resolve_path
    texts = [to_text(solver_param)]
    for field in ("net", "train_net"):
        if solver_param.has(field):
            path = resolve_path(getattr(solver_param, field), solver_path)
            if os.path.exists(path):
                with open(path, encoding="utf-8", errors="replace") as f:
                    texts.append(f.read())
    return any("data/digits/" in t for t in texts)


def _prepare_bundled_data(solver_path, solver_param, world, log):
    """The digits demo prepares its data on first use (no download: scikit-learn ships it).

    Rank 0 writes it while the others wait, so ranks never race on the same files.
    """
    if not _uses_digits(solver_path, solver_param):
        return
    from engine.datasets import ensure_digits
    if world.rank == 0:
        ensure_digits(log=log)
    if world.size > 1:
        world.comm.Barrier()


def cmd_test(args):
    from caffe8.wiring import register_all
    from engine.tester import run_test
    register_all()
    world = make_world()
    log = _logger(args, world)
    select_device(args.gpu, None, 0, world, log)
    run_test(args.model, args.weights, args.iterations, world, log)
    return 0


def cmd_time(args):
    from caffe8.wiring import register_all
    from engine.tester import run_time
    register_all()
    world = make_world()
    log = _logger(args, world)
    select_device(args.gpu, None, 0, world, log)
    run_time(args.model, args.iterations, log, phase=args.phase)
    return 0


def cmd_inspect(args):
    from caffe8.inspect import inspect_main
    return inspect_main(args.rest)


def cmd_bench(args):
    """``caffe8 bench ...`` = ``python scripts/allreduce_bench.py ...`` (needs the source tree)."""
    import runpy
    script = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                          "scripts", "allreduce_bench.py")
    if not os.path.exists(script):
        raise CaffeError(f"{script} not found: `caffe8 bench` runs from a source checkout "
                         "(pip install -e .)")
    sys.argv = [script, *args.rest]
    runpy.run_path(script, run_name="__main__")
    return 0


def build_parser():
    ap = argparse.ArgumentParser(prog="caffe8", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train", help="train a net from a solver prototxt")
    t.add_argument("--solver", required=True)
    t.add_argument("--snapshot", help="resume from a .solverstate.h5")
    t.add_argument("--weights", help="initialise from .caffemodel.h5 file(s), comma separated")
    t.add_argument("--log", help="also write the glog-format log to this file")
    t.add_argument("--timing-log", help="per-layer timing, JSON lines (one record per iteration per rank)")
    t.add_argument("--gpu", help="GPU id (one GPU per process: id + local rank)")
    t.set_defaults(fn=cmd_train)
    s = sub.add_parser("test", help="score a model")
    s.add_argument("--model", required=True)
    s.add_argument("--weights", required=True)
    s.add_argument("--iterations", type=int, default=50)
    s.add_argument("--log")
    s.add_argument("--gpu")
    s.set_defaults(fn=cmd_test)
    m = sub.add_parser("time", help="per-layer forward/backward timing")
    m.add_argument("--model", required=True)
    m.add_argument("--iterations", type=int, default=50)
    m.add_argument("--phase", default="TRAIN", choices=["TRAIN", "TEST"])
    m.add_argument("--log")
    m.add_argument("--gpu")
    m.set_defaults(fn=cmd_time)
    i = sub.add_parser("inspect", help="print layers, shapes and the parameter count "
                       "(MODEL [--phase TEST] [--data-shape data=N,C,H,W ...]; see -h of "
                       "python -m caffe8.inspect)", add_help=False)
    i.add_argument("rest", nargs=argparse.REMAINDER)
    i.set_defaults(fn=cmd_inspect)
    b = sub.add_parser("bench", help="allreduce micro-benchmark (run under mpiexec)")
    b.add_argument("rest", nargs=argparse.REMAINDER)
    b.set_defaults(fn=cmd_bench)
    return ap


def limit_blas_threads():
    """Under mpiexec, split the cores among the ranks of this node instead of oversubscribing
    them (OpenBLAS would start one thread per core in every rank). Must run before NumPy loads;
    the user's own settings win."""
    if not launched_by_mpiexec():
        return
    try:
        local = int(os.environ.get("MPI_LOCALNRANKS") or os.environ.get("OMPI_COMM_WORLD_LOCAL_SIZE") or 0)
    except ValueError:
        local = 0
    if local <= 0:
        return
    threads = str(max(1, (os.cpu_count() or 1) // local))
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, threads)


def main(argv=None):
    limit_blas_threads()
    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except CaffeError as e:
        return _fail(1, f"caffe8: error: {e}")
    except KeyboardInterrupt:
        return _fail(130, None)


def _fail(code, text):
    """Report a failure: one line on stderr and exit status ``code``. Under MPI one rank's
    error must end the whole job (never a hang in a collective): the first failing rank
    prints, rank-prefixed, and aborts the job; the others stay quiet (``comm.mpi.fail_job``)."""
    if launched_by_mpiexec() and "mpi4py.MPI" in sys.modules:
        from mpi4py import MPI
        if MPI.Is_initialized() and not MPI.Is_finalized():
            from comm.mpi import fail_job
            fail_job(text, code)
    if text:
        sys.stdout.flush()
        sys.stderr.write(text.rstrip("\n") + "\n")  # one write: never split by other output
        sys.stderr.flush()
    return code


if __name__ == "__main__":
    sys.exit(main())
