"""caffe8.cluster: rate parsing, the Hydra launcher script, the tools it needs (no namespaces
needed), then real clusters (skipped where network namespaces cannot be made): namespaces and
hosts files, per-node hostnames, MPI data on the shaped link, teardown after a failure and a
timeout, and a 2-node fp8 digits training across the namespaces. The command line,
``caffe8 cluster``: tests/caffe8/tools/test_cluster_tool.py.

Every cluster here uses the prefix "c8t" (never the default "c8", which others may be using)."""
import os
import re
import subprocess
import sys
import time

import pytest

from caffe8 import cluster as ec
from tests.engine.conftest import digits_root, in_digits_cwd
from tests.engine.trainer_util import write_solver

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

PREFIX = "c8t"
MiB = 1 << 20


# --- without namespaces -----------------------------------------------------------------------
@pytest.mark.parametrize("text, bps", [("1gbit", 1e9), ("500mbit", 5e8), ("10GBit", 1e10),
                                       ("2.5kbit", 2500.0), ("64bit", 64.0), ("1tbit", 1e12)])
def test_parse_rate(text, bps):
    assert ec.parse_rate(text) == bps


@pytest.mark.parametrize("text", ["fast", "1gbps", "gbit", "0mbit", "-1gbit", "nanmbit",
                                  "infgbit", "1e400bit", ""])
def test_parse_rate_rejects_with_the_value_in_the_message(text):
    with pytest.raises(ec.ClusterError) as e:
        ec.parse_rate(text)
    assert repr(text) in str(e.value) and "1gbit" in str(e.value)


def test_constructor_rejects_bad_shapes():
    with pytest.raises(ec.ClusterError, match="--nodes 0"):
        ec.EmulatedCluster(nodes=0, prefix=PREFIX)
    with pytest.raises(ec.ClusterError, match="--prefix"):
        ec.EmulatedCluster(prefix="c8 t")
    with pytest.raises(ec.ClusterError, match="'slow'"):
        ec.EmulatedCluster(rate="slow", prefix=PREFIX)


def _fake_tools(folder):
    """``ip``, ``unshare`` and ``hostname`` that report what they were asked and pass the rest
    of the command on, so the launcher runs end to end without namespaces or a hostname
    change."""
    folder.mkdir()
    tools = {
        "ip": 'echo "ip $1 $2 ns=$3"; shift 3; exec "$@"',    # ip netns exec NS CMD...
        "unshare": 'echo "unshare $1"; shift; exec "$@"',      # unshare --uts CMD...
        "hostname": 'echo "hostname=$1"',
    }
    for name, body in tools.items():
        path = folder / name
        path.write_text("#!/bin/sh\n" + body + "\n")
        path.chmod(0o755)
    return str(folder)


def test_launcher_maps_each_host_to_its_namespace(tmp_path, monkeypatch):
    monkeypatch.setattr(ec, "STATE_ROOT", str(tmp_path / "state"))
    c = ec.EmulatedCluster(nodes=3, prefix=PREFIX)
    assert c.state_dir == str(tmp_path / "state" / PREFIX)
    os.makedirs(c.state_dir)
    c._write_launcher()
    assert os.access(c.launcher, os.X_OK)
    env = dict(os.environ, PATH=_fake_tools(tmp_path / "bin") + os.pathsep + os.environ["PATH"])
    for i in range(3):
        # Hydra calls it as ssh: options, the host, then the proxy command in several words.
        r = subprocess.run([c.launcher, "-x", f"{PREFIX}-node{i}", "echo", "proxy", f"arg{i}"],
                           env=env, capture_output=True, text=True, timeout=10)
        assert r.returncode == 0, r.stderr
        assert r.stdout.splitlines() == [f"ip netns exec ns={PREFIX}-n{i}", "unshare --uts",
                                          f"hostname={PREFIX}-node{i}", f"proxy arg{i}"]
    # the command is run by a shell, as sshd would: its words are joined and re-split
    r = subprocess.run([c.launcher, "-x", f"{PREFIX}-node1", "exit 7"], env=env,
                       capture_output=True, text=True, timeout=10)
    assert r.returncode == 7


