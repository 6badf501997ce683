"""The scaling sweep of Oyama et al.'s figure 7 (weak_scaling.py, strong_scaling.py): for every
codec, mode and P, a copy of the solver trained under ``mpiexec`` with per-rank timing logs, the
CSV of iteration times, throughput and speedup, and the throughput/speedup plot. The runs
themselves (prototxt copies, ``mpiexec`` with a timeout, timing logs) are studies._runs'."""
import os
import sys

from caffe8.engine.errors import CaffeError
from studies._runs import (REPO, _default_mpiexec, comm_settings, int_list, iteration_walls,
                           load_train_net, net_batch_size, pyplot, read_timing_log, run_job,
                           save_figure, train_command, write_rows, write_run_prototxts)


# The codec registry (comm.codecs.CODECS) says fp32/fp16; the paper says float/half.
CODEC_ALIASES = {"float": "fp32", "float32": "fp32", "half": "fp16", "float16": "fp16"}


CSV_FIELDS = ("mode", "p", "codec", "async", "processes_per_node", "batch_per_process",
              "global_batch", "iterations", "mean_iter_s", "median_iter_s", "stat",
              "throughput_samples_s", "speedup",
              "load_1min", "run_dir")


def bool_list(text):
    """"false,true" → [False, True] (also sync/async, 0/1)."""
    table = {"false": False, "0": False, "sync": False, "true": True, "1": True, "async": True}
    try:
        return [table[v.strip().lower()] for v in text.split(",") if v.strip()]
    except KeyError as e:
        raise ValueError(f"expected false/true (or sync/async), got {e.args[0]!r}") from None


def codec_list(text):
    return [CODEC_ALIASES.get(c.strip().lower(), c.strip().lower()) for c in text.split(",")
            if c.strip()]


def emulate_spec(text):
    """"gru1=2:4,gru2=1.5:3" → {"gru1": (2.0, 4.0), "gru2": (1.5, 3.0)} (forward:backward ms)."""
    out = {}
    for item in (t for t in (text or "").split(",") if t.strip()):
        name, _, times = item.partition("=")
        fwd, _, bwd = times.partition(":")
        try:
            out[name.strip()] = (float(fwd), float(bwd))
        except ValueError:
            raise ValueError(f"--emulate expects LAYER=FWD_MS:BWD_MS, got {item!r}") from None
    return out


def run_tag(p, codec, asynchronous):
    """Folder name of a sweep point; p = 1 has no exchange at all, so one baseline ("p1")."""
    return "p1" if p == 1 else f"p{p}_{codec}_{'async' if asynchronous else 'sync'}"


def run_point(args, p, codec, asynchronous, batch, rep=0):
    """Train once on ``p`` processes; return ({iteration: seconds}, run folder, processes per
    node, 1-minute load average when it started). Repeat ``rep`` > 0 of a point goes to
    ``<point folder>/rep<rep>`` (with --repeats > 1 every repeat has its own folder)."""
    ppn = min(args.processes_per_node, p) if args.processes_per_node else 0
    if ppn and p % ppn:
        raise CaffeError(f"--processes-per-node {ppn} does not divide p = {p}")
    tag = run_tag(p, codec, asynchronous)
    run_dir = os.path.join(args.out, tag, f"rep{rep}") if args.repeats > 1 else \
        os.path.join(args.out, tag)
    solver = write_run_prototxts(args.solver, run_dir, batch, codec, asynchronous, ppn,
                                 args.max_iter, emulate_spec(args.emulate),
                                 comm_settings(args.comm_set))
    logs = [os.path.join(run_dir, f"timing.r{rank}.jsonl") for rank in range(p)]
    cmd = train_command(p, solver, logs, args.python, args.mpiexec)
    print(f"[{os.path.relpath(run_dir, args.out)}] {' '.join(cmd[:8])} ...", flush=True)
    # On a shared machine the other jobs' load is the main source of noise: keep it with the run.
    load = os.getloadavg()[0]
    run_job(cmd, args.timeout, os.path.join(run_dir, "train.log"))
    records = [rec for path in logs for rec in read_timing_log(path)]
    walls = iteration_walls(records, args.skip)
    if not walls:
        raise CaffeError(f"{run_dir}: no timing records after skipping {args.skip} iteration(s); "
                         f"raise --max-iter")
    return walls, run_dir, ppn, load


