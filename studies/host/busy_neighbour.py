"""What a busy neighbour costs: ``caffe8 time`` (and optionally a single-process ``caffe8 train``,
BVLC Caffe's ``caffe time``) beside 0, 1, 2 ... processes that spin on a core, interleaved.

Usage (repository root)::

    python -m studies.host.busy_neighbour --model prototxt/fashion_mnist/lenet_train_test.prototxt \
        --busy 0,1,2 --rounds 3 --iterations 50 --out docs/figures/threads/busy.csv \
        [--caffe /path/to/build/tools/caffe] [--solver S --train-iters 300]

Each round runs every (tool, busy count) once, in the same order, so the tools see the same
machine; a busy neighbour is a Python process spinning ``while True: pass``, started before the
measured command and killed after it. Variants: ``caffe8`` (adaptive BLAS threads, the default),
``caffe8-fixed`` (CAFFE8_ADAPT_THREADS=0: the thread count of before) and ``caffe`` when
``--caffe`` names a BVLC build. Prints and writes one row per run (tool, busy, round, ms), then
the median per (tool, busy) and its ratio to the same tool's quiet median.
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import time

from studies._runs import REPO, write_rows

FIELDS = ("tool", "busy", "round", "ms", "load_1min")
_TIME = re.compile(r"Average Forward-Backward: ([0-9.]+) ms")
_GLOG_T = re.compile(r"^[IWEF]\d{4,8} (\d\d):(\d\d):(\d\d\.\d+)")


def _spinners(n):
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def _stop(procs):
    for p in procs:
        p.kill()
    for p in procs:
        p.wait()


def _seconds(line):
    m = _GLOG_T.match(line)
    return int(m.group(1)) * 3600 + int(m.group(2)) * 60 + float(m.group(3)) if m else None


def train_ms(output, iters):
    """Milliseconds per iteration of a training log: from 'Solving' to 'Optimization Done'."""
    start = end = None
    for line in output.splitlines():
        if start is None and "Solving" in line:
            start = _seconds(line)
        elif "Optimization Done" in line:
            end = _seconds(line) if end is None else end
    if start is None or end is None:
        raise RuntimeError("no 'Solving' ... 'Optimization Done' lines in the training output")
    return (end - start) % 86400 * 1000.0 / iters


def time_ms(output):
    """Forward-backward milliseconds of a ``caffe time`` / ``caffe8 time`` output."""
    found = _TIME.findall(output)
    if not found:
        raise RuntimeError("no 'Average Forward-Backward' line in:\n" + output[-2000:])
    return float(found[-1])


def commands(args):
    """{tool: (argv, extra environment, parser)} of the variants to measure."""
    c8 = [sys.executable, "-m", "caffe8.cli"]
    timing = ["time", "-model", args.model, "-iterations", str(args.iterations)]
    out = {"caffe8": (c8 + timing, {}, time_ms),
           "caffe8-fixed": (c8 + timing, {"CAFFE8_ADAPT_THREADS": "0"}, time_ms)}
    if args.caffe:
        out["caffe"] = ([args.caffe] + timing, {"OPENBLAS_CORETYPE": None}, time_ms)
    if args.solver:
        def parse(text):
            return train_ms(text, args.train_iters)
        out["caffe8-train"] = (c8 + ["train", "-solver", args.solver], {}, parse)
    return out


def run_once(argv, env_changes, parse, busy, timeout):
    env = dict(os.environ)
    for k, v in env_changes.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    spin = _spinners(busy)
    try:
        time.sleep(0.5)   # let the neighbours take their cores
        proc = subprocess.run(argv, env=env, cwd=REPO, capture_output=True, text=True,
                              timeout=timeout)
    finally:
        _stop(spin)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {proc.returncode}:\n{proc.stderr[-2000:]}")
    return parse(proc.stdout + proc.stderr)


def summarise(rows):
    """[(tool, busy, median ms, ratio to the tool's quiet median)]."""
    out = []
    for tool in dict.fromkeys(r["tool"] for r in rows):
        med = {}
        for busy in sorted({r["busy"] for r in rows if r["tool"] == tool}):
            med[busy] = statistics.median(r["ms"] for r in rows
                                          if r["tool"] == tool and r["busy"] == busy)
        quiet = med.get(0)
        for busy, ms in med.items():
            out.append((tool, busy, ms, ms / quiet if quiet else float("nan")))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m studies.host.busy_neighbour",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="net for `time` (TRAIN phase)")
    ap.add_argument("--busy", default="0,1,2", help="neighbour counts, comma separated")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--iterations", type=int, default=50)
    ap.add_argument("--caffe", help="BVLC Caffe's caffe binary, to measure it beside caffe8")
    ap.add_argument("--solver", help="also time a single-process `caffe8 train` of this solver")
    ap.add_argument("--train-iters", type=int, default=0,
                    help="the solver's max_iter (for ms per iteration of --solver)")
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--out", required=True, help="CSV of every run")
    args = ap.parse_args(argv)
    if args.solver and args.train_iters < 1:
        ap.error("--solver needs --train-iters (its max_iter)")
    busy_counts = [int(b) for b in args.busy.split(",")]
    rows = []
    for rnd in range(args.rounds):
        for busy in busy_counts:
            for tool, (cmd, env, parse) in commands(args).items():
                ms = run_once(cmd, env, parse, busy, args.timeout)
                load = os.getloadavg()[0]
                rows.append({"tool": tool, "busy": busy, "round": rnd, "ms": round(ms, 3),
                             "load_1min": round(load, 2)})
                print(f"round {rnd} busy {busy} {tool:14s} {ms:9.2f} ms  (load {load:.2f})",
                      flush=True)
    write_rows(rows, FIELDS, args.out)
    print(f"{'tool':14s} busy  median ms  x quiet")
    for tool, busy, ms, ratio in summarise(rows):
        print(f"{tool:14s} {busy:4d} {ms:10.2f} {ratio:8.2f}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