def test_launcher_refuses_an_unknown_host(tmp_path, monkeypatch):
    monkeypatch.setattr(ec, "STATE_ROOT", str(tmp_path / "state"))
    c = ec.EmulatedCluster(nodes=2, prefix=PREFIX)
    os.makedirs(c.state_dir)
    c._write_launcher()
    env = dict(os.environ, PATH=_fake_tools(tmp_path / "bin") + os.pathsep + os.environ["PATH"])
    for host in (f"{PREFIX}-node2", "localhost", "c8-node0"):
        r = subprocess.run([c.launcher, "-x", host, "echo", "ran"], env=env,
                           capture_output=True, text=True, timeout=10)
        assert r.returncode == 255
        assert f"no node '{host}'" in r.stderr
        assert r.stdout == ""  # nothing was started


def test_available(monkeypatch):
    monkeypatch.setattr(ec.os, "geteuid", lambda: 1000)
    ok, why = ec.available()
    assert not ok and "root" in why
    monkeypatch.setattr(ec.os, "geteuid", lambda: 0)
    for missing, package in (("ip", "iproute2"), ("tc", "iproute2"), ("unshare", "util-linux")):
        monkeypatch.setattr(ec.shutil, "which",
                            lambda name, m=missing, **k: None if name == m else f"/bin/{name}")
        ok, why = ec.available()
        assert not ok and f"'{missing}'" in why and package in why, why
    monkeypatch.setattr(ec.shutil, "which", lambda name, **k: f"/bin/{name}")
    assert ec.available() == (True, "")


# --- with namespaces --------------------------------------------------------------------------
def _netns():
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.split()]


def _ours():
    return sorted(n for n in _netns() if n.startswith(PREFIX + "-"))


def _pids(ns):
    return subprocess.run(["ip", "netns", "pids", ns], capture_output=True,
                          text=True).stdout.split()


def _assert_gone():
    assert _ours() == []
    etc = os.listdir(ec.NETNS_ETC) if os.path.isdir(ec.NETNS_ETC) else []
    assert [d for d in etc if d.startswith(PREFIX + "-")] == []
    assert not os.path.exists(os.path.join(ec.STATE_ROOT, PREFIX))


@pytest.fixture(scope="session")
def netns_ok():
    """Skip (with the reason) where the namespaces cannot be made; else leave nothing behind."""
    ok, why = ec.available()
    if not ok:
        pytest.skip(f"no emulated cluster here: {why}")
    probe = ec.EmulatedCluster(nodes=1, rate="1gbit", prefix=PREFIX)
    try:
        probe.up()
    except (ec.ClusterError, OSError) as e:
        pytest.skip(f"no emulated cluster here: {e}")
    finally:
        probe.down()
    yield
    ec.EmulatedCluster(prefix=PREFIX).down()


@pytest.fixture
def make_cluster(netns_ok):
    """make_cluster(nodes, rate) → an up cluster of prefix c8t, torn down after the test."""
    made = []

    def make(nodes=2, rate="1gbit", delay="", dilation=1.0, cpu_groups=False):
        c = ec.EmulatedCluster(nodes=nodes, rate=rate, delay=delay, prefix=PREFIX,
                               dilation=dilation, cpu_groups=cpu_groups)
        made.append(c)
        return c.up()

    try:
        yield make
    finally:
        for c in made:
            c.down()


