"""The composition root (caffe8/wiring.py): the one log line that names a run's gradient
exchange, read from the objects built; one way to put a run together for the CLI and pycaffe,
with the timing log hooked in once."""
import ast
import json
import os

import pytest

from caffe8.comm.config import parse_comm
from caffe8.comm.exchange import Exchange
from caffe8.engine.world import SingleProcessWorld
from caffe8.wiring import build_trainer, exchange_summary, open_timing_log
from tests.comm.mpi.fakenet import FakeNet, make_tensors
from tests.engine.trainer_util import write_solver

CAFFE8 = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                      "caffe8")


class FakeWorld:
    def __init__(self, size, hosts):
        self.size, self.rank = size, 0
        self.comm = self
        self.hosts = hosts

    def allgather(self, value):
        return list(self.hosts)


def built(text):
    """The comm block and the exchange built from it (one process: the transports it names are
    the ones a job of any size builds for that block)."""
    comm = parse_comm(text)
    return comm, Exchange(SingleProcessWorld(), comm, FakeNet(*make_tensors(0)))


@pytest.mark.parametrize("text, world, line", [
    ("", FakeWorld(4, ["a", "a", "b", "b"]),
     "Gradient exchange: fp8 (ratio, q=0.95), hierarchical, 4 processes on 2 nodes, asynchronous"),
    ('codec: "fp8" relative: false quantile: 0.99 async: false hierarchical: false',
     FakeWorld(2, ["a", "a"]),
     "Gradient exchange: fp8 (absolute, q=0.99), rsag, 2 processes on 1 node, synchronous"),
    ('processes_per_node: 2 warmup_fp32_iters: 20', FakeWorld(8, ["a"] * 8),
     "Gradient exchange: fp8 (ratio, q=0.95, fp32 for the first 20 iterations), hierarchical, "
     "8 processes on 4 nodes, asynchronous"),
    ('codec: "fp32"', FakeWorld(2, ["a", "b"]),
     "Gradient exchange: fp32, hierarchical, 2 processes on 2 nodes, asynchronous"),
    ('codec: "fp32" algorithm: "flat"', FakeWorld(2, ["a", "b"]),
     "Gradient exchange: fp32, flat, 2 processes on 2 nodes, asynchronous"),
    ('codec: "fp16" algorithm: "ring"', FakeWorld(3, ["a", "b", "c"]),
     "Gradient exchange: fp16, ring, 3 processes on 3 nodes, asynchronous"),
    # the transport built for a gather codec is "gather" (not the float32 warm-up's sum)
    ('codec: "aps" aps_format: "E4M3" warmup_fp32_iters: 5', FakeWorld(2, ["a", "a"]),
     "Gradient exchange: aps (E4M3, fp32 for the first 5 iterations), gather, 2 processes on "
     "1 node, asynchronous"),
])
def test_exchange_summary_names_what_was_built(text, world, line):
    comm, exchange = built(text)
    try:
        assert exchange_summary(exchange, comm, world) == line
        assert exchange.codec.name in line and any(
            f", {t.name}, " in line for t in exchange.transports.values())
    finally:
        exchange.close()


def test_single_process_has_no_exchange():
    assert exchange_summary(None, parse_comm(), SingleProcessWorld()) == \
        "Gradient exchange: none (1 process)"


def test_one_run_for_the_cli_and_pycaffe_with_the_timing_hooked_in_once(in_digits_cwd, tmp_path):
    solver = write_solver(tmp_path, max_iter=2, test_interval=0, test_iter=[], display=0,
                          snapshot=0)
    timing = open_timing_log(str(tmp_path / "timing.jsonl"), SingleProcessWorld())
    attached, attach = [], timing.attach
    timing.attach = lambda trainer: (attached.append(trainer), attach(trainer))
    lines = []
    trainer = build_trainer(solver, log=lines.append, timing=timing)
    try:
        assert attached == [trainer] and trainer.timing is timing
        assert lines[-1] == "Gradient exchange: none (1 process)"
        trainer.solve()
    finally:
        trainer.close()
        timing.close()
    with open(tmp_path / "timing.jsonl") as f:
        assert len([json.loads(line) for line in f]) == 2      # one record per iteration


