#!/usr/bin/env python
"""What a link that is not clean costs: the same training on 2 emulated nodes over a clean link
and over links with loss (and netem delay with jitter, where the kernel has netem), interleaved.

Usage (as root, from the repository root)::

    python -m studies.link_faults.penalty --links "clean;loss=0.1%;delay=1ms,jitter=0.5ms,loss=0.1%" \\
        --rate 1gbit --iters 30 --skip 5 --rounds 3 --out runs/link_penalty

Every round brings up a cluster (``caffe8.cluster``, ``--prefix`` c8p) for each link in turn, trains
``--solver`` on it (``--nodes`` nodes of one process, ``processes_per_node: 1``, ``max_iter``
``--iters``, one timing log per rank) and takes it down again, so a change in the machine's load
hits every link alike. A link is ``clean`` or comma-separated ``delay=``, ``jitter=``, ``loss=``
(``caffe8 cluster up``'s options); one the kernel cannot make (netem's delay where it lacks netem)
is reported and left out. Per run, over the iterations after ``--skip`` (the slowest rank's wall
time each): the mean, which is what a loss costs (a lost packet that no later one reveals waits
for TCP's retransmission timer, 200 ms at least, and stalls one iteration: the median hides
that), the median and the longest; the packets the link lost and what TCP did about them
(segments sent again, fast retransmits, tail loss probes, retransmission timeouts: counts that
the machine's load does not blur), the load average, and the md5 of the final model, which must
be the same on every link (TCP resends what is lost). Writes OUT/penalty.csv (one row per round
and link, then the medians over rounds with the ratio of the mean to the clean link's, and the
counts summed).
"""
import argparse
import hashlib
import os
import statistics
import sys

from caffe8.cluster import ClusterError, EmulatedCluster
from studies._runs import REPO, iteration_walls, read_timing_log, write_rows

FIELDS = ("round", "link", "mean_seconds", "median_seconds", "max_seconds", "ratio_to_clean",
          "lost_packets", "retransmitted", "fast_retransmits", "loss_probes", "timeouts",
          "load_average", "model_md5")
# TCP's own counts of what it did about the losses (the nodes' namespaces, fresh each run):
# segments sent again, of them by fast retransmit (three duplicate ACKs), tail loss probes,
# and retransmission timer expiries (each a stall of 200 ms or more, whatever the load)
TCP_COUNTERS = {"retransmitted": ("Tcp", "RetransSegs"),
                "fast_retransmits": ("TcpExt", "TCPFastRetrans"),
                "loss_probes": ("TcpExt", "TCPLossProbes"), "timeouts": ("TcpExt", "TCPTimeouts")}


def parse_link(text):
    """"loss=0.1%,delay=1ms" → {"loss": "0.1%", "delay": "1ms"}; "clean" → {}."""
    if text.strip() == "clean":
        return {}
    link = {}
    for part in text.split(","):
        key, _, value = part.partition("=")
        if key.strip() not in ("delay", "jitter", "loss") or not value.strip():
            raise SystemExit(f"--links: {part!r} is not delay=, jitter= or loss=")
        link[key.strip()] = value.strip()
    return link


def write_solver(solver, folder, iters):
    """A copy of ``solver`` (and of its net, beside it) with ``max_iter`` ``iters``, one
    process per emulated node, no test phase and one snapshot at the end, in ``folder``."""
    from caffe8.engine.prototxt import parse_file, to_text
    sp = parse_file(solver, "SolverParameter")
    net = sp.net if os.path.isabs(sp.net) else os.path.join(os.path.dirname(solver), sp.net)
    if not os.path.exists(net):
        net = os.path.join(REPO, sp.net)
    sp.net, sp.max_iter, sp.snapshot = os.path.abspath(net), iters, 0
    sp.snapshot_prefix = os.path.join(folder, "model")
    sp.test_interval, sp.display = 0, iters
    del sp.test_iter[:]
    sp.comm.processes_per_node = 1
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "solver.prototxt")
    with open(path, "w", encoding="utf-8") as f:
        f.write(to_text(sp))
    return path


def tcp_counters(cluster):
    """TCP_COUNTERS summed over the cluster's nodes (/proc/net/snmp and netstat are per
    network namespace)."""
    import subprocess
    total = dict.fromkeys(TCP_COUNTERS, 0)
    for i in range(cluster.nodes):
        text = subprocess.run(cluster.in_node(i, ["cat", "/proc/net/snmp", "/proc/net/netstat"]),
                              capture_output=True, text=True, check=True).stdout
        lines = [line.split() for line in text.splitlines()]
        table = {}
        for head, values in zip(lines[::2], lines[1::2]):   # a header line, then its values
            table.update({(head[0].rstrip(":"), k): int(v) for k, v in zip(head[1:], values[1:])})
        for key, where in TCP_COUNTERS.items():
            total[key] += table.get(where, 0)
    return total


