"""studies/gradients/quantile_trace.py and grad_histograms.py on the digits net for a few iterations.

The quantiles are recomputed here from gradients captured by an independent backward hook:
D = g / (|W| + ε) in float32, then numpy.quantile of |D|. Tensors of at most R entries are
estimated from all entries, so they must match exactly; larger ones from R entries drawn with
replacement, so the estimate must lie between the full tensor's (Q − δ)- and (Q + δ)-quantiles,
δ = 6 binomial standard deviations √(Q(1 − Q)/R)."""
import csv
import os

import numpy
import pytest

from studies.gradients import grad_histograms
from studies.gradients import quantile_trace
from caffe8.engine import backend

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))
SOLVER = os.path.join(REPO, "prototxt", "digits", "solver.prototxt")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(autouse=True)
def _repo_cwd(monkeypatch):
    monkeypatch.chdir(REPO)   # the digits net reads data/digits relative to the CWD


def _capture(trainer):
    """{(iteration, tensor name): (grad copy, weight copy)} filled by a backward hook."""
    names = {(i, k): n for i, k, n in quantile_trace.tensor_names(trainer.net)}
    seen = {}

    def hook(i, layer):
        for k, blob in enumerate(layer.blobs):
            if (i, k) in names:
                seen[(trainer.iter, names[(i, k)])] = (backend.to_numpy(blob.diff).copy(),
                                                       backend.to_numpy(blob.data).copy())
    trainer.net.add_backward_hook(hook)
    return seen


def test_quantiles_match_numpy_on_the_same_samples():
    trainer = quantile_trace.make_trainer(SOLVER)
    seen = _capture(trainer)      # registered first: sees the same arrays as the trace's hook
    q, r, eps, seed = 0.9, 300, 1e-5, 7
    rows = quantile_trace.trace(trainer, 4, 2, q, r, eps, seed=seed)
    assert {row["iteration"] for row in rows} == {0, 2, 3}    # every 2nd and the last
    delta = 6 * (q * (1 - q) / r) ** 0.5
    sampled = 0
    for row in rows:
        g, w = seen[(row["iteration"], row["tensor"])]
        d = numpy.abs((g / (numpy.abs(w) + numpy.float32(eps))).astype(numpy.float32).ravel())
        d = d.astype(numpy.float64)
        assert row["elements"] == d.size
        if d.size <= r:
            assert row["quantile"] == pytest.approx(float(numpy.quantile(d, q)), rel=1e-12)
        else:
            sampled += 1
            lo, hi = numpy.quantile(d, [q - delta, min(q + delta, 1.0)])
            assert lo <= row["quantile"] <= hi, (row, lo, hi)
    assert sampled >= 3 * 3    # conv2, ip1, ip2 weights are larger than R at each of 3 points


def test_quantile_trace_cli_writes_csv_and_png(tmp_path):
    out = tmp_path / "qt"
    assert quantile_trace.main(["--solver", SOLVER, "--out", str(out), "--iterations", "3",
                                "--interval", "1", "--tensors", "conv1.weight,ip2.bias"]) == 0
    rows = list(csv.DictReader(open(out / "quantile_trace.csv")))
    assert [(r["iteration"], r["tensor"]) for r in rows] == [
        (str(i), t) for i in range(3) for t in ("ip2.bias", "conv1.weight")]
    assert all(float(r["quantile"]) > 0 for r in rows)
    assert (out / "quantile_trace.png").read_bytes()[:8] == PNG_MAGIC
    assert quantile_trace.main(["--solver", SOLVER, "--out", str(out), "--iterations", "1",
                                "--tensors", "nope.weight"]) == 1


def test_log_histogram_against_a_loop():
    rng = numpy.random.default_rng(3)
    v = 10.0 ** rng.uniform(-7, 2, 5000) * rng.choice([-1, 1], 5000)
    v[:37] = 0.0
    edges, counts, zeros = grad_histograms.log_histogram(v, bins_per_decade=2)
    assert zeros == 37 and counts.sum() == 5000 - 37
    expect = {}
    for x in numpy.abs(v[37:]):
        k = int(numpy.floor(numpy.log10(x) * 2))   # half-decade bucket of x
        expect[k] = expect.get(k, 0) + 1
    lo = int(round(numpy.log10(edges[0]) * 2))
    got = {lo + j: int(c) for j, c in enumerate(counts) if c}
    assert got == expect


def test_grad_histograms_cli(tmp_path):
    out = tmp_path / "gh"
    assert grad_histograms.main(["--solver", SOLVER, "--out", str(out), "--at", "0,2",
                                 "--tensors", "conv2.weight", "--processes-per-node", "2"]) == 0
    hist = list(csv.DictReader(open(out / "grad_histograms.csv")))
    window = list(csv.DictReader(open(out / "grad_window.csv")))
    assert {(r["iteration"], r["kind"]) for r in window} == {
        (i, k) for i in ("0", "2") for k in ("grad", "ratio")}
    for w in window:
        counts = [int(h["count"]) for h in hist
                  if (h["iteration"], h["tensor"], h["kind"]) == (w["iteration"], w["tensor"],
                                                                  w["kind"])]
        assert sum(counts) == 64 * 32 * 3 * 3          # every entry counted once
        q, lo, hi = float(w["q"]), float(w["window_lo"]), float(w["window_hi"])
        # P' = 2: values are sent as v·57344/(2q); fp8 holds [2^-16, 57344].
        assert hi == pytest.approx(2 * q, rel=1e-5)
        assert lo == pytest.approx(2 * q * 2.0 ** -16 / 57344, rel=1e-5)
        # The window's top is 2q (above the Q = 0.95 quantile): fewer than 5 % lie above.
        assert 0.0 <= float(w["frac_above"]) < 0.05
    assert (out / "grad_histograms.png").read_bytes()[:8] == PNG_MAGIC
