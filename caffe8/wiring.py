"""The composition root: how a training run is put together, once, for ``caffe8 train`` and for
pycaffe's solvers alike (``caffe8 test``/``time`` and pycaffe's nets use its world and registries).

``engine/`` knows only its own registries and the solver-callback seam; this module imports the
packages that register layer and solver types (and comm's registries of codecs, transports ...,
which the schema then checks against), reads the solver, prepares the bundled data, checks the
solver's ``comm`` block, and attaches the gradient exchange (``comm/``) to a trainer as a
callback, the way Caffe's tool adds its NCCL callback to a solver:

    world = make_world()
    param = read_solver(path)                       # every field checked, comm's choices too
    trainer = build_trainer(path, world, log, timing, param)

Module-level imports stay light: ``caffe8.cli`` imports this module before NumPy may load.
"""
import os

# SLURM_STEP_NUM_TASKS: srun --mpi=pmix sets no size variable of MPI's (Open MPI's ranks see
# only PMIX_RANK and Slurm's own); a batch script's step has 1
_MPI_SIZE_VARS = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MPI_LOCALNRANKS", "PMIX_SIZE",
                  "SLURM_STEP_NUM_TASKS")


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
        from caffe8.engine.world import SingleProcessWorld
        return SingleProcessWorld()
    from caffe8.comm.mpi import get_world, install_excepthook
    world = get_world()
    install_excepthook(world)
    return world


def read_solver(solver_path, solver_type=None):
    """The solver file, parsed and checked with every registry in place (layer and solver types,
    comm's codecs, transports ...). ``solver_type`` forces the algorithm (pycaffe's
    ``SGDSolver(path)``: whatever the file's ``type``)."""
    register_all()
    from caffe8.engine.prototxt import parse_file
    param = parse_file(str(solver_path), "SolverParameter")
    if solver_type is not None:
        param.clear("solver_type")
        param.type = solver_type
    return param


def open_timing_log(path, world):
    """``--timing-log``: rank 0 truncates the file, then every rank appends its own records (the
    ranks wait for rank 0 in a barrier of the world's, under its watchdog when it has one)."""
    from caffe8.engine.timing import TimingLog
    timing = TimingLog(path, world.rank, truncate=True) if world.rank == 0 else None
    world.barrier()
    return timing or TimingLog(path, world.rank, truncate=False)


def _uses_digits(solver_path, solver_param):
    """True when the solver's nets read the bundled digits data (data/digits/...)."""
    from caffe8.engine.prototxt import to_text
    from caffe8.engine.trainer import resolve_path
    texts = [to_text(solver_param)]
    for field in ("net", "train_net"):
        if solver_param.has(field):
            path = resolve_path(getattr(solver_param, field), solver_path)
            try:
                with open(path, encoding="utf-8", errors="replace") as f:
                    texts.append(f.read())
            except OSError:  # missing or unreadable: the Trainer reports it, naming the line
                pass
    return any("data/digits/" in t for t in texts)


def prepare_bundled_data(solver_path, solver_param, world, log):
    """The digits demo prepares its data on first use (no download: scikit-learn ships it).

    Rank 0 writes it while the others wait, so ranks never race on the same files.
    """
    if not _uses_digits(solver_path, solver_param):
        return
    from caffe8.engine.datasets import ensure_digits
    if world.rank == 0:
        ensure_digits(log=log)
    world.barrier()


def register_all():
    """Import every package that registers layer types and solver types, and hand comm's
    registries (codecs, transports, roundings, formats) to the schema (idempotent)."""
    import importlib
    # each layer module registers its Caffe type string, each solver module its type, and
    # comm.config hands comm's registries to the schema (engine.schema.provide_choices)
    for module in ("caffe8.layers", "caffe8.solvers", "caffe8.comm.config"):
        importlib.import_module(module)
    from caffe8 import caffe_alias
    from caffe8.layers import python_layer
    # Python layers written for pycaffe say `import caffe`: offer this package under that name
    python_layer.before_import = caffe_alias.install


def make_exchange(world, comm_param, net, log=None, timed=False):
    """The solver's ``comm`` block → the per-layer gradient exchange (a solver callback), every
    collective under the collective watchdog (``comm.stall_timeout``), the world's included.
    ``comm.async`` is honoured unless the overlap would take cores from the compute
    (``overlap_takes_cores``): then the exchange runs synchronously, and ``log`` says so.
    ``timed``: a timing log records the run (the exchange's device phases get CUDA events)."""
    from caffe8.comm.exchange import Exchange
    from caffe8.comm.watchdog import Watchdog
    if world.watchdog is None:
        world.own_watchdog(Watchdog(world.comm, comm_param.stall_timeout))
    asynchronous = getattr(comm_param, "async")
    if asynchronous:
        crowded = overlap_takes_cores(world, net)
        if crowded:
            asynchronous = False
            if log is not None and world.rank == 0:
                log(f"comm.async: the exchange runs synchronously: {crowded}")
    return Exchange(world, comm_param, net, asynchronous, timed)   # borrows the world's watchdog