def _calls(path):
    """Names called, and modules imported, in a source file (its AST)."""
    with open(path) as f:
        tree = ast.parse(f.read())
    calls = {n.func.id if isinstance(n.func, ast.Name) else getattr(n.func, "attr", None)
             for n in ast.walk(tree) if isinstance(n, ast.Call)}
    imports = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    return calls, imports


def test_the_cli_and_pycaffe_compose_a_run_through_the_wiring_alone():
    cli_calls, _ = _calls(os.path.join(CAFFE8, "tools", "train.py"))
    solver_calls, solver_imports = _calls(os.path.join(CAFFE8, "pysolver.py"))
    assert {"read_solver", "build_trainer"} <= cli_calls & solver_calls
    assert "caffe8.cli" not in solver_imports
    # no collective of the tool's own past the world (and its watchdog)
    assert "Barrier" not in cli_calls and "exchange_summary" not in cli_calls | solver_calls


class _NodeWorld(SingleProcessWorld):
    """One rank of a node of ``local_size`` processes (the exchange itself is single-process)."""

    def __init__(self, local_size):
        from caffe8.comm.allreduce import BLOCKING
        self.local_size = local_size
        self.watchdog = BLOCKING          # plain waits: a single process has nothing to watch


@pytest.mark.parametrize("local_size, cores, emulated, synchronous", [
    (4, 2, False, True),        # 4 ranks on 2 cores, host compute: the threads cost cores
    (2, 2, False, False),       # a core each: the overlap stays
    (1, 16, False, False),
    (4, 2, True, False),        # EmulatedCompute sleeps as a GPU kernel would: cores are free
])
def test_async_exchange_gives_way_when_its_threads_would_take_compute_cores(
        monkeypatch, local_size, cores, emulated, synchronous):
    from caffe8.engine import cpu_share
    from caffe8.wiring import make_exchange, overlap_takes_cores
    monkeypatch.setattr(cpu_share, "usable_cores", lambda *a, **k: cores)
    net = FakeNet(*make_tensors(0))
    if emulated:
        net.layers[1].type = "EmulatedCompute"
    for layer in net.layers:
        layer.__dict__.setdefault("type", "InnerProduct")
    world, lines = _NodeWorld(local_size), []
    reason = overlap_takes_cores(world, net)
    assert (reason is not None) == synchronous
    exchange = make_exchange(world, parse_comm(""), net, lines.append)      # async: true
    try:
        assert exchange.asynchronous is not synchronous
        assert lines == ([f"comm.async: the exchange runs synchronously: {local_size} processes "
                          f"on this node share {cores} cores, so overlap threads would take "
                          f"them from the backward pass"] if synchronous else [])
    finally:
        exchange.close()
    sync = make_exchange(world, parse_comm("async: false"), net, lines.append)
    try:
        assert sync.asynchronous is False and len(lines) == int(synchronous)    # no 2nd line
    finally:
        sync.close()


@pytest.mark.parametrize("env, launched", [
    ({}, False), ({"PMI_SIZE": "2"}, True), ({"OMPI_COMM_WORLD_SIZE": "4"}, True),
    ({"PMI_SIZE": "1"}, False),
    # srun --mpi=pmix (Open MPI): only Slurm's count says there are several ranks
    ({"PMIX_RANK": "1", "SLURM_STEP_NUM_TASKS": "4"}, True),
    ({"SLURM_STEP_NUM_TASKS": "1", "SLURM_NTASKS": "4"}, False),  # a batch script's own step
])
def test_launched_by_mpiexec_reads_every_process_manager(monkeypatch, env, launched):
    from caffe8.wiring import _MPI_SIZE_VARS, launched_by_mpiexec
    for var in _MPI_SIZE_VARS + ("SLURM_NTASKS", "PMIX_RANK"):
        monkeypatch.delenv(var, raising=False)
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    assert launched_by_mpiexec() is launched
