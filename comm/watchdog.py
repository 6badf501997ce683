"""Collective watchdog: a rank stuck in an exchange names the rank it waits for, then the job ends.

In the manner of Horovod's stall check and PyTorch's process-group timeout. Every collective of
the exchange is nonblocking and completed by :meth:`Watchdog.wait` with a deadline, on the thread
that started it, so only one thread ever calls MPI at a time (MPI_THREAD_SERIALIZED). The wait
blocks without the GIL: a C loop calls the MPI library's own MPI_Test (comm/csrc/kernels.c's
``c8_mpi_wait``; the node-shared barrier sleeps on a futex the same way, comm/shm.py) for at
most one census interval at a time, so the compute thread never has to hand the GIL to a
polling thread; between two slices the watchdog answers the others' questions and checks its
deadline. Without the C library it polls ``Testall`` from Python, as before. After half of ``comm.stall_timeout`` the rank logs a warning; after all
of it, a census on a private duplicate of the communicator finds out who is missing: the rank
asks every other rank for its progress (iteration, number of collectives started), answers the
others' questions while it waits, and after a short grace period blames the ranks that did not
answer or are behind it: it raises :class:`StallError`, whose message is the verdict, printed
once by the CLI's error path (MPI_Abort).

A rank answers questions while it is itself waiting in a collective (a healthy rank gets there
within the grace period once the others are stuck, because no collective can complete without
the stalled rank), and during the phases that legitimately keep one rank away from collectives
for long — writing a snapshot, testing, reading its first data — announced with
:meth:`Watchdog.busy`: a rank that hears "busy" logs what it waits for once and waits another
``stall_timeout``, so the deadline applies to each period without news, not to the whole wait.
"""
import ctypes
import os
import threading
import time

import numpy

from caffe8.comm import kernels
from caffe8.comm.mpi import mpi_module
from caffe8.engine.errors import CaffeError

_ASK, _TELL = 7101, 7102
# The poll from Python (without the C kernels): a short spin, then a sleep between polls: every
# Test call takes the GIL, and a long spin made the compute thread of the asynchronous exchange
# fight the communication thread for it (overlap_bench: async wall 165-241 ms with 2000 spins
# against 116-135 ms with 20). The C wait keeps _HOT and _SLEEP, without the GIL.
_SPIN = 20                # Test calls before the loop starts sleeping between polls
_HOT = 2e-3               # seconds of polling with time.sleep(0) in between: the GIL goes to
                          # other threads, yet MPICH, which only advances a transfer inside Test,
                          # keeps being polled (50 us sleeps here doubled the sync exchange time)
_SLEEP = 5e-5             # seconds between polls after that (a slow peer: leave it the core)
_CENSUS_EVERY = 0.05      # seconds between checks for other ranks' questions


class StallError(CaffeError):
    """A collective did not complete within ``comm.stall_timeout`` seconds."""

    #: the waiting ranks meet it, the stalled one does not: the CLI aborts the job at once
    #: rather than first asking whether every rank failed alike (caffe8.cli._fail)
    shared = False


#: what a rank tells the others it is doing (the third number of its answer)
PHASES = ("waiting in a collective", "writing a snapshot", "testing",
          "reading its first data")
_WAITING = 0
#: census rounds in which every rank answers, none behind and none busy, before the verdict
#: that the collective itself does not complete (a slow transfer gets that many timeouts)
_QUIET_ROUNDS = 3


