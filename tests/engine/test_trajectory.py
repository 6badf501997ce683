"""The trajectory oracle (tests/engine/trajectory.py): several steps of the trainer on changing
batches, each step's gradients against a fresh reference Net at the same weights, for every
layer configuration real nets use and every fast path (C kernels on and off, Convolution's
per-image and batch layouts, 1 and 2 BLAS threads), single process and two ranks."""
import os
import subprocess
import sys

import pytest

from caffe8.engine import blas
from caffe8.engine.trainer import Trainer
from caffe8.layers import native
from studies.bvlc_trajectory import _blocks as blocks
from tests.engine import trajectory
from tests.engine.test_mpi_training import _mpiexec

STEPS = 4
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


def write_case(folder, build, ranks=1, steps=STEPS, **solver):
    """Net files (trainer's, reference's) and a solver for one family; returns (solver, ref text,
    inputs)."""
    body, inputs, make = build()
    listing = blocks.write_batches(folder, inputs, steps, make, ranks=ranks)
    train, ref = blocks.net_texts(body, inputs, listing)
    net_path = os.path.join(str(folder), "net.prototxt")
    with open(net_path, "w") as f:
        f.write(train)
    fields = dict(base_lr=0.05, lr_policy='"fixed"', momentum=0.9, max_iter=steps, display=0,
                  snapshot=0, snapshot_after_train="false", random_seed=3, **solver)
    solver_path = os.path.join(str(folder), "solver.prototxt")
    with open(solver_path, "w") as f:
        f.write(f'net: "{net_path}"\n' + "".join(f"{k}: {v}\n" for k, v in fields.items()))
    return solver_path, ref, inputs


def train_and_check(folder, build, steps=STEPS):
    solver_path, ref, inputs = write_case(folder, build, steps=steps)
    trainer = Trainer(solver_path)
    try:
        recorder = trajectory.GradientRecorder(trainer.net, inputs)
        trainer.callbacks.insert(0, recorder)
        trainer.step(steps)
        names = trajectory.param_names(trainer.net)
    finally:
        trainer.close()
    errors = trajectory.step_errors(ref, recorder.steps)
    return errors, names, trajectory.failures(errors, names)


#: (C kernels on, BLAS threads): every fast path and its plain counterpart
PATHS = {"native-2threads": (True, 2), "native-1thread": (True, 1), "numpy-2threads": (False, 2)}


@pytest.fixture
def path(request):
    use_native, threads = PATHS[request.param]
    saved, saved_threads = native.use_native(use_native), blas.threads()
    blas.set_num_threads(threads)
    try:
        yield request.param
    finally:
        native.use_native(saved)
        blas.set_num_threads(saved_threads)


@pytest.mark.parametrize("path", list(PATHS), indirect=True)
@pytest.mark.parametrize("family", list(blocks.FAMILIES))
def test_trainer_steps_equal_the_reference(tmp_path, family, path):
    errors, names, bad = train_and_check(tmp_path, blocks.FAMILIES[family])
    assert not bad, f"{family} on {path}: " + "; ".join(bad)


@pytest.mark.parametrize("block", list(blocks.BLOCKS))
def test_modern_blocks_four_steps_equal_the_reference(tmp_path, block):
    errors, names, bad = train_and_check(tmp_path, blocks.BLOCKS[block])
    assert not bad, f"{block}: " + "; ".join(bad)


def _one_layer_net(size, kernel, pad):
    """One Convolution on a size x size input: the issue's reproduction."""
    def build():
        body = (blocks._conv("conv", "data", "a", 8, kernel, pad=pad)
                + blocks._pool("gap", "a", "g", "AVE", global_pool=True)
                + blocks._classifier("g"))
        return (body,) + blocks._images(8, size)
    return build


@pytest.mark.parametrize("size,kernel,pad", [(24, 1, 0), (16, 1, 0), (24, 3, 0), (24, 3, 1)],
                         ids=["1x1-24x24-per-image", "1x1-16x16-batch", "3x3-24x24-batch",
                              "3x3-24x24-per-image"])
def test_single_convolution_on_alternating_batches(tmp_path, size, kernel, pad):
    """The stale-columns reproduction: batches A, B, A, B through the trainer; before the fix
    the 1x1 convolution over 576 positions took A's columns at every B step (error ~1)."""
    errors, names, bad = train_and_check(tmp_path, _one_layer_net(size, kernel, pad))
    assert not bad, "; ".join(bad)
    conv_weight = names.index("conv/0")
    assert max(e[conv_weight] for e in errors) < trajectory.FIRST_STEP_BOUND


@pytest.mark.mpi
@pytest.mark.parametrize("net", list(blocks.FAMILIES) + list(blocks.BLOCKS))
def test_two_ranks_fp32_steps_equal_the_reference_and_each_other(tmp_path, net):
    """``mpiexec -n 2`` with the float32 exchange: each rank's local gradients against the
    reference at every step, and the ranks' parameters bit-identical after every step."""
    build = {**blocks.FAMILIES, **blocks.BLOCKS}[net]
    solver, ref, inputs = write_case(tmp_path, build, ranks=2,
                                     comm='{ codec: "fp32" async: false }')
    ref_path = os.path.join(str(tmp_path), "reference.prototxt")
    with open(ref_path, "w") as f:
        f.write(ref)
    out = subprocess.run([_mpiexec(), "-n", "2", sys.executable, "-m", "tests.engine.trajectory_prog",
                          solver, ref_path, *inputs], cwd=REPO, env=dict(os.environ, PYTHONPATH=REPO),
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    assert out.returncode == 0 and "ORACLE OK" in out.stdout, out.stdout[-3000:]
