"""``caffe8 bench ...``: the allreduce micro-benchmark (``caffe8.comm.bench``) under mpiexec;
CSVs and a PNG into ``--out`` (default a new folder under runs/). Its arguments are the
benchmark's own: everything after ``bench`` reaches it unparsed (``RAW_ARGUMENTS``), its
``--help`` included."""
import argparse
import os

NAME = "bench"
HELP = "allreduce micro-benchmark (run under mpiexec; caffe8 bench --help lists its options)"
GROUP = "cluster"
#: the dispatcher hands everything after the name to run() as args.rest
RAW_ARGUMENTS = True


def add_arguments(p):
    p.add_argument("rest", nargs=argparse.REMAINDER, help="the benchmark's own arguments")


def run(args):
    from caffe8.comm import bench
    from caffe8.wiring import make_world
    p = bench.add_arguments(argparse.ArgumentParser(
        prog="caffe8 bench", description=bench.__doc__.split("\n\n")[0].replace("\n", " ")))
    opts = p.parse_args(args.rest)
    world = make_world()
    rows, detail = bench.run(opts, world, log=lambda line: print(line, flush=True))
    if world.rank == 0:
        out = opts.out or bench.default_out()
        csv_path, detail_path = bench.write_csvs(out, rows, detail)
        png = os.path.join(out, bench.STEM + ".png")
        _plot(rows, png)
        print("\n".join(bench.ratio_lines(rows, detail)))
        print(f"wrote {csv_path}, {detail_path} and {png}")
    return 0


def _plot(rows, path):
    """Allreduce time vs elements, one line per codec (log-log)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 4))
    labels = {"fp32": "float (MPI_SUM)", "fp16": "half (op)", "fp8": "fp8 (op)"}
    for codec in dict.fromkeys(r["codec"] for r in rows):
        pts = [(r["elements"], r["median_seconds"]) for r in rows if r["codec"] == codec]
        ax.plot(*zip(*pts), marker="o", label=labels.get(codec, codec))
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("elements")
    ax.set_ylabel("allreduce time [s] (median)")
    ax.set_title(f"allreduce, {rows[0]['processes']} processes")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
