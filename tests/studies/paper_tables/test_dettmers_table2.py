"""studies/paper_tables/dettmers_table2.py with --rounding: small samples, the CSV and closed forms."""
import csv
import os

import numpy
import pytest

from studies.paper_tables import dettmers_table2 as t2
from caffe8.comm.dettmers import Table

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))


def test_error_sums_closed_form():
    s = t2.ErrorSums()
    s.add(numpy.array([1.0, -2.0, 0.0]), numpy.array([1.5, -2.0, 0.25]))
    mae, mre, bias, mse = s.result()
    assert mae == pytest.approx(0.75 / 3) and bias == pytest.approx(0.75 / 3)
    assert mse == pytest.approx((0.25 + 0.0625) / 3)
    assert mre == pytest.approx(100 * 0.25)                     # x = 0 left out


def test_approximate_bisection_vs_nearest_on_linear_quantisation():
    t = Table("linear")
    # 0.3 lies between 38/127 and 39/127 (nearer the first); compare with the naive choice
    x = numpy.array([0.3, 38.2 / 127, 38.7 / 127])
    near = t2.approximate(t, x, 1.0)
    assert numpy.allclose(near * 127, [38, 38, 39])
    bisect = t2.approximate(t, x, 1.0, "bisection")
    assert numpy.all(numpy.abs(bisect - x) >= numpy.abs(near - x))


@pytest.mark.parametrize("rounding", ["nearest", "bisection"])
def test_csv(tmp_path, rounding):
    out = tmp_path / "t2.csv"
    png = tmp_path / "t2.png"
    t2.main(["--samples", "20000", "--rounding", rounding, "--csv", str(out), "--png", str(png)])
    assert png.read_bytes()[:4] == b"\x89PNG"
    with open(out) as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 16 and {r["rounding"] for r in rows} == {rounding}
    for r in rows:
        assert float(r["ours_mse"]) >= float(r["ours_mae"]) ** 2 * (1 - 1e-9)   # Jensen


def test_bisection_rounding_raises_the_errors():
    near = t2.measure("N(0,1)", 20000, 8192, 0)
    bisect = t2.measure("N(0,1)", 20000, 8192, 0, "bisection")
    for key in near:
        assert bisect[key][0] > near[key][0] and bisect[key][3] > near[key][3]
