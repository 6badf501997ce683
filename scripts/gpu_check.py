"""The whole GPU path verified by one command, within 9 minutes (issue 22).

    python -m scripts.gpu_check [--out runs/gpu_check] [--budget 540] [--only STEP,...]

A dev tool, not part of the package: it drives the repository's own tests and benchmark scripts,
so it runs from the root of a clone (``python -m scripts.gpu_check`` or
``python scripts/gpu_check.py``). On a machine with an NVIDIA GPU (one is enough), in a venv
with the extras its steps use (tests, mpiexec, PyTorch for ``peer_bench``) and the CuPy wheels
for the driver's CUDA (README, "On GPUs")::

    python -m venv .venv
    .venv/bin/pip install -e '.[mpi,test,torch,cuda13]'    # cuda12: a driver before 580
    .venv/bin/python -m scripts.gpu_check                  # under 9 minutes; a table at the end

A machine without a package index can use a Python that already has CuPy and PyTorch, with the
wheels it lacks brought along and installed from their files (``pip install --no-index``; the
run in docs/BENCHMARKS.md "G" brought lmdb, mpi4py, mpich, plyvel, protobuf, pydot and
scipy-openblas32). One command does the whole check (``--budget``, 540 s, keeps it inside a
10-minute limit); ``--only`` reruns single steps; each step's log goes to ``--out``.

With a CUDA GPU (CuPy working) it runs, each step under its own time limit:

1. the ``gpu``-marked tests and the ``device``-marked ones (which run on the stand-in device
   without a GPU, here on the GPU; ``pytest -m "gpu or device"``, on 8 workers where
   pytest-xdist is installed): passed / failed / skipped counts;
2. ``scripts/peer_bench.py --gpu`` (CaffeNet b256, GoogLeNet b128, the GRU benchmark against
   ``nn.GRU``) with TF32 off, then on (``CAFFE8_TF32``; the PyTorch side follows the same
   setting): each net's caffe8 / PyTorch time ratio;
3. the exchange on the GRU benchmark (``solver_benchmark.prototxt``'s net), two processes on
   the GPU in every run (:data:`EXCHANGE_RUNS`): fp8 and fp32, each once synchronous and once
   asynchronous (their buckets in the CUDA-IPC arena: no copies), the synchronous fp8 run with
   its buffers staged through host memory (``CAFFE8_IPC=0``), and two processes training at
   once with no exchange; each with timing logs. Per codec the overlap
   (T_sync - T_async) / (T_sync - T_none) (``engine.timing.overlap``; T: the median over the
   iterations after the first two of the slower process's wall), with the three times; the
   per-layer D2H and H2D milliseconds of the run that copies; and the synchronous fp8
   exchange's own time per iteration (its phases, not the iteration) on the GPUs against
   staged through host memory (comm/ipc.py);
4. ``prototxt/gru/solver_benchmark.prototxt`` on one process for a few iterations: it trains
   (a finite loss at the end);

then prints one summary table: each step's status, its seconds against its limit, and its
figures, each saying what it is. Without a GPU it prints one line saying so and exits 0. The
exit status is 1 when a step failed, else 0.

Time: every step runs under a limit of at least 1.5 times what it is expected to take on an
H200 (:data:`STEPS`), and the default steps' limits add up to at most the 540 s budget, so the
check ends within 9 minutes with each step's margin its own. The expected times are estimates
from what each step runs (the 2026-11-27 run did not log its steps' times): the table prints
the measured seconds beside each limit, to set them from the next device run.

One more step runs only when named (``--only 'tf32 layers'``, about 2 minutes): GoogLeNet b128's
per-layer profile (``peer_bench --gpu --profile --layers``) with TF32 off, on, and on with
cuDNN's find instead of its heuristic (``CAFFE8_CUDNN_ALGO=find``); the layers whose forward
TF32 slows most, with their times in the three runs and the algorithms cuDNN was asked for
(issue 30's TF32 anomaly: GoogLeNet's forward 23.7 -> 30.8 ms with TF32).
"""
import argparse
import importlib.util
import os
import re
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if __package__ in (None, ""):          # run as a file: the repository root is not on the path
    sys.path.insert(0, REPO)

