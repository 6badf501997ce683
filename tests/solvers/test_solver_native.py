"""solvers.native: the fused SGD step gives the bits of the NumPy sequence it replaces, and the
finiteness test finds every Inf and NaN; SGDSolver takes the C path and the NumPy path alike."""
import numpy
import pytest

from caffe8.solvers import native


def _numpy_step(w, g, h, rate, momentum):
    tmp = g * rate
    h *= momentum
    h += tmp
    g[...] = h
    w -= g


@pytest.mark.parametrize("dtype", [numpy.float32, numpy.float64])
def test_sgd_momentum_equals_the_numpy_sequence_bit_for_bit(dtype):
    rng = numpy.random.default_rng(5)
    n = 100_003                                    # not a multiple of any vector width
    w, g, h = (rng.standard_normal(n).astype(dtype) * s for s in (1.0, 1e-3, 1e-2))
    g[::97] = 0
    h[::89] *= 1e-30                               # subnormal products
    rate, momentum = dtype(0.0137), dtype(0.9)
    ref = [a.copy() for a in (w, g, h)]
    _numpy_step(*ref, rate, momentum)
    assert native.sgd_momentum(w, g, h, rate, momentum)
    for got, want in zip((w, g, h), ref):
        assert got.tobytes() == want.tobytes()


def test_sgd_momentum_declines_what_it_cannot_run():
    a = numpy.zeros(8, numpy.float16)
    assert native.sgd_momentum(a, a.copy(), a.copy(), 0.1, 0.9) is False
    b = numpy.zeros((4, 4), numpy.float32)[:, ::2]          # not contiguous
    assert native.sgd_momentum(b, b.copy(), b.copy(), 0.1, 0.9) is False


@pytest.mark.parametrize("dtype", [numpy.float32, numpy.float64])
@pytest.mark.parametrize("bad", [numpy.inf, -numpy.inf, numpy.nan])
def test_all_finite_finds_every_inf_and_nan(dtype, bad):
    x = numpy.random.default_rng(3).standard_normal(20_000).astype(dtype)
    x[::7] = numpy.finfo(dtype).max                # the largest finite values are finite
    assert native.all_finite(x) is True
    for where in (0, 4095, 4096, 19_999):
        y = x.copy()
        y[where] = bad
        assert native.all_finite(y) is False
    assert native.all_finite(x[:0]) is True


def test_disabled_kernels_leave_it_to_numpy():
    x = numpy.ones(4, numpy.float32)
    native.use_native(False)
    try:
        assert native.all_finite(x) is None
        assert native.sgd_momentum(x, x.copy(), x.copy(), 0.1, 0.9) is False
    finally:
        native.use_native(True)


def test_sgd_solver_gives_the_same_weights_with_and_without_the_kernel():
    from caffe8.engine.net import Net
    from caffe8.engine.prototxt import parse_text
    from caffe8.solvers.sgd import SGDSolver
    net_text = '''
    layer { name: "p" type: "Parameter" top: "w" parameter_param { shape { dim: 3 dim: 5 } } }
    layer { name: "loss" type: "Reduction" bottom: "w" top: "loss" loss_weight: 1
      reduction_param { operation: SUMSQ } }'''
    solver_text = 'base_lr: 0.05 momentum: 0.9 weight_decay: 0.01 lr_policy: "fixed"'
    results = []
    for flag in (True, False):
        native.use_native(flag)
        try:
            net = Net(parse_text(net_text, "n.prototxt", "NetParameter"))
            net.params["p"][0].data[...] = numpy.arange(15, dtype=numpy.float32).reshape(3, 5)
            solver = SGDSolver(parse_text(solver_text, "s.prototxt", "SolverParameter"), net)
            for _ in range(5):
                net.clear_param_diffs()
                net.forward_backward()
                solver.apply_update()
            results.append(net.params["p"][0].data.copy())
        finally:
            native.use_native(True)
    assert results[0].tobytes() == results[1].tobytes()
    assert not numpy.array_equal(results[0], numpy.arange(15).reshape(3, 5))


NET_OF_THREE = '''
layer { name: "a" type: "Parameter" top: "a" parameter_param { shape { dim: 3 dim: 5 } }
  param { lr_mult: 1 decay_mult: 1 } }
layer { name: "b" type: "Parameter" top: "b" parameter_param { shape { dim: 4 } }
  param { lr_mult: 2 decay_mult: 0 } }
layer { name: "c" type: "Parameter" top: "c" parameter_param { shape { dim: 2 dim: 3 dim: 7 } }
  param { lr_mult: 0.5 decay_mult: 3 } }
layer { name: "la" type: "Reduction" bottom: "a" top: "la" loss_weight: 1
  reduction_param { operation: SUMSQ } }
layer { name: "lb" type: "Reduction" bottom: "b" top: "lb" loss_weight: 0.3
  reduction_param { operation: ASUM } }
layer { name: "lc" type: "Reduction" bottom: "c" top: "lc" loss_weight: 2
  reduction_param { operation: SUMSQ } }'''


@pytest.mark.parametrize("solver_extra", ['weight_decay: 0.01', 'weight_decay: 0',
                                          'weight_decay: 0.02 iter_size: 2',
                                          'weight_decay: 0.01 regularization_type: "L1"'])
@pytest.mark.parametrize("early", [False, True])
def test_one_call_update_equals_the_per_param_numpy_path(solver_extra, early, monkeypatch):
    """Plain momentum SGD on a net's flat buffers runs as one C call for every param
    (SGDSolver._update_together): over several steps whose gradients follow the moving weights,
    with lr_mult / decay_mult per param, iter_size, no decay and L1 (the per-param path then),
    and the pipelined update's share of the params first, the weights, diffs and history have
    the bits of the NumPy sequence param by param."""
    from caffe8.engine.net import Net
    from caffe8.engine.prototxt import parse_text
    from caffe8.solvers.sgd import SGDSolver
    text = f'base_lr: 0.05 momentum: 0.9 lr_policy: "step" gamma: 0.5 stepsize: 2 {solver_extra}'
    calls = []
    one_call = native.sgd_update
    monkeypatch.setattr(native, "sgd_update", lambda *a: calls.append(len(a[3])) or one_call(*a))
    results = []
    for flag in (True, False):
        native.use_native(flag)
        try:
            net = Net(parse_text(NET_OF_THREE, "n.prototxt", "NetParameter"))
            rng = numpy.random.default_rng(2)
            for p in net.learnable_params:
                p.data[...] = rng.standard_normal(p.data.shape)
            solver = SGDSolver(parse_text(text, "s.prototxt", "SolverParameter"), net)
            for _ in range(6):
                net.clear_param_diffs()
                for _ in range(solver.param.iter_size):
                    net.forward_backward()
                if early:
                    solver.update_early([0, 2])
                solver.apply_update(done=(0, 2) if early else ())
            results.append([a.tobytes() for a in (net.flat_data, net.flat_diff,
                                                   *solver.history)])
        finally:
            native.use_native(True)
        if flag:   # one call an update (two with the early share: 2 params, then the third)
            assert calls == ([] if "L1" in solver_extra else [2, 1] * 6 if early else [3] * 6)
    assert results[0] == results[1]
