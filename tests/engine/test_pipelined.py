"""engine/pipelined.py by itself: the per-layer verdict, the params already updated and the
final sweep, against a solver that records what it was asked to update."""
from types import SimpleNamespace

import numpy

from caffe8.engine.pipelined import PipelinedUpdate


def _setup(sizes=(4, 2, 3)):
    """A net of params of ``sizes`` in one flat diff, and a solver recording its updates."""
    flat = numpy.zeros(sum(sizes), numpy.float32)
    slices, params, at = [], [], 0
    for n in sizes:
        sl = slice(at, at + n)
        slices.append(sl)
        params.append(SimpleNamespace(diff=flat[sl]))
        at += n
    net = SimpleNamespace(param_slices=slices, learnable_params=params)
    updates = []
    solver = SimpleNamespace(gradients_finite=lambda d: bool(numpy.isfinite(d).all()),
                             update_early=lambda indices: updates.append(list(indices)))
    return flat, net, solver, updates


def test_layers_are_updated_as_they_come_and_left_out_of_the_end():
    flat, net, solver, updates = _setup()
    update = PipelinedUpdate(solver, net)
    update.begin(True)
    update.layer_ready([net.param_slices[2]])
    update.layer_ready([net.param_slices[0], net.param_slices[1]])
    assert updates == [[2], [0, 1]]
    assert update.finish() == (True, frozenset({0, 1, 2}))


def test_a_nonfinite_gradient_stops_the_early_updates_and_the_sweep_reports_it():
    flat, net, solver, updates = _setup()
    update = PipelinedUpdate(solver, net)
    update.begin(True)
    update.layer_ready([net.param_slices[2]])
    flat[net.param_slices[1]][0] = numpy.inf
    update.layer_ready([net.param_slices[1]])            # stops here: nothing of it moves
    update.layer_ready([net.param_slices[0]])            # and nothing after it
    assert updates == [[2]]
    assert update.finish() == (False, frozenset({2}))


def test_the_sweep_finds_a_nonfinite_gradient_of_a_param_left_for_the_end():
    flat, net, solver, updates = _setup()
    update = PipelinedUpdate(solver, net)
    update.begin(True)
    update.layer_ready([net.param_slices[2]])
    flat[0] = numpy.nan                                   # param 0 never came early
    assert update.finish() == (False, frozenset({2}))
    flat[0] = 0.0
    update.begin(True)                                    # a new iteration starts clean
    assert update.finish() == (True, frozenset())


def test_a_nonfinite_loss_moves_nothing_early():
    flat, net, solver, updates = _setup()
    update = PipelinedUpdate(solver, net)
    update.begin(False)
    update.layer_ready([net.param_slices[0]])
    assert updates == [] and update.finish() == (False, frozenset())
    update.layer_ready([net.param_slices[0]])            # after the sweep: nothing either
    assert updates == []