@pytest.mark.mpi
@pytest.mark.timeout(60)
def test_up_makes_nodes_plus_switch_with_hosts_files(make_cluster):
    c = make_cluster(nodes=3, rate="500mbit")
    assert _ours() == [f"{PREFIX}-n0", f"{PREFIX}-n1", f"{PREFIX}-n2", f"{PREFIX}-sw"]
    hosts = "".join(f"10.208.0.{i + 1} {PREFIX}-node{i}\n" for i in range(3))
    for i in range(3):
        with open(os.path.join(ec.NETNS_ETC, f"{PREFIX}-n{i}", "hosts")) as f:
            assert f.read() == "127.0.0.1 localhost\n" + hosts
        addr = subprocess.run(["ip", "-n", c.ns(i), "-br", "addr", "show", "eth0"],
                              capture_output=True, text=True).stdout
        assert f"10.208.0.{i + 1}/24" in addr
        qdisc = subprocess.run(["ip", "netns", "exec", c.ns(i), "tc", "qdisc", "show", "dev",
                                "eth0"], capture_output=True, text=True).stdout
        assert "tbf" in qdisc and "500Mbit" in qdisc, qdisc
    assert ec.EmulatedCluster.load(PREFIX).nodes == 3
    with open(os.path.join(ec.STATE_ROOT, PREFIX, "launch")) as f:
        assert f"{PREFIX}-node2) ns={PREFIX}-n2" in f.read()


@pytest.mark.mpi
@pytest.mark.timeout(60)
def test_up_that_fails_midway_leaves_nothing(netns_ok):
    # tc rejects the delay only after the switch and node 0 exist
    c = ec.EmulatedCluster(nodes=2, rate="1gbit", delay="bogus", prefix=PREFIX)
    try:
        with pytest.raises(ec.ClusterError, match="tc qdisc"):
            c.up()
        _assert_gone()
    finally:
        c.down()


@pytest.mark.mpi
@pytest.mark.timeout(60)
def test_delay_adds_netem_before_the_bucket(make_cluster):
    try:
        c = make_cluster(nodes=2, rate="1gbit", delay="50us")
    except ec.ClusterError as e:
        if "qdisc kind is unknown" in str(e):
            pytest.skip(f"no netem in this kernel: {e}")
        raise
    for where, dev in ((c.ns(1), "eth0"), (c.switch, "p1")):
        qdisc = subprocess.run(["ip", "netns", "exec", where, "tc", "qdisc", "show", "dev", dev],
                               capture_output=True, text=True).stdout
        assert "netem 1: root" in qdisc and "delay 50us" in qdisc, qdisc
        assert "tbf 10: parent 1:1" in qdisc and "1Gbit" in qdisc, qdisc


@pytest.mark.mpi
@pytest.mark.timeout(60)
def test_each_node_runs_under_its_own_hostname(make_cluster, tmp_path):
    c = make_cluster(nodes=3)
    out = tmp_path / "hostnames"
    with open(out, "w") as f:
        assert c.run(["hostname"], ppn=1, timeout=30, stdout=f) == 0
    assert sorted(out.read_text().split()) == [f"{PREFIX}-node{i}" for i in range(3)]
    assert os.uname().nodename not in out.read_text().split()

ALLREDUCE = """\
import sys
import numpy as np
from mpi4py import MPI
comm = MPI.COMM_WORLD
send = np.full(1 << 20, comm.rank + 1, np.float32)   # 4 MiB
recv = np.empty_like(send)
comm.Allreduce(send, recv)
assert (recv == 3).all(), recv[:4]
sys.stdout.write(f"allreduce ok on {MPI.Get_processor_name()}\\n")  # one write: mpiexec
sys.stdout.flush()                                                 # interleaves ranks' writes
"""


@pytest.mark.mpi
@pytest.mark.timeout(60)
def test_mpi_data_crosses_the_shaped_link(make_cluster, tmp_path):
    pytest.importorskip("mpi4py")
    c = make_cluster(nodes=2, rate="1gbit")
    script = tmp_path / "allreduce.py"
    script.write_text(ALLREDUCE)
    before = c.counters()
    out = tmp_path / "out"
    with open(out, "w") as f:
        rc = c.run([sys.executable, str(script)], ppn=1, timeout=45, stdout=f)
    assert rc == 0, out.read_text()
    ok = re.findall(rf"allreduce ok on ({PREFIX}-node\d)", out.read_text())
    assert sorted(ok) == [f"{PREFIX}-node{i}" for i in range(2)]
    after = c.counters()
    # Each node needs every element of the other's 4 MiB to form the sum: it must receive (and
    # the other send) at least that much over the link, not through shared memory.
    for host in after:
        for key in ("tx_bytes", "rx_bytes"):
            assert after[host][key] - before[host][key] >= 4 * MiB, (host, key, before, after)


