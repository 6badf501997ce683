"""Reproduce the random-distribution rows of Table 2 of Dettmers, "8-bit approximations for parallelism in deep learning".

Run: python -m studies.paper_tables.dettmers_table2 --samples 25000000 --csv runs/dettmers_table2.csv

What the paper measures (§3.4): the mean absolute error and the mean relative error (in %) of
approximating each number of a sample of 25 million numbers drawn from U(0, 1), N(0, 1),
N(0, 10^2) and N(0, 0.2^2) by each 8-bit data type. Protocol, as the paper states it: "8-bit
mantissa" and "8-bit static tree" are not normalised and use an exponent offset of 10^2 for
N(0, 10^2) and 10^1 otherwise; "dynamic tree" and "linear quant" divide the sample by its max
|value| (the whole sample's) and multiply back after the approximation. The data types are
comm/dettmers.py's (its docstring gives the exact tables).

Here: mean absolute error = mean |x' - x|; mean relative error = 100 * mean(|x' - x| / |x|)
over x != 0; also the mean signed error (bias) mean(x' - x), since some of the paper's "mean
absolute error" numbers are far below what any rounding to these tables can give (e.g. 0.00004
for the dynamic tree on U(0, 1), whose values in [0.1, 1] are 0.014 apart) and may be a bias.
The extra "codec" columns give the errors when every type is normalised by the max |value| (what
comm.dettmers.DettmersCompressor sends). Not reproduced: the MNIST rows (gradients and activations
of the paper's 784-1024-1024-10 net, not available here); the sample is NumPy's PCG64 with --seed.
Writes a CSV and prints a markdown table (ours next to the paper's numbers) to stdout.

``--rounding bisection`` encodes with the paper's own binary search (comm.dettmers.bisection_search:
the second nearest value for about 25 % of inputs) instead of the exact nearest value; the
default stays "nearest". Note on the paper's "mean absolute error" column: across N(0, 0.2^2),
N(0, 1) and N(0, 10^2) it grows like sigma^2 (dynamic tree 0.000018, 0.0005, 0.049: ratios 0.036
and 98 for sigma^2 ratios 0.04 and 100), while a mean absolute error of a scale-invariant rounding
grows like sigma; the column behaves like a mean squared error, hence the ``ours_mse`` column.
"""
import argparse
import csv
import os

import numpy

from caffe8.comm.dettmers import Table
from studies._runs import pyplot, save_figure

# (distribution, data type) -> (mean absolute error, mean relative error in %), the paper's Table 2.
PAPER = {
    ("U(0,1)", "dynamic_tree"): (0.00004, 1.39), ("U(0,1)", "linear"): (0.0024, 2.16),
    ("U(0,1)", "mantissa"): (0.0017, 7.22), ("U(0,1)", "static_tree"): (0.0007, 4.82),
    ("N(0,1)", "dynamic_tree"): (0.0005, 2.46), ("N(0,1)", "linear"): (0.0004, 6.47),
    ("N(0,1)", "mantissa"): (0.0104, 6.89), ("N(0,1)", "static_tree"): (0.0093, 6.3),
    ("N(0,10^2)", "dynamic_tree"): (0.049, 2.49), ("N(0,10^2)", "linear"): (0.041, 6.44),
    ("N(0,10^2)", "mantissa"): (1.066, 7.19), ("N(0,10^2)", "static_tree"): (0.926, 6.28),
    ("N(0,0.2^2)", "dynamic_tree"): (0.000018, 2.45), ("N(0,0.2^2)", "linear"): (0.000015, 6.15),
    ("N(0,0.2^2)", "mantissa"): (0.00055, 8.26), ("N(0,0.2^2)", "static_tree"): (0.00022, 6.58),
}
DISTRIBUTIONS = ("U(0,1)", "N(0,1)", "N(0,10^2)", "N(0,0.2^2)")
KINDS = ("dynamic_tree", "linear", "mantissa", "static_tree")
NORMALISED_IN_PAPER = ("dynamic_tree", "linear")


def sample(name, n, rng):
    """float32 sample of distribution ``name`` (the engine's gradients are float32)."""
    if name == "U(0,1)":
        return rng.random(n, dtype=numpy.float32)
    sigma = {"N(0,1)": 1.0, "N(0,10^2)": 10.0, "N(0,0.2^2)": 0.2}[name]
    return (rng.standard_normal(n, dtype=numpy.float32) * numpy.float32(sigma))


class ErrorSums:
    """Running sums of |e|, e, e^2 and |e|/|x| (x != 0) in float64 over chunks."""

    def __init__(self):
        self.abs = self.signed = self.rel = self.sq = 0.0
        self.n = self.n_rel = 0

    def add(self, x, approx):
        e = approx.astype(numpy.float64) - x
        self.abs += float(numpy.abs(e).sum())
        self.signed += float(e.sum())
        self.sq += float((e * e).sum())
        nz = x != 0
        self.rel += float((numpy.abs(e[nz]) / numpy.abs(x[nz])).sum())
        self.n += x.size
        self.n_rel += int(nz.sum())

    def result(self):
        return self.abs / self.n, 100.0 * self.rel / self.n_rel, self.signed / self.n, \
            self.sq / self.n


