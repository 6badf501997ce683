"""caffe8.cluster: rate, delay and loss parsing, the launcher script, the tools it needs (no
namespaces needed), then real clusters (skipped where network namespaces cannot be made):
namespaces and hosts files, per-node hostnames, MPI data on the shaped link, the loss rate,
teardown after a failure and a timeout, a 2-node fp8 digits training across the namespaces, the
same bytes over a lossy link, and a link pulled mid-run. The command line, ``caffe8 cluster``:
tests/caffe8/tools/test_cluster_tool.py; the MPIs: tests/caffe8/test_mpis.py.

Every cluster here uses the prefix PREFIX, "c8t" and four hex digits of the test process's id:
never the default "c8", which others may be using, and not another test run's (a second run on
the machine would take this one's clusters down as it brings up its own)."""
import json
import os
import re
import subprocess
import sys
import threading
import time

import pytest

from caffe8 import cluster as ec
from tests.engine.conftest import digits_root, in_digits_cwd
from tests.engine.trainer_util import write_solver

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

PREFIX = f"c8t{os.getpid() % 0x10000:04x}"
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


@pytest.mark.parametrize("text, seconds", [("1ms", 1e-3), ("500us", 5e-4), ("0.5MS", 5e-4),
                                           ("2s", 2.0), ("0us", 0.0)])
def test_parse_time(text, seconds):
    assert ec.parse_time(text, "--delay") == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["1", "ms", "-1ms", "nanms", "1e9s", "1 hour", "fast", ""])
def test_parse_time_rejects_with_the_flag_and_value_in_the_message(text):
    with pytest.raises(ec.ClusterError) as e:
        ec.parse_time(text, "--jitter")
    assert str(e.value).startswith(f"--jitter {text!r}:") and "500us" in str(e.value)


@pytest.mark.parametrize("text, percent", [("0.1%", 0.1), ("0.1", 0.1), (" 5 % ", 5.0),
                                           ("100%", 100.0), ("0", 0.0), (0.25, 0.25)])
def test_parse_loss(text, percent):
    assert ec.parse_loss(text) == percent


@pytest.mark.parametrize("text", ["-0.1%", "101%", "nan", "lots", "%", "0.1%%"])
def test_parse_loss_rejects_with_the_value_in_the_message(text):
    with pytest.raises(ec.ClusterError) as e:
        ec.parse_loss(text)
    assert str(e.value).startswith(f"--loss {text!r}:") and "0.1%" in str(e.value)


def test_loss_classifier_drops_the_share_asked_for():
    """The classic BPF program, interpreted here on the random numbers the kernel would draw:
    it drops exactly the numbers below loss x 2^32 (rounded: the share asked for to 2^-32)."""
    for percent in (0.1, 12.5, 50.0, 100.0):
        code = ec._loss_bytecode(percent).split(",")
        assert int(code[0]) == len(code) - 1
        prog = [tuple(int(w) for w in ins.split()) for ins in code[1:]]

        def dropped(rand):
            pc = 0
            while True:
                op, jt, jf, k = prog[pc]
                if op == 0x20:                       # ld [SKF_AD_OFF + SKF_AD_RANDOM]
                    assert k == (-4096 + 56) % 2 ** 32
                    a = rand
                elif op == 0x35:                     # jge #k
                    pc += jt if a >= k else jf
                elif op == 0x06:                     # ret #k: classid 1:2 drops, 0 passes
                    assert k in (0, 0x10002)
                    return k == 0x10002
                pc += 1
        cut = round(percent / 100 * 2 ** 32)
        for rand in (0, 1, int(cut) - 1, int(cut), int(cut) + 1, 2 ** 32 - 1):
            if 0 <= rand < 2 ** 32:
                assert dropped(rand) == (rand < cut), (percent, rand)


