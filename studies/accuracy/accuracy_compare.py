#!/usr/bin/env python
"""Test accuracy of exchange variants side by side (Oyama et al.'s figures 8, 11 and 13).

Usage (from the repository root; the digits data path is relative to the CWD)::

    python -m studies.accuracy.accuracy_compare --out runs/acc --procs 4 --processes-per-node 2 \
        --variants fp32,fp8,fp8_direct,fp8_flat --max-iter 1000

Every variant trains the same solver (same ``random_seed``, same iterations, same test
schedule) under ``mpiexec -n P python -m caffe8.cli train --log OUT/<variant>/train.log``; only
the solver's ``comm`` block differs. A variant is a preset name (``PRESETS``) or
``NAME:field=value,field=value`` with fields of the ``comm`` block, e.g.
``fp8_q99:codec=fp8,quantile=0.99,warmup_fp32_iters=0``.

The glog lines are parsed back (``Iteration N, Testing net``, ``Test net output #k: accuracy =``,
``... loss =``): seconds are the glog timestamps measured from the run's ``Solving`` line.
Writes OUT/accuracy.csv (variant, iteration, seconds, test_accuracy, test_loss) and
OUT/accuracy.png (accuracy vs iteration and vs seconds, plus the final accuracy of each).
"""
import argparse
import csv
import datetime
import os
import re
import sys

from caffe8.engine.errors import CaffeError
from caffe8.engine.prototxt import parse_file, to_text
from caffe8.engine.schema import SCHEMA
from studies._runs import (REPO, _default_mpiexec, label_axes, pyplot, run_job, save_figure,
                           write_rows)

# Oyama et al.'s comparisons. warmup_fp32_iters 0 makes fp8 variants fp8 from the first iteration
# (a clean comparison); "fp8_warmup" keeps the solver's own warm-up.
PRESETS = {
    "fp32": {"codec": "fp32"},
    "fp16": {"codec": "fp16"},
    "fp8": {"codec": "fp8", "relative": True, "hierarchical": True, "warmup_fp32_iters": 0},
    "fp8_warmup": {"codec": "fp8", "relative": True, "hierarchical": True},
    "fp8_direct": {"codec": "fp8", "relative": False, "hierarchical": True,
                   "warmup_fp32_iters": 0},
    "fp8_flat": {"codec": "fp8", "relative": True, "hierarchical": False,
                 "warmup_fp32_iters": 0},
}
CSV_FIELDS = ("variant", "iteration", "seconds", "test_accuracy", "test_loss")

_GLOG = re.compile(r"^[IWEF](\d{4}) (\d\d):(\d\d):(\d\d)\.(\d{6}) +\d+ [^\]]*\] (.*)$")
_TESTING = re.compile(r"Iteration (\d+), Testing net \(#(\d+)\)")
_OUTPUT = re.compile(r"Test net output #\d+: (\S+) = ([-+0-9.eEinfa]+)")
_TEST_LOSS = re.compile(r"Test loss: ([-+0-9.eEinfa]+)")


# --- variants --------------------------------------------------------------------------------
def _typed(field, text):
    """The ``comm`` field's value from text, typed by the schema (bool/int/float/string)."""
    spec = SCHEMA["CommParameter"].get(field)
    if spec is None:
        raise ValueError(f"comm has no field '{field}'; valid: "
                         + ", ".join(sorted(SCHEMA["CommParameter"])))
    if spec.type == "bool":
        if text.lower() not in ("true", "false", "1", "0"):
            raise ValueError(f"comm.{field} is a bool, got {text!r}")
        return text.lower() in ("true", "1")
    if spec.type in ("float", "double"):
        return float(text)
    if spec.type.startswith(("int", "uint")):
        return int(text)
    return text


