#!/usr/bin/env python
"""Per-tensor Q-quantile of |D| = |∇W / (|W| + ε)| during training (Oyama et al.'s figure 12).

Usage (from the repository root)::

    python -m studies.gradients.quantile_trace --out runs/qtrace --iterations 1000 --interval 20

Trains the solver's net in one process (no exchange; the solver's own update) with a backward
hook: every ``--interval`` iterations, right after a layer's backward, each of its parameter
tensors gets D from the fp8 codec's own ``ratio`` (comm/codecs.py) and q from a
``comm.quantile.QuantileTracker`` — the exchange's own estimator (at most R random entries,
with replacement; all entries of smaller tensors), here without the MAX-allreduce (one process).
``--direct`` traces |∇W| instead (the D_l = ∇W_l ablation).
Writes OUT/quantile_trace.csv (iteration, tensor, elements, quantile) and OUT/quantile_trace.png
(log-scale traces; weights solid, biases dotted, as in figure 12).

``probe_training`` is the shared part (also used by grad_histograms.py): it calls
``fn(iteration, tensor name, grad, weight)`` for every parameter tensor at chosen iterations.
"""
import argparse
import csv
import inspect
import os
import sys

from caffe8.comm.codecs import create_codec
from caffe8.comm.config import parse_comm
from caffe8.comm.quantile import QuantileTracker
from caffe8.engine.errors import CaffeError
from studies._runs import pyplot, save_figure

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TENSOR_SUFFIX = {0: "weight", 1: "bias"}


def tensor_names(net):
    """[(layer index, blob index, "layer.weight" / "layer.bias" / "layer.k")] of owned params."""
    out = []
    for net_id, (i, k) in enumerate(net.param_layer_indices):
        if net.param_owners[net_id] is None:
            out.append((i, k, f"{net.layers[i].name}.{TENSOR_SUFFIX.get(k, k)}"))
    return out


def make_trainer(solver_path):
    """A one-process Trainer on ``solver_path`` with testing, display and snapshots off."""
    from caffe8.wiring import build_trainer
    if os.path.basename(os.path.dirname(os.path.abspath(solver_path))) == "digits":
        from caffe8.engine.datasets import ensure_digits
        ensure_digits()
    trainer = build_trainer(solver_path)
    for field in ("test_interval", "display", "snapshot"):
        setattr(trainer.param, field, 0)
    trainer.param.snapshot_after_train = False
    return trainer


def probe_training(trainer, iterations, want, fn, tensors=None):
    """Train ``iterations`` steps; for every iteration ``it`` with ``want(it)`` call
    ``fn(it, name, grad, weight)`` (device arrays, the tensor's shape) after its layer's
    backward, i.e. on the raw gradient of that iteration before any exchange or update.
    ``tensors``: names to keep (None: all)."""
    net = trainer.net
    by_layer = {}
    for i, k, name in tensor_names(net):
        if tensors is None or name in tensors:
            by_layer.setdefault(i, []).append((k, name))
    if tensors is not None:
        missing = set(tensors) - {n for v in by_layer.values() for _, n in v}
        if missing:
            raise CaffeError(f"net '{net.name}' has no parameter tensor(s) {sorted(missing)}; "
                             f"valid: {[n for _, _, n in tensor_names(net)]}")

    def hook(i, layer):
        if i in by_layer and want(trainer.iter):
            for k, name in by_layer[i]:
                fn(trainer.iter, name, layer.blobs[k].diff, layer.blobs[k].data)

    net.add_backward_hook(hook)
    trainer.step(iterations)


def tracker_quantile(tracker, key, d, iteration):
    """q of tensor ``key`` from D by ``tracker.update`` (one process: no allreduce). Passes the
    iteration when the tracker's ``update`` takes one (its sample positions may depend on it)."""
    if "iteration" in inspect.signature(tracker.update).parameters:
        return tracker.update(key, d, None, iteration=iteration)
    return tracker.update(key, d, None)


