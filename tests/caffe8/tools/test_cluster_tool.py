"""``caffe8 cluster``, the command line of caffe8.cluster: one error line for a user without root
or with a bad rate, what ``down`` says it removed, the command after ``--`` reaching mpiexec as
given, then (skipped where network namespaces cannot be made) the one-shot ``run``'s exit
status and its teardown, also on Ctrl-C and SIGTERM.

Every cluster here uses test_cluster's PREFIX (never the default "c8", nor another test run's)."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from caffe8 import cluster as ec
from tests.caffe8.test_cluster import (PREFIX, REPO, _assert_gone, _netns, _pids,  # noqa: F401
                                       netns_ok)
from tests.caffe8.tools.tool_helpers import cli


# --- without namespaces -----------------------------------------------------------------------
def test_up_as_non_root_is_one_error_line(monkeypatch, capsys):
    monkeypatch.setattr(ec.os, "geteuid", lambda: 1000)
    # would fail loudly if it got as far as touching namespaces or the state folder
    monkeypatch.setattr(ec, "_sh", lambda *a, **k: pytest.fail(f"ran {a}"))
    assert cli("cluster", "up", "--nodes", "2", "--rate", "1gbit", "--prefix", PREFIX) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1 and err.startswith("caffe8: error: needs root")


def test_down_says_what_it_removed_or_that_nothing_was_up(monkeypatch, tmp_path, capsys):
    """The namespaces ``ip netns`` lists under the prefix (and no other) are removed and
    named, with the processes killed in them; with none, it says nothing was up."""
    monkeypatch.setattr(ec, "STATE_ROOT", str(tmp_path))
    pids = {"c8t-n0": ["101", "102"], "c8t-sw": []}
    ran = []

    def sh(argv, check=True, capture=False):
        ran.append(argv)
        if argv[:3] == ["ip", "netns", "list"]:
            return "c8t-n0 (id: 1)\nc8t-sw (id: 0)\nc8tx-n0\nother\n"
        if argv[:3] == ["ip", "netns", "pids"]:  # the processes, gone once killed
            alive, pids[argv[3]] = pids[argv[3]], []
            return "\n".join(alive)
        return ""
    monkeypatch.setattr(ec, "_sh", sh)
    monkeypatch.setattr(ec.os, "kill", lambda pid, sig: None)
    assert cli("cluster", "down", "--prefix", "c8t") == 0
    assert capsys.readouterr().out == ("down: removed 2 namespaces (c8t-n0, c8t-sw), killed 2 "
                                       "processes\n")
    assert [a[3] for a in ran if a[:3] == ["ip", "netns", "del"]] == ["c8t-n0", "c8t-sw"]
    monkeypatch.setattr(ec, "_sh", lambda *a, **k: "")
    assert cli("cluster", "down", "--prefix", "c8t") == 0
    assert capsys.readouterr().out == "down: no emulated cluster 'c8t' was up; nothing to remove\n"


def test_bad_rate_on_the_command_line_is_one_error_line(capsys):
    assert cli("cluster", "up", "--rate", "fast", "--prefix", PREFIX) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'fast'" in err


def test_counters_or_run_without_a_cluster_up_is_one_error_line(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(ec, "STATE_ROOT", str(tmp_path))
    for argv in (["counters", "--prefix", PREFIX], ["run", "--prefix", PREFIX, "--", "hostname"]):
        assert cli("cluster", *argv) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"no emulated cluster '{PREFIX}' is up" in err, err
        assert "caffe8 cluster up" in err


def test_run_without_a_command_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as e:
        cli("cluster", "run", "--prefix", PREFIX, "--")
    assert e.value.code == 2
    assert "caffe8 cluster: error: run: give the command after --" in capsys.readouterr().err


def test_run_hands_the_command_after_the_dashes_to_mpiexec_unchanged(monkeypatch, tmp_path,
                                                                     capsys):
    """On a cluster that is up, ``run`` starts the command as given, Caffe's single-dash flags
    included (the dispatcher must not rewrite them), ``--ppn`` per node on every node."""
    monkeypatch.setattr(ec, "STATE_ROOT", str(tmp_path))
    os.makedirs(tmp_path / PREFIX)
    with open(tmp_path / PREFIX / "state.json", "w") as f:
        json.dump({"nodes": 3, "rate": "1gbit", "delay": "", "subnet": ec.DEFAULT_SUBNET}, f)
    ran = []

    def job(self, argv, ppn=1, timeout=None, **kw):
        ran.append((self.nodes, self.prefix, list(argv), ppn, timeout))
        return 5
    monkeypatch.setattr(ec.EmulatedCluster, "run", job)
    monkeypatch.setattr(ec, "default_mpiexec", lambda: sys.executable)  # any file that exists
    cmd = ["caffe8", "train", "-solver", "s.prototxt", "-gpu", "0", "--", "-x"]
    assert cli("cluster", "run", "--prefix", PREFIX, "--ppn", "2", "--timeout", "9", "--",
               *cmd) == 5
    assert ran == [(3, PREFIX, cmd, 2, 9.0)]
    shown = capsys.readouterr().err
    assert shown.startswith(f"+ ip netns exec {PREFIX}-n0 ") and shown.endswith(
        " " + " ".join(cmd) + "\n"), shown
    assert f"-hosts {PREFIX}-node0:2,{PREFIX}-node1:2,{PREFIX}-node2:2 -n 6" in shown, shown


# --- with namespaces --------------------------------------------------------------------------
def _cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline") as f:
            return f.read()
    except OSError:
        return ""


def _running(pid):
    """Whether process ``pid`` still runs (a killed one may linger as a zombie until reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


@pytest.mark.mpi
@pytest.mark.timeout(60)
def test_one_shot_run_returns_the_jobs_status_and_leaves_nothing(netns_ok):
    try:
        assert cli("cluster", "run", "--nodes", "2", "--rate", "1gbit", "--prefix", PREFIX,
                   "--", "sh", "-c", "exit 3") == 3
    finally:
        ec.EmulatedCluster(prefix=PREFIX).down()
    _assert_gone()


@pytest.mark.mpi
@pytest.mark.timeout(90)
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_ctrl_c_or_sigterm_tears_the_one_shot_cluster_down(netns_ok, sig):
    """Ctrl-C, or SIGTERM as timeout(1) or a batch system sends it: the job is killed and the
    cluster removed, not left running behind a Python that ended."""
    cmd = [sys.executable, "-m", "caffe8.cli", "cluster", "run", "--nodes", "2", "--rate",
           "1gbit", "--prefix", PREFIX, "--", "sleep", "60"]
    # SIGINT as a terminal's Ctrl-C would deliver it, even where the test runner ignores it
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline, job = time.monotonic() + 30, []
        while time.monotonic() < deadline and proc.poll() is None:
            # the cluster is up (PREFIX-n0 listed) and the job's sleep runs on node 1 (not just
            # one of up's tc commands)
            if f"{PREFIX}-n0" in _netns() and any(
                    _cmdline(p).startswith("sleep\0") for p in _pids(f"{PREFIX}-n1")):
                job = _pids(f"{PREFIX}-n0") + _pids(f"{PREFIX}-n1")
                break
            time.sleep(0.1)
        assert job, f"the job never started: {proc.poll()}"
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=15)
        assert proc.returncode == 130, (out, err)
        assert err.endswith("caffe8 cluster: interrupted\n"), err
        alive = [p for p in job if _running(p)]
        assert alive == [], alive
        _assert_gone()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        ec.EmulatedCluster(prefix=PREFIX).down()
