#!/usr/bin/env python
"""Per-iteration time breakdown (Oyama et al.'s figures 5-6) from caffe8 timing logs.

Usage (from the repository root)::

    python -m studies.scaling.plot_breakdown fp32=runs/p2_fp32_sync fp8=runs/p2_fp8_sync \
        --skip 3 --ranks mean --out breakdown.png --csv breakdown.csv
    python -m studies.scaling.plot_breakdown fp8=runs/p2_fp8_sync --per-layer fp8 --out layers.png

Each run is LABEL=PATH, PATH a timing log (``caffe8 train --timing-log``), a comma-separated
list of them (one per rank) or a folder whose ``*.jsonl`` files are read (or, when it has none,
those of its subfolders: a scaling sweep point run with ``--repeats``, iterations pooled).
The first ``--skip`` iterations are warm-up and left out. ``--ranks 0`` keeps rank 0's records,
``--ranks mean`` averages each rank's mean over the ranks. The PNG stacks ForwardBackward / D2H /
Communication / H2D / Quantile / Other per run (labels containing ``--hatch``, default "fp8", are
hatched as in Oyama et al., where filled bars are float and hatched ones fp8); the CSV holds the
means in seconds.
``--per-layer LABEL`` instead draws that run's per-layer forward and backward bars and writes the
per-layer means (every timed phase) to the CSV.
"""
import argparse
import glob
import os
import sys

from studies._runs import pyplot, read_timing_log, save_figure
from studies.scaling._sweep import write_csv
from caffe8.engine.errors import CaffeError

SPLIT = ("ForwardBackward", "D2H", "Communication", "H2D", "Quantile", "Other")
LAYER_PHASES = ("forward", "backward", "encode", "d2h", "comm", "h2d", "decode", "quantile")
COLORS = ("tab:blue", "tab:orange", "tab:red", "tab:green", "tab:purple", "tab:gray")


def run_paths(spec):
    """LABEL=PATH → (label, [log files])."""
    label, sep, path = spec.partition("=")
    if not sep or not label or not path:
        raise CaffeError(f"run {spec!r}: expected LABEL=PATH")
    if os.path.isdir(path):
        # a sweep point's folder: its logs, or its rep*/ folders' logs (--repeats)
        files = sorted(glob.glob(os.path.join(path, "*.jsonl"))) or \
            sorted(glob.glob(os.path.join(path, "*", "*.jsonl")))
    else:
        files = [p for p in path.split(",") if p]
    missing = [p for p in files if not os.path.isfile(p)]
    if missing or not files:
        raise CaffeError(f"run {label!r}: no timing log at {missing[0] if missing else path}")
    return label, files


def kept_records(files, skip, ranks):
    """{rank: [records with iteration ≥ skip]}, only rank 0 when ``ranks`` is "0"."""
    by_rank = {}
    for path in files:
        for rec in read_timing_log(path):
            if rec["iteration"] >= skip and (ranks == "mean" or rec["rank"] == 0):
                by_rank.setdefault(rec["rank"], []).append(rec)
    if not by_rank:
        raise CaffeError(f"{', '.join(files)}: no records of "
                         f"{'any rank' if ranks == 'mean' else 'rank 0'} after skipping {skip} "
                         f"iteration(s)")
    return by_rank


def mean_over_ranks(by_rank, value):
    """Mean over ranks of each rank's mean of ``value(record)``."""
    per_rank = [sum(value(r) for r in recs) / len(recs) for recs in by_rank.values()]
    return sum(per_rank) / len(per_rank)


def split_means(label, by_rank):
    """CSV row: label, record count, mean wall and mean of each split component (seconds)."""
    row = {"label": label, "records": sum(len(v) for v in by_rank.values()),
           "wall": mean_over_ranks(by_rank, lambda r: r["wall"])}
    for key in SPLIT:
        row[key] = mean_over_ranks(by_rank, lambda r, k=key: r["split"][k])
    return row