def parse_variants(text):
    """"fp32,fp8,x:codec=fp8,relative=false" → [(name, {comm field: value})].

    Items are split on commas; an item with '=' but no ':' continues the previous custom
    variant's field list.
    """
    variants = []
    for item in (t.strip() for t in text.split(",") if t.strip()):
        if ":" in item:
            name, _, first = item.partition(":")
            variants.append((name.strip(), {}))
            item = first
        elif "=" not in item:
            if item not in PRESETS:
                raise ValueError(f"unknown variant {item!r}; presets: {', '.join(PRESETS)} "
                                 f"(or NAME:field=value,...)")
            variants.append((item, dict(PRESETS[item])))
            continue
        if not variants or not item:
            continue
        field, _, value = item.partition("=")
        variants[-1][1][field.strip()] = _typed(field.strip(), value.strip())
    names = [n for n, _ in variants]
    if len(set(names)) != len(names):
        raise ValueError(f"variant names must be unique, got {names}")
    return variants


def write_variant_solver(solver_path, run_dir, comm_fields, max_iter, test_interval, ppn,
                         random_seed=None):
    """Copy of the solver in ``run_dir`` with the comm block changed; returns its path.

    The net path is made absolute (the copy lives elsewhere); data sources inside the net stay
    as they are, i.e. relative to the CWD as in Caffe. Snapshots are switched off.
    """
    from caffe8.engine.trainer import resolve_path
    solver = parse_file(solver_path, "SolverParameter")
    for field in ("net", "train_net"):
        if solver.has(field):
            setattr(solver, field, os.path.abspath(resolve_path(getattr(solver, field),
                                                                solver_path)))
    if solver.test_net:
        solver.test_net = [os.path.abspath(resolve_path(t, solver_path)) for t in solver.test_net]
    if max_iter:
        solver.max_iter = int(max_iter)
    if test_interval:
        solver.test_interval = int(test_interval)
    if random_seed is not None:
        solver.random_seed = int(random_seed)
    solver.snapshot = 0
    solver.snapshot_after_train = False
    comm = solver.comm
    comm.processes_per_node = int(ppn)
    for field, value in comm_fields.items():
        setattr(comm, field, value)
    os.makedirs(run_dir, exist_ok=True)
    out = os.path.join(os.path.abspath(run_dir), "solver.prototxt")
    with open(out, "w", encoding="utf-8") as f:
        f.write(to_text(solver))
    return out


# --- log parsing -----------------------------------------------------------------------------
def _stamp(match, year=2000):
    month, day = int(match.group(1)[:2]), int(match.group(1)[2:])
    h, m, s, us = (int(match.group(k)) for k in range(2, 6))
    return datetime.datetime(year, month, day, h, m, s, us)


def parse_test_log(lines, accuracy_blob="accuracy", loss_blob="loss"):
    """[{iteration, seconds, test_accuracy, test_loss}] of test net #0 in a glog-format log.

    ``seconds``: glog time of the "Testing net" line minus that of the first ``Solving`` line
    (or of the first glog line). The loss is ``Test loss:`` when the solver logs it, else the
    output blob ``loss_blob``; NaN when neither is there.
    """
    rows, start, current, solving_seen = [], None, None, False
    for line in lines:
        m = _GLOG.match(line.rstrip("\n"))
        if not m:
            continue
        when, msg = _stamp(m), m.group(6)
        if start is None or (msg.startswith("Solving ") and not solving_seen):
            start, solving_seen = when, solving_seen or msg.startswith("Solving ")
        t = _TESTING.search(msg)
        if t:
            current = None
            if t.group(2) == "0":
                current = {"iteration": int(t.group(1)),
                           "seconds": (when - start).total_seconds() % 86400.0,
                           "test_accuracy": float("nan"), "test_loss": float("nan")}
                rows.append(current)
            continue
        if current is None:
            continue
        lm = _TEST_LOSS.search(msg)
        if lm:
            current["test_loss"] = float(lm.group(1))
            current["_loss_line"] = True
            continue
        om = _OUTPUT.search(msg)
        if om and om.group(1) == accuracy_blob:
            current["test_accuracy"] = float(om.group(2))
        elif om and om.group(1) == loss_blob and not current.get("_loss_line"):
            current["test_loss"] = float(om.group(2))
    for row in rows:
        row.pop("_loss_line", None)
    return rows


