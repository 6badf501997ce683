"""An emulated cluster on one machine: N nodes as network namespaces behind a shaped switch
(``caffe8 cluster up|run|counters|down``, the command line: ``caffe8.tools.cluster``).

Each node is a network namespace ``<prefix>-n<i>`` whose only link, ``eth0`` (address
10.208.0.<i+1>/24 by default), goes to port ``p<i>`` of a bridge in a switch namespace
``<prefix>-sw``. Both ends of every link are shaped with ``tc`` (a token bucket at ``--rate``,
optionally after a netem ``--delay``), so each node sends and receives at most ``--rate``, as a
port of a real switch. Every process a node runs is started in a UTS namespace of its own whose
hostname is the node's name (``<prefix>-node<i>``); ``/etc/netns/<ns>/hosts`` (which
``ip netns exec`` mounts over ``/etc/hosts``) maps the node names to their addresses. No address
outside the namespaces this module creates is ever configured or used.

``run`` starts MPICH's ``mpiexec`` (Hydra) in node 0 with ``-hosts`` naming every node and
``-launcher ssh -launcher-exec`` a small script that starts Hydra's proxy inside the named
node's namespace instead of over ssh. MPICH then sees N hosts of ``--ppn`` processes; ranks of
one node talk through shared memory, ranks of different nodes through TCP over the shaped link:
``UCX_TLS=tcp`` and ``FI_PROVIDER=tcp`` (without them UCX would find the other "node"'s memory
on the same machine and never use the link) and ``UCX_NET_DEVICES=eth0``. On a real cluster the
same job needs only the launcher's own host list (``-hosts``/``-f hostfile``, or Slurm's
``srun``) and, where several networks exist, the interface and transport selection
(docs/MPI.md, "Across nodes").

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
            "GLOO_SOCKET_IFNAME": IFACE}

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


def _shaping(ns, dev, rate_bps, delay):
    """tc commands: a token bucket at ``rate_bps`` on ``dev``'s egress (after netem ``delay``).

    The bucket holds 2 ms of traffic (at least 256 KiB, above a veth's 64 KiB GSO packets), so
    the shaper does not itself cap the rate below ``rate_bps``; the queue holds 50 ms."""
    burst = max(int(rate_bps / 8 * 0.002), 256 * 1024)
    tbf = ["tbf", "rate", f"{int(rate_bps)}bit", "burst", str(burst), "latency", "50ms"]
    tc = ["ip", "netns", "exec", ns, "tc", "qdisc", "replace", "dev", dev]
    if not delay:
        return [tc + ["root", "handle", "1:"] + tbf]
    return [tc + ["root", "handle", "1:", "netem", "delay", delay],
            tc + ["parent", "1:1", "handle", "10:"] + tbf]


class EmulatedCluster:
    """N network-namespace nodes on a shaped switch; ``up()``/``down()`` or a ``with`` block."""

    def __init__(self, nodes=2, rate="10gbit", delay="", prefix=DEFAULT_PREFIX,
                 subnet=DEFAULT_SUBNET):
        if not 1 <= int(nodes) <= 250:
            raise ClusterError(f"--nodes {nodes}: expected 1 to 250")
        if not prefix.replace("-", "").isalnum() or len(prefix) > 8:
            raise ClusterError(f"--prefix {prefix!r}: up to 8 letters, digits or '-'")
        self.nodes, self.rate, self.delay = int(nodes), str(rate), str(delay or "")
        self.rate_bps = parse_rate(rate)
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
        return cls(state["nodes"], state["rate"], state["delay"], prefix, state["subnet"])

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
                for cmd in _shaping(where, dev, self.rate_bps, self.delay):
                    _sh(cmd)
            etc = os.path.join(NETNS_ETC, ns)
            os.makedirs(etc, exist_ok=True)
            with open(os.path.join(etc, "hosts"), "w", encoding="utf-8") as f:
                f.write(hosts)
            with open(os.path.join(etc, "hostname"), "w", encoding="utf-8") as f:
                f.write(self.host(i) + "\n")
        self._write_launcher()
        with open(os.path.join(self.state_dir, "state.json"), "w", encoding="utf-8") as f:
            json.dump({"nodes": self.nodes, "rate": self.rate, "delay": self.delay,
                       "subnet": self.subnet}, f)

    def _write_launcher(self):
        """Hydra's ``-launcher-exec``: called as ``launch -x HOST COMMAND...`` (ssh's form), it
        runs COMMAND with ``sh -c`` (as sshd would) inside HOST's namespace and hostname."""
        cases = "".join(f"  {self.host(i)}) ns={self.ns(i)} ;;\n" for i in range(self.nodes))
        script = (
            "#!/bin/sh\n"
            "# Written by caffe8.cluster: Hydra's ssh launcher, into a namespace.\n"
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
        ``-genv`` variables; ``mpmd``: ``argv`` is mpiexec's MPMD form (``-n 1 CMD : -n 1 ...``),
        which sets the process count itself."""
        mpiexec = mpiexec or default_mpiexec()
        if shutil.which(mpiexec) is None:
            raise ClusterError("no mpiexec beside this python or on PATH: run the venv's caffe8 "
                               "(.venv/bin/caffe8), whose python has the mpich wheel")
        hosts = ",".join(f"{self.host(i)}:{ppn}" for i in range(self.nodes))
        cmd = [mpiexec, "-launcher", "ssh", "-launcher-exec", self.launcher, "-hosts", hosts]
        if not mpmd:
            cmd += ["-n", str(self.nodes * ppn)]
        for key, value in {**LINK_ENV, **(env or {})}.items():
            cmd += ["-genv", key, str(value)]
        return self.in_node(0, cmd + list(argv))

    def run(self, argv, ppn=1, timeout=None, env=None, stdout=None, mpiexec=None, mpmd=False,
            cwd=None, process_env=None):
        """Run ``argv`` as an MPI job on every node (``ppn`` each); returns the exit status.
        ``cwd`` / ``process_env``: the job's working folder and environment (default ours).

        Ctrl-C, a timeout or any error kills the whole job (every process in the namespaces)."""
        cmd = self.mpiexec_argv(argv, ppn, mpiexec, env, mpmd)
        proc = subprocess.Popen(cmd, stdout=stdout, stderr=subprocess.STDOUT if stdout else None,
                                cwd=cwd, env=process_env, start_new_session=True)
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise ClusterError(f"the job ran past {timeout} s and was killed: "
                               f"{' '.join(argv[:6])} ...") from None
        finally:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
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


def default_mpiexec():
    """The mpiexec beside this python (the venv's mpich wheel), else the one on PATH."""
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    return here if os.path.exists(here) else (shutil.which("mpiexec") or here)
