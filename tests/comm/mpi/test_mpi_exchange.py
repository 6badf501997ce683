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


@pytest.mark.parametrize("ranks,ppn", [(2, 2), (4, 2)])
def test_the_intra_node_stage_on_the_stand_in_device_gives_the_host_bits(mpirun, ranks, ppn):
    """prog_device_stage on the stand-in device (tests/device_standin), on every machine: the
    exchange's device buckets in the CUDA-IPC arena against host staging, fp8/fp16/fp32, async
    and sync, hierarchical and rsag, 3 changing steps, with every stream order checked."""
    out = mpirun("prog_device_stage.py", ranks, ppn, "standin")
    assert f"device stage P={ranks} ppn={ppn}: OK" in out


@pytest.mark.parametrize("ranks", [2, 4])
def test_the_device_arena_is_every_processs_or_none_and_falls_back_to_the_host_bits(mpirun,
                                                                                  ranks):
    """prog_device_arena on the stand-in: an arena across two GPUs with peer access; without
    it, with another process's GPU not visible, with an IPC open refused or a segment not
    allocated on one process, every process falls back (GPUs checked before any handle is
    opened) and its exchange gives the bits of host staging."""
    cases = ["twogpus", "nopeer", "invisible", "refused", "nomemory"]
    out = mpirun("prog_device_arena.py", ranks, ",".join(cases))
    assert all(f"{case}: OK" in out for case in cases), out[-2000:]


@pytest.mark.parametrize("ranks,ppn", [(4, 2), (6, 2), (6, 3)])
def test_hierarchical_fp8_sum_equals_ml_dtypes_simulation(mpirun, ranks, ppn):
    assert f"fp8 exact P={ranks} ppn={ppn}: OK" in mpirun("prog_fp8_exact.py", ranks, ppn)


@pytest.mark.gpu
@pytest.mark.parametrize("ranks,ppn", [(2, 2), (4, 2)])
def test_the_intra_node_stage_on_the_gpus_gives_the_host_bits(mpirun, ranks, ppn):
    """comm/ipc.py's device arena against host staging, the same exchange (prog_device_stage);
    the piece order without a GPU: prog_fp8_exact's "staged" arena."""
    assert f"device stage P={ranks} ppn={ppn}: OK" in mpirun("prog_device_stage.py", ranks, ppn)


@pytest.mark.parametrize("ranks,ppn", [(4, 2), (6, 3)])
def test_every_algorithm_and_codec_returns_the_mean(mpirun, ranks, ppn):
    assert f"means P={ranks} ppn={ppn}: OK" in mpirun("prog_means.py", ranks, ppn)


def test_quantile_scaling_keeps_out_of_range_gradients_finite(mpirun):
    assert "quantile P=4: OK" in mpirun("prog_quantile.py", 4)


def test_node_comms_warmup_layer_exchange_and_checksum(mpirun):
    assert "exchange: OK" in mpirun("prog_exchange.py", 4)


def test_async_and_sync_give_bit_identical_weights_for_every_codec(mpirun):
    """4 ranks in 2 emulated nodes; every codec of the registry, including a layer whose hook
    never came."""
    out = mpirun("prog_async_sync.py", 4)
    from caffe8.comm.codecs import CODECS
    assert all(f"{c}: async == sync" in out for c in CODECS) and "async == sync P=4: OK" in out


def test_watchdog_warns_then_names_only_the_rank_that_stays_away(mpirun):
    assert "watchdog: OK" in mpirun("prog_watchdog.py", 3)


@pytest.mark.parametrize("codec", ["dettmers", "aps", "strom"])
def test_gather_codecs_equal_rank_order_simulation_on_3_ranks(mpirun, codec):
    assert f"{codec} on 3 ranks: OK" in mpirun("prog_codec_means.py", 3, codec)


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
        "from caffe8 import comm\n"
        "import caffe8.comm.mpi, caffe8.comm.ops, caffe8.comm.allreduce, caffe8.comm.codecs, caffe8.comm.quantile, caffe8.comm.exchange\n"
        "from caffe8.comm.config import parse_comm, validate_comm\n"
        "w = comm.mpi.get_world()\n"
        "assert (w.rank, w.size, w.comm, w.is_mpi) == (0, 1, None, False)\n"
        "net = SimpleNamespace(flat_diff=numpy.arange(4, dtype=numpy.float32),\n"
        "    flat_data=numpy.ones(4, numpy.float32), layer_param_slices={0: [(0, slice(0, 4))]},\n"
        "    layers=[SimpleNamespace(name='ip')])\n"
        "c = validate_comm(parse_comm('codec: \"fp32\"'), 1)\n"
        "ex = comm.exchange.Exchange(w, c, net)\n"
        "ex.on_start(); ex.on_backward(0); ex.on_gradients_ready(); ex.close()\n"
        "assert net.flat_diff.tolist() == [0, 1, 2, 3] and ex.consistency_check()\n"
        "print('no-mpi OK')\n")
    proc = _python(code)
    assert proc.returncode == 0 and "no-mpi OK" in proc.stdout, proc.stdout


