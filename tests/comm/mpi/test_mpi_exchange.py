"""MPI side of the exchange: rank programs under mpiexec, plus the parts that need no MPI."""
import os
import subprocess
import sys
import time

import numpy
import pytest

from mpirunner import run_ranks

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))
pytestmark = pytest.mark.mpi


@pytest.mark.parametrize("ranks,ppn", [(4, 2), (6, 2), (6, 3)])
def test_hierarchical_fp8_sum_equals_ml_dtypes_simulation(mpirun, ranks, ppn):
    assert f"fp8 exact P={ranks} ppn={ppn}: OK" in mpirun("prog_fp8_exact.py", ranks, ppn)


@pytest.mark.parametrize("ranks,ppn", [(4, 2), (6, 3)])
def test_every_algorithm_and_codec_returns_the_mean(mpirun, ranks, ppn):
    assert f"means P={ranks} ppn={ppn}: OK" in mpirun("prog_means.py", ranks, ppn)


def test_quantile_scaling_keeps_out_of_range_gradients_finite(mpirun):
    assert "quantile P=4: OK" in mpirun("prog_quantile.py", 4)


def test_node_comms_warmup_layer_exchange_and_checksum(mpirun):
    assert "exchange: OK" in mpirun("prog_exchange.py", 4)


def test_datatype_user_ops_and_settings(mpirun):
    assert "ops: OK" in mpirun("prog_ops.py", 2)


def test_failing_rank_ends_the_whole_job():
    pytest.importorskip("mpi4py")
    start = time.monotonic()
    proc = run_ranks("prog_abort.py", 4, timeout=60)
    elapsed = time.monotonic() - start
    assert proc.returncode != 0, proc.stdout[-2000:]
    assert "rank 1 fails on purpose" in proc.stdout
    assert "unreachable" not in proc.stdout
    assert elapsed < 60


def test_killed_rank_ends_job_within_60s():
    start = time.monotonic()
    proc = run_ranks("prog_killed.py", 4, timeout=60)
    assert proc.returncode != 0, proc.stdout[-2000:]
    assert "unreachable" not in proc.stdout
    assert time.monotonic() - start < 60


def _python(code, env=None):
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=120,
                          env={**os.environ, **(env or {})})


def test_comm_works_without_mpi4py():
    code = (
        "import sys; sys.modules['mpi4py'] = None\n"
        "import numpy\n"
        "from types import SimpleNamespace\n"
        "import comm.mpi, comm.ops, comm.allreduce, comm.codecs, comm.quantile, comm.exchange\n"
        "w = comm.mpi.get_world()\n"
        "assert (w.rank, w.size, w.comm, w.is_mpi) == (0, 1, None, False)\n"
        "net = SimpleNamespace(flat_diff=numpy.arange(4, dtype=numpy.float32),\n"
        "    flat_data=numpy.ones(4, numpy.float32), layer_param_slices={0: [(0, slice(0, 4))]})\n"
        "ex = comm.exchange.GradientExchange(w, None, net)\n"
        "ex.exchange_all()\n"
        "assert net.flat_diff.tolist() == [0, 1, 2, 3] and ex.checksum_check()\n"
        "print('no-mpi OK')\n")
    proc = _python(code)
    assert proc.returncode == 0 and "no-mpi OK" in proc.stdout, proc.stdout


def test_user_settings_win_over_ours():
    pytest.importorskip("mpi4py")
    code = ("import os, comm.mpi as m\n"
            "m.mpi_module()\n"
            "print(os.environ['MPIR_CVAR_POSIX_POLL_FREQUENCY'], m.thread_level_name(),\n"
            "      os.environ.get('MPIR_CVAR_CH4_CMA_ENABLE', 'unset'))\n")
    from comm.mpi import _cma_permitted
    env = {"MPIR_CVAR_POSIX_POLL_FREQUENCY": "7", "MPI4PY_RC_THREAD_LEVEL": "funneled"}
    proc = _python(code, env)
    assert proc.returncode == 0, proc.stdout
    cma = "1" if _cma_permitted() else "unset"
    assert proc.stdout.split()[-3:] == ["7", "funneled", cma]
    proc = _python(code, {**env, "MPIR_CVAR_CH4_CMA_ENABLE": "0"})
    assert proc.stdout.split()[-1] == "0"


# --- pieces that need no MPI ---------------------------------------------------------------------
def test_padding():
    from comm.ops import pad, padded_length
    assert [padded_length(n, 16, 3) for n in (0, 1, 48, 49)] == [0, 48, 48, 96]
    w = numpy.arange(1, 6, dtype=numpy.uint8)
    out = pad(w, 16)
    assert out.tolist() == list(range(1, 6)) + [0] * 11
    assert pad(out, 16) is out


def test_registries_name_the_valid_choices():
    from comm.allreduce import create_allreduce
    from comm.codecs import create_codec
    with pytest.raises(ValueError, match=r"Unrecognized allreduce algorithm: 'tree', valid: "
                                         r"flat, hierarchical, ring, rsag"):
        create_allreduce("tree", None)
    with pytest.raises(ValueError, match=r"Unrecognized codec: 'int4', valid: .*fp16.*fp8"):
        create_codec("int4")
    with pytest.raises(ValueError, match="nearest, truncate"):
        create_codec("fp8", rounding="up")


def test_sample_quantile_matches_numpy_and_is_seeded():
    from comm.quantile import QuantileTracker, sample_quantile
    x = numpy.random.default_rng(0).standard_normal(5000).astype(numpy.float32)
    small = numpy.abs(x[:700])
    assert sample_quantile(small, 0.95, 1024, numpy.random.default_rng(1)) == pytest.approx(
        float(numpy.quantile(small.astype(numpy.float64), 0.95)), rel=0, abs=0)
    idx = numpy.random.default_rng(4).integers(0, 5000, 1024)
    expected = numpy.quantile(numpy.abs(x)[idx].astype(numpy.float64), 0.95)
    assert sample_quantile(numpy.abs(x), 0.95, 1024, numpy.random.default_rng(4)) == expected
    a, b = QuantileTracker(seed=3, rank=0), QuantileTracker(seed=3, rank=5)
    assert a.update("k", x, None) == b.update("k", x, None)      # shared seed: same positions
    c = QuantileTracker(seed=3, rank=5, shared_seed=False)
    assert c.update("k", x, None) != a.values["k"]
    assert QuantileTracker().update("z", numpy.zeros(10, numpy.float32), None) == 1.0
    with pytest.raises(ValueError, match="comm.quantile"):
        QuantileTracker(quantile=1.5)


def test_settings_come_from_the_solvers_comm_block():
    from engine import prototxt
    from comm.exchange import _setting
    solver = prototxt.parse_text('comm { codec: "fp16" processes_per_node: 2 }', "s.prototxt",
                                 "SolverParameter")
    got = [_setting(solver.comm, k) for k in ("codec", "processes_per_node", "relative",
                                              "algorithm", "quantile", "warmup_fp32_iters")]
    assert got == ["fp16", 2, True, "", pytest.approx(0.95), 0]
    assert _setting(None, "codec") == "fp8"