def test_constructor_rejects_bad_shapes():
    with pytest.raises(ec.ClusterError, match="--nodes 0"):
        ec.EmulatedCluster(nodes=0, prefix=PREFIX)
    with pytest.raises(ec.ClusterError, match="--prefix"):
        ec.EmulatedCluster(prefix="c8 t")
    with pytest.raises(ec.ClusterError, match="'slow'"):
        ec.EmulatedCluster(rate="slow", prefix=PREFIX)
    with pytest.raises(ec.ClusterError, match="--jitter 1ms: needs --delay"):
        ec.EmulatedCluster(jitter="1ms", prefix=PREFIX)
    with pytest.raises(ec.ClusterError, match="--delay 'bogus'"):
        ec.EmulatedCluster(delay="bogus", prefix=PREFIX)
    with pytest.raises(ec.ClusterError, match="--loss '150%'"):
        ec.EmulatedCluster(loss="150%", prefix=PREFIX)
    with pytest.raises(ec.ClusterError, match="--node 2: the cluster has nodes 0 to 1"):
        ec.EmulatedCluster(nodes=2, prefix=PREFIX).set_link(2, False)


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
    """make_cluster(nodes, rate, **link) → an up cluster of prefix PREFIX, torn down after the
    test."""
    made = []

    def make(nodes=2, rate="1gbit", **link):
        c = ec.EmulatedCluster(nodes=nodes, rate=rate, prefix=PREFIX, **link)
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
def test_up_that_fails_midway_leaves_nothing(netns_ok, monkeypatch):
    # tc rejects node 1's shaping only after the switch and node 0 exist
    shaping = ec._shaping

    def failing_for_node_1(ns, dev, *args):
        cmds = shaping(ns, dev, *args)
        return [c + ["bogus"] for c in cmds] if ns == f"{PREFIX}-n1" else cmds
    monkeypatch.setattr(ec, "_shaping", failing_for_node_1)
    c = ec.EmulatedCluster(nodes=2, rate="1gbit", prefix=PREFIX)
    try:
        with pytest.raises(ec.ClusterError, match="tc qdisc"):
            c.up()
        _assert_gone()
    finally:
        c.down()


def _qdiscs(where, dev):
    return subprocess.run(["ip", "netns", "exec", where, "tc", "qdisc", "show", "dev", dev],
                          capture_output=True, text=True).stdout


@pytest.mark.mpi
@pytest.mark.timeout(60)
def test_delay_and_jitter_add_netem_before_the_bucket(make_cluster):
    try:
        c = make_cluster(nodes=2, rate="1gbit", delay="1ms", jitter="0.5ms")
    except ec.ClusterError as e:
        if "netem" in str(e):
            pytest.skip(f"no netem in this kernel: {e}")
        raise
    for where, dev in ((c.ns(1), "eth0"), (c.switch, "p1")):
        qdisc = _qdiscs(where, dev)
        assert "netem 1: root" in qdisc and re.search(r"delay 1ms\s+500us", qdisc), qdisc
        assert "tbf 10: parent 1:1" in qdisc and "1Gbit" in qdisc, qdisc


def _root_counts(where, dev):
    """(packets sent, packets dropped) by the root qdisc of ``dev``."""
    text = subprocess.run(["ip", "netns", "exec", where, "tc", "-s", "-j", "qdisc", "show", "dev",
                           dev], capture_output=True, text=True, check=True).stdout
    root = [q for q in json.loads(text) if q.get("root")][0]
    return root["packets"], root["drops"]


BROADCASTS = """\
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)
for _ in range(4000):
    s.sendto(b"x", ("10.208.0.255", 9))
"""


@pytest.mark.mpi
@pytest.mark.timeout(60)
def test_loss_drops_the_share_asked_for_at_each_link_end(make_cluster):
    c = make_cluster(nodes=2, rate="1gbit", loss="10%")
    for where, dev in ((c.ns(0), "eth0"), (c.switch, "p1")):
        qdisc = _qdiscs(where, dev)
        assert "htb 1: root" in qdisc and "pfifo 2: parent 1:2 limit 0p" in qdisc, qdisc
        assert "tbf 10: parent 1:1" in qdisc and "1Gbit" in qdisc, qdisc
    before = _root_counts(c.ns(0), "eth0")
    # broadcasts need no neighbour (ARP) answer, so every one of them reaches the qdisc
    subprocess.run(c.in_node(0, [sys.executable, "-c", BROADCASTS]), check=True, timeout=30)
    sent, dropped = (a - b for a, b in zip(_root_counts(c.ns(0), "eth0"), before))
    n = sent + dropped
    assert n >= 4000
    # binomial(n, 0.1): a standard deviation of about 19 packets; 5 of them either way
    assert abs(dropped - 0.1 * n) < 5 * (n * 0.1 * 0.9) ** 0.5, (dropped, n)
    assert c.losses()[c.host(0)] >= dropped


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
def test_dilation_needed_gives_each_process_a_core_once_they_outnumber_the_cores():
    assert ec.dilation_needed(1, cores=2) == ec.dilation_needed(2, cores=2) == 1.0
    for p in (3, 4, 8, 16):
        k = ec.dilation_needed(p, cores=2)
        assert p / k <= ec.CORE_SHARE * 2 < p / (k - 0.5), (p, k)   # sound, and the least so