def mean_median(values):
    """(mean, median) of a non-empty sequence."""
    v = sorted(values)
    mid = len(v) // 2
    return sum(v) / len(v), (v[mid] if len(v) % 2 else (v[mid - 1] + v[mid]) / 2)


# --- the sweep, its CSV and its plot (Oyama et al.'s figure 7) -----------------------------------------
def build_parser(description, mode):
    import argparse
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--solver",
                    default=os.path.join(REPO, "prototxt", "gru", "solver_small.prototxt"),
                    help="solver prototxt to copy (default: the small GRU net)")
    ap.add_argument("--out", required=True, help="output folder (run copies, logs, CSV, PNG)")
    ap.add_argument("--procs", type=int_list, default=[1, 2, 4], help="process counts, e.g. 1,2,4")
    ap.add_argument("--codecs", type=codec_list, default=["fp32", "fp8"],
                    help="exchange codecs (fp32/float32, fp16/half, fp8, ...)")
    ap.add_argument("--async", dest="async_modes", type=bool_list, default=[False],
                    help="communication modes: false, true or false,true (comm.async)")
    ap.add_argument("--processes-per-node", type=int, default=2,
                    help="comm.processes_per_node: p=4 with 2 is two emulated nodes of 2 (0: auto)")
    ap.add_argument("--max-iter", type=int, default=20, help="iterations per run")
    ap.add_argument("--skip", type=int, default=3, help="warm-up iterations left out of the means")
    ap.add_argument("--repeats", type=int, default=1,
                    help="runs per point, round robin over the points; iterations are pooled")
    ap.add_argument("--stat", choices=("mean", "median"), default="mean",
                    help="iteration time behind throughput and speedup (Oyama et al. use the median)")
    if mode == "weak":
        ap.add_argument("--batch", type=int, default=0,
                        help="per-process batch (default: the net's own)")
    else:
        ap.add_argument("--global-batch", type=int, default=0,
                        help="global batch, divided by p (default: the net's own batch)")
    ap.add_argument("--emulate", default="",
                    help="EmulatedCompute after layers: LAYER=FWD_MS:BWD_MS,... (GPU-like compute)")
    ap.add_argument("--comm-set", default="",
                    help="more comm block fields, FIELD=VALUE,... (e.g. algorithm=hierarchical)")
    ap.add_argument("--timeout", type=float, default=300,
                    help="seconds per run before it is killed")
    ap.add_argument("--python", default=sys.executable, help="python that runs caffe8.cli")
    ap.add_argument("--mpiexec", default=_default_mpiexec(), help="mpiexec to launch with")
    ap.add_argument("--title", default="", help="plot title")
    return ap


def batch_for(mode, args, net_batch, p):
    """Per-process batch of a run on p processes: fixed (weak) or global / p (strong)."""
    if mode == "weak":
        return args.batch or net_batch
    total = args.global_batch or net_batch
    if total % p:
        raise CaffeError(f"global batch {total} is not divisible by p = {p} (strong scaling)")
    return total // p


def sweep(args, mode):
    """Run every (codec, async, p) ``--repeats`` times; return (CSV rows, failures).

    p = 1 is Oyama et al.'s baseline (one process, no MPI communication at all), so it runs once per
    repeat and heads every series; speedup = throughput / baseline throughput. Repeats go round
    robin over all points, so a burst of load from other jobs hits every point alike; a point's
    statistics pool the iterations of all its repeats.
    """
    _, net = load_train_net(args.solver)
    net_batch = net_batch_size(net)
    points = [(1, args.codecs[0], False)] + [
        (p, codec, asynchronous) for codec in args.codecs for asynchronous in args.async_modes
        for p in sorted(set(args.procs)) if p > 1]
    done, failures = {}, []
    for rep in range(args.repeats):
        for point in points:
            if point in done and done[point] is None:
                continue   # failed before: do not retry it every repeat
            try:
                walls, _, ppn, load = run_point(args, *point, batch_for(mode, args, net_batch,
                                                                        point[0]), rep)
            except CaffeError as e:
                done[point] = None
                failures.append(point + (str(e),))
                print(f"FAILED p={point[0]} codec={point[1]} async={point[2]}:\n{e}",
                      file=sys.stderr)
                continue
            acc = done.setdefault(point, {"walls": [], "loads": [], "ppn": ppn})
            acc["walls"] += list(walls.values())
            acc["loads"].append(load)
    if done.get(points[0]) is None:
        raise CaffeError("the one-process baseline run failed; see the message above")
    return _rows(args, mode, net_batch, points, done), failures