SOLVER = os.path.join(REPO, "prototxt", "gru", "solver_benchmark.prototxt")
BUDGET = 540.0              # seconds of the whole check: 9 minutes of a 10-minute device call
MARGIN = 1.5                # each step's limit against the time it is expected to take
#: step -> (seconds it is expected to take on an H200, seconds it may take at most): estimates
#: from what each step runs (module docstring, "Time")
STEPS = {"gpu tests": (110, 165), "peer_bench tf32 off": (55, 85),
         "peer_bench tf32 on": (55, 85), "2-process exchange": (100, 150),
         "solver_benchmark": (20, 30), "tf32 layers": (100, 150)}
LIMITS = {name: limit for name, (_, limit) in STEPS.items()}
#: steps that run only when --only names them
OPTIONAL = {"tf32 layers"}
#: runs of the TF32 study: name -> environment
TF32_RUNS = {"off": {"CAFFE8_TF32": "0"}, "on": {"CAFFE8_TF32": "1"},
             "on, find": {"CAFFE8_TF32": "1", "CAFFE8_CUDNN_ALGO": "find"}}


def gpu_absent_reason():
    """None when CuPy reaches a CUDA device, else why not (one short phrase)."""
    from caffe8.engine import backend
    if backend.cupy is None:
        return "CuPy does not import"
    return None if backend.gpu_available() else "CuPy finds no CUDA device"


def run_step(cmd, limit, log_path, env=None):
    """Run ``cmd`` (an argv, or a list of argvs started together) with its output to
    ``log_path`` for at most ``limit`` seconds, killing the process groups past it. Returns
    (status: "ok" | "failed (rc N)" | "timed out", seconds, output)."""
    cmds = cmd if cmd and isinstance(cmd[0], (list, tuple)) else [cmd]
    full_env = dict(os.environ, **(env or {}))
    full_env["PYTHONPATH"] = REPO + os.pathsep + full_env.get("PYTHONPATH", "")
    t0 = time.monotonic()
    with open(log_path, "w", encoding="utf-8") as out:
        procs = [subprocess.Popen(c, cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                                  env=full_env, start_new_session=True) for c in cmds]
        rcs = []
        for proc in procs:
            try:
                rcs.append(proc.wait(timeout=max(t0 + limit - time.monotonic(), 0.01)))
            except subprocess.TimeoutExpired:
                rcs.append(None)
        if None in rcs:
            for proc in procs:
                if proc.poll() is None:
                    os.killpg(proc.pid, 9)
                    proc.wait()
    with open(log_path, encoding="utf-8", errors="replace") as f:
        text = f.read()
    failed = [rc for rc in rcs if rc]
    status = "timed out" if None in rcs else f"failed (rc {failed[0]})" if failed else "ok"
    return status, time.monotonic() - t0, text


def pytest_counts(text):
    """'12 passed, 1 failed, 3 skipped' style summary of a pytest run, from its last line."""
    found = dict((k, int(n)) for n, k in
                 re.findall(r"(\d+) (passed|failed|skipped|errors?|deselected)", text))
    return ", ".join(f"{found[k]} {k}" for k in ("passed", "failed", "error", "errors",
                                                 "skipped") if k in found) or "no summary"


def peer_ratios(csv_path):
    """'caffenet 42.9/40.2 ms = 1.07 (262 cuDNN calls/it), ...': per net from peer_bench, the
    forward+backward ms of caffe8 and PyTorch and their ratio (below 1: caffe8 faster), with
    caffe8's cuDNN calls per iteration where the CSV has them."""
    import csv
    if not os.path.exists(csv_path):
        return "no CSV"
    with open(csv_path, newline="") as f:
        rows = list(csv.DictReader(f))
    peer = {r["net"]: float(r["total_ms"]) for r in rows if r["side"] == "pytorch"}

    def calls(r):
        return f" ({float(r['cudnn_calls']):.0f} cuDNN calls/it)" if r.get("cudnn_calls") else ""

    def line(r):
        ms = f" {float(r['total_ms']):.1f}/{peer[r['net']]:.1f} ms =" if r["net"] in peer else ""
        return f"{r['net']}{ms} {float(r['ratio']):.2f}{calls(r)}"
    text = ", ".join(line(r) for r in rows if r["side"] == "caffe8")
    return f"caffe8/PyTorch per iteration: {text}" if text else "no rows"


def overlap_figure(sync_logs, async_logs, none_logs, skip=2):
    """The overlap (T_sync - T_async) / (T_sync - T_none) (``engine.timing.overlap``; NaN when
    the synchronous run is not slower than the one without an exchange) with the three times
    in ms, T the median over iterations >= ``skip`` of the slower process's wall."""
    from caffe8.engine.timing import overlap
    t_sync, t_async, t_none = (_wall(_records(logs, skip))
                               for logs in (sync_logs, async_logs, none_logs))
    try:
        value = overlap(t_sync, t_async, t_none)
    except ValueError:
        value = float("nan")
    return (f"overlap {value:.2f} = (T_sync {t_sync * 1e3:.1f} - T_async {t_async * 1e3:.1f}) / "
            f"(T_sync {t_sync * 1e3:.1f} - T_none {t_none * 1e3:.1f}) ms, the share of the "
            f"exchange's cost hidden behind backward")


