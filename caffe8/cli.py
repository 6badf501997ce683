"""``caffe8`` command line, as Caffe's tool: train | test | time | device_query | inspect | convert | bench.

Caffe's own spellings work as well as the ``--long`` ones: ``caffe8 train -solver S -weights W
-gpu 0``, ``caffe8 time -model M -iterations 10``, ``-flag=value``. Run under ``mpiexec -n P``
for data-parallel training; without mpiexec (or with one process) caffe8 never imports mpi4py,
so the single-process path works with no MPI installed.
"""
import argparse
import os
import sys

from caffe8.engine.errors import CaffeError, relative_to_cwd
from caffe8.wiring import launched_by_mpiexec, make_world


def select_device(gpu, solver_mode, device_id, world, log):
    """One GPU per process: ``--gpu N`` (or solver_mode GPU) → device N + local rank."""
    from caffe8.engine import backend, blas
    want = gpu is not None or solver_mode == "GPU"
    if not want or not backend.gpu_available():
        if want and gpu is not None:
            from caffe8.device import no_gpu_message
            raise CaffeError(no_gpu_message(f"--gpu {gpu}"))
        if want:
            from caffe8.device import note_solver_mode
            note_solver_mode(solver_mode, log)
        log(blas.describe())
        return
    gpu_all = gpu == "all"
    if gpu_all:  # Caffe's -gpu all: every GPU of the node, one per process
        gpu = "0"
    try:
        base = int(gpu) if gpu is not None else device_id
    except ValueError:
        raise CaffeError(f"--gpu {gpu}: give one device id or 'all'; each process uses id + its "
                         "local rank") from None
    local = getattr(world, "local_rank", 0)
    count = backend.cupy.cuda.runtime.getDeviceCount()
    if gpu_all and world.size == 1 and count > 1:
        log(f"-gpu all: caffe8 drives one GPU per process; run under mpiexec -n {count} to use "
            f"all {count} GPUs")
    backend.use_gpu((base + local) % count)


def _logger(args, world):
    from caffe8.engine.glog import GLog
    path = getattr(args, "log", None)
    log_dir = getattr(args, "log_dir", None)
    if log_dir and not path:  # glog's -log_dir: the INFO log as a file in that folder
        os.makedirs(log_dir, exist_ok=True)
        path = os.path.join(log_dir, f"caffe8.{args.command}.INFO")
    if path and world.rank == 0:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    log = GLog(path, enabled=(world.rank == 0))
    from caffe8.engine import backend
    backend.set_note_sink(log)  # one-time backend notes (cuDNN fallback, TF32) go to the log
    return log


def _apply_tf32(args, log):
    """``--tf32``: allow TensorFloat-32 math in float32 GEMMs and convolutions (GPU)."""
    if not getattr(args, "tf32", False):
        return
    from caffe8.engine import backend
    if not hasattr(backend, "set_tf32"):
        raise CaffeError("--tf32: this build has no TF32 switch (engine.backend.set_tf32)")
    message = backend.set_tf32(True)
    if message:
        log(message)


# --- file arguments, checked before any work -------------------------------------------------
#: per command: argument dest -> "in" (a file to read), "in-list" (comma-separated files to
#: read), "out" (a file to write), "log" (a file to write, its folder created when missing, as
#: -log_dir's), "dir" (a folder to write into, created when missing)
_FILE_ARGS = {"train": {"solver": "in", "snapshot": "in", "weights": "in-list",
                        "timing_log": "out"},
              "test": {"model": "in", "weights": "in"},
              "time": {"model": "in"},
              "inspect": {"model": "in"},
              "convert": {"src": "in", "dst": "out"}}
_LOG_ARGS = {"log": "log", "log_dir": "dir"}


def _flag(dest):
    return dest if dest in ("src", "dst") else "--" + dest.replace("_", "-")


def _check_readable(flag, path):
    if os.path.isdir(path):
        raise CaffeError(f"{flag} {path}: is a directory, not a file")
    try:
        with open(path, "rb"):
            pass
    except OSError as e:
        raise CaffeError(f"{flag} {path}: cannot be read: {e.strerror}{relative_to_cwd(path)}") \
            from None