def _rows(args, mode, net_batch, points, done):
    """CSV rows, one per (codec, async, p), the baseline repeated at the head of each series."""
    pick = 0 if args.stat == "mean" else 1
    b1 = batch_for(mode, args, net_batch, 1)
    base = b1 / mean_median(done[points[0]]["walls"])[pick]
    rows = []
    for codec in args.codecs:
        for asynchronous in args.async_modes:
            for p in sorted(set([1] + list(args.procs))):
                point = points[0] if p == 1 else (p, codec, asynchronous)
                if done.get(point) is None:
                    continue
                acc, batch = done[point], batch_for(mode, args, net_batch, p)
                stats = mean_median(acc["walls"])
                rows.append({"mode": mode, "p": p, "codec": codec, "async": asynchronous,
                             "processes_per_node": acc["ppn"], "batch_per_process": batch,
                             "global_batch": batch * p, "iterations": len(acc["walls"]),
                             "mean_iter_s": stats[0], "median_iter_s": stats[1],
                             "stat": args.stat, "throughput_samples_s": batch * p / stats[pick],
                             "speedup": batch * p / stats[pick] / base,
                             "load_1min": sum(acc["loads"]) / len(acc["loads"]),
                             "run_dir": run_tag(*point)})
    return rows


def write_csv(rows, path, fields=CSV_FIELDS):
    """The scaling studies' CSV (floats to 9 significant digits)."""
    write_rows(rows, fields, path, digits=9)


def plot_scaling(rows, path, title=""):
    """Throughput and speedup vs processes, one line per (codec, async); ideal speedup = p."""
    plt = pyplot()
    fig, (ax_t, ax_s) = plt.subplots(1, 2, figsize=(10, 4))
    series = {}
    for row in rows:
        series.setdefault((row["codec"], row["async"]), []).append(row)
    for (codec, asynchronous), pts in series.items():
        pts = sorted(pts, key=lambda r: r["p"])
        label = codec + (" A" if asynchronous else "")
        ps = [r["p"] for r in pts]
        style = "--" if codec == "fp8" else "-"
        ax_t.plot(ps, [r["throughput_samples_s"] for r in pts], style, marker="o", label=label)
        ax_s.plot(ps, [r["speedup"] for r in pts], style, marker="o", label=label)
    all_p = sorted({r["p"] for r in rows})
    ax_s.plot(all_p, all_p, ":", color="grey", label="ideal")
    for ax, ylabel in ((ax_t, "throughput (samples/s)"), (ax_s, "speedup vs 1 process")):
        ax.set_xlabel("processes")
        ax.set_ylabel(ylabel)
        ax.set_xticks(all_p)
        ax.grid(alpha=0.3)
        ax.legend()
    if title:
        fig.suptitle(title)
    save_figure(fig, path, dpi=120)


def scaling_main(argv, mode, description):
    """Entry point shared by weak_scaling.py and strong_scaling.py."""
    ap = build_parser(description, mode)
    args = ap.parse_args(argv)
    if args.repeats < 1 or args.max_iter <= args.skip:
        ap.error("need --repeats >= 1 and --max-iter > --skip")
    os.makedirs(args.out, exist_ok=True)
    try:
        rows, failures = sweep(args, mode)
    except CaffeError as e:
        print(f"{mode}_scaling: error: {e}", file=sys.stderr)
        return 1
    csv_path = os.path.join(args.out, f"{mode}_scaling.csv")
    png_path = os.path.join(args.out, f"{mode}_scaling.png")
    write_csv(rows, csv_path)
    plot_scaling(rows, png_path, args.title or f"{mode} scaling: {os.path.basename(args.solver)}")
    for row in rows:
        print(f"p={row['p']} {row['codec']:5s} async={str(row['async']).lower():5s} "
              f"{row[args.stat + '_iter_s'] * 1e3:9.3f} ms/iter ({args.stat}) "
              f"{row['throughput_samples_s']:10.1f} "
              f"samples/s speedup {row['speedup']:.3f}")
    print(f"wrote {csv_path} and {png_path}")
    return 1 if failures else 0
