"""Lazy MPI initialisation, the world object, node communicators and whole-job abort.

Nothing here imports ``mpi4py.MPI`` at module import time: the engine's single-process path must
work with no MPI installed, and the settings below only take effect if they are in place *before*
``MPI_Init_thread`` runs, which is when ``mpi4py.MPI`` is first imported.

Settings applied by :func:`apply_settings`, each only when the user's environment does not set
it already, so ``VAR=... mpiexec ...`` always wins (docs/MPI.md has the measurements):

``mpi4py.rc.thread_level = "serialized"`` (unless ``MPI4PY_RC_THREAD_LEVEL`` is set)
    mpi4py asks for MPI_THREAD_MULTIPLE by default, and MPICH then takes a global lock on every
    call and gives up its shared-memory ("release/gather") collective path. caffe8 lets exactly
    one thread (the communication thread, or the main thread when synchronous) call MPI at a
    time, which is SERIALIZED.

``MPIR_CVAR_CH4_CMA_ENABLE=1`` (only where Yama's ptrace_scope is absent or 0)
    Large intra-node messages then take the single-copy cross-memory-attach path instead of
    two copies through 8 KiB shared-memory cells. Measured on 2 ranks: turning it off makes the
    explicit fp8 sum of 64 M elements 3-8x and the float32 one 5x slower. MPICH's documentation
    calls it off by default (builds differ; the pip wheel's is on), and it needs ptrace
    permission between sibling processes, hence the guard.

``MPIR_CVAR_ALLREDUCE_DEVICE_COLLECTIVE=0``
    After 5 collectives on a communicator MPICH switches MPI_Allreduce to its shared-memory
    "release_gather" algorithm, which streams the vector through 8 KiB cells with a handshake
    per cell: fine on an idle machine, but every handshake waits for both ranks to be running,
    and on shared cores that made a 64 M float32 MPI_SUM allreduce 2.1 s instead of 0.49 s
    (16 M: 0.50 s vs 0.15 s; fp8 flat 16 M: 0.24 s vs 0.023 s; 1 K elements unchanged).
    This only concerns MPI_Allreduce (the "flat" algorithm, the float32 baseline, the fp8 scale's
    MAX); caffe8's own schedules use Alltoallv/Allgather.

``MPIR_CVAR_POSIX_POLL_FREQUENCY=50``
    A rank waiting in a collective spins on shared memory and yields the core only every
    1000 polls by default. With more ranks than cores (tests run 6 ranks on 2 cores, and
    colleagues' jobs share them) the spinning rank starves the one it waits for; yielding
    after 50 polls costs nothing when each rank has its own core (nothing else is runnable).

Not set on purpose: ``MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM``. For MPI_SUM on float32 MPICH's
automatic choice was within noise of forcing ``reduce_scatter_allgather``, and for *user-defined*
ops forcing it changed nothing measurable (MPICH reduces user ops with recursive
doubling, the op running on the whole vector at every step), which is why comm/allreduce.py
schedules reduce-scatter + allgather itself. The benchmark still times MPICH's own
Reduce_scatter_block + Allgather for every format.
"""
import os
import pickle
import sys
import tempfile
import threading
import time
import traceback

import numpy

from caffe8.engine.errors import CaffeError

# Variable name -> value; applied only where the environment does not set it (the user wins).
MPICH_SETTINGS = {
    "MPIR_CVAR_ALLREDUCE_DEVICE_COLLECTIVE": "0",
    "MPIR_CVAR_POSIX_POLL_FREQUENCY": "50",
}
PTRACE_SCOPE = "/proc/sys/kernel/yama/ptrace_scope"
THREAD_LEVEL = "serialized"

_world = None


def apply_settings():
    """Put the MPICH variables and the mpi4py thread level in place; returns what was set.

    Must run before ``mpi4py.MPI`` is imported; afterwards it has no effect on MPI (and says so
    by returning an empty dict).
    """
    if "mpi4py.MPI" in sys.modules:
        return {}
    applied = {}
    settings = dict(MPICH_SETTINGS)
    if _cma_permitted():
        settings["MPIR_CVAR_CH4_CMA_ENABLE"] = "1"
    for name, value in settings.items():
        if name not in os.environ:
            os.environ[name] = value
            applied[name] = value
    import mpi4py
    if "MPI4PY_RC_THREAD_LEVEL" not in os.environ:
        mpi4py.rc.thread_level = THREAD_LEVEL
        applied["mpi4py.rc.thread_level"] = THREAD_LEVEL
    return applied