def _check_writable(flag, path, folder, make_folder=False):
    """``path`` can be written as a file (``folder`` False) or used as a folder (True): it is
    not the other kind, nothing on the way to it is a file, and (for a file) its folder exists
    or (``make_folder``) can be made."""
    if os.path.exists(path) and os.path.isdir(path) != folder:
        kind = "a directory, not a file" if not folder else "a file, not a directory"
        raise CaffeError(f"{flag} {path}: is {kind}")
    parent = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(parent):
        if not folder and not make_folder:
            raise CaffeError(f"{flag} {path}: folder {os.path.dirname(path) or '.'} does not "
                             "exist")
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise CaffeError(f"{flag} {path}: {parent} is a file, not a directory")


def check_file_arguments(args):
    """Every file argument of ``args`` checked up front, each failure one line naming the flag:
    inputs exist, are files and can be read; outputs are not folders and their folder exists."""
    table = dict(_FILE_ARGS.get(getattr(args, "command", None), {}), **_LOG_ARGS)
    for dest, kind in table.items():
        value = getattr(args, dest, None)
        if value is None or (dest == "snapshot" and value == "latest"):
            continue
        flag = _flag(dest)
        if kind == "in-list":
            parts = str(value).split(",")
            if not all(parts):
                raise CaffeError(f"{flag} {value}: empty file name in the comma-separated list")
            for part in parts:
                _check_readable(flag, part)
        elif kind == "in":
            _check_readable(flag, str(value))
        else:
            _check_writable(flag, str(value), folder=kind == "dir", make_folder=kind == "log")


def _net_state(args):
    """(level, stages) of Caffe's -level / -stage flags."""
    stages = []
    for item in args.stage or []:
        stages += [s for s in item.split(",") if s]  # Caffe's -stage takes a comma list
    return args.level, stages


def cmd_train(args):
    """The run is put together by ``caffe8.wiring`` (as pycaffe's solvers are); the tool adds
    its flags: -level/-stage, the device, --tf32, --timing-log, signals and the progress bar."""
    from caffe8.wiring import build_trainer, open_timing_log, read_solver
    world = make_world()
    log = _logger(args, world)
    sp = read_solver(args.solver)
    level, stages = _net_state(args)
    if level or stages:  # Caffe's tool: -level / -stage set the train net's state
        sp.train_state.level = level
        sp.train_state.stage = list(sp.train_state.stage) + stages
    # Caffe's tool: solver_mode GPU counts only when the file sets it (its default is GPU).
    select_device(args.gpu, sp.solver_mode if sp.has("solver_mode") else None, sp.device_id, world, log)
    _apply_tf32(args, log)
    if args.snapshot and args.weights:
        raise CaffeError("give either --snapshot or --weights, not both")
    timing = open_timing_log(args.timing_log, world) if args.timing_log else None
    trainer = build_trainer(args.solver, world=world, log=log, timing=timing, param=sp)
    _install_signal_handlers(trainer, log, args.sigint_effect, args.sighup_effect)
    log("Starting Optimization")
    progress = _progress_bar(world, trainer)
    aborting = False
    try:
        trainer.solve(resume_file=args.snapshot, weights=args.weights, progress=progress)
    except BaseException as e:
        # Under MPI main() ends the whole job with MPI_Abort unless every rank failed alike,
        # which kills every process at once; closing first could wait on a collective with
        # ranks that are already gone.
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


def _install_signal_handlers(trainer, log, sigint_effect="stop", sighup_effect="snapshot"):
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
    """A tqdm bar on rank 0 beside the log, only when stdout is a terminal."""
    if world.rank != 0 or not sys.stdout.isatty():
        return None
    from tqdm import tqdm
    return tqdm(total=trainer.param.max_iter, initial=trainer.iter, unit="iter", file=sys.stdout,
                dynamic_ncols=True, leave=False)