def layer_means(label, by_rank):
    """CSV rows: one per layer (net order) with the mean of every timed phase (seconds)."""
    first = next(iter(by_rank.values()))[0]["layers"]
    rows = []
    for i, layer in enumerate(first):
        row = {"label": label, "layer": layer["name"], "type": layer["type"]}
        for ph in LAYER_PHASES:
            row[ph] = mean_over_ranks(by_rank, lambda r, i=i, ph=ph: r["layers"][i][ph])
        rows.append(row)
    return rows


def plot_split(rows, path, hatch_marker, title):
    """Stacked bars of the split per run; the wall time as a black tick above each bar."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(max(4, 1.2 * len(rows) + 2), 4.5))
    x = range(len(rows))
    bottom = [0.0] * len(rows)
    for key, color in zip(SPLIT, COLORS):
        vals = [r[key] * 1e3 for r in rows]
        bars = ax.bar(x, vals, bottom=bottom, color=color, label=key, edgecolor="black", lw=0.4)
        for bar, row in zip(bars, rows):
            if hatch_marker and hatch_marker in row["label"]:
                bar.set_hatch("//")
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.scatter(list(x), [r["wall"] * 1e3 for r in rows], marker="_", s=400, color="black",
               label="Iteration", zorder=3)
    ax.set_xticks(list(x))
    ax.set_xticklabels([r["label"] for r in rows], rotation=30, ha="right")
    ax.set_ylabel("time per iteration (ms)")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.set_title(title or "per-iteration breakdown")
    save_figure(fig, path, dpi=120)


def plot_layers(rows, path, title):
    """Horizontal forward/backward bars per layer (net order top to bottom)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, max(3, 0.35 * len(rows) + 1.5)))
    y = list(range(len(rows)))[::-1]
    ax.barh([v + 0.2 for v in y], [r["forward"] * 1e3 for r in rows], 0.4, label="forward")
    ax.barh([v - 0.2 for v in y], [r["backward"] * 1e3 for r in rows], 0.4, label="backward")
    ax.set_yticks(y)
    ax.set_yticklabels([f"{r['layer']} ({r['type']})" for r in rows], fontsize=8)
    ax.set_xlabel("time per iteration (ms)")
    ax.legend()
    ax.set_title(title or f"per-layer times: {rows[0]['label']}")
    save_figure(fig, path, dpi=120)


def build_parser():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", help="LABEL=PATH (log file, comma list, or folder)")
    ap.add_argument("--skip", type=int, default=3, help="warm-up iterations to leave out")
    ap.add_argument("--ranks", choices=("0", "mean"), default="0",
                    help="rank 0 only, or the mean over ranks")
    ap.add_argument("--out", required=True, help="PNG to write")
    ap.add_argument("--csv", help="CSV of the means (default: the PNG's name with .csv)")
    ap.add_argument("--per-layer", metavar="LABEL", help="per-layer bars of this run instead")
    ap.add_argument("--hatch", default="fp8", help="hatch runs whose label contains this")
    ap.add_argument("--title", default="")
    return ap


def main(argv=None):
    args = build_parser().parse_args(argv)
    csv_path = args.csv or os.path.splitext(args.out)[0] + ".csv"
    try:
        runs = [run_paths(spec) for spec in args.runs]
        if args.per_layer:
            files = dict(runs).get(args.per_layer)
            if files is None:
                raise CaffeError(f"--per-layer {args.per_layer!r}: no run with that label "
                                 f"(runs: {', '.join(label for label, _ in runs)})")
            rows = layer_means(args.per_layer, kept_records(files, args.skip, args.ranks))
            write_csv(rows, csv_path, ("label", "layer", "type") + LAYER_PHASES)
            plot_layers(rows, args.out, args.title)
        else:
            rows = [split_means(label, kept_records(files, args.skip, args.ranks))
                    for label, files in runs]
            write_csv(rows, csv_path, ("label", "records", "wall") + SPLIT)
            plot_split(rows, args.out, args.hatch, args.title)
    except CaffeError as e:
        print(f"plot_breakdown: error: {e}", file=sys.stderr)
        return 1
    print(f"wrote {args.out} and {csv_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