def copy_figure(logs, skip=2):
    """Each layer's median D2H/H2D ms over iterations >= ``skip`` (of every process) in the
    logs of a run whose buckets are copied (staged through host memory)."""
    layers = {}
    for r in _records(logs, skip):
        for rec in r["layers"]:
            if rec["d2h"] or rec["h2d"]:
                layers.setdefault(rec["name"], []).append((rec["d2h"], rec["h2d"]))
    return "; ".join(
        f"{name} {statistics.median(d for d, _ in v) * 1e3:.3f}/"
        f"{statistics.median(h for _, h in v) * 1e3:.3f} ms" for name, v in layers.items()) \
        or "no D2H/H2D recorded"


def exchange_seconds(record):
    """The exchange's own time in one timing record, not the iteration's wall: from the first
    start to the last end of its buckets' phases (encode, copies, reduction, decode; a
    synchronous exchange runs them after backward). Summing the phases would count the
    device's copies and the host's wait for them twice."""
    from caffe8.engine.timing import BUCKET_PHASES
    spans = [b[ph] for b in record["buckets"] for ph in BUCKET_PHASES if ph in b]
    return max(end for _, end in spans) - min(start for start, _ in spans) if spans else 0.0


def staging_figure(device_logs, host_logs, skip=2):
    """The synchronous exchange's own time per iteration with its buckets in the device arena
    against staged through host memory: medians over iterations >= ``skip`` of the slower
    process's :func:`exchange_seconds`."""
    def per_iteration(logs):
        slowest = {}
        for r in _records(logs, skip):
            slowest[r["iteration"]] = max(slowest.get(r["iteration"], 0.0), exchange_seconds(r))
        return statistics.median(slowest.values())
    device, host = per_iteration(device_logs), per_iteration(host_logs)
    return (f"fp8 sync exchange {device * 1e3:.1f} ms per iteration on the GPUs (CUDA IPC) vs "
            f"{host * 1e3:.1f} ms staged through host memory ({device / host:.2f}x: the "
            f"exchange's own time, not whole iterations)")


def _records(paths, skip):
    """The timing-log records of iterations >= ``skip`` of every log in ``paths``."""
    from caffe8.engine.timing import read_log
    return [r for path in paths for r in read_log(path) if r["iteration"] >= skip]


def _wall(recs):
    """The median over iterations of the slowest process's wall."""
    per_iter = {}
    for r in recs:
        per_iter[r["iteration"]] = max(per_iter.get(r["iteration"], 0.0), r["wall"])
    return statistics.median(per_iter.values())


_PROFILE_LINE = re.compile(r"^  (\S+)\s+(\S+)\s+(-?[\d.]+)\s+(-?[\d.]+)(?:\s+(\S.*))?$")


def profile_layers(text):
    """{layer: (forward ms, backward ms, algorithms text)} from ``peer_bench --profile --layers``
    output (its per-type summary lines end the per-layer ones)."""
    layers = {}
    for line in text.splitlines():
        if line.startswith("  type "):
            break
        m = _PROFILE_LINE.match(line)
        if m:
            layers[m.group(1)] = (float(m.group(3)), float(m.group(4)), m.group(5) or "")
    return layers


def tf32_layer_figures(profiles, top=5):
    """The ``top`` layers whose forward TF32 slows most ("off" vs "on" in ``profiles``, a
    {run: profile_layers(...)}), each with its forward ms in every run and the algorithms of
    the "on" run; and the forward totals of each run."""
    off, on = profiles["off"], profiles["on"]
    common = [name for name in on if name in off]
    worst = sorted(common, key=lambda n: off[n][0] - on[n][0])[:top]
    totals = ", ".join(f"{run} {sum(f for f, _, _ in p.values()):.1f}"
                       for run, p in profiles.items())
    rows = [f"{name} " + "/".join(f"{p[name][0]:.2f}" if name in p else "-"
                                  for p in profiles.values())
            + (f" [{on[name][2]}]" if on[name][2] else "") for name in worst]
    return f"forward ms ({'/'.join(profiles)}): total {totals}; slowed most: " + "; ".join(rows)


