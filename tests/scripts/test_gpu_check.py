"""scripts/gpu_check.py: one line and status 0 without a GPU, either way it is started; its
figures from hand-made timing logs, pytest summaries and peer_bench CSVs; a step past its limit
is killed; the budget skips what no longer fits; the runs' prototxts are written."""
import json
import os
import subprocess
import sys

import pytest

from caffe8.engine import backend
from scripts import gpu_check

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.skipif(backend.gpu_available(), reason="a GPU is present: the check would run")
@pytest.mark.parametrize("how", [["scripts/gpu_check.py"], ["-m", "scripts.gpu_check"]])
def test_without_a_gpu_it_says_so_in_one_line_and_exits_0(how):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable] + how, cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpu_check: no GPU to check (")
    assert done.stderr == ""


def test_pytest_summary_and_peer_ratios(tmp_path):
    text = "....\n=== 41 passed, 2 failed, 7 skipped, 1 warning in 88.0s ===\n"
    assert gpu_check.pytest_counts(text) == "41 passed, 2 failed, 7 skipped"
    assert gpu_check.pytest_counts("crashed") == "no summary"
    csv_path = tmp_path / "p.csv"
    csv_path.write_text("net,batch,device,side,forward_ms,backward_ms,total_ms,ratio\n"
                        "caffenet,256,cuda,caffe8,1,2,3,0.934\n"
                        "caffenet,256,cuda,pytorch,1,2,3.2,\n"
                        "gru,64,cuda,caffe8,1,1,2,1.25\ngru,64,cuda,pytorch,1,0.6,1.6,\n")
    assert gpu_check.peer_ratios(str(csv_path)) == "caffenet 0.93, gru 1.25"
    csv_path.write_text("net,batch,device,side,forward_ms,backward_ms,total_ms,ratio,cudnn_calls\n"
                        "googlenet,128,cuda,caffe8,1,2,3,0.934,304.0\n"
                        "googlenet,128,cuda,pytorch,1,2,3.2,,\n")
    assert gpu_check.peer_ratios(str(csv_path)) == "googlenet 0.93 (304 cuDNN calls/it)"
    assert gpu_check.peer_ratios(str(tmp_path / "none.csv")) == "no CSV"


def _record(iteration, rank, wall, comm, layers):
    return {"iteration": iteration, "rank": rank, "wall": wall,
            "split": {"Communication": comm, "D2H": 0.001, "H2D": 0.002},
            "layers": [{"name": n, "d2h": d, "h2d": h} for n, d, h in layers]}


def test_exchange_figures_from_timing_logs(tmp_path):
    """Iterations 0-1 are skipped; T = median over iterations of the slower rank's wall; the
    overlap is (T_sync - T_async) / (T_sync - T_none)."""
    def write(name, walls, comm, ranks=2):
        paths = []
        for rank in range(ranks):
            path = tmp_path / f"{name}{rank}.jsonl"
            path.write_text("".join(json.dumps(_record(
                i, rank, w + 0.01 * rank, comm, [("g1", 0.002, 0.003), ("loss", 0, 0)])) + "\n"
                for i, w in enumerate(walls)))
            paths.append(str(path))
        return paths
    sync = write("s", [9.0, 9.0, 0.50, 0.52, 0.54], 0.097)        # slower rank: .51 .53 .55
    asyn = write("a", [9.0, 9.0, 0.43, 0.44, 0.45], 0.0)          # slower rank: .44 .45 .46
    none = write("n", [9.0, 9.0, 0.40, 0.41, 0.42], 0.0, ranks=1)
    per_layer, overlap = gpu_check.exchange_figures(sync, asyn, none)
    assert per_layer == "g1 2.000/3.000 ms"                      # the loss layer has no copies
    assert overlap == pytest.approx((0.53 - 0.45) / (0.53 - 0.41))
    _, no_cost = gpu_check.exchange_figures(sync, asyn, write("m", [9.0, 9.0, 0.6, 0.6, 0.6], 0.0))
    assert no_cost != no_cost                                     # NaN: nothing to hide
    # the device stage against host staging: the same medians of the slower rank
    host = write("h", [9.0, 9.0, 1.00, 1.05, 1.10], 0.2)          # slower rank: 1.01 1.06 1.11
    assert gpu_check.staging_figure(sync, host) == (
        "fp8 sync, intra-node stage on the GPUs 530.0 ms vs staged through host memory "
        "1060.0 ms (0.50x)")


def test_a_step_past_its_limit_is_killed(tmp_path):
    status, seconds, _ = gpu_check.run_step([sys.executable, "-c", "import time; "
                                             "print('x', flush=True); time.sleep(30)"],
                                            1.0, str(tmp_path / "log"))
    assert status == "timed out" and seconds < 10
    status, _, text = gpu_check.run_step([sys.executable, "-c", "import sys; print('hi'); "
                                          "sys.exit(3)"], 20, str(tmp_path / "log2"))
    assert status == "failed (rc 3)" and text == "hi\n"


def test_budget_and_table(monkeypatch, tmp_path, capsys):
    """Steps run in order with min(their limit, what is left); a step that no longer fits is
    skipped, a step's exception is its row; status 1 unless every step is ok."""
    clock = [0.0]
    monkeypatch.setattr(gpu_check.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(gpu_check, "gpu_absent_reason", lambda: None)
    limits = []

    def step(seconds, fail=False):
        def run(limit):
            limits.append(limit)
            clock[0] += seconds
            if fail:
                raise RuntimeError("boom")
            return "ok", seconds, "fine"
        return run
    monkeypatch.setattr(gpu_check, "steps", lambda args: [
        ("gpu tests", step(100)), ("peer_bench tf32 off", step(50, fail=True)),
        ("peer_bench tf32 on", step(45)), ("2-process exchange", step(1)),
        ("solver_benchmark", step(1))])
    assert gpu_check.main(["--budget", "200", "--out", str(tmp_path)]) == 1
    # then 5 s left: the last two are skipped
    assert limits == [gpu_check.LIMITS["gpu tests"], 100, 50]
    out = capsys.readouterr().out
    assert "error: RuntimeError: boom" in out and out.count("skipped (budget spent)") == 2


def test_the_runs_prototxts_are_written_from_solver_benchmark(tmp_path):
    from caffe8.engine.prototxt import parse_file
    from studies import _runs
    solver = _runs.write_run_prototxts(gpu_check.SOLVER, str(tmp_path), gpu_check._batch(),
                                       "fp32", True, 0, 12)
    sp = parse_file(solver, type_name="SolverParameter")
    assert sp.max_iter == 12 and getattr(sp.comm, "async") is True
    assert os.path.exists(sp.net)


def test_the_tf32_study_reads_peer_bench_profiles(tmp_path):
    """profile_layers parses peer_bench's real --profile --layers output (here LeNet on the
    CPU, no algorithms); tf32_layer_figures names the layers TF32 slows most, with each run's
    forward time and the TF32 run's algorithms."""
    proc = subprocess.run([sys.executable, "-m", "scripts.peer_bench", "--profile", "--layers",
                           "--nets", "lenet", "--batch", "lenet=2", "--iters", "1",
                           "--threads", "1"], cwd=gpu_check.REPO, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    layers = gpu_check.profile_layers(proc.stdout)
    assert {"conv1", "pool1", "conv2", "ip1", "ip2", "loss"} <= set(layers)
    assert all(f >= 0 and b >= 0 and algos == "" for f, b, algos in layers.values())
    row = "  {:28s} {:16s} {:9.2f} {:9.2f}{}"
    def text(times):
        return "\n".join(row.format(n, "Convolution", f, 1.0, tail)
                         for n, (f, tail) in times.items()) + "\n  type  forward backward\n"
    profiles = {"off": gpu_check.profile_layers(text({"a": (1.0, ""), "b": (2.0, ""),
                                                      "c": (3.0, "")})),
                "on": gpu_check.profile_layers(text({"a": (1.1, "  forward=1/m1"),
                                                     "b": (4.0, "  forward=7/m1 backward_data=1/m1"),
                                                     "c": (2.0, "")})),
                "on, find": gpu_check.profile_layers(text({"a": (1.0, ""), "b": (2.1, ""),
                                                           "c": (2.0, "")}))}
    assert gpu_check.tf32_layer_figures(profiles, top=2) == (
        "forward ms (off/on/on, find): total off 6.0, on 7.1, on, find 5.1; slowed most: "
        "b 2.00/4.00/2.10 [forward=7/m1 backward_data=1/m1]; a 1.00/1.10/1.00 [forward=1/m1]")


def test_optional_steps_run_only_when_named(monkeypatch, tmp_path):
    monkeypatch.setattr(gpu_check, "gpu_absent_reason", lambda: None)
    ran = []
    monkeypatch.setattr(gpu_check, "steps", lambda args: [
        (name, lambda limit, name=name: ran.append(name) or ("ok", 0.0, ""))
        for name in gpu_check.LIMITS])
    assert gpu_check.main(["--out", str(tmp_path)]) == 0
    assert ran == [n for n in gpu_check.LIMITS if n not in gpu_check.OPTIONAL]
    ran.clear()
    assert gpu_check.main(["--out", str(tmp_path), "--only", "tf32 layers"]) == 0
    assert ran == ["tf32 layers"]
