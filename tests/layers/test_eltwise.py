"""Eltwise SUM (coefficients), PROD (stable and top/bottom gradients), MAX (Caffe's tie rule,
argmax backward) against element loops; float64 gradients; errors naming the layer."""
import numpy
import pytest

from caffe8.engine.errors import LayerError
from caffe8.engine.gradcheck import check_layer_gradient
from layer_util import assert_gpu_matches_cpu, blob, make, run, run_backward, tops


def elt_text(op, extra="", n=3):
    bottoms = " ".join(f'bottom: "b{i}"' for i in range(n))
    return f'name: "elt" type: "Eltwise" {bottoms} top: "y" eltwise_param {{ operation: {op} {extra} }}'


def inputs(n=3, shape=(2, 3, 2), seed=0):
    rng = numpy.random.default_rng(seed)
    return [rng.uniform(0.5, 1.5, shape) * rng.choice([-1, 1], shape) for _ in range(n)]


def loop(arrays, f):
    out = numpy.empty_like(arrays[0])
    for idx in numpy.ndindex(out.shape):
        out[idx] = f([float(a[idx]) for a in arrays])
    return out


def test_sum_with_coefficients():
    xs = inputs()
    layer = make(elt_text("SUM", "coeff: 1 coeff: -2 coeff: 0.5"))
    bottom, top = run(layer, xs)
    numpy.testing.assert_allclose(top[0].data, loop(xs, lambda v: v[0] - 2 * v[1] + 0.5 * v[2]),
                                  rtol=1e-14)
    dy = numpy.random.default_rng(5).standard_normal(xs[0].shape)
    grads = run_backward(layer, bottom, top, [dy])
    for g, c in zip(grads, [1, -2, 0.5]):
        numpy.testing.assert_allclose(g, c * dy, rtol=1e-15)


@pytest.mark.parametrize("coeffs", ["", "coeff: 1 coeff: -2 coeff: 0.5"])
def test_sum_in_place_and_into_its_own_top_give_the_same_bits(coeffs):
    """The sum runs in the top's buffer unless the top is a bottom's (in place); both, float32,
    equal the products summed in order (x * 1 is x); coefficients of 1 hand dy on as it is."""
    xs = [x.astype(numpy.float32) for x in inputs(shape=(4, 5, 6))]
    c = [1.0, -2.0, 0.5] if coeffs else [1.0, 1.0, 1.0]
    ref = (xs[0] * numpy.float32(c[0]) + xs[1] * numpy.float32(c[1])) + xs[2] * numpy.float32(c[2])
    _, top = run(make(elt_text("SUM", coeffs)), xs, dtype=numpy.float32)
    assert numpy.array_equal(top[0].data, ref)
    layer = make(elt_text("SUM", coeffs).replace('top: "y"', 'top: "b1"'))
    bottom = [blob(x, numpy.float32) for x in xs]
    layer.setup(bottom, [bottom[1]])
    layer.reshape(bottom, [bottom[1]])
    layer.forward(bottom, [bottom[1]])                 # the top is bottom 1: in place
    assert numpy.array_equal(bottom[1].data, ref)
    if coeffs:       # in place with coefficients, Caffe's backward scales the shared diff as it
        return       # goes (bottom 1 writes dy * -2 where bottom 2 then reads dy); caffe8 does too
    dy = numpy.random.default_rng(3).standard_normal(xs[0].shape).astype(numpy.float32)
    grads = run_backward(layer, bottom, [bottom[1]], [dy])
    assert all(numpy.array_equal(g, dy) for g in grads)


def test_prod_forward():
    xs = inputs()
    _, top = run(make(elt_text("PROD")), xs)
    numpy.testing.assert_allclose(top[0].data, loop(xs, lambda v: v[0] * v[1] * v[2]), rtol=1e-14)


def test_max_follows_caffe_ties_and_routes_gradient():
    # columns: b0 wins; b0 == b1 (Caffe gives 1); b1 == b2 (1 stays); b2 strictly biggest
    xs = [numpy.array([3.0, 2.0, 1.0, 0.0]), numpy.array([1.0, 2.0, 4.0, 0.0]),
          numpy.array([0.0, 1.0, 4.0, 5.0])]
    layer = make(elt_text("MAX"))
    bottom, top = run(layer, xs)
    numpy.testing.assert_array_equal(top[0].data, [3.0, 2.0, 4.0, 5.0])
    grads = run_backward(layer, bottom, top, [numpy.array([1.0, 2.0, 3.0, 4.0])])
    numpy.testing.assert_array_equal(grads[0], [1.0, 0.0, 0.0, 0.0])
    numpy.testing.assert_array_equal(grads[1], [0.0, 2.0, 3.0, 0.0])
    numpy.testing.assert_array_equal(grads[2], [0.0, 0.0, 0.0, 4.0])


def test_max_forward_against_loop():
    xs = inputs(seed=3)
    _, top = run(make(elt_text("MAX")), xs)
    numpy.testing.assert_array_equal(top[0].data, loop(xs, max))


@pytest.mark.parametrize("op,extra", [("SUM", "coeff: 0.5 coeff: -1 coeff: 2"), ("SUM", ""),
                                      ("PROD", ""), ("PROD", "stable_prod_grad: false"),
                                      ("MAX", "")])
def test_gradcheck(op, extra):
    xs = inputs(seed=4)  # |x| >= 0.5 with distinct values: no MAX ties, no division by 0
    check_layer_gradient(make(elt_text(op, extra)), [blob(x) for x in xs], tops(1))


def test_stable_prod_grad_handles_zero_input():
    xs = [numpy.array([0.0, 2.0]), numpy.array([3.0, 4.0])]
    layer = make(elt_text("PROD", n=2))
    bottom, top = run(layer, xs)
    g0, g1 = run_backward(layer, bottom, top, [numpy.ones(2)])
    numpy.testing.assert_array_equal(g0, [3.0, 4.0])
    numpy.testing.assert_array_equal(g1, [0.0, 2.0])


@pytest.mark.parametrize("extra,pattern", [("coeff: 1", "one coefficient per bottom"),
                                           ("", r"bottom\[0\] \(2, 3\), bottom\[1\] \(3, 2\)")])
def test_errors_name_layer(extra, pattern):
    with pytest.raises(LayerError, match=f"layer 'elt'.*{pattern}"):
        run(make(elt_text("SUM", extra, n=2)), [numpy.zeros((2, 3)), numpy.zeros((3, 2))])


def test_coefficients_only_for_sum():
    with pytest.raises(LayerError, match="layer 'elt'.*coefficients"):
        run(make(elt_text("PROD", "coeff: 1 coeff: 2", n=2)), inputs(2))


@pytest.mark.gpu
@pytest.mark.parametrize("op,extra", [("SUM", "coeff: 0.5 coeff: -1 coeff: 2"), ("PROD", ""),
                                      ("MAX", "")])
def test_gpu_matches_cpu(op, extra):
    assert_gpu_matches_cpu(elt_text(op, extra), inputs(seed=6))