def test_dilation_slows_the_links_tc_rate_delay_and_jitter_by_k(monkeypatch):
    """What tc is told (no kernel needed): rate / k; delay and jitter x k."""
    sent = []
    monkeypatch.setattr(ec, "_sh", lambda args, check=True, capture=False: sent.append(args))
    c = ec.EmulatedCluster(nodes=2, rate="1gbit", delay="50us", jitter="10us", dilation=4,
                           prefix=PREFIX)
    c._shape("ns", "dev")
    netem = [a for a in sent if "netem" in a][0]
    assert netem[netem.index("delay") + 1:][:2] == ["200us", "40us"], netem
    tbf = [a for a in sent if "tbf" in a][0]
    assert tbf[tbf.index("rate") + 1] == "250000000bit", tbf


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
        c = make_cluster(nodes=2, rate="1gbit", dilation=4)
    except ec.ClusterError as e:
        if "cgroup" in str(e):
            pytest.skip(f"no CPU cgroups here: {e}")
        raise
    # the link: rate / 4 on both ends
    for where, dev in ((c.ns(1), "eth0"), (c.switch, "p1")):
        qdisc = subprocess.run(["ip", "netns", "exec", where, "tc", "qdisc", "show", "dev", dev],
                               capture_output=True, text=True).stdout
        assert "250Mbit" in qdisc, qdisc
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
        c = make_cluster(nodes=2, rate="1gbit", loss="1%", cpu_groups=True)
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


# --- a link that is not clean, and one that goes down -----------------------------------------
# digits on 2 nodes of one process each: the solver says so (processes_per_node: 1), so a run of
# 2 processes on one machine sums in the same order and gives the same bytes as one across the
# emulated nodes, whatever carries them.
ITERS = 60


def two_node_solver(folder):
    """The digits solver for 2 one-process nodes, ITERS iterations, binary-proto snapshots every
    20, a 2 s comm.stall_timeout; returns its path (snapshots in folder/snap/)."""
    return write_solver(folder, max_iter=ITERS, display=20, test_interval=ITERS, test_iter=[2],
                        snapshot=20, snapshot_format="BINARYPROTO",
                        comm=dict(processes_per_node=1, warmup_fp32_iters=5,
                                  quantile_interval=10, consistency_check_interval=20,
                                  stall_timeout=2))


def train_argv(python, solver, *flags):
    return [python, "-m", "caffe8.cli", "train", "--solver", str(solver), *flags]


def final_model(folder):
    with open(os.path.join(str(folder), "snap", f"digits_iter_{ITERS}.caffemodel"), "rb") as f:
        return f.read()


