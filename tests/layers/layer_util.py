"""Test helpers for the non-spatial layer tests: build layers from prototxt text, wrap arrays
in Blobs, run forward/backward, and compare a CuPy run with a NumPy run of the same layer."""
import contextlib

import numpy

from caffe8.engine import backend
from caffe8.engine.blob import Blob
from caffe8.engine.layer import create_layer
from caffe8.engine.prototxt import parse_layer


def make(text, phase="TRAIN", dtype=numpy.float64):
    """A layer from the body of a ``layer { ... }`` block."""
    return create_layer(parse_layer(text), phase, dtype)


def blob(array, dtype=numpy.float64, xp=None):
    """A Blob holding a copy of ``array`` (on ``xp``, NumPy by default)."""
    array = numpy.asarray(array, dtype=dtype)
    b = Blob(array.shape, dtype, xp=xp)
    b.data[...] = backend.to_device(array, like=b.data)
    return b


def tops(n, dtype=numpy.float64, xp=None):
    return [Blob((), dtype, xp=xp) for _ in range(n)]


def run(layer, bottom_arrays, n_top=1, dtype=numpy.float64):
    """setup + forward; returns (bottoms, tops)."""
    bottom = [blob(a, dtype) for a in bottom_arrays]
    top = tops(n_top, dtype)
    layer.setup(bottom, top)
    layer.reshape(bottom, top)
    layer.forward(bottom, top)
    return bottom, top


def run_backward(layer, bottom, top, top_diffs, propagate=None):
    """Set top diffs, run backward, return host copies of the bottom diffs."""
    for t, d in zip(top, top_diffs):
        t.diff[...] = backend.to_device(numpy.asarray(d, dtype=t.dtype), like=t.diff)
    propagate = [True] * len(bottom) if propagate is None else propagate
    layer.backward(top, propagate, bottom)
    return [backend.to_numpy(b.diff).copy() for b in bottom]


@contextlib.contextmanager
def built_on(xp):
    """Layers made inside live on ``xp``: CuPy runs go under ``backend.use_gpu()``, as a Net on
    the GPU does, so that the parameters are on the device too."""
    if xp is numpy:
        yield
        return
    backend.use_gpu()
    try:
        yield
    finally:
        backend.use_cpu()


def forward_on(xp, text, arrays, n_top=1, phase="TRAIN", dtype=numpy.float32, backward=False):
    """Run a layer on ``xp`` arrays; host copies of the top data (and bottom diffs)."""
    with built_on(xp):
        return _forward_on(xp, text, arrays, n_top, phase, dtype, backward)


def _forward_on(xp, text, arrays, n_top, phase, dtype, backward):
    layer = make(text, phase, dtype)
    bottom = [blob(a, dtype, xp=xp) for a in arrays]
    top = tops(n_top, dtype, xp=xp)
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    out = [backend.to_numpy(t.data).copy() for t in top]
    if backward:
        for t in top:
            t.diff[...] = xp.ones(t.data.shape, dtype=dtype) * dtype(0.5)
        layer.backward(top, [layer.allow_force_backward(i) for i in range(len(bottom))], bottom)
        out += [backend.to_numpy(b.diff).copy() for b in bottom]
    return out


def assert_gpu_matches_cpu(text, arrays, n_top=1, phase="TRAIN", backward=True, rtol=1e-5,
                           atol=1e-6):
    """The same layer on CuPy and NumPy (float32) gives the same tops and bottom diffs."""
    cpu = forward_on(numpy, text, arrays, n_top, phase, backward=backward)
    gpu = forward_on(backend.cupy, text, arrays, n_top, phase, backward=backward)
    for c, g in zip(cpu, gpu):
        numpy.testing.assert_allclose(g, c, rtol=rtol, atol=atol)
