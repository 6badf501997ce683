#!/usr/bin/env python
"""Strom's threshold quantisation: compression ratio vs tau on our nets' real gradients, and
the arithmetic of the paper's Tables 3 and 4 ("Scalable distributed DNN training using commodity
GPU cloud computing").

Compression ratio, as the paper defines it: the size of the full gradient divided by the size of
the sparse update, i.e. ``4 n / (4 m)`` for n float32 weights and m sent uint32 words (index and
sign packed, comm/strom.py), accumulated over the iterations measured. The residuals carry from
one iteration to the next (error feedback), each parameter tensor its own, exactly as
``comm.strom.threshold_step`` does in training.

1. ``measure``: the raw (pre-exchange) gradients of the first ``--iterations`` training
   iterations of each net, recorded in one process, then replayed through the threshold step for
   every tau of a log grid. Nets: the digits demo (prototxt/digits) and LeNet at test size
   (prototxt/lenet/train_val_small.prototxt: LeNet's layers on 4 DummyData images). Columns also
   give tau / RMS(gradient), which makes the nets comparable.
2. ``paper``: Table 3's update sizes from its ratios: with n = 14.6 M weights (Table 4's 5-layer
   DNN), 4 n / ratio bytes per mini-batch (69 KB at tau = 4, ratio 846), and the implied n of
   every row; Table 4's update sizes 4 n / ratio for the larger models.

Usage (from the repository root)::

    python -m studies.gradients.strom_ratios --out docs/figures --iterations 20

Writes OUT/strom_ratio_vs_tau.{csv,png} and OUT/strom_ratio_paper_tables.csv.
"""
import argparse
import os
import sys
import tempfile

import numpy

from caffe8.comm.strom import threshold_step
from caffe8.engine import backend
from studies._runs import pyplot, save_figure, write_rows
from studies.gradients.quantile_trace import REPO, make_trainer, probe_training

# Table 3: tau -> (update size per mini-batch in KB, compression ratio), as printed
TABLE3 = {2.0: (210, 278), 4.0: (69, 846), 6.0: (33, 1770), 9.0: (15, 3893),
          12.0: (7.8, 7487), 15.0: (4.5, 12978)}
# Table 4: model -> (weights in millions, compression ratio), as printed
TABLE4 = {"5 hidden layers": (14.6, 846), "8 hidden layers": (21.7, 998),
          "5 hidden layers of 2x size": (23.7, 1436), "5 hidden layers of 3x size": (48.8, 2871)}
BYTES_PER_WEIGHT = BYTES_PER_WORD = 4
LENET_SMALL_SOLVER = """net: "{net}"
base_lr: 0.01
momentum: 0.9
weight_decay: 0.0005
lr_policy: "fixed"
max_iter: {iters}
display: 0
snapshot: 0
solver_mode: CPU
random_seed: 1
"""
RATIO_FIELDS = ("net", "weights", "iterations", "tau", "tau_over_rms", "sent_words",
                "update_bytes_per_iteration", "compression_ratio")


# --- the paper's arithmetic --------------------------------------------------------------------
def compression_ratio(weights, sent_words):
    """Full gradient size over sparse update size: 4 n / (4 m)."""
    return BYTES_PER_WEIGHT * weights / (BYTES_PER_WORD * sent_words) if sent_words else \
        float("inf")


def paper_rows(weights=14.6e6):
    rows = []
    for tau, (kb, ratio) in TABLE3.items():
        update_kb = BYTES_PER_WEIGHT * weights / ratio / 1e3
        rows.append(dict(table="3", row=f"tau={tau:g}", weights_m=weights / 1e6,
                         ratio=ratio, printed_update_kb=kb, update_kb_from_ratio=update_kb,
                         weights_m_from_row=ratio * kb * 1e3 / BYTES_PER_WEIGHT / 1e6,
                         words_per_minibatch=kb * 1e3 / BYTES_PER_WORD))
    for model, (m, ratio) in TABLE4.items():
        rows.append(dict(table="4", row=model, weights_m=m, ratio=ratio, printed_update_kb="",
                         update_kb_from_ratio=BYTES_PER_WEIGHT * m * 1e6 / ratio / 1e3,
                         weights_m_from_row="",
                         words_per_minibatch=m * 1e6 / ratio))
    return rows


# --- measuring ----------------------------------------------------------------------------------
def record_gradients(trainer, iterations):
    """{tensor name: [flat float32 gradient of each iteration]} of the first iterations."""
    grads = {}

    def keep(it, name, grad, weight):
        grads.setdefault(name, []).append(
            numpy.array(backend.to_numpy(grad), numpy.float32).ravel())

    probe_training(trainer, iterations, lambda it: True, keep)
    return grads


