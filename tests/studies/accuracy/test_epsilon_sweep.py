"""studies/accuracy/epsilon_sweep.py: the variants it asks accuracy_compare for (Oyama et al.'s figure 8)
and the summary arithmetic, on hand-made rows."""
import csv
import os

import pytest

from studies.accuracy import accuracy_compare
from studies.accuracy import epsilon_sweep as es

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))


def test_variants():
    v = dict(accuracy_compare.parse_variants(es.variants_text()))
    assert list(v) == ["fp32", "fp8_eps0.001", "fp8_eps0.0001", "fp8_eps1e-05", "fp8_direct"]
    assert v["fp32"] == {"codec": "fp32"}
    for name, eps in (("fp8_eps0.001", 1e-3), ("fp8_eps0.0001", 1e-4), ("fp8_eps1e-05", 1e-5)):
        assert v[name] == {"codec": "fp8", "hierarchical": True, "warmup_fp32_iters": 0,
                           "relative": True, "epsilon": pytest.approx(eps)}
    assert v["fp8_direct"]["relative"] is False and "epsilon" not in v["fp8_direct"]


def _row(variant, it, acc, loss=0.5):
    return {"variant": variant, "iteration": it, "seconds": float(it), "test_accuracy": acc,
            "test_loss": loss}


def test_summary_and_replot(tmp_path):
    rows = [_row("fp32", 0, 0.1), _row("fp32", 50, 0.95), _row("fp32", 100, 0.94, 0.2),
            _row("fp8_direct", 100, 0.90, 0.3), _row("fp8_direct", 0, 0.1),
            _row("fp8_direct", 50, 0.92)]
    summary = {r["variant"]: r for r in es.summarise(rows)}
    assert summary["fp32"]["final_accuracy"] == 0.94 and summary["fp32"]["best_accuracy"] == 0.95
    d = summary["fp8_direct"]
    assert d["final_iteration"] == 100 and d["final_loss"] == 0.3
    assert d["final_minus_fp32_points"] == pytest.approx(-4.0)
    assert d["best_minus_fp32_points"] == pytest.approx(-3.0)
    runs = tmp_path / "runs"
    runs.mkdir()
    accuracy_compare.write_csv(rows, str(runs / "accuracy.csv"))
    assert es.main(["--replot", "--runs", str(runs), "--out", str(tmp_path)]) == 0
    with open(tmp_path / "epsilon_sweep_digits_summary.csv") as f:
        assert {r["variant"] for r in csv.DictReader(f)} == {"fp32", "fp8_direct"}
    assert (tmp_path / "epsilon_sweep_digits_accuracy.png").read_bytes()[:4] == b"\x89PNG"