def tf32_layers_step(out, limit):
    """The optional TF32 study (module docstring)."""
    profiles, seconds = {}, 0.0
    for k, (run, env) in enumerate(TF32_RUNS.items()):
        cmd = [sys.executable, "-m", "scripts.peer_bench", "--gpu", "--profile", "--layers",
               "--nets", "googlenet", "--iters", "5"]
        log = os.path.join(out, f"tf32_layers_{run.replace(', ', '_')}.log")
        status, t, text = run_step(cmd, max((limit - seconds) / (len(TF32_RUNS) - k), 10),
                                   log, env)
        seconds += t
        if status != "ok":
            return status, seconds, f"TF32 {run}: see {log}"
        profiles[run] = profile_layers(text)
    return "ok", seconds, tf32_layer_figures(profiles)


def _batch():
    """The GRU benchmark's own batch size (the runs keep it)."""
    from scripts import _runs
    return _runs.net_batch_size(_runs.load_train_net(SOLVER)[1])


@dataclass(frozen=True)
class Run:
    """One run of the exchange step: ``processes`` processes training the GRU benchmark on the
    GPU, as one job that exchanges with ``codec`` (``asynchronous`` or not), or each alone
    (``exchange`` False: T_none, with as many processes on the GPU as the runs it is compared
    with); ``env`` on top of the environment."""
    name: str
    codec: str
    asynchronous: bool
    processes: int = 2
    exchange: bool = True
    env: tuple = ()

    @property
    def copies(self):
        """True when its buckets are staged through host memory (D2H and H2D copies); a job of
        one node's processes otherwise sums them in the CUDA-IPC arena, with no copy."""
        return self.exchange and dict(self.env).get("CAFFE8_IPC") == "0"


EXCHANGE_RUNS = (Run("none", "fp32", False, exchange=False), Run("fp8_sync", "fp8", False),
                 Run("fp8_async", "fp8", True), Run("fp32_sync", "fp32", False),
                 Run("fp32_async", "fp32", True),
                 Run("fp8_sync_host", "fp8", False, env=(("CAFFE8_IPC", "0"),)))
#: codec -> its (synchronous, asynchronous, no exchange) runs: the overlap's three times
OVERLAP_RUNS = {"fp8": ("fp8_sync", "fp8_async", "none"),
                "fp32": ("fp32_sync", "fp32_async", "none")}
COPY_RUN = "fp8_sync_host"                          # the D2H/H2D figure's run
STAGING_RUNS = ("fp8_sync", "fp8_sync_host")        # device arena vs host staging
EXCHANGE_ITERS = 8                                  # per run: 2 to warm up, 6 timed


def run_commands(run, solver, logs):
    """The commands of ``run``: one job of its processes, or each process alone."""
    from scripts import _runs
    mpiexec = _runs._default_mpiexec()
    if run.exchange:
        return _runs.train_command(run.processes, solver, logs, sys.executable, mpiexec)
    return [_runs.train_command(1, solver, [log], sys.executable, mpiexec) for log in logs]


def exchange_step(out, limit):
    """Step 3: the runs of :data:`EXCHANGE_RUNS`, each under an equal share of what is left,
    then their figures."""
    from scripts import _runs
    logs, seconds = {}, 0.0
    for k, run in enumerate(EXCHANGE_RUNS):
        run_dir = os.path.join(out, f"exchange_{run.name}")
        solver = _runs.write_run_prototxts(SOLVER, run_dir, _batch(), run.codec,
                                           run.asynchronous, 0, EXCHANGE_ITERS)
        logs[run.name] = [os.path.join(run_dir, f"timing.r{r}.jsonl")
                          for r in range(run.processes)]
        left = (limit - seconds) / (len(EXCHANGE_RUNS) - k)
        status, t, _ = run_step(run_commands(run, solver, logs[run.name]), max(left, 10),
                                os.path.join(run_dir, "train.log"), dict(run.env))
        seconds += t
        if status != "ok":
            return status, seconds, f"{run.name} run: see {run_dir}/train.log"
    figures = [f"{codec}: " + overlap_figure(*(logs[name] for name in names))
               for codec, names in OVERLAP_RUNS.items()]
    figures.append(f"D2H/H2D per layer of the {COPY_RUN} run (staged through host memory): "
                   + copy_figure(logs[COPY_RUN]))
    figures.append(staging_figure(*(logs[name] for name in STAGING_RUNS)))
    return "ok", seconds, "; ".join(figures)