def _cma_permitted():
    """Cross-memory attach between sibling processes works: no Yama, or ptrace_scope 0."""
    try:
        with open(PTRACE_SCOPE) as f:
            return f.read().strip() == "0"
    except OSError:
        return True


def mpi_module():
    """``mpi4py.MPI`` after :func:`apply_settings`, or None when mpi4py is not installed."""
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return None
    apply_settings()
    from mpi4py import MPI
    return MPI


class World:
    """The job: ``rank``, ``size``, ``comm`` (an mpi4py communicator, or None when single).

    ``watchdog``: the world's comm.watchdog.Watchdog, handed over by the wiring of a training
    run (:meth:`own_watchdog`); the world owns it, the exchange and its transports borrow it.
    The array collectives of the training loop complete through it, so a stalled rank is named
    there too rather than hanging the others.
    """

    watchdog = None

    def own_watchdog(self, watchdog):
        """Take ``watchdog`` as this world's (a previous one is freed); returns it."""
        if self.watchdog is not None and self.watchdog is not watchdog:
            self.watchdog.free()
        self.watchdog = watchdog
        return watchdog

    def __init__(self, comm=None):
        self.comm = comm
        self.rank = comm.Get_rank() if comm is not None else 0
        self.size = comm.Get_size() if comm is not None else 1
        self.local_rank, self.local_size = self._node_place()

    def _node_place(self):
        """(rank among the processes of this node, their number): one GPU per local rank, and
        the cores the node's ranks share."""
        if self.comm is None:
            return 0, 1
        node = self.comm.Split_type(mpi_module().COMM_TYPE_SHARED)  # collective, all ranks
        try:
            return node.Get_rank(), node.Get_size()
        finally:
            node.Free()

    @property
    def is_mpi(self):
        return self.comm is not None

    def _wait(self, request):
        if self.watchdog is not None:
            self.watchdog.wait(request)
        else:
            request.Wait()

    def barrier(self):
        if self.comm is not None:
            self._wait(self.comm.Ibarrier())

    # The collectives of the training loop (the protocol of ``engine.world``). Python objects
    # travel pickled, as mpi4py's lower-case calls send them, but through the nonblocking
    # forms (a length, then the bytes) so that they too complete under the watchdog: a rank
    # that stays away from a snapshot's bcast or gather is named instead of hanging the others.
    def bcast(self, obj, root=0):
        if self.comm is None:
            return obj
        data = pickle.dumps(obj, pickle.HIGHEST_PROTOCOL) if self.rank == root else b""
        length = numpy.array([len(data)], numpy.int64)
        self._wait(self.comm.Ibcast(length, root=root))
        buf = numpy.frombuffer(data, numpy.uint8).copy() if self.rank == root else \
            numpy.empty(int(length[0]), numpy.uint8)
        self._wait(self.comm.Ibcast(buf, root=root))
        return obj if self.rank == root else pickle.loads(buf.tobytes())

    def gather(self, obj, root=0):
        """``[obj of rank 0, obj of rank 1, ...]`` on ``root``, None elsewhere."""
        if self.comm is None:
            return [obj]
        data = numpy.frombuffer(pickle.dumps(obj, pickle.HIGHEST_PROTOCOL), numpy.uint8)
        lengths = numpy.zeros(self.size, numpy.int64) if self.rank == root else None
        self._wait(self.comm.Igather(numpy.array([data.size], numpy.int64), lengths, root=root))
        if self.rank != root:
            self._wait(self.comm.Igatherv(data, None, root=root))
            return None
        offsets = numpy.concatenate(([0], numpy.cumsum(lengths)[:-1]))
        recv = numpy.empty(int(lengths.sum()), numpy.uint8)
        self._wait(self.comm.Igatherv(data, [recv, (lengths.tolist(), offsets.tolist())],
                                      root=root))
        return [pickle.loads(recv[o:o + n].tobytes()) for o, n in zip(offsets, lengths)]

    def allgather_bytes(self, data):
        """Every rank's ``data`` (bytes of one common length) in rank order, under the watchdog."""
        if self.comm is None:
            return [data]
        send = numpy.frombuffer(data, numpy.uint8)
        recv = numpy.empty(send.size * self.size, numpy.uint8)
        self._wait(self.comm.Iallgather(send, recv))
        return [recv[i * send.size:(i + 1) * send.size].tobytes() for i in range(self.size)]

    def bcast_array(self, array, root=0):
        if self.comm is not None:
            self._wait(self.comm.Ibcast(array, root=root))

    def allreduce_sum_array(self, array):
        if self.comm is not None:
            self._wait(self.comm.Iallreduce(mpi_module().IN_PLACE, array, op=mpi_module().SUM))

    def allreduce_or(self, value):
        if self.comm is None:
            return int(value)
        buf = numpy.array([int(value)], numpy.int64)
        self._wait(self.comm.Iallreduce(mpi_module().IN_PLACE, buf, op=mpi_module().BOR))
        return int(buf[0])

    def abort(self, code=1):
        """End every rank of the job (MPI_Abort), or this process when single."""
        if self.comm is not None:
            self.comm.Abort(code)
        os._exit(code)

    def __repr__(self):
        return f"World(rank={self.rank}, size={self.size}, mpi={self.is_mpi})"