def run_on_one_machine(python, folder, cwd):
    """``mpiexec -n 2`` of two_node_solver beside ``python`` (its venv's MPI); (status, log)."""
    solver = two_node_solver(folder)
    mpiexec = os.path.join(os.path.dirname(python), "mpiexec")
    # Open MPI refuses root unless told (harmless to the others)
    env = dict(os.environ, PYTHONPATH=REPO, OMPI_ALLOW_RUN_AS_ROOT="1",
               OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    r = subprocess.run([mpiexec, "-n", "2"] + train_argv(python, solver), cwd=str(cwd), env=env,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
    return r.returncode, r.stdout


@pytest.fixture(scope="session")
def reference_model(digits_root, tmp_path_factory):  # noqa: F811
    """The final model of the 2-process digits run under MPICH on one machine, no link."""
    pytest.importorskip("mpi4py")
    folder = tmp_path_factory.mktemp("reference")
    rc, log = run_on_one_machine(sys.executable, folder, digits_root)
    assert rc == 0, log[-3000:]
    return final_model(folder)


def run_on_cluster(cluster, folder, cwd, *flags, python=sys.executable, timeout=100):
    """two_node_solver trained on ``cluster`` (one process a node) by ``python`` and the
    mpiexec beside it; (status, log)."""
    solver = two_node_solver(folder)
    log = os.path.join(str(folder), "train.log")
    with open(log, "w") as f:
        rc = cluster.run(train_argv(python, solver, *flags), ppn=1, timeout=timeout,
                         env={"PYTHONPATH": REPO}, stdout=f, cwd=str(cwd),
                         mpiexec=os.path.join(os.path.dirname(python), "mpiexec"))
    with open(log) as f:
        return rc, f.read()


@pytest.mark.mpi
@pytest.mark.timeout(150)
@pytest.mark.parametrize("link", [dict(loss="1%"), dict(delay="1ms", jitter="0.5ms", loss="0.1%")],
                         ids=["loss 1%", "delay 1ms +- 0.5ms, loss 0.1%"])
def test_a_lossy_link_ends_training_with_the_clean_bytes(make_cluster, digits_root,  # noqa: F811
                                                          reference_model, tmp_path, link):
    """TCP resends what the link drops and reorders: the same model, byte for byte."""
    try:
        c = make_cluster(nodes=2, rate="1gbit", **link)
    except ec.ClusterError as e:
        if "netem" in str(e):
            pytest.skip(f"no netem in this kernel: {e}")
        raise
    rc, log = run_on_cluster(c, tmp_path, digits_root)
    assert rc == 0, log[-3000:]
    assert "2 processes on 2 nodes" in log, log[-3000:]
    lost = c.losses()
    assert all(n > 0 for n in lost.values()) or link["loss"] == "0.1%", lost  # it did lose
    assert final_model(tmp_path) == reference_model


@pytest.mark.mpi
@pytest.mark.timeout(150)
def test_a_pulled_link_ends_the_job_in_one_line_and_its_snapshot_resumes(
        make_cluster, digits_root, reference_model, tmp_path):  # noqa: F811
    """Node 1's cable pulled after the first snapshot: rank 0's watchdog names rank 1 after
    comm.stall_timeout (2 s) and the job ends, no hang; with the link back, ``--snapshot latest``
    resumes from the last snapshot and ends with the bytes of a run that never lost its link."""
    c = make_cluster(nodes=2, rate="1gbit")
    first = tmp_path / "snap" / "digits_iter_20.caffemodel"
    pulled = []

    def pull():
        deadline = time.monotonic() + 60
        while not first.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        c.set_link(1, False)
        pulled.append(time.monotonic())
    puller = threading.Thread(target=pull, daemon=True)
    puller.start()
    rc, log = run_on_cluster(c, tmp_path, digits_root)
    ended = time.monotonic()
    puller.join()
    assert rc != 0 and first.exists(), log[-3000:]
    errors = [line for line in log.splitlines() if "error" in line.lower()]
    assert len(errors) == 1, log[-3000:]
    assert errors[0].startswith("[rank 0] caffe8: error:") and "comm.stall_timeout 2 s" in \
        errors[0] and "waiting for rank 1 does not answer" in errors[0], errors
    # stall_timeout, the census's grace (2 s at least), up to 3 s for the ranks to agree on a
    # clean end (rank 1 never does), MPI_Abort; slack for a loaded machine
    assert ended - pulled[0] < 2 + 2 + 3 + 5, ended - pulled[0]
    assert f"digits_iter_{ITERS}" not in log  # it did end early
    c.set_link(1, True)
    rc, log = run_on_cluster(c, tmp_path, digits_root, "--snapshot", "latest")
    assert rc == 0, log[-3000:]
    assert re.search(r"Latest complete snapshot of .*: iteration (20|40) ", log), log[-3000:]
    assert final_model(tmp_path) == reference_model


@pytest.mark.mpi
@pytest.mark.timeout(60)
def test_exec_runs_a_real_clusters_hostfile_command_as_written(make_cluster, tmp_path):
    """In ``exec``'s node-0 shell, Hydra's ``mpiexec -f hosts`` reaches the other node as it
    would over ssh: one process on each host the file names."""
    c = make_cluster(nodes=2)
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    line = (f"printf '{PREFIX}-node0:1\\n{PREFIX}-node1:1\\n' > hosts && "
            f"{mpiexec} -f hosts -ppn 1 -n 2 hostname")
    out = tmp_path / "out"
    with open(out, "w") as f:
        assert c.exec(["sh", "-c", line], stdout=f, cwd=str(tmp_path), timeout=45) == 0
    assert sorted(out.read_text().split()) == [f"{PREFIX}-node0", f"{PREFIX}-node1"]
    for i in range(2):
        assert _pids(c.ns(i)) == []  # nothing left behind
