"""studies/paper_tables/aps_roundoff.py: the grouped small-format sum against hand-derived sums, the CSV."""
import csv

import numpy
import pytest

from studies.paper_tables import aps_roundoff as ar

from caffe8.comm.formats import get_format  # noqa: E402


def test_grouping_changes_the_rounding_as_derived_by_hand():
    """E5M2, 1.0 then seven 0.125s (exact 1.875). Flat: every 1 + 0.125 ties to 1.0, so 1.0.
    Groups of 4: 1 + 3 * 0.125 -> 1.0 and 4 * 0.125 = 0.5 exactly; 1.0 + 0.5 = 1.5.
    Groups of 2: 1.0, 0.25, 0.25, 0.25 -> 1.25, 1.5, 1.75."""
    fmt = get_format("E5M2")
    rows = [numpy.array([1.0])] + [numpy.array([0.125])] * 7
    assert ar.grouped_sum(rows, fmt, 8, False).tolist() == [1.0]
    assert ar.grouped_sum(rows, fmt, 1, False).tolist() == [1.0]
    assert ar.grouped_sum(rows, fmt, 4, False).tolist() == [1.5]
    assert ar.grouped_sum(rows, fmt, 2, False).tolist() == [1.75]
    with pytest.raises(ValueError, match="does not divide"):
        ar.grouped_sum(rows, fmt, 3, False)


def test_wire_rows_keep_the_p_fold_sum_in_range():
    grads = ar.synthetic_gradients(16, 64, seed=3)
    fmt = get_format("E5M2")
    rows, k = ar.wire_rows(grads, fmt)
    assert numpy.abs(numpy.sum(numpy.abs(rows), axis=0)).max() <= fmt.max
    peak = numpy.abs(grads).max()
    assert 16 * 2.0 ** (numpy.floor(numpy.log2(peak)) + 1 + k) <= fmt.max \
        < 16 * 2.0 ** (numpy.floor(numpy.log2(peak)) + 2 + k)


def test_study_writes_one_row_per_setting(tmp_path):
    path = tmp_path / "r.csv"
    rows = ar.main(["--formats", "E5M2", "--ranks", "8", "--groups", "2,4,3",
                    "--elements", "256", "--csv", str(path)])
    with open(path) as f:
        read = list(csv.DictReader(f))
    assert [(int(r["group_size"]), int(r["kahan"])) for r in read] == \
        [(2, 0), (2, 1), (4, 0), (4, 1), (8, 0), (8, 1)]
    assert len(rows) == 6 and all(float(r["sum_error_pct"]) >= 0 for r in read)
    # on these seeded inputs Kahan lowers the flat ring's round-off
    flat = {int(r["kahan"]): float(r["sum_error_pct"]) for r in read if r["group_size"] == "8"}
    assert flat[1] < flat[0]