#: "1": honour comm.async even where the node's ranks outnumber its cores
KEEP_ASYNC_ENV = "CAFFE8_KEEP_ASYNC"


def overlap_takes_cores(world, net):
    """Why the asynchronous exchange would slow this job down, or None. Its threads (encode,
    send, update) overlap backward on a GPU, or beside compute that leaves the host's cores
    free (EmulatedCompute, which stands in for GPU kernels); on the host with more ranks on
    the node than cores they may use, every thread takes a core from the backward pass
    (BVLC's LeNet on Fashion-MNIST, 4 ranks on 2 cores: 31 s per 1,000 iterations
    asynchronous, 21.5 s synchronous)."""
    import numpy
    from caffe8.engine import backend, cpu_share
    if os.environ.get(KEEP_ASYNC_ENV, "") not in ("", "0") or \
            backend.get_array_module(net.flat_diff) is not numpy or \
            any(layer.type == "EmulatedCompute" for layer in net.layers):
        return None
    ranks, cores = getattr(world, "local_size", 1), cpu_share.usable_cores()
    if ranks <= cores:
        return None
    return (f"{ranks} processes on this node share {cores} core{'s' if cores != 1 else ''}, "
            f"so overlap threads would take them from the backward pass")


def build_trainer(solver_path, world=None, log=None, timing=None, param=None):
    """A ``engine.trainer.Trainer`` for ``solver_path``, put together as every run is (the CLI's
    and pycaffe's): the ``comm`` block checked on every rank before any collective (single-
    process runs too), the bundled data prepared, the exchange attached when the world has more
    than one process, ``timing`` (``open_timing_log``) hooked in, and with a ``log`` the lines
    that name the exchange built. ``param``: the solver already read (``read_solver``)."""
    from caffe8.comm.config import validate_comm
    from caffe8.engine.trainer import Trainer
    from caffe8.engine.world import SingleProcessWorld
    world = world or SingleProcessWorld()
    param = param if param is not None else read_solver(solver_path)
    validate_comm(param.comm, world.size)
    prepare_bundled_data(str(solver_path), param, world, log)
    trainer = Trainer(solver_path, world=world, log=log, param=param)
    try:
        exchange = _attach_exchange(trainer, log, timing is not None) \
            if trainer.world.size > 1 else None
        if timing is not None:
            timing.attach(trainer)
        if log is not None:
            log(exchange_summary(exchange, param.comm, trainer.world))
    except BaseException:
        trainer.close()
        raise
    return trainer


def _attach_exchange(trainer, log, timed):
    exchange = make_exchange(trainer.world, trainer.param.comm, trainer.net, log, timed)
    trainer.add_callback(exchange)      # it takes the trainer's pipelined update (pipeline)
    if log is not None:
        for line in exchange.shared_memory_summary():
            log(f"Wire buffers, {line}")
    return exchange


def _node_count(world, processes_per_node):
    """Nodes of the job: emulated ones when ``processes_per_node`` is set, else the distinct
    host names (collective: every rank calls it)."""
    if processes_per_node > 0:
        return max(1, world.size // processes_per_node)
    comm = getattr(world, "comm", None)
    if comm is None:
        return 1
    import socket
    return len(set(comm.allgather(socket.gethostname())))


def exchange_summary(exchange, comm_param, world):
    """One log line naming the gradient exchange that was built (``exchange``; None for one
    process): its codec with the settings it was made with (``codec.details()``), the transport
    constructed for that codec, processes, nodes and mode, e.g. ``Gradient exchange: fp8
    (ratio, q=0.95), hierarchical, 4 processes on 2 nodes, asynchronous``. Collective under MPI
    (the node count): every rank calls it.
    """
    if exchange is None:
        return "Gradient exchange: none (1 process)"
    codec = exchange.codec
    transport = next(t for t in exchange.transports.values() if t.reduction == codec.reduction)
    details = codec.details()
    if exchange.warmup_fp32_iters > 0 and codec.name != "fp32":
        details.append(f"fp32 for the first {exchange.warmup_fp32_iters} iterations")
    name = f"{codec.name} ({', '.join(details)})" if details else codec.name
    nodes = _node_count(world, comm_param.processes_per_node)
    mode = "asynchronous" if exchange.asynchronous else "synchronous"
    return (f"Gradient exchange: {name}, {transport.name}, {world.size} processes on {nodes} "
            f"node{'s' if nodes != 1 else ''}, {mode}")