@pytest.mark.mpi
@pytest.mark.timeout(60)
def test_down_removes_everything_after_a_failing_command(netns_ok, tmp_path):
    c = ec.EmulatedCluster(nodes=2, rate="1gbit", prefix=PREFIX)
    try:
        c.up()
        assert c.run(["sh", "-c", "exit 3"], timeout=30) == 3
    finally:
        c.down()
    _assert_gone()
    # the with-block form tears down when its body raises
    with pytest.raises(RuntimeError):
        with ec.EmulatedCluster(nodes=2, rate="1gbit", prefix=PREFIX):
            assert len(_ours()) == 3
            raise RuntimeError("body failed")
    _assert_gone()


@pytest.mark.mpi
@pytest.mark.timeout(60)
def test_hanging_run_is_killed_at_the_timeout(make_cluster):
    c = make_cluster(nodes=2)
    start = time.monotonic()
    with pytest.raises(ec.ClusterError, match="ran past 2 s"):
        c.run(["sleep", "60"], timeout=2)
    assert time.monotonic() - start < 15
    assert len(_ours()) == 3  # the cluster is still up, its processes are not
    for i in range(2):
        assert _pids(c.ns(i)) == []


@pytest.mark.mpi
@pytest.mark.timeout(120)
def test_two_node_fp8_training_across_the_namespaces(make_cluster, in_digits_cwd,  # noqa: F811
                                                     tmp_path):
    pytest.importorskip("mpi4py")
    import h5py
    iters = 60
    solver = write_solver(tmp_path, max_iter=iters, display=20, test_interval=iters,
                          test_iter=[6], snapshot=0,
                          comm=dict(codec="fp8", consistency_check_interval=20,
                                    warmup_fp32_iters=0, processes_per_node=0))
    c = make_cluster(nodes=2, rate="1gbit")
    before = c.counters()
    log = tmp_path / "train.log"
    with open(log, "w") as f:
        rc = c.run([sys.executable, "-m", "caffe8.cli", "train", "--solver", solver], ppn=1,
                   timeout=100, env={"PYTHONPATH": REPO}, stdout=f)
    after = c.counters()
    text = log.read_text()
    assert rc == 0, text[-3000:]
    # MPI itself sees two nodes (shared memory between them is not found)
    assert "2 processes on 2 nodes" in text, text[-3000:]
    assert len(re.findall(r"consistency check: parameters bit-identical on all 2 ranks",
                          text)) == iters // 20, text[-3000:]
    acc = float(re.findall(r"Test net output #0: accuracy = ([\d.e+-]+)", text)[-1])
    assert acc > 0.5, text[-3000:]  # 60 iterations learn; a broken exchange stays near 0.1
    # The fp8 gradients crossed the link: at least one byte per parameter per iteration into
    # each node, and less than float32's four.
    params = 0
    with h5py.File(tmp_path / "snap" / f"digits_iter_{iters}.caffemodel.h5", "r") as f:
        def count(_, obj):
            nonlocal params
            params += obj.size if isinstance(obj, h5py.Dataset) else 0
        f["data"].visititems(count)
    assert params > 10000
    for host in after:
        received = after[host]["rx_bytes"] - before[host]["rx_bytes"]
        assert iters * params <= received < 4 * iters * params, (host, received, params)


# --- time dilation ---------------------------------------------------------------------------
def test_scale_time_multiplies_tc_times():
    assert ec.scale_time("50us", 4) == "200.000us"
    assert ec.scale_time("1.5ms", 2) == "3000.000us"
    assert ec.scale_time("2s", 1) == "2000000.000us"
    with pytest.raises(ec.ClusterError, match="--delay 'fast'"):
        ec.scale_time("fast", 2)