def test_user_settings_win_over_ours():
    pytest.importorskip("mpi4py")
    code = ("import os, caffe8.comm.mpi as m\n"
            "m.mpi_module()\n"
            "print(os.environ['MPIR_CVAR_POSIX_POLL_FREQUENCY'], m.thread_level_name(),\n"
            "      os.environ.get('MPIR_CVAR_CH4_CMA_ENABLE', 'unset'))\n")
    from caffe8.comm.mpi import _cma_permitted
    env = {"MPIR_CVAR_POSIX_POLL_FREQUENCY": "7", "MPI4PY_RC_THREAD_LEVEL": "funneled"}
    proc = _python(code, env)
    assert proc.returncode == 0, proc.stdout
    cma = "1" if _cma_permitted() else "unset"
    assert proc.stdout.split()[-3:] == ["7", "funneled", cma]
    proc = _python(code, {**env, "MPIR_CVAR_CH4_CMA_ENABLE": "0"})
    assert proc.stdout.split()[-1] == "0"


def _pid_of_rank(marker, rank):
    """PID of the rank process whose environment carries ``marker`` (set for this job only)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = dict(v.split(b"=", 1) for v in f.read().split(b"\0") if b"=" in v)
        except OSError:
            continue
        if env.get(b"CAFFE8_TEST_MARKER") == marker.encode() and \
                env.get(b"PMI_RANK") == str(rank).encode():
            return int(entry)
    return None


def test_stalled_rank_is_named_and_the_job_ends(tmp_path):
    """SIGSTOP rank 1 of a 2-process training with stall_timeout 20: rank 0 warns, then names
    rank 1 and the job ends with an error, well within 50 s."""
    import signal
    pytest.importorskip("mpi4py")
    if not os.path.isdir("/proc/self"):
        pytest.skip("needs /proc to find the rank's process")
    from caffe8.engine.datasets import ensure_digits
    from caffe8.engine.prototxt import parse_file, to_text
    ensure_digits(str(tmp_path / "data" / "digits"))
    sp = parse_file(os.path.join(ROOT, "prototxt", "digits", "solver.prototxt"), "SolverParameter")
    sp.net = os.path.join(ROOT, "prototxt", "digits", "train_val.prototxt")
    sp.snapshot_prefix = str(tmp_path / "snap" / "digits")
    sp.max_iter, sp.display, sp.test_interval, sp.snapshot = 1000000, 10, 0, 0
    sp.snapshot_after_train = False
    sp.comm.stall_timeout = 20
    solver = tmp_path / "solver.prototxt"
    solver.write_text(to_text(sp))
    marker = f"stall-{os.getpid()}-{time.monotonic_ns()}"
    env = dict(os.environ, PYTHONPATH=ROOT, CAFFE8_TEST_MARKER=marker)
    cmd = [os.path.join(os.path.dirname(sys.executable), "mpiexec"), "-n", "2", sys.executable,
           "-m", "caffe8.cli", "train", "--solver", str(solver)]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    stopped = None
    try:
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if "Iteration 20 (" in line:
                break
        stopped = _pid_of_rank(marker, 1)
        assert stopped is not None, "".join(lines)[-2000:]
        os.kill(stopped, signal.SIGSTOP)
        t = time.monotonic()
        out, _ = proc.communicate(timeout=50)
        elapsed = time.monotonic() - t
    finally:
        if proc.poll() is None:
            proc.kill()
        if stopped is not None:
            try:
                os.kill(stopped, signal.SIGCONT)
                os.kill(stopped, signal.SIGKILL)
            except ProcessLookupError:
                pass
    text = "".join(lines) + out
    assert proc.returncode != 0, text[-3000:]
    assert elapsed < 50
    assert "[rank 0] warning: waiting" in text, text[-3000:]
    assert "caffe8: error:" in text and "waiting for rank 1 does not answer" in text, text[-3000:]


def test_bad_comm_block_fails_on_every_rank_with_its_location(tmp_path):
    """processes_per_node 3 does not divide 2 processes: the job ends with one error line (the
    first failing rank's, rank-prefixed) naming the field at its file:line, no hang."""
    pytest.importorskip("mpi4py")
    from caffe8.engine.prototxt import parse_file, to_text
    sp = parse_file(os.path.join(ROOT, "prototxt", "digits", "solver.prototxt"), "SolverParameter")
    sp.net = os.path.join(ROOT, "prototxt", "digits", "train_val.prototxt")
    sp.comm.processes_per_node = 3
    text = to_text(sp)
    line = next(i for i, l in enumerate(text.splitlines(), 1) if "processes_per_node" in l)
    (tmp_path / "solver.prototxt").write_text(text)
    env = dict(os.environ, PYTHONPATH=ROOT)
    cmd = [os.path.join(os.path.dirname(sys.executable), "mpiexec"), "-n", "2", sys.executable,
           "-m", "caffe8.cli", "train", "--solver", str(tmp_path / "solver.prototxt")]
    r = subprocess.run(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=120)
    errors = [l for l in r.stdout.splitlines() if "caffe8: error:" in l]
    assert r.returncode != 0 and len(errors) == 1, r.stdout[-3000:]
    assert errors[0].startswith("[rank ")
    assert all(f"solver.prototxt:{line}:" in e and "'processes_per_node'" in e and
               "does not divide the 2 process" in e for e in errors), errors