def trace(trainer, iterations, interval, quantile, samples, epsilon, seed=0, relative=True,
          tensors=None):
    """[{iteration, tensor, elements, quantile}] every ``interval`` iterations (and the last)."""
    codec = create_codec("fp8", parse_comm(f"relative: {str(bool(relative)).lower()} "
                                           f"epsilon: {float(epsilon)!r}"))
    tracker = QuantileTracker(quantile, max(1, interval), samples, seed)
    rows = []

    def record(it, name, grad, weight):
        d = codec.ratio(grad, weight)
        q = tracker_quantile(tracker, name, d, it)
        rows.append({"iteration": it, "tensor": name, "elements": int(d.size), "quantile": q})

    probe_training(trainer, iterations,
                   lambda it: it % interval == 0 or it == iterations - 1, record, tensors)
    return rows


def write_csv(rows, path):
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=["iteration", "tensor", "elements", "quantile"])
        w.writeheader()
        for r in rows:
            w.writerow(dict(r, quantile=f"{r['quantile']:.9g}"))


def plot(rows, path, title):
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    layers = list(dict.fromkeys(r["tensor"].rsplit(".", 1)[0] for r in rows))
    colors = {name: plt.cm.tab10(k % 10) for k, name in enumerate(layers)}
    series = {}
    for r in rows:
        series.setdefault(r["tensor"], []).append((r["iteration"], r["quantile"]))
    for name, pts in series.items():
        layer, _, kind = name.rpartition(".")
        it, q = zip(*sorted(pts))
        ax.plot(it, [max(v, 1e-30) for v in q], ":" if kind == "bias" else "-",
                color=colors[layer], label=name)
    ax.set_yscale("log")
    ax.set_xlabel("iteration")
    ax.set_ylabel("Q-quantile of |D|")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, ncol=2)
    ax.set_title(title, fontsize=10)
    save_figure(fig, path)


def build_parser():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--solver", default=os.path.join(REPO, "prototxt", "digits", "solver.prototxt"))
    ap.add_argument("--out", required=True)
    ap.add_argument("--iterations", type=int, default=0, help="default: the solver's max_iter")
    ap.add_argument("--interval", type=int, default=0,
                    help="N (default: the solver's comm.quantile_interval)")
    ap.add_argument("--quantile", type=float, default=None, help="Q (default: comm.quantile)")
    ap.add_argument("--samples", type=int, default=0, help="R (default: comm.samples)")
    ap.add_argument("--epsilon", type=float, default=None, help="default: comm.epsilon")
    ap.add_argument("--seed", type=int, default=0, help="sampling generator seed")
    ap.add_argument("--direct", action="store_true", help="trace |∇W| instead of |D|")
    ap.add_argument("--tensors", default="", help="comma-separated tensor names (default: all)")
    return ap


def main(argv=None):
    args = build_parser().parse_args(argv)
    try:
        trainer = make_trainer(args.solver)
        comm = trainer.param.comm
        iterations = args.iterations or int(trainer.param.max_iter)
        rows = trace(trainer, iterations, args.interval or comm.quantile_interval,
                     args.quantile if args.quantile is not None else comm.quantile,
                     args.samples or comm.samples,
                     args.epsilon if args.epsilon is not None else comm.epsilon,
                     args.seed, not args.direct,
                     [t for t in args.tensors.split(",") if t] or None)
    except CaffeError as e:
        print(f"quantile_trace: error: {e}", file=sys.stderr)
        return 1
    os.makedirs(args.out, exist_ok=True)
    write_csv(rows, os.path.join(args.out, "quantile_trace.csv"))
    what = "|∇W|" if args.direct else "|D|"
    plot(rows, os.path.join(args.out, "quantile_trace.png"),
         f"{trainer.net.name}: Q-quantile of {what} per tensor")
    last = {}
    for r in rows:
        last[r["tensor"]] = r
    qs = [r["quantile"] for r in last.values() if r["quantile"] > 0]
    for r in last.values():
        print(f"{r['tensor']:16s} n={r['elements']:8d}  q={r['quantile']:.4g} "
              f"(iter {r['iteration']})")
    if qs:
        print(f"spread of the last quantiles: max/min = {max(qs) / min(qs):.3g}")
    print(f"wrote {args.out}/quantile_trace.csv and .png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
