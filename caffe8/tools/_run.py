"""What ``caffe8 train``, ``test`` and ``time`` share: the log (glog lines on stderr, ``--log`` /
``-log_dir`` files), one device per process, ``--tf32``, Caffe's ``-level`` / ``-stage`` and the
flags that declare them."""
import os

from caffe8.engine.errors import CaffeError


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


def logger(args, world):
    """The run's GLog: stderr on rank 0, and ``--log`` (or ``-log_dir``'s
    ``caffe8.<command>.INFO``) as a file, its folder made when missing."""
    from caffe8.engine.glog import GLog
    path = getattr(args, "log", None)
    log_dir = getattr(args, "log_dir", None)
    if log_dir and not path:  # glog's -log_dir: the INFO log as a file in that folder
        path = os.path.join(log_dir, f"caffe8.{args.command}.INFO")
    if path and world.rank == 0:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    log = GLog(path, enabled=(world.rank == 0))
    from caffe8.engine import backend
    backend.set_note_sink(log)  # one-time backend notes (cuDNN fallback, TF32) go to the log
    return log


def apply_tf32(args, log):
    """``--tf32``: allow TensorFloat-32 math in float32 GEMMs and convolutions (GPU)."""
    if not getattr(args, "tf32", False):
        return
    from caffe8.engine import backend
    if not hasattr(backend, "set_tf32"):
        raise CaffeError("--tf32: this build has no TF32 switch (engine.backend.set_tf32)")
    message = backend.set_tf32(True)
    if message:
        log(message)


def net_state(args):
    """(level, stages) of Caffe's -level / -stage flags."""
    stages = []
    for item in args.stage or []:
        stages += [s for s in item.split(",") if s]  # Caffe's -stage takes a comma list
    return args.level, stages


def filtered_model(path, level, stages):
    """The model file, or its NetParameter with -level / -stage added to its NetState."""
    if not level and not stages:
        return path
    from caffe8.engine.prototxt import parse_file
    param = parse_file(path)
    param.state.level = level
    param.state.stage = list(param.state.stage) + stages
    return param


def start(args):
    """(world, log, model) of a ``test`` or ``time`` run: the layers registered, the log, the
    device, and the model file with -level / -stage applied (:func:`filtered_model`)."""
    from caffe8.wiring import make_world, register_all
    register_all()
    world = make_world()
    log = logger(args, world)
    select_device(args.gpu, None, 0, world, log)
    return world, log, filtered_model(args.model, *net_state(args))


def add_common(p, gpu_help="GPU id (one GPU per process: id + local rank), or 'all'"):
    """``--gpu``, ``--log``, ``--log-dir``."""
    p.add_argument("--gpu", help=gpu_help)
    p.add_argument("--log", help="also write the glog-format log to this file")
    p.add_argument("--log-dir", "--log_dir", dest="log_dir",
                   help="write the log to LOG_DIR/caffe8.<command>.INFO (glog's -log_dir)")


def add_state(p):
    """Caffe's ``-level`` and ``-stage``."""
    p.add_argument("--level", type=int, default=0, help="NetState level (Caffe's -level)")
    p.add_argument("--stage", action="append", default=[],
                   help="NetState stage, repeatable or comma separated (Caffe's -stage)")


def add_tf32(p):
    p.add_argument("--tf32", action="store_true",
                   help="allow TensorFloat-32 math in float32 GEMMs and convolutions (GPU)")