def cmd_test(args):
    from caffe8.wiring import register_all
    from caffe8.engine.tester import run_test
    register_all()
    world = make_world()
    log = _logger(args, world)
    select_device(args.gpu, None, 0, world, log)
    level, stages = _net_state(args)
    log(f"Copying layers from {args.weights}")
    run_test(_filtered_model(args.model, level, stages), args.weights, args.iterations, world, log)
    return 0


def _filtered_model(path, level, stages):
    """The model file, or its NetParameter with -level / -stage added to its NetState."""
    if not level and not stages:
        return path
    from caffe8.engine.prototxt import parse_file
    param = parse_file(path)
    param.state.level = level
    param.state.stage = list(param.state.stage) + stages
    return param


def cmd_time(args):
    from caffe8.wiring import register_all
    from caffe8.engine.tester import run_time
    register_all()
    world = make_world()
    log = _logger(args, world)
    select_device(args.gpu, None, 0, world, log)
    _apply_tf32(args, log)
    level, stages = _net_state(args)
    model = _filtered_model(args.model, level, stages)
    if args.data_shape:  # data layers become Input layers of their shapes, as inspect's
        from caffe8.engine.prototxt import parse_file
        from caffe8.inspect import resolve_data_layers
        model = resolve_data_layers(parse_file(model) if isinstance(model, str) else model,
                                    dict(args.data_shape))
    run_time(model, args.iterations, log, phase=args.phase)
    return 0


def cmd_device_query(args):
    """Caffe's ``device_query``: the properties of the GPU(s) given by -gpu (all by default)."""
    from caffe8.device import device_query
    for line in device_query(args.gpu):
        print(line)
    return 0


def cmd_inspect(args):
    from caffe8.inspect import run_inspect
    return run_inspect(args)


def cmd_convert(args):
    """``caffe8 convert SRC DST``: a model between Caffe's binary proto and HDF5 layouts."""
    from caffe8.engine.model_io import convert
    convert(args.src, args.dst)
    print(f"wrote {args.dst}")
    return 0


def cmd_bench(args):
    """``caffe8 bench ...``: the allreduce micro-benchmark (``caffe8.comm.bench``) under mpiexec;
    CSVs and a PNG into ``--out`` (default a new folder under runs/)."""
    from caffe8.comm import bench
    p = bench.add_arguments(argparse.ArgumentParser(
        prog="caffe8 bench", description=bench.__doc__.split("\n\n")[0].replace("\n", " ")))
    opts = p.parse_args(args.rest)
    world = make_world()
    rows, detail = bench.run(opts, world, log=lambda line: print(line, flush=True))
    if world.rank == 0:
        out = opts.out or bench.default_out()
        csv_path, detail_path = bench.write_csvs(out, rows, detail)
        png = os.path.join(out, bench.STEM + ".png")
        _plot_bench(rows, png)
        print("\n".join(bench.ratio_lines(rows, detail)))
        print(f"wrote {csv_path}, {detail_path} and {png}")
    return 0


