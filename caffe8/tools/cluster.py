"""``caffe8 cluster up|run|exec|link|counters|down``: an emulated cluster on this machine (as
root): N nodes as network namespaces on a switch whose links ``tc`` shapes to ``--rate`` (with
``--delay``, ``--jitter``, ``--loss``), the venv's mpiexec (MPICH, Open MPI or Intel MPI) over
TCP between them (``caffe8.cluster``; docs/MPI.md, "Across nodes")::

    caffe8 cluster up --nodes 2 --rate 1gbit [--delay 1ms --jitter 0.5ms] [--loss 0.1%] [--dilation 4]
    caffe8 cluster run --ppn 1 -- caffe8 train -solver S
    caffe8 cluster counters
    caffe8 cluster link --node 1 down      # pull node 1's cable (and 'up' to plug it back)
    caffe8 cluster exec [-- CMD]            # a shell (or CMD) in node 0, as on a login node
    caffe8 cluster down

    # or all three in one, always torn down afterwards (also on an error or Ctrl-C):
    caffe8 cluster run --nodes 2 --rate 10gbit --ppn 1 -- CMD ...

Everything after ``cluster`` reaches the tool unparsed (``RAW_ARGUMENTS``): the command after
``--`` is run exactly as given, its Caffe-style ``-flags`` included.
"""
import argparse
import signal
import sys

NAME = "cluster"
HELP = ("an emulated cluster of network namespaces on tc-shaped links, as root (up, run, exec, "
        "link, counters, down; caffe8 cluster --help lists them)")
GROUP = "cluster"
#: the dispatcher hands everything after the name to run() as args.rest
RAW_ARGUMENTS = True


def add_arguments(p):
    p.add_argument("rest", nargs=argparse.REMAINDER, help="the verb and its arguments")


def parser():
    """The verbs and their flags (``caffe8 cluster --help``)."""
    from caffe8.cluster import DEFAULT_PREFIX
    ap = argparse.ArgumentParser(
        prog="caffe8 cluster", description="An emulated cluster on one machine: N nodes as "
        "network namespaces behind a switch whose links tc shapes (needs root).")
    sub = ap.add_subparsers(dest="verb", required=True)
    shape = argparse.ArgumentParser(add_help=False)
    shape.add_argument("--nodes", type=int, default=None, help="nodes (default 2)")
    shape.add_argument("--rate", default=None, help="each link's rate, tc units (default 10gbit)")
    shape.add_argument("--delay", default="", help="one-way delay per link end (netem: 50us)")
    shape.add_argument("--jitter", default="", help="the delay varies by up to this either way, "
                       "uniformly (netem; needs --delay: --delay 1ms --jitter 0.5ms)")
    shape.add_argument("--loss", default="", help="percent of the packets each link end drops "
                       "at random (0.1%%; no netem needed)")
    shape.add_argument("--dilation", type=float, default=1.0,
                       help="time dilation k: each node capped at ppn/k CPU cores, links k "
                            "times slower (rate / k, delay x k); a job that also slows its "
                            "emulated compute k times and divides its times by k sees nodes "
                            "of a core per process (default 1: off)")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--prefix", default=DEFAULT_PREFIX, help="names of the namespaces")
    sub.add_parser("up", parents=[shape, common], help="create the cluster")
    sub.add_parser("down", parents=[common], help="kill its processes and remove it")
    sub.add_parser("counters", parents=[common], help="bytes sent/received per node link")
    link = sub.add_parser("link", parents=[common], help="take a node's link down (its cable "
                          "pulled) or up again")
    link.add_argument("--node", type=int, required=True, help="the node (0 to nodes-1)")
    link.add_argument("state", choices=("down", "up"))
    run_ = sub.add_parser("run", parents=[shape, common],
                          help="run CMD under mpiexec on every node (with any of --nodes, --rate, "
                               "--delay, --jitter, --loss given: up, run, down in one)")
    run_.add_argument("--ppn", type=int, default=1, help="processes per node")
    run_.add_argument("--timeout", type=float, default=None, help="seconds before it is killed")
    run_.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD ...")
    exec_ = sub.add_parser("exec", parents=[common], help="run CMD (default: a shell) in a node "
                           "as on a cluster's login node, where commands for a real cluster "
                           "(mpiexec -f HOSTFILE, mpirun --hostfile) run as written")
    exec_.add_argument("--node", type=int, default=0, help="the node (default 0)")
    exec_.add_argument("--timeout", type=float, default=None, help="seconds before it is killed")
    exec_.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD ...")
    return ap


def run(args):
    ap = parser()
    opts = ap.parse_args(args.rest)
    # SIGTERM (timeout(1), a batch system) ends the tool as Ctrl-C does, through the clean-up
    # that kills the job; by default it would end Python at once and leave the job running
    before = signal.signal(signal.SIGTERM, _interrupt)
    try:
        return _dispatch(opts, ap)
    except KeyboardInterrupt:
        print("caffe8 cluster: interrupted", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, before)


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def _dispatch(args, ap):
    import json
    import os
    import shlex
    from caffe8.cluster import EmulatedCluster
    shape = {}
    if args.verb in ("up", "run"):
        shape = dict(nodes=args.nodes or 2, rate=args.rate or "10gbit", delay=args.delay,
                     jitter=args.jitter, loss=args.loss, prefix=args.prefix,
                     dilation=args.dilation)
    if args.verb == "up":
        c = EmulatedCluster(**shape).up()
        print(f"up: {c.nodes} nodes ({', '.join(c.host(i) for i in range(c.nodes))}), "
              f"links {_link_words(c)}")
        return 0
    if args.verb == "down":
        removed, killed = EmulatedCluster(prefix=args.prefix).down()
        if removed:
            print(f"down: removed {len(removed)} namespaces ({', '.join(removed)}), killed "
                  f"{killed} processes")
        else:
            print(f"down: no emulated cluster '{args.prefix}' was up; nothing to remove")
        return 0
    if args.verb == "counters":
        print(json.dumps(EmulatedCluster.load(args.prefix).counters(), indent=1))
        return 0
    if args.verb == "link":
        c = EmulatedCluster.load(args.prefix)
        c.set_link(args.node, args.state == "up")
        print(f"link: {c.host(args.node)}'s link is {args.state}")
        return 0
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if args.verb == "exec":
        c = EmulatedCluster.load(args.prefix)
        return c.exec(cmd or [os.environ.get("SHELL") or "/bin/sh"], args.node, args.timeout)
    if not cmd:
        ap.error("run: give the command after --")
    # A one-shot run when the shape is given on the command line; else the cluster that is up.
    if any(v not in (None, "") for v in (args.nodes, args.rate, args.delay, args.jitter,
                                         args.loss)):
        with EmulatedCluster(**shape) as c:
            return c.run(cmd, args.ppn, args.timeout)
    c = EmulatedCluster.load(args.prefix)
    print(f"+ {' '.join(shlex.quote(a) for a in c.mpiexec_argv(cmd, args.ppn))}",
          file=sys.stderr)
    return c.run(cmd, args.ppn, args.timeout)


def _link_words(c):
    """"1gbit + 1ms ± 0.5ms delay + 0.1 % loss": the link as ``up`` made it."""
    words = c.rate
    if c.delay:
        words += f" + {c.delay}{' ± ' + c.jitter if c.jitter else ''} delay"
    words += f" + {c.loss:g} % loss" if c.loss else ""
    return words + (f", time dilated {c.dilation:g}x" if c.dilation > 1 else "")