def sent_words(grads, tau):
    """Words the threshold step sends over the recorded iterations (residual per tensor)."""
    total = 0
    for seq in grads.values():
        residual = numpy.zeros(seq[0].size, numpy.float32)
        for g in seq:
            total += threshold_step(residual, g, tau).size
    return total


def ratio_rows(name, grads, taus):
    weights = sum(seq[0].size for seq in grads.values())
    iterations = len(next(iter(grads.values())))
    allg = numpy.concatenate([g for seq in grads.values() for g in seq]).astype(numpy.float64)
    rms = float(numpy.sqrt(numpy.mean(allg * allg)))
    rows = []
    for tau in taus:
        m = sent_words(grads, tau)
        rows.append(dict(net=name, weights=weights, iterations=iterations, tau=float(tau),
                         tau_over_rms=float(tau) / rms, sent_words=m,
                         update_bytes_per_iteration=BYTES_PER_WORD * m / iterations,
                         compression_ratio=compression_ratio(weights * iterations, m)))
    return rows


def nets(iterations, workdir):
    """(name, solver path) of the measured nets; LeNet small gets a solver written here."""
    lenet = os.path.join(workdir, "lenet_small_solver.prototxt")
    with open(lenet, "w", encoding="utf-8") as f:
        f.write(LENET_SMALL_SOLVER.format(
            net=os.path.join(REPO, "prototxt", "lenet", "train_val_small.prototxt"),
            iters=iterations))
    return [("digits", os.path.join(REPO, "prototxt", "digits", "solver.prototxt")),
            ("lenet_small", lenet)]


def plot(rows, path):
    plt = pyplot()
    fig, (ax_abs, ax_rel) = plt.subplots(1, 2, figsize=(11, 4))
    for name in dict.fromkeys(r["net"] for r in rows):
        pts = [r for r in rows if r["net"] == name and r["sent_words"] > 0]
        label = f"{name} ({pts[0]['weights']:,} weights)" if pts else name
        ax_abs.plot([r["tau"] for r in pts], [r["compression_ratio"] for r in pts], "o-",
                    label=label)
        ax_rel.plot([r["tau_over_rms"] for r in pts], [r["compression_ratio"] for r in pts],
                    "o-", label=label)
    ax_abs.set_xlabel("threshold tau")
    ax_rel.set_xlabel("tau / RMS of the gradient")
    for ax in (ax_abs, ax_rel):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_ylabel("compression ratio 4n / update bytes")
        ax.axhline(846, color="gray", ls=":", lw=0.8, label="Strom, tau = 4: 846")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
    fig.suptitle("Strom's threshold quantisation with residuals on the first training "
                 "iterations' gradients")
    save_figure(fig, path)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(REPO, "docs", "figures"))
    ap.add_argument("--iterations", type=int, default=20)
    ap.add_argument("--taus", default="1e-5,1e-4,1e-3,3e-3,1e-2,3e-2,1e-1,3e-1,1",
                    help="comma-separated thresholds")
    ap.add_argument("--nets", default="digits,lenet_small")
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    taus = [float(t) for t in args.taus.split(",") if t.strip()]
    paper = paper_rows()
    write_rows(paper, list(paper[0]), os.path.join(args.out, "strom_ratio_paper_tables.csv"))
    for r in paper[:len(TABLE3)]:
        print(f"Table 3 {r['row']}: ratio {r['ratio']} -> 4n/ratio = "
              f"{r['update_kb_from_ratio']:.1f} KB (printed {r['printed_update_kb']} KB)")
    rows = []
    wanted = [n for n in args.nets.split(",") if n]
    with tempfile.TemporaryDirectory() as work:
        for name, solver in nets(args.iterations, work):
            if name in wanted:
                grads = record_gradients(make_trainer(solver), args.iterations)
                rows += ratio_rows(name, grads, taus)
    path = os.path.join(args.out, "strom_ratio_vs_tau.csv")
    write_rows(rows, RATIO_FIELDS, path)
    plot(rows, path[:-4] + ".png")
    for r in rows:
        print(f"{r['net']:12s} tau {r['tau']:8.1e} (tau/rms {r['tau_over_rms']:8.3g}) sent "
              f"{r['sent_words']:8d} ratio {r['compression_ratio']:10.4g}")
    print(f"wrote {path} and its .png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
