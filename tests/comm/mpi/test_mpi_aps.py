"""APS under mpiexec: the small-format rank-order sum is bit-identical on every rank and equals
an independent per-addition simulation (prog_aps_sum.py)."""
import pytest

pytestmark = pytest.mark.mpi


def test_aps_small_format_sum_fp32_layers_and_iters_on_4_ranks(mpirun):
    out = mpirun("prog_aps_sum.py", 4)
    assert "aps small-format sum on 4 ranks: OK" in out
    # Kahan lowers the error of every format on the same inputs
    err = {line.split(":")[0]: float(line.rsplit(" ", 1)[1])
           for line in out.splitlines() if "relative L1 error" in line}
    for name in ("E5M2", "E4M3_APS", "E3M0"):
        assert err[f"{name} kahan=True"] < err[f"{name} kahan=False"]