def solver_step(out, limit):
    """Step 4: solver_benchmark.prototxt for a few iterations on one process."""
    from scripts import _runs
    run_dir = os.path.join(out, "solver_benchmark")
    solver = _runs.write_run_prototxts(SOLVER, run_dir, _batch(), "fp32", False, 0, 10)
    cmd = [sys.executable, "-m", "caffe8.cli", "train", "--solver", solver]
    status, seconds, text = run_step(cmd, limit, os.path.join(run_dir, "train.log"))
    losses = re.findall(r"loss = ([-+0-9.eE]+|nan|inf)", text)
    if status == "ok" and (not losses or losses[-1] in ("nan", "inf")):
        status = "failed (no finite loss)"
    return status, seconds, f"loss after 10 iterations {losses[-1] if losses else 'none'}"


def steps(args):
    """(name, function of the remaining budget -> (status, seconds, result)) of every step."""
    py = sys.executable
    tests = [py, "-m", "pytest", "-q", "-m", "gpu or device", "-p", "no:cacheprovider",
             "-rfE", "--tb=short", "tests"]
    if importlib.util.find_spec("xdist") is not None:   # CuPy's first compiles run in parallel
        tests[3:3] = ["-n", str(min(8, os.cpu_count() or 1))]

    def pytest_step(limit):
        status, t, text = run_step(tests, limit, os.path.join(args.out, "gpu_tests.log"))
        return status, t, pytest_counts(text)

    def peer_step(tf32):
        def run(limit):
            csv_path = os.path.join(args.out, f"peer_tf32_{tf32}.csv")
            cmd = [py, "-m", "scripts.peer_bench", "--gpu", "--nets", "caffenet,googlenet,gru",
                   "--rounds", "2", "--iters", "3", "--csv", csv_path]
            status, t, _ = run_step(cmd, limit, os.path.join(args.out, f"peer_{tf32}.log"),
                                    env={"CAFFE8_TF32": "1" if tf32 == "on" else "0"})
            return status, t, peer_ratios(csv_path)
        return run

    return [("gpu tests", pytest_step), ("peer_bench tf32 off", peer_step("off")),
            ("peer_bench tf32 on", peer_step("on")),
            ("2-process exchange", lambda limit: exchange_step(args.out, limit)),
            ("solver_benchmark", lambda limit: solver_step(args.out, limit)),
            ("tf32 layers", lambda limit: tf32_layers_step(args.out, limit))]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=os.path.join(REPO, "runs", "gpu_check"))
    p.add_argument("--budget", type=float, default=BUDGET, help="seconds for the whole check")
    p.add_argument("--only", default="", help="comma-separated steps to run (default: all but "
                   "the optional " + ", ".join(f"'{n}'" for n in sorted(OPTIONAL)) + "): "
                   + ", ".join(f"'{name}'" for name in LIMITS))
    args = p.parse_args(argv)
    only = [name.strip() for name in args.only.split(",") if name.strip()]
    unknown = sorted(set(only) - set(LIMITS))
    if unknown:
        p.error(f"--only: no step named {', '.join(map(repr, unknown))}")
    reason = gpu_absent_reason()
    if reason is not None:
        print(f"gpu_check: no GPU to check ({reason}); nothing run")
        return 0
    os.makedirs(args.out, exist_ok=True)
    start, table = time.monotonic(), []
    for name, step in steps(args):
        if (only and name not in only) or (not only and name in OPTIONAL):
            continue
        left = args.budget - (time.monotonic() - start)
        limit = min(LIMITS[name], left)
        if limit < 10:
            table.append((name, "skipped (budget spent)", 0.0, limit, ""))
            continue
        print(f"gpu_check: {name} (at most {limit:.0f} s) ...", flush=True)
        try:
            status, seconds, result = step(limit)
            table.append((name, status, seconds, limit, result))
        except Exception as e:        # a step's own error is its row, the others still run
            table.append((name, f"error: {type(e).__name__}: {e}", 0.0, limit, ""))
    print(f"\n{'step':22s} {'status':24s} {'seconds':>8s} {'limit':>6s}  result")
    for name, status, seconds, limit, result in table:
        print(f"{name:22s} {status:24s} {seconds:8.1f} {limit:6.0f}  {result}")
    print(f"total {time.monotonic() - start:.0f} s of a {args.budget:.0f} s budget; "
          f"logs in {args.out}")
    return 0 if all(row[1] == "ok" for row in table) else 1


if __name__ == "__main__":
    sys.exit(main())