def approximate(table, x, scale, rounding="nearest"):
    """x → table value of x / scale (nearest, or the paper's search), times scale (float64)."""
    return table.values[table.encode(x / scale, rounding).astype(numpy.intp)] * scale


def measure(dist, n, chunk, seed, rounding="nearest"):
    """{(kind, protocol): (mae, mre %, bias)} for one distribution; protocol 'paper' | 'codec'."""
    decade = 2 if dist == "N(0,10^2)" else 1
    tables = {(k, "paper"): Table(k, 0 if k in NORMALISED_IN_PAPER else decade) for k in KINDS}
    tables.update({(k, "codec"): Table(k, 0) for k in KINDS})
    # Two passes over the same stream: the max |x| of the whole sample first, then the errors.
    peak = 0.0
    for x in chunks(dist, n, chunk, seed):
        peak = max(peak, float(numpy.abs(x).max()))
    sums = {key: ErrorSums() for key in tables}
    for x in chunks(dist, n, chunk, seed):
        x64 = x.astype(numpy.float64)
        for (kind, protocol), table in tables.items():
            normalised = protocol == "codec" or kind in NORMALISED_IN_PAPER
            sums[kind, protocol].add(x64, approximate(table, x64, peak if normalised else 1.0,
                                                      rounding))
    return {key: s.result() for key, s in sums.items()}


def chunks(dist, n, chunk, seed):
    rng = numpy.random.default_rng([seed, DISTRIBUTIONS.index(dist)])
    for start in range(0, n, chunk):
        yield sample(dist, min(chunk, n - start), rng)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--samples", type=int, default=25_000_000, help="numbers per distribution")
    p.add_argument("--chunk", type=int, default=1 << 20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--csv", default="runs/dettmers_table2.csv")
    p.add_argument("--rounding", choices=("nearest", "bisection"), default="nearest",
                   help="nearest table value, or the paper's binary search")
    p.add_argument("--png", default="", help="also plot mean relative error, ours vs the paper")
    args = p.parse_args(argv)
    rows = []
    for dist in DISTRIBUTIONS:
        res = measure(dist, args.samples, args.chunk, args.seed, args.rounding)
        for kind in KINDS:
            mae, mre, bias, mse = res[kind, "paper"]
            cmae, cmre, _, _ = res[kind, "codec"]
            smae, smre = PAPER[dist, kind]
            rows.append(dict(distribution=dist, data_type=kind, samples=args.samples,
                             rounding=args.rounding,
                             paper_mae=smae, ours_mae=mae, ours_mse=mse, ours_bias=bias,
                             paper_mre_pct=smre,
                             ours_mre_pct=mre, codec_mae=cmae, codec_mre_pct=cmre))
    os.makedirs(os.path.dirname(os.path.abspath(args.csv)), exist_ok=True)
    with open(args.csv, "w", newline="") as f:
        w = csv.DictWriter(f, list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    if args.png:
        plot(rows, args.png, args.rounding)
    print(f"{args.samples} samples per distribution, rounding {args.rounding}; CSV: {args.csv}\n")
    print("| Distribution | Data type | MAE paper | MAE ours | bias ours | MRE % paper | MRE % ours "
          "| MAE codec | MRE % codec |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['distribution']} | {r['data_type']} | {r['paper_mae']:g} | {r['ours_mae']:.3g} "
              f"| {r['ours_bias']:.2g} | {r['paper_mre_pct']:g} | {r['ours_mre_pct']:.3g} "
              f"| {r['codec_mae']:.3g} | {r['codec_mre_pct']:.3g} |")


def plot(rows, path, rounding):
    """Mean relative error per (distribution, data type): ours as bars, the paper's as marks."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(10, 4))
    x = numpy.arange(len(rows))
    colors = [f"C{KINDS.index(r['data_type'])}" for r in rows]
    ax.bar(x, [r["ours_mre_pct"] for r in rows], color=colors, alpha=0.6,
           label=f"ours ({rounding})")
    ax.plot(x, [r["paper_mre_pct"] for r in rows], "k_", ms=14, mew=2, label="paper's Table 2")
    ax.set_xticks(x)
    ax.set_xticklabels([f"{r['distribution']}\n{r['data_type']}" for r in rows], rotation=90,
                       fontsize=7)
    ax.set_ylabel("mean relative error (%)")
    ax.set_title(f"Dettmers' 8-bit data types, rounding {rounding}: ours vs the paper", fontsize=10)
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8)
    save_figure(fig, path)


if __name__ == "__main__":
    main()
