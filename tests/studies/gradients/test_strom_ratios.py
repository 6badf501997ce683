"""studies/gradients/strom_ratios.py: the paper's Table 3/4 arithmetic ("Scalable distributed DNN training
using commodity GPU cloud computing"), the residual replay against a closed form, and a short
real run on LeNet at test size."""
import csv
import math
import os

import numpy
import pytest

from studies.gradients import strom_ratios as sr

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))


def test_table3_update_size_at_tau_4():
    # 4 bytes x 14.6 M weights / 846 = 69.0 KB per mini-batch, as printed
    row = [r for r in sr.paper_rows() if r["row"] == "tau=4"][0]
    assert row["update_kb_from_ratio"] == pytest.approx(4 * 14.6e6 / 846 / 1e3)
    assert round(row["update_kb_from_ratio"]) == 69


def test_every_table3_row_implies_the_same_model():
    for r in sr.paper_rows():
        if r["table"] == "3":
            assert r["weights_m_from_row"] == pytest.approx(14.6, rel=0.002)
            assert r["update_kb_from_ratio"] == pytest.approx(r["printed_update_kb"], rel=0.006)


def test_table4_update_sizes_do_not_grow_with_layer_width():
    kb = {r["row"]: r["update_kb_from_ratio"] for r in sr.paper_rows() if r["table"] == "4"}
    assert kb["5 hidden layers of 2x size"] < kb["5 hidden layers"]
    assert kb["5 hidden layers of 3x size"] < kb["5 hidden layers"]


def test_compression_ratio():
    assert sr.compression_ratio(1000, 10) == 100.0
    assert math.isinf(sr.compression_ratio(1000, 0))


@pytest.mark.parametrize("steps", [3, 4, 5, 8, 9, 13])
def test_sent_words_closed_form(steps):
    # constant g = 0.25 < tau = 1 on 7 elements (and -g on 5): a word goes out at step t when
    # t g - s tau > tau, so after T steps s = ceil(T g / tau) - 1 per element (never negative)
    g = numpy.concatenate([numpy.full(7, 0.25), numpy.full(5, -0.25)]).astype(numpy.float32)
    grads = {"a": [g.copy() for _ in range(steps)]}
    per_element = max(0, math.ceil(steps * 0.25 / 1.0) - 1)
    assert sr.sent_words(grads, 1.0) == 12 * per_element


def test_residuals_are_per_tensor():
    grads = {"a": [numpy.full(3, 0.6, numpy.float32)] * 2,
             "b": [numpy.full(2, 0.6, numpy.float32)] * 2}
    assert sr.sent_words(grads, 1.0) == 5          # 1.2 > 1 once per element, not shared


def test_short_run_on_lenet_small(tmp_path):
    assert sr.main(["--out", str(tmp_path), "--iterations", "3", "--nets", "lenet_small",
                    "--taus", "1e-6,1e-2,10"]) == 0
    with open(tmp_path / "strom_ratio_vs_tau.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["net"] for r in rows] == ["lenet_small"] * 3
    sent = [int(r["sent_words"]) for r in rows]
    weights = int(rows[0]["weights"])
    assert sent[0] >= sent[1] >= sent[2]              # a larger tau never sends more
    assert sent[0] <= 3 * weights                     # at most one word per element and step
    assert float(rows[0]["compression_ratio"]) == pytest.approx(3 * weights / sent[0], rel=1e-5)
    assert (tmp_path / "strom_ratio_vs_tau.png").read_bytes()[:4] == b"\x89PNG"
    assert (tmp_path / "strom_ratio_paper_tables.csv").exists()