# --- running, CSV, plot ----------------------------------------------------------------------
def train_command(p, solver, log_path, python, mpiexec):
    cmd = [python, "-m", "caffe8.cli", "train", "--solver", solver, "--log", log_path]
    return ([mpiexec, "-n", str(p)] + cmd) if p > 1 else cmd


def finished(log_path):
    """True when a training log reached its end ("Optimization Done")."""
    try:
        with open(log_path, encoding="utf-8") as f:
            return any("Optimization Done" in line for line in f)
    except OSError:
        return False


def run_variant(args, name, fields, seed=None, out=None):
    run_dir = os.path.join(out or args.out, name)
    log_path = os.path.join(os.path.abspath(run_dir), "train.log")
    if not (args.resume and finished(log_path)):
        solver = write_variant_solver(args.solver, run_dir, fields, args.max_iter,
                                      args.test_interval, args.processes_per_node,
                                      args.random_seed if seed is None else seed)
        if os.path.exists(log_path):
            os.remove(log_path)   # GLog appends; a rerun must not mix two runs
        cmd = train_command(args.procs, solver, log_path, args.python, args.mpiexec)
        print(f"[{name}] {' '.join(cmd)}", flush=True)
        run_job(cmd, args.timeout, os.path.join(run_dir, "stdout.log"))
    with open(log_path, encoding="utf-8") as f:
        rows = parse_test_log(f, args.accuracy_blob, args.loss_blob)
    if not rows:
        raise CaffeError(f"{log_path}: no 'Testing net (#0)' lines; does the solver test "
                         f"(test_interval, test_iter)?")
    return [dict(r, variant=name) for r in rows]


def write_csv(rows, path):
    write_rows(rows, CSV_FIELDS, path)


def run_variants(out, variants, procs, processes_per_node, max_iter, test_interval, solver=""):
    """Train every variant (``main``'s command line) and return the rows of ``out/accuracy.csv``,
    or the exit status when training failed."""
    argv = ["--out", out, "--procs", str(procs), "--processes-per-node",
            str(processes_per_node), "--variants", variants,
            "--max-iter", str(max_iter), "--test-interval", str(test_interval)]
    if solver:
        argv += ["--solver", solver]
    rc = main(argv)
    return rc if rc else read_csv(os.path.join(out, "accuracy.csv"))


def plot(rows, path, title=""):
    """Accuracy vs iteration and vs seconds, one line per variant (Oyama et al.'s figures 8, 11, 13)."""
    plt = pyplot()
    fig, (ax_i, ax_t) = plt.subplots(1, 2, figsize=(11, 4))
    series = {}
    for r in rows:
        series.setdefault(r["variant"], []).append(r)
    for name, pts in series.items():
        pts = sorted(pts, key=lambda r: r["iteration"])
        acc = [100.0 * r["test_accuracy"] for r in pts]
        label = f"{name} (final {acc[-1]:.2f}%)"
        ax_i.plot([r["iteration"] for r in pts], acc, marker="o", ms=3, label=label)
        ax_t.plot([r["seconds"] for r in pts], acc, marker="o", ms=3, label=name)
    # Zoom on the trained range: the untrained first test (about chance) would flatten the
    # differences that matter; it stays off the bottom of the axes.
    later = [100.0 * r["test_accuracy"] for r in rows if r["iteration"] > 0]
    low = max(0.0, min(later) - 2.0) if later else 0.0
    for ax, xlabel in ((ax_i, "iteration"), (ax_t, "wall seconds")):
        ax.set_ylim(low, 100.5)
        label_axes(ax, xlabel=xlabel, ylabel="test accuracy (%)", legend_size=8)
    if title:
        fig.suptitle(title)
    save_figure(fig, path)