def run_once(args, name, link, folder):
    """One training on a cluster with ``link``: ({mean, median, max seconds per iteration},
    {lost packets and TCP's counters}, md5)."""
    solver = write_solver(args.solver, folder, args.iters)
    logs = [os.path.join(folder, f"rank{r}.jsonl") for r in range(args.nodes)]
    mpmd = []
    for r, log in enumerate(logs):
        mpmd += ([":"] if r else []) + ["-n", "1", sys.executable, "-m", "caffe8.cli", "train",
                                        "--solver", solver, "--timing-log", log]
    with EmulatedCluster(nodes=args.nodes, rate=args.rate, prefix=args.prefix, **link) as cluster:
        with open(os.path.join(folder, "train.log"), "w", encoding="utf-8") as out:
            rc = cluster.run(mpmd, ppn=1, timeout=args.timeout, env={"PYTHONPATH": REPO},
                             stdout=out, mpmd=True, cwd=REPO)
        lost = sum(cluster.losses().values())
        tcp = tcp_counters(cluster)
    if rc != 0:
        raise SystemExit(f"{name}: training exited with {rc}; see {folder}/train.log")
    records = [r for log in logs for r in read_timing_log(log)]
    walls = list(iteration_walls(records, args.skip).values())
    times = dict(mean_seconds=statistics.fmean(walls), median_seconds=statistics.median(walls),
                 max_seconds=max(walls))
    with open(os.path.join(folder, f"model_iter_{args.iters}.caffemodel"), "rb") as f:
        md5 = hashlib.md5(f.read()).hexdigest()
    return times, dict(lost_packets=lost, **tcp), md5


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--solver", default=os.path.join(REPO, "prototxt", "digits",
                                                     "solver.prototxt"))
    ap.add_argument("--links", default="clean;loss=0.1%;delay=1ms,jitter=0.5ms,loss=0.1%",
                    help="';'-separated links: clean, or delay=, jitter=, loss= joined by ','")
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--rate", default="1gbit")
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--skip", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--out", default="runs/link_penalty")
    ap.add_argument("--prefix", default="c8p", help="the clusters' namespace prefix (one that "
                    "no other cluster on the machine uses)")
    args = ap.parse_args(argv)
    links = {text.strip(): parse_link(text) for text in args.links.split(";") if text.strip()}
    rows, times = [], {name: [] for name in links}
    for rnd in range(args.rounds):
        for name, link in list(links.items()):
            folder = os.path.abspath(os.path.join(args.out, f"round{rnd}", name.replace("/", "_")))
            try:
                seconds, lost, md5 = run_once(args, name, link, folder)
            except ClusterError as e:
                if "netem" not in str(e):
                    raise
                print(f"{name}: left out: {e}", flush=True)
                del links[name], times[name]
                continue
            times[name].append(seconds)
            rows.append(dict(round=rnd, link=name, load_average=os.getloadavg()[0],
                             model_md5=md5, **seconds, **lost))
            print(f"round {rnd} {name}: mean {seconds['mean_seconds']:.4f} s/iteration (median "
                  f"{seconds['median_seconds']:.4f}, longest {seconds['max_seconds']:.3f}), "
                  + ", ".join(f"{v} {k.replace('_', ' ')}" for k, v in lost.items())
                  + f", load {os.getloadavg()[0]:.1f}, model {md5}", flush=True)
    over_rounds = {name: {k: statistics.median(v[k] for v in values) for k in values[0]}
                   for name, values in times.items() if values}
    clean = over_rounds.get("clean", {}).get("mean_seconds")
    for name, seconds in over_rounds.items():
        ratio = seconds["mean_seconds"] / clean if clean else ""
        counts = {k: sum(r[k] for r in rows if r["link"] == name and r["round"] != "all")
                  for k in ("lost_packets",) + tuple(TCP_COUNTERS)}
        rows.append(dict(round="all", link=name, ratio_to_clean=ratio, **seconds, **counts))
        print(f"{name}: mean {seconds['mean_seconds']:.4f} s/iteration (medians over rounds)"
              + (f", {ratio:.3f}x the clean link's" if clean else ""))
    md5s = {r["model_md5"] for r in rows if r.get("model_md5")}
    print("final models: " + ("all the same bytes" if len(md5s) == 1 else f"DIFFER: {md5s}"))
    os.makedirs(args.out, exist_ok=True)
    write_rows(rows, FIELDS, os.path.join(args.out, "penalty.csv"))
    return 0 if len(md5s) == 1 else 1


if __name__ == "__main__":
    sys.exit(main())