class Watchdog:
    """Deadline waits for the requests of ``comm`` (see the module docstring).

    ``timeout``: seconds (``comm.stall_timeout``), counted afresh for every wait and again
    after every census that finds a rank alive and busy; ``warn_fraction``: the share of it
    after which a warning is logged; ``log``: fn(text) for warnings (default: stderr, every
    rank). ``where`` (set by the exchange before each tensor) names what is exchanged. The
    world owns its watchdog (``World.use_watchdog``) and frees it; the others borrow it.
    """

    def __init__(self, comm, timeout, warn_fraction=0.5, log=None, grace=None):
        self.MPI = mpi_module()
        self.comm = comm
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.ctl = comm.Dup()            # collective: every rank builds its watchdog at start
        self.timeout = float(timeout)
        self.warn_after = self.timeout * warn_fraction
        # at least 2 s for the answers: a busy rank's answering thread shares a loaded machine
        self.grace = float(grace) if grace is not None else min(5.0, max(2.0, self.timeout / 4))
        self.log = log or _stderr
        self.iteration, self.started, self.where = 0, 0, "a collective"
        self.phase = _WAITING
        self._answers = []               # pending Isend requests of our answers
        self._told = set()               # (rank, phase, iteration) already logged as busy

    # --- progress -------------------------------------------------------------------------------
    def at(self, iteration, where):
        """Name what the following collectives exchange (e.g. "layer 'conv1'")."""
        self.iteration, self.where = int(iteration), f"the exchange of {where}"

    def collective(self, iteration, what):
        """Name the following collectives by themselves (e.g. "the snapshot's broadcast")."""
        self.iteration, self.where = int(iteration), what

    def _progress(self):
        return numpy.array([self.iteration, self.started, self.phase], numpy.int64)

    def busy(self, phase):
        """``with watchdog.busy("writing a snapshot"):`` around work that keeps this rank away
        from collectives for long (one of ``PHASES``; the block itself must make no MPI call):
        a thread answers the others' census meanwhile, so their deadline starts afresh instead
        of ending the job, and their log says what they wait for."""
        return _Busy(self, PHASES.index(phase))

    # --- waiting --------------------------------------------------------------------------------
    def wait(self, requests):
        """Complete ``requests`` (one or a list), or raise StallError after the timeout: in C
        without the GIL where the kernels and the MPI library's MPI_Test are at hand, else by
        polling ``Testall``."""
        reqs = requests if isinstance(requests, list) else [requests]
        test = _mpi_test_address(self.MPI)
        if test is None:
            testall = self.MPI.Request.Testall
            self.wait_until(lambda: testall(reqs))
        else:
            self.wait_blocking(_RequestWait(self.MPI, reqs, test))

    def wait_until(self, done):
        """Return once ``done()`` (a poll) is true, or raise StallError after the timeout: a
        short spin, then polls with a sleep between them (every poll takes the GIL)."""
        start, polls = time.monotonic(), 0

        def poll(seconds):
            nonlocal polls
            if done():
                return True
            polls += 1
            if polls >= _SPIN:
                time.sleep(0.0 if time.monotonic() - start < _HOT else _SLEEP)
            return False
        self.wait_blocking(poll)

    def wait_blocking(self, block):
        """Return once ``block(seconds)`` — a wait of at most ``seconds`` that says whether it
        is done, e.g. in C without the GIL (MPI requests, the node-shared barrier's futex) —
        says so, or raise StallError after the timeout; between two waits the others'
        questions are answered and the deadline is checked."""
        self.started += 1
        start = time.monotonic()
        warned, next_census, quiet = False, start + _CENSUS_EVERY, 0
        done = lambda: block(0.0)     # noqa: E731  (one look: the census's early end)
        while not block(_CENSUS_EVERY):
            now = time.monotonic()
            if now >= next_census:
                self._answer_questions()
                next_census = now + _CENSUS_EVERY
            waited = now - start
            if not warned and waited >= self.warn_after:
                warned = True
                self.log(f"[rank {self.rank}] warning: waiting {waited:.0f} s in {self.where} "
                         f"(iteration {self.iteration}); comm.stall_timeout is "
                         f"{self.timeout:g} s")
            if waited >= self.timeout:
                if done():
                    return
                heard = self._census(done)
                if done():                       # completed during the census
                    return
                quiet = 0 if self._someone_busy(heard) else quiet + 1
                if self._stalled_ranks(heard) or quiet >= _QUIET_ROUNDS:
                    raise StallError(self._verdict(time.monotonic() - start, heard))
                start = time.monotonic()         # alive and busy, or all here: a new period

    def _answer_questions(self):
        status = self.MPI.Status()
        while self.ctl.Iprobe(self.MPI.ANY_SOURCE, _ASK, status):
            source = status.Get_source()
            self.ctl.Recv(numpy.empty(3, numpy.int64), source, _ASK)
            self._answers.append(self.ctl.Isend(self._progress(), source, _TELL))

    def _census(self, done):
        """Ask every other rank for its progress and wait ``grace`` seconds for the answers
        (serving the others' questions meanwhile, and ending early once ``done()``):
        {rank: (iteration, collectives, phase)}."""
        status = self.MPI.Status()
        while self.ctl.Iprobe(self.MPI.ANY_SOURCE, _TELL, status):   # late answers of before
            self.ctl.Recv(numpy.empty(3, numpy.int64), status.Get_source(), _TELL)
        mine = self._progress()
        asks = [self.ctl.Isend(mine, r, _ASK) for r in range(self.size) if r != self.rank]
        heard = {}
        deadline = time.monotonic() + self.grace
        while time.monotonic() < deadline and len(heard) < self.size - 1 and not done():
            self._answer_questions()
            self._collect_answers(heard, status)
            time.sleep(0.01)
        # once more after the deadline: on a loaded machine this rank can be off the CPU past
        # it while the answers arrive, and an answer waiting here is no stall
        self._collect_answers(heard, status)
        self._answers.extend(asks)      # completed or cancelled with the answers in free()
        return heard

    def _collect_answers(self, heard, status):
        """Receive the answers that have arrived into ``heard``."""
        while self.ctl.Iprobe(self.MPI.ANY_SOURCE, _TELL, status):
            source = status.Get_source()
            theirs = numpy.empty(3, numpy.int64)
            self.ctl.Recv(theirs, source, _TELL)
            heard[source] = tuple(int(v) for v in theirs)

    def _someone_busy(self, heard):
        """True when a rank answered from a busy phase; logs it once per rank and phase."""
        busy = {r: p for r, p in heard.items() if p[2] != _WAITING}
        for r, p in sorted(busy.items()):
            if (r, p[2], p[0]) not in self._told:
                self._told.add((r, p[2], p[0]))
                self.log(f"[rank {self.rank}] waiting in {self.where} at iteration "
                         f"{self.iteration} for rank {r}, which is {PHASES[p[2]]} (iteration "
                         f"{p[0]}); not a stall")
        return bool(busy)

    def _stalled_ranks(self, heard):
        """Ranks that do not answer, or wait in an earlier collective than this one."""
        mine = (self.iteration, self.started)
        return {r: heard.get(r) for r in range(self.size)
                if r != self.rank and (r not in heard or
                                       (heard[r][2] == _WAITING and heard[r][:2] < mine))}

    def _verdict(self, waited, heard):
        stalled = self._stalled_ranks(heard)
        parts = [f"rank {r} " + ("does not answer (not in a collective, or hung)" if p is None
                                 else f"is behind (iteration {p[0]}, collective {p[1]})")
                 for r, p in sorted(stalled.items())]
        waiting_for = "; waiting for " + ", ".join(parts) if parts else \
            (f"; every rank waits in collective {self.started} at iteration {self.iteration}: "
             "the collective itself does not complete")
        return (f"rank {self.rank} waited {waited:.0f} s (comm.stall_timeout {self.timeout:g} "
                f"s) in {self.where} at iteration {self.iteration}{waiting_for}")

    def free(self):
        for req in self._answers:
            if not req.Test():
                req.Cancel()
        self._answers = []
        self.ctl.Free()