def read_csv(path):
    """Rows of an accuracy.csv written by ``write_csv`` (numbers parsed back)."""
    with open(path, encoding="utf-8") as f:
        return [{"variant": r["variant"], "iteration": int(r["iteration"]),
                 "seconds": float(r["seconds"]), "test_accuracy": float(r["test_accuracy"]),
                 "test_loss": float(r["test_loss"])} for r in csv.DictReader(f)]


def build_parser():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--solver", default=os.path.join(REPO, "prototxt", "digits", "solver.prototxt"))
    ap.add_argument("--out", required=True, help="output folder (solver copies, logs, CSV, PNG)")
    ap.add_argument("--procs", type=int, default=2, help="processes (mpiexec -n)")
    ap.add_argument("--processes-per-node", type=int, default=0,
                    help="comm.processes_per_node (e.g. 2 with --procs 4: two emulated nodes)")
    ap.add_argument("--variants", type=parse_variants, default=parse_variants("fp32,fp8"),
                    help=f"presets ({', '.join(PRESETS)}) or NAME:field=value,...")
    ap.add_argument("--max-iter", type=int, default=0, help="iterations (default: the solver's)")
    ap.add_argument("--test-interval", type=int, default=0, help="default: the solver's")
    ap.add_argument("--random-seed", type=int, default=None,
                    help="solver random_seed for every variant (default: the solver's)")
    ap.add_argument("--seeds", type=lambda t: [int(v) for v in t.split(",") if v.strip()],
                    default=None, help="random seeds, e.g. 1,2,3: every variant once per seed "
                    "(OUT/seed<S>/<variant>/), then OUT/seeds.csv and the final accuracy's mean "
                    "and spread per variant (OUT/summary.csv, OUT/accuracy.png: mean curve, "
                    "min-max band)")
    ap.add_argument("--resume", action="store_true",
                    help="keep runs whose train.log is complete instead of training them again")
    ap.add_argument("--accuracy-blob", default="accuracy")
    ap.add_argument("--loss-blob", default="loss")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per run")
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--mpiexec", default=_default_mpiexec())
    ap.add_argument("--title", default="")
    ap.add_argument("--replot", action="store_true",
                    help="only redraw OUT/accuracy.png from OUT/accuracy.csv (no training)")
    return ap


def main(argv=None):
    args = build_parser().parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    rows = []
    if args.replot:
        plot(read_csv(os.path.join(args.out, "accuracy.csv")),
             os.path.join(args.out, "accuracy.png"), args.title)
        return 0
    if args.seeds:
        return main_seeds(args)
    try:
        for name, fields in args.variants:
            rows += run_variant(args, name, fields)
            # Rewritten after every variant: a long sweep leaves usable results if cut short.
            write_csv(rows, os.path.join(args.out, "accuracy.csv"))
    except CaffeError as e:
        print(f"accuracy_compare: error: {e}", file=sys.stderr)
        return 1
    png = os.path.join(args.out, "accuracy.png")
    plot(rows, png, args.title or f"{os.path.basename(args.solver)}, {args.procs} processes")
    finals = {}
    for r in rows:
        finals[r["variant"]] = r
    for name, r in finals.items():
        print(f"{name:12s} iter {r['iteration']:6d}  accuracy {100 * r['test_accuracy']:.2f}%  "
              f"loss {r['test_loss']:.4f}  {r['seconds']:.1f} s")
    print(f"wrote {os.path.join(args.out, 'accuracy.csv')} and {png}")
    return 0


# --- several random seeds --------------------------------------------------------------------
SEED_FIELDS = ("variant", "seed") + CSV_FIELDS[1:]
SUMMARY_FIELDS = ("variant", "seeds", "final_iteration", "mean_accuracy", "min_accuracy",
                  "max_accuracy", "std_accuracy", "gap_to_first_points")


