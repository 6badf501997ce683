"""studies/accuracy/rounding_ablation.py: the bias measures against closed forms, the CSV/PNG output, and
the training variants it asks accuracy_compare for."""
import csv
import os

import numpy
import pytest

from studies.accuracy import accuracy_compare
from studies.accuracy import rounding_ablation as ra

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


ONE, THREE_EIGHTHS = 0x3C, 0x36      # fp8 codes of 1.0 and 0.375 (half 0x3C00, 0x3600)


def test_relative_errors_closed_form():
    bias, rms = ra.relative_errors([1.25, -2.0], [1.375, -1.5])
    # sign(exact) * err: -0.125 and +0.5 over |exact| 2.875; rms over sqrt(1.375^2 + 1.5^2)
    assert bias == pytest.approx((-0.125 + 0.5) / 2.875, rel=1e-15)
    assert rms == pytest.approx(((0.125 ** 2 + 0.5 ** 2) / (1.375 ** 2 + 1.5 ** 2)) ** 0.5,
                                rel=1e-15)


def test_tie_goes_to_even_with_nearest_and_toward_zero_with_oyama():
    # 1 + 0.375 = 1.375 lies halfway between the fp8 values 1.25 and 1.5
    codes = numpy.array([[ONE, ONE | 0x80], [THREE_EIGHTHS, THREE_EIGHTHS | 0x80]], numpy.uint8)
    from caffe8.comm import fp8
    nearest = fp8.decode(ra.chain_sum(codes, "nearest"))
    oyama = fp8.decode(ra.chain_sum(codes, "oyama"))
    assert list(nearest) == [1.5, -1.5] and list(oyama) == [1.25, -1.25]
    assert ra.relative_errors(oyama, [1.375, -1.375])[0] == pytest.approx(-1 / 11, rel=1e-15)


def test_chain_sum_is_left_to_right():
    # (57344 + 57344) saturates, then - 57344 gives 0; any other order would give 57344
    codes = numpy.array([[0x7B], [0x7B], [0xFB]], numpy.uint8)
    from caffe8.comm import fp8
    for mode in ra.MODES:
        assert fp8.decode(ra.chain_sum(codes, mode))[0] == 0.0


def test_addends_never_saturate_a_chain():
    for k in (2, 4, 8):
        x = ra.addends("symmetric", k, 5000, numpy.random.default_rng(k))
        assert x.shape == (k, 5000) and x.dtype == numpy.float32
        assert numpy.abs(x).sum(axis=0).max() <= 0.875 * 57344
    with pytest.raises(ValueError, match="law"):
        ra.addends("uniform", 2, 10, numpy.random.default_rng(0))


def test_bias_rows_csv_and_png(tmp_path):
    assert ra.main(["bias", "--out", str(tmp_path), "--samples", "4000"]) == 0
    with open(tmp_path / "rounding_ablation_sum_bias.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2 * 3 * 2
    by = {(r["law"], int(r["addends"]), r["rounding"]): r for r in rows}
    for law in ("same_sign", "symmetric"):
        for k in (2, 4, 8):
            oyama, nearest = by[law, k, "oyama"], by[law, k, "nearest"]
            # truncation only ever moves toward zero: a bias no rounding to nearest can have
            assert float(oyama["sum_rel_bias"]) < float(nearest["sum_rel_bias"]) - 0.02
    assert (tmp_path / "rounding_ablation_sum_bias.png").read_bytes()[:8] == PNG_MAGIC


def test_training_variants_are_valid_accuracy_compare_variants():
    variants = dict(accuracy_compare.parse_variants(ra.variants_text()))
    assert variants == {
        f"fp8_{m}": {"codec": "fp8", "relative": True, "hierarchical": True, "rounding": m,
                     "warmup_fp32_iters": 0} for m in ("nearest", "oyama")}
