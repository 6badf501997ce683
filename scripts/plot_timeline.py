#!/usr/bin/env python
"""The exchange's timeline of one iteration, from a timing log (``caffe8 train --timing-log``).

    python -m scripts.plot_timeline runs/t.jsonl --iteration 3 --rank 0 --out timeline.png

One row per bucket of the gradient exchange, with a bar for each phase it went through (encode,
D2H copy, reduce, H2D copy, decode), and a row "backward" with a tick at the moment each layer
with a bucket finished its backward pass, so that a bucket reduced while backward still runs —
the overlap the asynchronous exchange is for — shows as a reduce bar left of the last ticks.
Times are seconds since the iteration's start (docs/timing_schema.json, ``buckets`` and
``backward_end``). Without ``--iteration`` the last iteration of the rank is drawn.
"""
import argparse
import sys

from caffe8.engine.errors import CaffeError
from caffe8.engine.timing import BUCKET_PHASES, read_log
from studies._runs import pyplot, save_figure

COLORS = {"encode": "tab:blue", "d2h": "tab:orange", "reduce": "tab:red", "h2d": "tab:green",
          "decode": "tab:purple"}


def pick(records, iteration=None, rank=0):
    """The record of ``iteration`` (default: the last one) of ``rank``."""
    mine = [r for r in records if r["rank"] == rank]
    if iteration is not None:
        mine = [r for r in mine if r["iteration"] == iteration]
    if not mine:
        raise CaffeError(f"no timing record of rank {rank}"
                         + (f" at iteration {iteration}" if iteration is not None else ""))
    return mine[-1]


def timeline(record):
    """(ticks, bars) of one record: ticks [(layer name, backward end)] of the layers that are in
    a bucket, in time order; bars [(row, phase, start, end)], row k for the k-th bucket."""
    exchanged = {name for b in record["buckets"] for name in b["layers"]}
    ticks = sorted(((l["name"], l["backward_end"]) for l in record["layers"]
                    if l["name"] in exchanged and l["backward_end"] is not None),
                   key=lambda tick: tick[1])
    bars = [(row, phase, *b[phase]) for row, b in enumerate(record["buckets"])
            for phase in BUCKET_PHASES if phase in b]
    return ticks, bars


def plot(record, path):
    """Draw :func:`timeline` of ``record`` into the image file ``path``."""
    ticks, bars = timeline(record)
    rows = len(record["buckets"])
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(10, 1.2 + 0.45 * (rows + 1)))
    ms = 1e3
    for row, phase, start, end in bars:
        ax.broken_barh([(start * ms, max(end - start, 0.0) * ms)], (row - 0.35, 0.7),
                       color=COLORS[phase])
    backward = rows
    for name, end in ticks:
        ax.plot([end * ms, end * ms], [backward - 0.35, backward + 0.35], color="black", lw=1)
        ax.annotate(name, (end * ms, backward + 0.4), fontsize=7, rotation=45, ha="left")
    ax.set_yticks(range(rows + 1))
    ax.set_yticklabels([f"bucket {b['bucket']}: {', '.join(b['layers'])}"[:40]
                        for b in record["buckets"]] + ["backward"], fontsize=8)
    ax.set_ylim(-0.6, rows + 1.2)
    ax.set_xlim(0, record["wall"] * ms)
    ax.set_xlabel("ms since the iteration's start")
    ax.set_title(f"iteration {record['iteration']}, rank {record['rank']}: wall "
                 f"{record['wall'] * ms:.1f} ms")
    for phase in BUCKET_PHASES:
        if any(p == phase for _, p, _, _ in bars):
            ax.barh(0, 0, color=COLORS[phase], label=phase)
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    ax.grid(axis="x", alpha=0.3)
    save_figure(fig, path)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("log", help="a timing log (JSON lines)")
    ap.add_argument("--iteration", type=int, default=None)
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--out", default="timeline.png")
    args = ap.parse_args(argv)
    try:
        record = pick(read_log(args.log), args.iteration, args.rank)
        if not record["buckets"]:
            raise CaffeError(f"{args.log}: iteration {record['iteration']} of rank "
                             f"{record['rank']} has no exchange timeline (one process?)")
        plot(record, args.out)
    except (CaffeError, OSError) as e:
        print(f"plot_timeline: {e}", file=sys.stderr)
        return 1
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
