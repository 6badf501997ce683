"""engine/pipelined.py by itself: whether a layer may move early, the params already updated,
and the check of the gradients left for the end (the trainer's verdict reads it), against a
solver that records what it was asked to update."""
from types import SimpleNamespace

import numpy

from caffe8.engine.pipelined import PipelinedUpdate, gradients_finite


def _setup(sizes=(4, 2, 3)):
    """A net of params of ``sizes`` in one flat diff, and a solver recording its updates."""
    flat = numpy.zeros(sum(sizes), numpy.float32)
    slices, params, at = [], [], 0
    for n in sizes:
        sl = slice(at, at + n)
        slices.append(sl)
        params.append(SimpleNamespace(diff=flat[sl]))
        at += n
    net = SimpleNamespace(param_slices=slices, learnable_params=params, flat_diff=flat)
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
    assert update.finish() == frozenset({0, 1, 2})
    assert gradients_finite(solver, net, update.done)


def test_a_nonfinite_gradient_stops_the_early_updates_and_is_left_for_the_check():
    flat, net, solver, updates = _setup()
    update = PipelinedUpdate(solver, net)
    update.begin(True)
    update.layer_ready([net.param_slices[2]])
    flat[net.param_slices[1]][0] = numpy.inf
    update.layer_ready([net.param_slices[1]])            # stops here: nothing of it moves
    update.layer_ready([net.param_slices[0]])            # and nothing after it
    assert updates == [[2]]
    assert update.finish() == frozenset({2})
    assert not gradients_finite(solver, net, frozenset({2}))


def test_the_check_finds_a_nonfinite_gradient_of_a_param_left_for_the_end():
    flat, net, solver, updates = _setup()
    update = PipelinedUpdate(solver, net)
    update.begin(True)
    update.layer_ready([net.param_slices[2]])
    flat[0] = numpy.nan                                   # param 0 never came early
    assert update.finish() == frozenset({2})
    assert not gradients_finite(solver, net, frozenset({2}))
    flat[0] = 0.0
    update.begin(True)                                    # a new iteration starts clean
    assert update.finish() == frozenset() and gradients_finite(solver, net, frozenset())


def test_with_none_aside_the_check_is_one_pass_over_the_flat_diff_with_the_same_verdict():
    flat, net, solver, _ = _setup()
    seen = []
    solver.gradients_finite = lambda d: (seen.append(d.size), bool(numpy.isfinite(d).all()))[1]
    for at in range(flat.size):
        for bad in (numpy.nan, numpy.inf, -numpy.inf, 0.0):
            flat[:] = numpy.arange(flat.size)
            flat[at] = bad
            per_param = all(numpy.isfinite(p.diff).all() for p in net.learnable_params)
            seen.clear()
            assert gradients_finite(solver, net) == per_param == (bad == 0.0)
            assert seen == [flat.size]


def test_a_nonfinite_loss_moves_nothing_early():
    flat, net, solver, updates = _setup()
    update = PipelinedUpdate(solver, net)
    update.begin(False)
    update.layer_ready([net.param_slices[0]])
    assert updates == [] and update.finish() == frozenset()
    update.layer_ready([net.param_slices[0]])            # after finish: nothing either
    assert updates == []
