"""Running the real ``caffe8`` command line in a fresh process group, with a time limit.

Every helper starts the command as the leader of a new session, so when it returns — normally
or after the limit, when the whole group is killed — the test can check that no process of the
run (mpiexec, its proxy, any rank) is left behind.
"""
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest

from tests.faults import exit_loop  # the exit-loop case and its runner

REPO = exit_loop.REPO

ERROR_LINE = re.compile(r"error:", re.IGNORECASE)


def mpiexec():
    exe = exit_loop.mpiexec()
    if exe is None:
        pytest.skip("no mpiexec")
    return exe


class Run:
    """Outcome of one command: ``rc`` (None when it ran past the limit), ``out`` (stdout and
    stderr together), ``leftover`` (True when a process of its group was still alive)."""

    def __init__(self, rc, out, leftover):
        self.rc, self.out, self.leftover = rc, out, leftover

    def error_lines(self):
        return [line for line in self.out.splitlines() if ERROR_LINE.search(line)]

    def __repr__(self):
        return f"Run(rc={self.rc}, leftover={self.leftover})\n{self.out[-3000:]}"


def _group_alive(pgid):
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def run(cmd, cwd, limit=60, env=None):
    """Run ``cmd`` in its own process group; kill the group after ``limit`` seconds."""
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.Popen(cmd, cwd=str(cwd), env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=limit)
        rc = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        rc = None
    # mpiexec returns once every rank has ended; give stragglers of a killed job a moment
    deadline = time.monotonic() + 5
    while _group_alive(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    leftover = _group_alive(proc.pid)
    if leftover:
        os.killpg(proc.pid, signal.SIGKILL)
    return Run(rc, out.decode(errors="replace"), leftover)


def caffe8(args, cwd, processes=1, limit=60):
    """``caffe8 ARGS`` (as ``python -m <cli>``), under ``mpiexec -n processes`` when > 1."""
    cmd = [sys.executable, "-m", exit_loop.cli_module(), *map(str, args)]
    if processes > 1:
        cmd = [mpiexec(), "-n", str(processes)] + cmd
    return run(cmd, cwd, limit)


def have_mpiexec():
    return exit_loop.mpiexec() is not None and shutil.which(exit_loop.mpiexec()) is not None


def run_cases(cases, tmp, processes=1, initialises_mpi=False, limit=60):
    """Run the argv lists ``cases`` through caffe8's ``main`` one after another in ONE process
    (``processes`` 1) or ONE ``mpiexec -n processes`` launch (prog_cli_cases.py): one start-up
    for many cases. The launch must exit 0 with nothing left behind; returns, per rank, the
    list of {"argv", "rc", "out"} of each case."""
    import json
    spec, out = os.path.join(str(tmp), "cases.json"), os.path.join(str(tmp), "cases-out")
    with open(spec, "w") as f:
        json.dump([[str(a) for a in argv] for argv in cases], f)
    cmd = [sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                        "prog_cli_cases.py"), spec, out]
    cmd += ["--mpi"] if initialises_mpi else []
    if processes > 1:
        cmd = [mpiexec(), "-n", str(processes)] + cmd
    r = run(cmd, tmp, limit)
    assert r.rc == 0 and not r.leftover, r
    ranks = []
    for k in range(processes):
        with open(os.path.join(out, f"rank{k}.json")) as f:
            ranks.append(json.load(f))
    shutil.rmtree(out)
    return ranks


def case_run(result):
    """A :class:`Run` of one case of :func:`run_cases` (its process group is the launch's,
    checked there)."""
    return Run(result["rc"], result["out"], False)