def test_dilation_needed_gives_each_process_a_core_once_they_outnumber_the_cores():
    assert ec.dilation_needed(1, cores=2) == ec.dilation_needed(2, cores=2) == 1.0
    for p in (3, 4, 8, 16):
        k = ec.dilation_needed(p, cores=2)
        assert p / k <= ec.CORE_SHARE * 2 < p / (k - 0.5), (p, k)   # sound, and the least so


def test_dilation_out_of_range_is_one_clear_error():
    with pytest.raises(ec.ClusterError, match="--dilation 0.5: expected a factor from 1"):
        ec.EmulatedCluster(nodes=2, dilation=0.5)


def _cpu_seconds_and_wall(c, node, tmp_path):
    """A CPU-bound Python loop run inside ``node`` (its CPU group joined): (CPU s, wall s)."""
    out = tmp_path / f"burn{node}"
    code = ("import time; w = time.perf_counter(); c = time.process_time(); s = 0\n"
            "for i in range(2 * 10 ** 6): s += i\n"
            f"open({str(out)!r}, 'w').write(f'{{time.process_time() - c}} "
            "{time.perf_counter() - w}')")
    c.cpu.cap(1.0 / c.dilation)
    subprocess.run(c.in_node(node, [sys.executable, "-c", code]), check=True, timeout=60)
    return tuple(float(x) for x in out.read_text().split())


@pytest.mark.mpi
@pytest.mark.timeout(90)
def test_dilation_slows_the_nodes_cpu_and_link_by_k_and_leaves_nothing(make_cluster, tmp_path):
    try:
        c = make_cluster(nodes=2, rate="1gbit", delay="50us", dilation=4)
    except ec.ClusterError as e:
        if "qdisc kind is unknown" in str(e) or "cgroup" in str(e):
            pytest.skip(f"no netem or no CPU cgroups here: {e}")
        raise
    # the link: rate / 4 and delay x 4 on both ends
    for where, dev in ((c.ns(1), "eth0"), (c.switch, "p1")):
        qdisc = subprocess.run(["ip", "netns", "exec", where, "tc", "qdisc", "show", "dev", dev],
                               capture_output=True, text=True).stdout
        assert "delay 200us" in qdisc and "250Mbit" in qdisc, qdisc
    # the host: a CPU-bound loop in a node gets a quarter of a core (wall ~ 4 x its CPU time)
    cpu, wall = _cpu_seconds_and_wall(c, 1, tmp_path)
    assert wall > 3.0 * cpu, (cpu, wall)
    periods, throttled = c.cpu.stat()[1]
    assert throttled > 0 and periods > 0
    top = c.cpu.top
    assert os.path.isdir(top) and ec.EmulatedCluster.load(PREFIX).dilation == 4
    c.down()
    assert not os.path.exists(top) and not os.path.ismount(c.cpu.mount)


@pytest.mark.mpi
@pytest.mark.timeout(90)
def test_reshape_changes_rate_and_dilation_of_a_cluster_that_is_up(make_cluster, tmp_path):
    try:
        c = make_cluster(nodes=2, rate="1gbit", cpu_groups=True)
    except ec.ClusterError as e:
        if "cgroup" in str(e):
            pytest.skip(f"no CPU cgroups here: {e}")
        raise
    cpu, wall = _cpu_seconds_and_wall(c, 0, tmp_path)     # dilation 1: uncapped
    assert wall < 2.0 * cpu + 0.5, (cpu, wall)
    c.reshape(dilation=2, rate="500mbit")
    qdisc = subprocess.run(["ip", "netns", "exec", c.ns(0), "tc", "qdisc", "show", "dev",
                            "eth0"], capture_output=True, text=True).stdout
    assert "250Mbit" in qdisc, qdisc
    cpu, wall = _cpu_seconds_and_wall(c, 0, tmp_path)
    assert wall > 1.6 * cpu, (cpu, wall)
