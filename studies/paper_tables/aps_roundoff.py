"""Round-off of the small-format gradient sum against ranks and grouping, with and without Kahan:
the study behind Tables 8-9 of Han, Demmel, You, "Auto-Precision Scaling for distributed deep
learning".

Run: python -m studies.paper_tables.aps_roundoff --csv docs/figures/aps_roundoff_groups.csv \\
         --png docs/figures/aps_roundoff_groups.png

The paper compares hierarchical all-reduce group sizes on 256 nodes by the average round-off
error of one gradient (ResNet-50's first convolution, E5M2) and finds group size 16 best
(41.83 %, against 85.22 % for a flat ring). Here, for P ranks in groups of G consecutive ranks:

1. every rank's float32 gradient is scaled by APS' common power of two 2**k (for P ranks) and
   rounded to the format (comm.aps, comm.formats: what goes on the wire);
2. each group master sums its group's G contributions in rank order in the small format, one
   rounding per addition (comm.aps.small_format_sum; Kahan: compensated within the group, the
   compensation left over at the end of the group is dropped, since only the sum travels on);
3. the P / G group sums are summed in group order the same way (the inter-group ring: a ring
   reduce accumulates each chunk one rank after another, a rotation of this order).
G = P is the flat ring. Errors (relative L1, in %): ``sum_error`` = |S - W| / |W| with W the
exact sum of the wire values (the summation's round-off alone); ``total_error`` = |S - X| / |X|
with X the exact float64 sum of the float32 gradients (quantisation and summation, closer to
the paper's "high vs low precision communication"); S, W, X are unscaled by 2**-k; sums over
elements.

Not reproduced: the paper's gradients (ResNet-50's conv1 on ImageNet at 256 nodes). The
gradients here are synthetic, seeded: per element a shared signal N(0, 1) plus per-rank noise
N(0, 2**2), times a per-element magnitude 2**U(-8, 0), so the ranks partly agree and partly cancel
as minibatch gradients do. The absolute percentages therefore differ from the paper's; the
shape of the curves (error against G, Kahan against plain) is the object of study.
"""
import argparse
import csv

import numpy

from caffe8.comm.aps import local_exponent, scale_exponent, small_format_sum
from caffe8.comm.formats import get_format
from studies._runs import label_axes, pyplot, save_figure

FIELDS = ("format", "ranks", "group_size", "kahan", "sum_error_pct", "total_error_pct")


def synthetic_gradients(ranks, n, seed):
    """float32 [ranks, n]: shared signal + per-rank noise, magnitudes over 8 binades."""
    rng = numpy.random.default_rng(seed)
    magnitude = 2.0 ** rng.uniform(-8, 0, n)
    signal = rng.standard_normal(n)
    noise = 2.0 * rng.standard_normal((ranks, n))
    return ((signal + noise) * magnitude).astype(numpy.float32)


def wire_rows(grads, fmt):
    """The P contributions on the wire scale (float64 values of ``fmt``) and the exponent k."""
    e = max(local_exponent(g) for g in grads)
    k = scale_exponent(e, fmt, len(grads))
    rows = [fmt.decode(fmt.encode(numpy.ldexp(g.astype(numpy.float64), k))).astype(numpy.float64)
            for g in grads]
    return rows, k


def grouped_sum(rows, fmt, group, kahan):
    """Hierarchical small-format sum: groups of ``group`` consecutive rows, then the groups."""
    if len(rows) % group:
        raise ValueError(f"group size {group} does not divide {len(rows)} ranks")
    partial = [small_format_sum(rows[i:i + group], fmt, kahan).astype(numpy.float64)
               for i in range(0, len(rows), group)]
    return small_format_sum(partial, fmt, kahan).astype(numpy.float64)


def relative_error(approx, exact):
    return 100.0 * float(numpy.abs(approx - exact).sum() / numpy.abs(exact).sum())


def study(formats, ranks_list, groups, n, seed):
    """One CSV row per (format, P, G, kahan) with G dividing P."""
    out = []
    for name in formats:
        fmt = get_format(name)
        for ranks in ranks_list:
            grads = synthetic_gradients(ranks, n, seed)
            rows, k = wire_rows(grads, fmt)
            wire_exact = numpy.sum(rows, axis=0)
            grad_exact = numpy.ldexp(grads.astype(numpy.float64).sum(axis=0), k)
            for group in sorted({g for g in groups if ranks % g == 0} | {ranks}):
                for kahan in (False, True):
                    s = grouped_sum(rows, fmt, group, kahan)
                    out.append({"format": name, "ranks": ranks, "group_size": group,
                                "kahan": int(kahan),
                                "sum_error_pct": round(relative_error(s, wire_exact), 4),
                                "total_error_pct": round(relative_error(s, grad_exact), 4)})
    return out


def plot(rows, path):
    plt = pyplot()
    keys = sorted({(r["format"], r["ranks"]) for r in rows})
    fig, axes = plt.subplots(1, len(keys), figsize=(4.2 * len(keys), 3.6), squeeze=False)
    for ax, (name, ranks) in zip(axes[0], keys):
        for kahan, style in ((0, "o-"), (1, "s--")):
            sel = sorted((r for r in rows if (r["format"], r["ranks"], r["kahan"])
                          == (name, ranks, kahan)), key=lambda r: r["group_size"])
            ax.plot([r["group_size"] for r in sel], [r["sum_error_pct"] for r in sel], style,
                    label="Kahan" if kahan else "plain")
        ax.set_xscale("log", base=2)
        label_axes(ax, xlabel="group size (P = flat ring)",
                   ylabel="summation round-off, % (rel. L1)", title=f"{name}, P = {ranks}")
    save_figure(fig, path)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--formats", default="E5M2,E4M3_APS")
    ap.add_argument("--ranks", default="64,256", help="comma-separated P values")
    ap.add_argument("--groups", default="4,8,16,32,64", help="group sizes (P itself is added)")
    ap.add_argument("--elements", type=int, default=8192)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--csv")
    ap.add_argument("--png")
    args = ap.parse_args(argv)
    rows = study(args.formats.split(","), [int(p) for p in args.ranks.split(",")],
                 [int(g) for g in args.groups.split(",")], args.elements, args.seed)
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.DictWriter(f, FIELDS)
            w.writeheader()
            w.writerows(rows)
    if args.png:
        plot(rows, args.png)
    print("| format | P | group | plain sum err % | Kahan sum err % | plain total % | Kahan total % |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        if r["kahan"]:
            continue
        kr = next(x for x in rows if x["kahan"] and all(
            x[f] == r[f] for f in ("format", "ranks", "group_size")))
        print(f"| {r['format']} | {r['ranks']} | {r['group_size']} | {r['sum_error_pct']} | "
              f"{kr['sum_error_pct']} | {r['total_error_pct']} | {kr['total_error_pct']} |")
    return rows


if __name__ == "__main__":
    main()
