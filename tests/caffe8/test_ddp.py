"""caffe8.ddp: the DDP communication hook against caffe8's own exchange (tests/caffe8/ddp_ranks.py
under mpiexec: the hook's gradients must be the bytes of comm.exchange.Exchange for the same
weights and gradients, 2 and 4 ranks, flat and two-level, no_sync accumulation, exclusions, a
training run's ranks identical, the CUDA side on the stand-in device; each tensor's own context
in the step between the levels, in both front doors), torch staying optional, and the state's
one-line errors.
Tests that need torch skip without it; the import tests run everywhere."""
import os
import shutil
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RANKS = os.path.join(REPO, "tests", "caffe8", "ddp_ranks.py")
MPIEXEC = os.path.join(os.path.dirname(sys.executable), "mpiexec")


def _python(code):
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=120, env=dict(os.environ, PYTHONPATH=REPO))


def test_import_caffe8_never_imports_torch():
    r = _python("import sys, caffe8, caffe8.cli, caffe8.wiring, caffe8.comm.exchange\n"
                "caffe8.SGDSolver, caffe8.Net\n"
                "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


def test_ddp_without_torch_says_how_to_install_it_in_one_line():
    # sys.modules["torch"] = None makes `import torch` fail as if it were not installed
    r = _python("import sys; sys.modules['torch'] = None\nimport caffe8\ncaffe8.ddp")
    assert r.returncode == 1
    last = r.stderr.strip().splitlines()[-1]
    assert last == ("ImportError: caffe8.ddp needs PyTorch, which is not installed here: "
                    "pip install 'caffe8[torch]' (or pip install torch)")
    assert "Traceback" in r.stderr and "torch/" not in r.stderr     # no trace into torch


def _ranks(n, cases):
    pytest.importorskip("torch")
    pytest.importorskip("mpi4py")
    if not os.path.exists(MPIEXEC) and shutil.which("mpiexec") is None:
        pytest.skip("no mpiexec next to the Python interpreter")
    exe = MPIEXEC if os.path.exists(MPIEXEC) else shutil.which("mpiexec")
    r = subprocess.run([exe, "-n", str(n), sys.executable, RANKS, ",".join(cases)], cwd=REPO,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300,
                       env=dict(os.environ, PYTHONPATH=REPO, OMP_NUM_THREADS="1"))
    assert r.returncode == 0, r.stdout[-4000:]
    for case in cases:
        assert f"{case}: OK" in r.stdout, r.stdout[-4000:]


@pytest.mark.mpi
def test_hook_equals_caffe8s_exchange_on_2_ranks():
    """flat, two nodes of one rank (the folded scale), no_sync, exclusions, training, a slow
    rank, closing states (by hand and at exit), the CUDA side on the stand-in device."""
    _ranks(2, ["flat", "twolevel", "nosync", "exclude", "train", "slowrank", "close", "cuda"])


@pytest.mark.mpi
def test_hook_equals_caffe8s_exchange_on_4_ranks():
    """flat over 4 (the rank order matters from 3 addends on), 2 nodes x 2 (the x1/nodes table
    between the levels), both on the CUDA side too (the stand-in device); each tensor's own
    context in the step between the levels, in both front doors."""
    _ranks(4, ["flat", "twolevel", "contexts", "cuda"])


# --- one process: the state's checks -----------------------------------------------------------
@pytest.fixture
def one_process(tmp_path):
    torch = pytest.importorskip("torch")
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0,
                            world_size=1)
    yield torch
    dist.destroy_process_group()


def test_state_needs_an_initialised_process_group():
    pytest.importorskip("torch")
    from caffe8 import ddp
    with pytest.raises(RuntimeError, match="call torch.distributed.init_process_group first"):
        ddp.Fp8State()


def test_state_errors_name_the_argument(one_process):
    from caffe8 import ddp
    model = one_process.nn.Linear(3, 2)
    for kwargs, message in (
            ({"quantile": 1.5}, r"Fp8State\.quantile: .* allowed range: \(0,1\]"),
            ({"samples": 0}, r"Fp8State\.samples: .*>= 1"),
            ({"rounding": "up"}, r"Fp8State\.rounding: .*'nearest', 'truncate', 'oyama'"),
            ({"processes_per_node": 2}, r"processes_per_node=2 does not divide the group's 1"),
            ({"min_elements": -1}, r"min_elements must be an integer >= 0"),
            ({"chunk_bytes": 0}, r"chunk_bytes must be an integer >= 1, got 0"),
            ({"exclude": ["weight"]}, r"naming parameters needs module="),
            ({"exclude": ["fc.weight"], "module": model},
             r"the model has no parameter 'fc.weight'; it has weight, bias")):
        with pytest.raises(ValueError, match=message):
            ddp.Fp8State(**kwargs)
    state = ddp.Fp8State(module=model, exclude=["weight", model.bias])
    assert state._kind(model.weight) == state._kind(model.bias) == "fp32"
    assert state.stages == (1, 1) and state.comm.quantile_interval == 100    # the comm defaults
    assert abs(state.comm.quantile - 0.95) < 1e-7 and state.comm.samples == 1024
    with pytest.raises(TypeError, match="must be a caffe8.ddp.Fp8State"):
        ddp.fp8_hook(None, None)


def test_one_process_keeps_the_exact_gradients_and_float64_is_refused(one_process):
    torch = one_process
    from torch.nn.parallel import DistributedDataParallel as DDP
    from caffe8 import ddp
    torch.manual_seed(0)
    net = torch.nn.Linear(5, 3)
    x = torch.randn(4, 5)
    net(x).square().sum().backward()
    expected = [p.grad.clone() for p in net.parameters()]
    net.zero_grad()
    model = DDP(net)
    model.register_comm_hook(ddp.Fp8State(), ddp.fp8_hook)
    model(x).square().sum().backward()
    assert all(torch.equal(p.grad, e) for p, e in zip(net.parameters(), expected))
    model = DDP(torch.nn.Linear(5, 3).double())
    model.register_comm_hook(ddp.Fp8State(), ddp.fp8_hook)
    with pytest.raises(TypeError, match="holds torch.float64 gradients; the fp8 exchange takes "
                                        "float32"):
        model(x.double()).sum().backward()