class _Busy:
    """The context of :meth:`Watchdog.busy`: a thread answering questions, nothing else in MPI."""

    def __init__(self, watchdog, phase):
        self.watchdog, self.phase = watchdog, phase
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="watchdog-busy", daemon=True)

    def _serve(self):
        while not self._stop.wait(_CENSUS_EVERY):
            self.watchdog._answer_questions()

    def __enter__(self):
        self.watchdog.phase = self.phase
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.watchdog.phase = _WAITING
        return False


_MPI_TEST = []          # [address of MPI_Test or None], looked up once


def _mpi_test_address(MPI):
    """Address of MPI_Test in the MPI library mpi4py loaded (found through mpi4py's own
    module, whose dependencies it is), or None without it or without the C kernels."""
    if not _MPI_TEST:
        address = None
        if kernels.mpi_wait_function() is not None:
            try:
                address = ctypes.cast(ctypes.CDLL(MPI.__file__).MPI_Test, ctypes.c_void_p).value
            except (OSError, AttributeError):
                address = None
        _MPI_TEST.append(address)
    return _MPI_TEST[0]


class _RequestWait:
    """``block(seconds)`` of :meth:`Watchdog.wait_blocking` for MPI requests: comm.kernels'
    ``c8_mpi_wait`` calls MPI_Test on each request's handle (which it sets to
    MPI_REQUEST_NULL when it completes, so the request objects see it) without the GIL, yielding
    the core for the first ``_HOT`` seconds of the wait and sleeping ``_SLEEP`` between rounds
    after that, the policy of the Python poll."""

    def __init__(self, MPI, requests, test):
        self.MPI, self.requests, self.test = MPI, requests, test     # requests: kept alive
        self.handles = (ctypes.c_void_p * len(requests))(*[MPI._addressof(r) for r in requests])
        self.status = ctypes.create_string_buffer(max(MPI._sizeof(MPI.Status), 64))
        self.wait = kernels.mpi_wait_function()
        self.start = time.monotonic()

    def __call__(self, seconds):
        hot = max(0.0, _HOT - (time.monotonic() - self.start))
        code = self.wait(self.test, self.handles, len(self.requests), self.status,
                         int(seconds * 1e9), int(hot * 1e9), int(_SLEEP * 1e9))
        if code < 0:
            raise self.MPI.Exception(-code)
        return code == 1


def _stderr(text):
    os.write(2, (text + "\n").encode(errors="replace"))
