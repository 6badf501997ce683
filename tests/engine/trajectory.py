"""The trajectory oracle: the trainer's gradients, step by step, against a fresh reference Net.

A net is written twice from one body of layers (studies/bvlc_trajectory/_blocks.py: the nets
and their writers): with an ``HDF5Data`` layer that hands the trainer a different batch every
step, and with ``Input`` layers of the same shapes for the reference. :class:`GradientRecorder`,
a solver callback placed first, keeps what each step of the trainer started from (every layer's blobs) and what it ended with before the update
(its batch, Dropout's masks, the local gradients, before any exchange). :func:`reference_gradients`
then builds a *fresh* Net for each step on the plain paths (NumPy im2col, NumPy's BLAS, no kept
buffers, pycaffe's separate forward and backward), loads that step's blobs, batch and masks and
computes the gradients again. A fast path that reuses stale work (Convolution's columns of an
earlier batch) shows at its second step as an error far above rounding.

Imported by the tests and by ``trajectory_prog.py`` (the same under ``mpiexec``).
"""
import contextlib

import numpy

from caffe8.engine import backend, blas
from caffe8.engine.callbacks import SolverCallback
from caffe8.engine.net import Net
from caffe8.engine.prototxt import parse_text
from caffe8.layers import native

#: error a step may show beyond 10x its first step's (float32 rounding of sums of a few thousand
#: terms, relative to the largest element); a reused stale input shows 1e-2 .. 1
ROUNDING_FLOOR = 2e-6
#: the first step's own bound: the fast and the plain path agree to float32 rounding
FIRST_STEP_BOUND = 1e-4
#: gradients below this are zero in exact arithmetic (a bias before BatchNorm): compared absolutely
NEGLIGIBLE = 1e-5


def _layer_blobs(net):
    return [(layer.name, i, b) for layer in net.layers for i, b in enumerate(layer.blobs)]


class GradientRecorder(SolverCallback):
    """Keeps, per step: every layer blob before forward, the batch, Dropout's masks and the
    local gradients before the update (place it first, before an exchange)."""

    def __init__(self, net, inputs):
        self.net, self.inputs, self.steps = net, list(inputs), []

    def on_start(self):
        self._blobs = {(n, i): b.data.copy() for n, i, b in _layer_blobs(self.net)}

    def on_gradients_ready(self):
        masks = [layer.mask.copy() / layer.scale for layer in self.net.layers
                 if layer.type == "Dropout"]
        self.steps.append({
            "blobs": self._blobs,
            "batch": {name: self.net.blobs[name].data.copy() for name in self.inputs},
            "masks": masks,
            "grads": [p.diff.copy() for p in self.net.learnable_params]})


@contextlib.contextmanager
def plain_paths():
    """NumPy im2col/pooling instead of the C kernels, NumPy's BLAS instead of caffe8's."""
    saved_native, saved_blas = native.use_native(False), blas._state
    blas._state = (None, "the trajectory oracle's reference")
    try:
        yield
    finally:
        native.use_native(saved_native)
        blas._state = saved_blas


@contextlib.contextmanager
def replayed_uniforms(draws):
    """``backend.random_uniform`` hands out ``draws`` in order (Dropout's recorded masks as 0/1,
    which select the same elements as the uniforms that made them)."""
    queue = list(draws)
    original = backend.random_uniform

    def replay(shape, dtype, xp=None):
        u = queue.pop(0)
        assert u.shape == tuple(shape), (u.shape, shape)
        return u.astype(dtype)

    backend.random_uniform = replay
    try:
        yield
    finally:
        backend.random_uniform = original


def reference_gradients(ref_text, step):
    """The gradients a fresh Net computes at ``step``'s blobs, batch and masks."""
    with plain_paths():
        net = Net(parse_text(ref_text, "reference.prototxt"), phase="TRAIN")
        for name, i, blob in _layer_blobs(net):
            blob.data[...] = step["blobs"][(name, i)]
        for name, value in step["batch"].items():
            net.blobs[name].data[...] = value
        net.clear_param_diffs()
        with replayed_uniforms(step["masks"]):
            net.forward_loss()
        net.backward()
        return [p.diff.copy() for p in net.learnable_params]


def param_names(net):
    """``layer/index`` of each learnable param, in ``net.learnable_params`` order."""
    owners = {id(b): f"{n}/{i}" for n, i, b in _layer_blobs(net)}
    return [owners.get(id(p), f"param{j}") for j, p in enumerate(net.learnable_params)]


def step_errors(ref_text, steps):
    """``errors[k][j]``: max |trainer - reference| / max |reference| of param j at step k (over
    ``NEGLIGIBLE`` where the reference is smaller: a gradient that is zero but for rounding)."""
    errors = []
    for step in steps:
        ref = reference_gradients(ref_text, step)
        errors.append([float(numpy.abs(g - r).max() / max(numpy.abs(r).max(), NEGLIGIBLE))
                       for g, r in zip(step["grads"], ref)])
    return errors


def failures(errors, names):
    """What breaks the oracle's bounds: the first step beyond FIRST_STEP_BOUND, a later step
    beyond 10x the first step's error (at least ROUNDING_FLOOR)."""
    bad = []
    for j, name in enumerate(names):
        first = errors[0][j]
        if first > FIRST_STEP_BOUND:
            bad.append(f"{name}: step 1 error {first:.2e}")
        bound = 10 * max(first, ROUNDING_FLOOR)
        for k in range(1, len(errors)):
            if errors[k][j] > bound:
                bad.append(f"{name}: step {k + 1} error {errors[k][j]:.2e} "
                           f"(step 1: {first:.2e})")
    return bad