def get_world():
    """The process-wide :class:`World`; a trivial one-process world when mpi4py is absent."""
    global _world
    if _world is None:
        MPI = mpi_module()
        _world = World(MPI.COMM_WORLD if MPI is not None else None)
    return _world


def thread_level_name():
    """The thread level MPI actually provided ("single" ... "multiple"), or None without MPI."""
    MPI = mpi_module()
    if MPI is None or not MPI.Is_initialized():
        return None
    names = {MPI.THREAD_SINGLE: "single", MPI.THREAD_FUNNELED: "funneled",
             MPI.THREAD_SERIALIZED: "serialized", MPI.THREAD_MULTIPLE: "multiple"}
    return names[MPI.Query_thread()]


def node_comms(comm, processes_per_node=0):
    """(intra, inter) communicators of the hierarchical sum.

    ``intra`` holds the processes of one node, ordered by world rank; ``inter`` holds the
    processes with the same local index across nodes, ordered by node. ``processes_per_node``
    0 asks MPI which processes share memory (``Split_type(COMM_TYPE_SHARED)``); N > 0 emulates
    nodes of N consecutive ranks (node = rank // N), so several nodes fit on one machine.
    Every node must hold the same number of processes, else the sum's 1/P' pieces would not
    line up; that raises a CaffeError on every rank (the check is collective-free or agreed).
    """
    MPI = mpi_module()
    rank, size = comm.Get_rank(), comm.Get_size()
    if processes_per_node == 0:
        intra = comm.Split_type(MPI.COMM_TYPE_SHARED, key=rank)
    else:
        if size % processes_per_node != 0:
            raise CaffeError(
                f"comm.processes_per_node: {size} processes do not divide evenly into nodes of "
                f"{processes_per_node}")
        intra = comm.Split(rank // processes_per_node, rank)
    local_sizes = comm.allgather(intra.Get_size())
    if len(set(local_sizes)) != 1:
        intra.Free()
        raise CaffeError(
            f"comm.processes_per_node: nodes hold different numbers of processes {local_sizes}; "
            "set processes_per_node to emulate equal nodes")
    node = comm.allgather(rank if intra.Get_rank() == 0 else -1)
    node_id = sorted(r for r in node if r >= 0).index(intra.bcast(rank, root=0))
    inter = comm.Split(intra.Get_rank(), node_id)
    return intra, inter


# --- one error line per job -----------------------------------------------------------------
#: how long a rank that failed second waits to be ended by the first one's MPI_Abort before
#: aborting by itself (the first may have been killed between its claim and its abort)
LOSER_WAIT_S = 10.0
_CLAIM_PREFIX = "caffe8-fail-"


def _process_start(pid):
    """Start time of process ``pid`` (clock ticks since boot, Linux), or None when unknown."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]  # field 22, counted after "comm"
    except (OSError, IndexError):
        return None


def _claim_path(parent=None):
    """The claim file of this job on this node: named after the process manager's proxy that
    started the ranks (their common parent) and its start time, so a reused PID never matches."""
    parent = os.getppid() if parent is None else parent
    return os.path.join(tempfile.gettempdir(),
                        f"{_CLAIM_PREFIX}{parent}-{_process_start(parent) or 0}")


def _remove_stale_claims():
    """Remove the claim files of jobs whose process manager proxy is gone."""
    for name in os.listdir(tempfile.gettempdir()):
        if not name.startswith(_CLAIM_PREFIX):
            continue
        try:
            pid, start = name[len(_CLAIM_PREFIX):].split("-")
            alive = (_process_start(int(pid)) or "0") == start
        except ValueError:
            continue
        if not alive:
            try:
                os.remove(os.path.join(tempfile.gettempdir(), name))
            except OSError:
                pass


def claim_first_failure():
    """True for the first rank of this job (on this node) that fails, False for later ones.

    Needs no collective — the other ranks may be anywhere — only an exclusive file create.
    On several nodes without a shared temporary folder each node has its own first rank.
    When nothing can be created the rank counts as first: a duplicate line beats silence.
    """
    _remove_stale_claims()
    try:
        fd = os.open(_claim_path(), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    except OSError:
        return True
    os.write(fd, str(os.getpid()).encode())
    os.close(fd)
    return True


#: how long a failing rank waits for every other rank to fail too (an error every rank finds
#: alike, such as a bad solver field, reaches all of them within moments of each other)
AGREE_S = 3.0
_agreement = {}   # "comm": the failure communicator; "verdict": failure_agreed()'s answer


def prepare_failure_agreement(world):
    """Collective, once, before anything can fail: the private communicator on which
    :func:`failure_agreed` asks whether every rank is failing."""
    if world.comm is not None and "comm" not in _agreement:
        _agreement["comm"] = world.comm.Dup()


def failure_agreed(timeout=AGREE_S):
    """True when every rank of the job reaches this within ``timeout`` seconds, i.e. every
    rank is failing: the job can then end cleanly (MPI_Finalize at exit) instead of through
    MPI_Abort, which leaves MPICH's shared-memory file in /dev/shm. A nonblocking barrier on
    the failure communicator; the answer is kept (asked again, it is the same)."""
    if "verdict" not in _agreement:
        comm, agreed = _agreement.get("comm"), False
        if comm is not None:
            request = comm.Ibarrier()
            deadline = time.monotonic() + timeout
            while not agreed and time.monotonic() < deadline:
                agreed = request.Test()
                time.sleep(0 if agreed else 0.01)
        _agreement["verdict"] = agreed
    return _agreement["verdict"]


def _write_rank_prefixed(rank, text):
    lines = text.rstrip("\n").split("\n")
    out = "".join(f"[rank {rank}] {line}\n" for line in lines)
    os.write(2, out.encode(errors="replace"))


def fail_job(text, code=1, world=None, agree=False):
    """End the whole job because this rank failed.

    ``agree``: first ask whether every rank is failing (:func:`failure_agreed`); when so,
    rank 0 alone writes ``text`` and this returns (every rank then exits with ``code``,
    cleanly). Otherwise it never returns: the first failing rank writes ``text`` once,
    prefixed with its rank, in a single ``os.write`` (so lines of different ranks are never
    glued together), gives mpiexec a moment to forward it, then calls MPI_Abort, which ends
    every rank. A rank that fails after it writes nothing and waits to be ended by that abort
    (aborting by itself after ``LOSER_WAIT_S``). ``text`` None: quietly (e.g. a second Ctrl-C).
    """
    world = world or get_world()
    sys.stdout.flush()
    if agree and failure_agreed():
        if world.rank == 0 and text:
            _write_rank_prefixed(world.rank, text)
        return
    first = claim_first_failure()
    if first and text:
        _write_rank_prefixed(world.rank, text)
        time.sleep(0.2)
    if not first:
        time.sleep(LOSER_WAIT_S)
    world.abort(code)


def install_excepthook(world=None):
    """Make an uncaught exception on any rank end the whole job with exit status 1.

    Without it one rank dies while the others wait forever in the next collective. The first
    failing rank prints the error (a ``CaffeError``: its message only, the user's input is at
    fault; anything else: the traceback) and aborts the job (``fail_job``); threads get the
    same treatment through ``threading.excepthook``.
    """
    world = world or get_world()
    prepare_failure_agreement(world)

    def _abort(exc_type, exc, tb):
        if isinstance(exc, CaffeError):
            text = f"caffe8: error: {exc}"
        else:
            text = (f"uncaught {exc_type.__name__}; aborting the job\n"
                    + "".join(traceback.format_exception(exc_type, exc, tb)))
        fail_job(text, 1, world)

    sys.excepthook = _abort
    threading.excepthook = lambda args: _abort(args.exc_type, args.exc_value, args.exc_traceback)
    return _abort