def _plot_bench(rows, path):
    """Allreduce time vs elements, one line per codec (log-log)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 4))
    labels = {"fp32": "float (MPI_SUM)", "fp16": "half (op)", "fp8": "fp8 (op)"}
    for codec in dict.fromkeys(r["codec"] for r in rows):
        pts = [(r["elements"], r["median_seconds"]) for r in rows if r["codec"] == codec]
        ax.plot(*zip(*pts), marker="o", label=labels.get(codec, codec))
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("elements")
    ax.set_ylabel("allreduce time [s] (median)")
    ax.set_title(f"allreduce, {rows[0]['processes']} processes")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


_EFFECTS = ("stop", "snapshot", "none")


def _add_common(p, gpu_help="GPU id (one GPU per process: id + local rank), or 'all'"):
    p.add_argument("--gpu", help=gpu_help)
    p.add_argument("--log", help="also write the glog-format log to this file")
    p.add_argument("--log-dir", "--log_dir", dest="log_dir",
                   help="write the log to LOG_DIR/caffe8.<command>.INFO (glog's -log_dir)")


def _add_state(p):
    p.add_argument("--level", type=int, default=0, help="NetState level (Caffe's -level)")
    p.add_argument("--stage", action="append", default=[],
                   help="NetState stage, repeatable or comma separated (Caffe's -stage)")


def build_parser():
    ap = argparse.ArgumentParser(prog="caffe8", description=__doc__.splitlines()[0],
                                 epilog="Flags may be spelled as in Caffe: -solver, -weights, "
                                 "-model, -iterations, -gpu, -sigint_effect ...")
    from caffe8 import __version__
    ap.add_argument("--version", "-version", action="version", version=f"caffe8 {__version__}")
    sub = ap.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train", help="train a net from a solver prototxt")
    t.add_argument("--solver", required=True, help="solver prototxt")
    t.add_argument("--snapshot", help="resume from a .solverstate or .solverstate.h5; "
                   "'latest': the newest complete model + state pair of the snapshot_prefix")
    t.add_argument("--weights", help="initialise from model file(s), comma separated")
    t.add_argument("--timing-log", "--timing_log", dest="timing_log",
                   help="per-layer timing, JSON lines (one record per iteration per rank)")
    t.add_argument("--sigint-effect", "--sigint_effect", dest="sigint_effect", default="stop",
                   choices=_EFFECTS, help="what SIGINT does (default: stop, with a snapshot)")
    t.add_argument("--sighup-effect", "--sighup_effect", dest="sighup_effect",
                   default="snapshot", choices=_EFFECTS,
                   help="what SIGHUP does (default: snapshot and go on)")
    t.add_argument("--tf32", action="store_true",
                   help="allow TensorFloat-32 math in float32 GEMMs and convolutions (GPU)")
    _add_state(t)
    _add_common(t)
    t.set_defaults(fn=cmd_train)
    s = sub.add_parser("test", help="score a model")
    s.add_argument("--model", required=True, help="net prototxt")
    s.add_argument("--weights", required=True, help="model file to score")
    s.add_argument("--iterations", type=int, default=50)
    _add_state(s)
    _add_common(s)
    s.set_defaults(fn=cmd_test)
    m = sub.add_parser("time", help="per-layer forward/backward timing")
    m.add_argument("--model", required=True, help="net prototxt")
    m.add_argument("--iterations", type=int, default=50)
    m.add_argument("--phase", default="TRAIN", choices=["TRAIN", "TEST"])
    from caffe8.inspect import _shape_arg
    m.add_argument("--data-shape", "--data_shape", dest="data_shape", action="append",
                   type=_shape_arg, default=[], metavar="TOP=d0,d1,...",
                   help="time without the data: the data layer whose top this is becomes an "
                   "Input layer of this shape (repeatable; its label follows the batch)")
    m.add_argument("--tf32", action="store_true",
                   help="allow TensorFloat-32 math in float32 GEMMs and convolutions (GPU)")
    _add_state(m)
    _add_common(m)
    m.set_defaults(fn=cmd_time)
    q = sub.add_parser("device_query",
                       help="show the GPU(s) properties (Caffe's device_query)")
    q.add_argument("--gpu", help="device id(s), comma separated, or 'all' (default)")
    q.set_defaults(fn=cmd_device_query)
    from caffe8.inspect import add_arguments
    i = sub.add_parser("inspect", help="print layers, shapes and the parameter count")
    add_arguments(i)
    i.set_defaults(fn=cmd_inspect)
    c = sub.add_parser("convert", help="convert a model between binary .caffemodel and HDF5 "
                       "(.caffemodel.h5), chosen by the file names")
    c.add_argument("src", help="model to read (.caffemodel or .h5)")
    c.add_argument("dst", help="model to write (.caffemodel or .h5)")
    c.set_defaults(fn=cmd_convert)
    b = sub.add_parser("bench", help="allreduce micro-benchmark (run under mpiexec; "
                       "caffe8 bench --help lists its options)", add_help=False)
    b.add_argument("rest", nargs=argparse.REMAINDER)
    b.set_defaults(fn=cmd_bench)
    from caffe8.tools import add_subcommands
    add_subcommands(sub)  # Caffe's tools: convert_imageset, compute_image_mean, ...
    return ap


def _long_options(parser):
    """Every ``--name`` option of the parser and its subcommands, without the dashes."""
    names = set()
    for action in parser._actions:
        names.update(o[2:] for o in action.option_strings if o.startswith("--"))
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                names |= _long_options(sub)
    return names


def translate_caffe_flags(argv, parser=None):
    """Caffe's gflags spellings → argparse's: ``-solver x`` / ``-solver=x`` → ``--solver``.

    Only names of known long options are translated (``-h`` and negative numbers stay).
    Arguments after ``bench`` go to the benchmark script unchanged.
    """
    names = _long_options(parser or build_parser())
    out = []
    for k, arg in enumerate(argv):
        if arg == "bench" and not any(a.startswith("-") for a in argv[:k]):
            return out + list(argv[k:])
        if arg.startswith("-") and not arg.startswith("--"):
            name = arg[1:].split("=", 1)[0]
            if name in names:
                arg = "-" + arg
        out.append(arg)
    return out


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
    from caffe8.engine.cpu_share import usable_cores  # stdlib only: NumPy is not loaded yet
    threads = str(max(1, usable_cores() // local))
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, threads)


def main(argv=None):
    from caffe8.engine.message import freeze_after_builds
    limit_blas_threads()
    freeze_after_builds()  # one run, then exit: its nets are never collected (message.py)
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["bench"]:  # everything after it, --help included, is the script's
        args = argparse.Namespace(command="bench", rest=argv[1:], fn=cmd_bench)
    else:
        with _only_rank0_prints():  # usage and argparse's error: once per job, not per rank
            args = parser.parse_args(translate_caffe_flags(argv, parser))
    try:
        check_file_arguments(args)
        return args.fn(args)
    except CaffeError as e:
        return _fail(1, f"caffe8: error: {e}", agree=getattr(e, "shared", True))
    except KeyboardInterrupt:
        return _fail(130, None)


def _launch_rank():
    """This process's rank as the process manager tells it (before MPI is initialised)."""
    for var in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return 0