def summarise_seeds(rows):
    """One row per variant: the final test accuracy's mean, min, max and standard deviation over
    the seeds, and the gap of the mean to the first variant's, in points."""
    finals = {}
    for r in rows:
        key = (r["variant"], r["seed"])
        if key not in finals or r["iteration"] > finals[key]["iteration"]:
            finals[key] = r
    out, first = [], None
    for variant in dict.fromkeys(r["variant"] for r in rows):
        accs = [100.0 * f["test_accuracy"] for (v, _), f in finals.items() if v == variant]
        iters = {f["iteration"] for (v, _), f in finals.items() if v == variant}
        mean = sum(accs) / len(accs)
        std = (sum((a - mean) ** 2 for a in accs) / (len(accs) - 1)) ** 0.5 if len(accs) > 1 else 0.0
        first = mean if first is None else first
        out.append({"variant": variant, "seeds": len(accs), "final_iteration": max(iters),
                    "mean_accuracy": round(mean, 3), "min_accuracy": round(min(accs), 3),
                    "max_accuracy": round(max(accs), 3), "std_accuracy": round(std, 3),
                    "gap_to_first_points": round(mean - first, 3)})
    return out


def plot_seeds(rows, path, title="", x="iteration"):
    """Mean test accuracy per variant over the seeds, with the min-max band, against the
    iteration or (``x="seconds"``) the mean wall time at which the seeds reached it."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for variant in dict.fromkeys(r["variant"] for r in rows):
        by_iter, at = {}, {}
        for r in rows:
            if r["variant"] == variant:
                by_iter.setdefault(r["iteration"], []).append(100.0 * r["test_accuracy"])
                at.setdefault(r["iteration"], []).append(r[x])
        its = sorted(by_iter)
        mean = [sum(by_iter[i]) / len(by_iter[i]) for i in its]
        xs = [sum(at[i]) / len(at[i]) for i in its]
        line, = ax.plot(xs, mean, label=f"{variant} (final {mean[-1]:.2f}%)")
        ax.fill_between(xs, [min(by_iter[i]) for i in its], [max(by_iter[i]) for i in its],
                        color=line.get_color(), alpha=0.15)
    later = [100.0 * r["test_accuracy"] for r in rows if r["iteration"] > 0]
    ax.set_ylim(max(0.0, min(later) - 2.0) if later else 0.0, 100.5)
    label_axes(ax, xlabel="wall time (s), mean over seeds" if x == "seconds" else x,
               ylabel="test accuracy (%), mean over seeds", legend_size=8)
    if title:
        ax.set_title(title, fontsize=9)
    save_figure(fig, path)


def main_seeds(args):
    rows = []
    try:
        for seed in args.seeds:
            for name, fields in args.variants:
                found = run_variant(args, name, fields, seed,
                                    os.path.join(args.out, f"seed{seed}"))
                rows += [dict(r, seed=seed) for r in found]
                write_rows(rows, SEED_FIELDS, os.path.join(args.out, "seeds.csv"))
    except CaffeError as e:
        print(f"accuracy_compare: error: {e}", file=sys.stderr)
        return 1
    summary = summarise_seeds(rows)
    write_rows(summary, SUMMARY_FIELDS, os.path.join(args.out, "summary.csv"))
    png = os.path.join(args.out, "accuracy.png")
    plot_seeds(rows, png, args.title or f"{os.path.basename(args.solver)}, {args.procs} "
               f"processes, seeds {','.join(map(str, args.seeds))}")
    for s in summary:
        print(f"{s['variant']:12s} {s['seeds']} seeds  final {s['mean_accuracy']:.2f}% "
              f"(min {s['min_accuracy']:.2f}, max {s['max_accuracy']:.2f}, sd "
              f"{s['std_accuracy']:.2f})  {s['gap_to_first_points']:+.2f} points")
    print(f"wrote {os.path.join(args.out, 'summary.csv')}, seeds.csv and {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