def _only_rank0_prints():
    """Under mpiexec, ranks other than 0 write nothing inside the block (before MPI is
    initialised every rank meets the same argument error; rank 0 reports it)."""
    import contextlib
    import io
    if not launched_by_mpiexec() or _launch_rank() == 0:
        return contextlib.nullcontext()
    stack = contextlib.ExitStack()
    stack.enter_context(contextlib.redirect_stdout(io.StringIO()))
    stack.enter_context(contextlib.redirect_stderr(io.StringIO()))
    return stack


def _mpi_running():
    if not launched_by_mpiexec() or "mpi4py.MPI" not in sys.modules:
        return False
    from mpi4py import MPI
    return MPI.Is_initialized() and not MPI.Is_finalized()


def _fail(code, text, agree=True):
    """Report a failure: one line on stderr and exit status ``code``.

    Under MPI one rank's error must end the whole job (never a hang in a collective):
    ``comm.mpi.fail_job`` returns when every rank failed alike (the job then ends cleanly,
    rank 0 printing, nothing left behind by MPI_Abort), else the first failing rank prints,
    rank-prefixed, and aborts the job. Before MPI is initialised every rank meets the same
    error: rank 0 prints it, the others exit quietly with the same status."""
    if _mpi_running():
        from caffe8.comm.mpi import fail_job
        fail_job(text, code, agree=agree)
        return code
    if launched_by_mpiexec() and _launch_rank() != 0:
        return code
    if text:
        sys.stdout.flush()
        sys.stderr.write(text.rstrip("\n") + "\n")  # one write: never split by other output
        sys.stderr.flush()
    return code


if __name__ == "__main__":
    sys.exit(main())
