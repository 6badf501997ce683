"""Pooling: Caffe's loops as reference, closed-form divisor/tie/padding cases, gradients, errors."""
import numpy
import pytest

from caffe8.engine import backend
from caffe8.engine.errors import LayerError
from caffe8.engine.gradcheck import check_layer_gradient
from tests.layers import naive
from tests.layers.spatial_helpers import build, forward, gpu_matches_cpu

RNG = numpy.random.default_rng(7)
FLT_MAX = float(numpy.finfo(numpy.float32).max)


def pool_text(body, name="p"):
    return f'name: "{name}" type: "Pooling" pooling_param {{ {body} }}'


def distinct(shape):
    """Values spaced >= 0.01 apart, so finite differences never flip an argmax."""
    n = int(numpy.prod(shape))
    return (RNG.permutation(n) * 0.01 - n * 0.005).reshape(shape)


# (bottom shape, pooling_param body, method, kernel, stride, pad, ceil)
CASES = [
    ((2, 3, 7, 7), "pool: MAX kernel_size: 3 stride: 2", "MAX", (3, 3), (2, 2), (0, 0), True),
    ((1, 2, 16, 16), "pool: AVE kernel_size: 3 stride: 2", "AVE", (3, 3), (2, 2), (0, 0), True),
    ((1, 2, 6, 7), "pool: MAX kernel_size: 3 stride: 2 pad: 1", "MAX", (3, 3), (2, 2), (1, 1), True),
    ((1, 2, 6, 7), "pool: AVE kernel_size: 3 stride: 2 pad: 1", "AVE", (3, 3), (2, 2), (1, 1), True),
    ((1, 2, 4, 4), "pool: AVE kernel_size: 3 stride: 2 pad: 2", "AVE", (3, 3), (2, 2), (2, 2), True),
    ((1, 2, 4, 4), "pool: MAX kernel_size: 3 stride: 2 pad: 2", "MAX", (3, 3), (2, 2), (2, 2), True),
    ((1, 2, 8, 7), "pool: MAX kernel_size: 3 stride: 2 round_mode: FLOOR", "MAX", (3, 3), (2, 2), (0, 0), False),
    ((1, 2, 8, 7), "pool: AVE kernel_size: 2 stride: 3 pad: 1 round_mode: FLOOR", "AVE", (2, 2), (3, 3), (1, 1), False),
    ((2, 2, 9, 8), "pool: MAX kernel_h: 3 kernel_w: 2 stride_h: 2 stride_w: 3 pad_h: 1 pad_w: 1",
     "MAX", (3, 2), (2, 3), (1, 1), True),
    ((2, 2, 9, 8), "pool: AVE kernel_h: 2 kernel_w: 4 stride_h: 3 stride_w: 1 pad_h: 1 pad_w: 0",
     "AVE", (2, 4), (3, 1), (1, 0), True),
    ((1, 2, 5, 5), "pool: MAX kernel_size: 1 stride: 3", "MAX", (1, 1), (3, 3), (0, 0), True),
    ((1, 2, 5, 5), "pool: AVE kernel_size: 1 stride: 3", "AVE", (1, 1), (3, 3), (0, 0), True),
]


@pytest.mark.parametrize("shape,body,method,kernel,stride,pad,ceil", CASES)
def test_forward_matches_caffe_loops(shape, body, method, kernel, stride, pad, ceil):
    x = RNG.standard_normal(shape)
    n_top = 2 if method == "MAX" else 1
    layer, bottom, top = build(pool_text(body), [x], n_top=n_top)
    got = forward(layer, bottom, top)
    expected, mask = naive.pool_forward(x, method, kernel, stride, pad, ceil)
    assert got[0].shape == expected.shape
    numpy.testing.assert_allclose(got[0], expected, rtol=1e-13, atol=1e-13)
    if method == "MAX":
        numpy.testing.assert_array_equal(got[1], mask)


def test_cifar10_quick_pool2_divisors():
    """AVE k3 s2 on 16x16: 8x8, the last row/column divides by 6 and the corner by 4, not 9."""
    layer, bottom, top = build(pool_text("pool: AVE kernel_size: 3 stride: 2"), [numpy.ones((1, 1, 16, 16))])
    (ones,) = forward(layer, bottom, top)
    assert ones.shape == (1, 1, 8, 8)
    numpy.testing.assert_allclose(ones, 1.0)  # real pixels / divisor == 1 everywhere
    x = numpy.zeros((1, 1, 16, 16))
    x[0, 0, 15, :] = 1.0  # only the last row: seen by the bottom row of windows (rows 14-15)
    bottom[0].data[...] = x
    (y,) = forward(layer, bottom, top)
    numpy.testing.assert_allclose(y[0, 0, 7, :7], 3 / 6)
    numpy.testing.assert_allclose(y[0, 0, 7, 7], 2 / 4)
    numpy.testing.assert_allclose(y[0, 0, 6, :], 0.0)


def test_ave_divisor_counts_padding():
    layer, bottom, top = build(pool_text("pool: AVE kernel_size: 3 stride: 2 pad: 1"), [numpy.ones((1, 1, 5, 5))])
    (y,) = forward(layer, bottom, top)
    assert y.shape == (1, 1, 3, 3)
    expected = numpy.array([[4, 6, 4], [6, 9, 6], [4, 6, 4]]) / 9.0
    numpy.testing.assert_allclose(y[0, 0], expected)


def test_clip_rule_only_with_padding():
    # pad 2: ceil((4+4-3)/2)+1 = 4, but window 3 would start at 6 >= H+pad, so Caffe drops it
    layer, bottom, top = build(pool_text("pool: MAX kernel_size: 3 stride: 2 pad: 2"), [RNG.standard_normal((1, 1, 4, 4))])
    assert top[0].shape == (1, 1, 3, 3)
    # no pad: the rule is not applied, and the last window (start 6 >= 5) is empty
    layer, bottom, top = build(pool_text("pool: MAX kernel_size: 1 stride: 3"), [RNG.standard_normal((1, 1, 5, 5))],
                               n_top=2)
    y, mask = forward(layer, bottom, top)
    assert y.shape == (1, 1, 3, 3)
    assert (y[0, 0, 2, :] == -FLT_MAX).all() and (mask[0, 0, 2, :] == -1).all()


def test_max_ties_first_wins_and_gets_the_gradient():
    x = numpy.array([[[[1, 3, 3, 0],
                       [3, 2, 0, 3]]]], dtype=float)
    layer, bottom, top = build(pool_text("pool: MAX kernel_size: 2 stride: 2"), [x], n_top=2)
    y, mask = forward(layer, bottom, top)
    numpy.testing.assert_array_equal(y[0, 0], [[3, 3]])
    numpy.testing.assert_array_equal(mask[0, 0], [[1, 2]])
    top[0].diff[...] = [[[[10.0, 20.0]]]]
    layer.backward(top, [True], bottom)
    numpy.testing.assert_array_equal(bottom[0].diff[0, 0], [[0, 10, 20, 0], [0, 0, 0, 0]])


def test_max_padding_never_wins():
    x = -1.0 - RNG.random((1, 2, 4, 4))
    layer, bottom, top = build(pool_text("pool: MAX kernel_size: 3 stride: 1 pad: 1"), [x])
    (y,) = forward(layer, bottom, top)
    assert (y < -1.0).all()
    numpy.testing.assert_allclose(y, naive.pool_forward(x, "MAX", (3, 3), (1, 1), (1, 1))[0])


def test_max_backward_accumulates_overlaps_and_ties():
    x = RNG.integers(0, 3, (2, 2, 7, 6)).astype(float)  # many ties, overlapping windows
    layer, bottom, top = build(pool_text("pool: MAX kernel_size: 3 stride: 1 pad: 1"), [x], n_top=2)
    y, mask = forward(layer, bottom, top)
    expected_mask = naive.pool_forward(x, "MAX", (3, 3), (1, 1), (1, 1))[1]
    numpy.testing.assert_array_equal(mask, expected_mask)
    dy = RNG.standard_normal(y.shape)
    top[0].diff[...] = dy
    layer.backward(top, [True], bottom)
    numpy.testing.assert_allclose(bottom[0].diff, naive.max_pool_backward(dy, expected_mask, x.shape))


@pytest.mark.parametrize("body", ["pool: MAX global_pooling: true", "pool: AVE global_pooling: true"])
def test_global_pooling(body):
    x = RNG.standard_normal((2, 3, 4, 5))
    layer, bottom, top = build(pool_text(body), [x])
    (y,) = forward(layer, bottom, top)
    assert y.shape == (2, 3, 1, 1)
    ref = x.max(axis=(2, 3)) if "MAX" in body else x.mean(axis=(2, 3))
    numpy.testing.assert_allclose(y[:, :, 0, 0], ref, rtol=1e-13)


@pytest.mark.parametrize("body", ["pool: MAX global_pooling: true", "pool: MAX kernel_h: 4 kernel_w: 5",
                                  "pool: AVE kernel_h: 4 kernel_w: 5 stride: 2"])
def test_whole_image_window_with_ties_matches_caffe_loops(body):
    """One window covering the image (a reduction path): first max wins, gradient to it."""
    x = RNG.integers(0, 3, (2, 3, 4, 5)).astype(float)
    method = body.split()[1]
    layer, bottom, top = build(pool_text(body), [x], n_top=2 if method == "MAX" else 1)
    got = forward(layer, bottom, top)
    expected, mask = naive.pool_forward(x, method, (4, 5), (1, 1), (0, 0))
    numpy.testing.assert_allclose(got[0], expected, rtol=1e-13)
    dy = RNG.standard_normal(expected.shape)
    top[0].diff[...] = dy
    layer.backward(top, [True], bottom)
    if method == "MAX":
        numpy.testing.assert_array_equal(got[1], mask)
        numpy.testing.assert_allclose(bottom[0].diff, naive.max_pool_backward(dy, mask, x.shape))
    else:
        numpy.testing.assert_allclose(bottom[0].diff, numpy.broadcast_to(dy / 20, x.shape))


@pytest.mark.parametrize("shape,body", [
    ((1, 2, 7, 7), "pool: MAX kernel_size: 3 stride: 2 pad: 1"),
    ((1, 2, 7, 6), "pool: MAX kernel_size: 3 stride: 2"),
    ((1, 2, 7, 6), "pool: AVE kernel_size: 3 stride: 2"),
    ((1, 2, 6, 7), "pool: AVE kernel_size: 3 stride: 2 pad: 1"),
    ((1, 2, 9, 8), "pool: AVE kernel_h: 2 kernel_w: 4 stride_h: 3 stride_w: 1 pad_h: 1 pad_w: 0"),
    ((2, 2, 3, 4), "pool: AVE global_pooling: true"),
    ((2, 2, 3, 4), "pool: MAX global_pooling: true"),
])
def test_gradients(shape, body):
    layer, bottom, top = build(pool_text(body), [distinct(shape)])
    check_layer_gradient(layer, bottom, top, setup=False)


def test_gradients_with_mask_top():
    layer, bottom, top = build(pool_text("pool: MAX kernel_size: 2 stride: 1"), [distinct((1, 2, 4, 4))], n_top=2)
    check_layer_gradient(layer, bottom, top, setup=False)


@pytest.mark.parametrize("body,shape", [
    ("pool: MAX kernel_size: 3 stride: 2", (1, 96, 55, 55)),  # CaffeNet pool1 -> 27
    ("pool: MAX kernel_size: 3 stride: 2", (1, 64, 112, 112)),  # GoogLeNet pool1 -> 56
    ("pool: MAX kernel_size: 3 stride: 1 pad: 1", (1, 4, 28, 28)),  # inception pool branch -> 28
    ("pool: AVE kernel_size: 7 stride: 1", (1, 8, 7, 7)),  # GoogLeNet pool5 -> 1
    ("pool: AVE kernel_size: 5 stride: 3", (1, 8, 14, 14)),  # aux heads -> 4
])
def test_output_shapes_of_shipped_nets(body, shape):
    expected = {55: 27, 112: 56, 28: 28, 7: 1, 14: 4}[shape[2]]
    layer, bottom, top = build(pool_text(body), [numpy.zeros(shape, numpy.float32)], dtype=numpy.float32)
    assert top[0].shape == shape[:2] + (expected, expected)


def test_stochastic_test_phase_closed_form():
    x = RNG.random((1, 2, 4, 4)) + 0.1
    layer, bottom, top = build(pool_text("pool: STOCHASTIC kernel_size: 2 stride: 2"), [x], phase="TEST")
    (y,) = forward(layer, bottom, top)
    win = x.reshape(1, 2, 2, 2, 2, 2).transpose(0, 1, 2, 4, 3, 5).reshape(1, 2, 2, 2, 4)
    numpy.testing.assert_allclose(y, (win ** 2).sum(-1) / win.sum(-1), rtol=1e-12)


def test_stochastic_train_picks_a_window_value_and_routes_its_gradient():
    x = RNG.random((2, 3, 6, 6)) + 0.1
    layer, bottom, top = build(pool_text("pool: STOCHASTIC kernel_size: 3 stride: 3"), [x])
    (y,) = forward(layer, bottom, top)
    win = x.reshape(2, 3, 2, 3, 2, 3).transpose(0, 1, 2, 4, 3, 5).reshape(2, 3, 2, 2, 9)
    assert (numpy.abs(win - y[..., None]) == 0).any(axis=-1).all()
    top[0].diff[...] = 1.0
    layer.backward(top, [True], bottom)
    picked = (bottom[0].diff == 1.0).reshape(2, 3, 2, 3, 2, 3).transpose(0, 1, 2, 4, 3, 5).reshape(2, 3, 2, 2, 9)
    assert (picked.sum(axis=-1) == 1).all()  # exactly one position per window gets the gradient
    numpy.testing.assert_array_equal(win[picked].reshape(y.shape), y)  # ... the sampled one


@pytest.mark.parametrize("body,shape,n_top,fragment", [
    ("pool: MAX kernel_size: 5", (1, 1, 3, 3), 1, "larger than the padded input"),
    ("pool: AVE kernel_size: 2", (1, 1, 3, 3), 2, "2nd top"),
    ("pool: MAX global_pooling: true kernel_size: 2", (1, 1, 3, 3), 1, "global_pooling"),
    ("pool: MAX global_pooling: true stride: 2", (1, 1, 3, 3), 1, "global_pooling"),
    ("pool: MAX kernel_size: 2 pad: 2", (1, 1, 5, 5), 1, "smaller than kernel"),
    ("pool: STOCHASTIC kernel_size: 2 pad: 1", (1, 1, 5, 5), 1, "padding"),
    ("pool: MAX stride: 2", (1, 1, 5, 5), 1, "kernel_size"),
    ("pool: MAX kernel_size: 2 kernel_h: 2 kernel_w: 2", (1, 1, 5, 5), 1, "not both"),
    ("pool: MAX kernel_size: 3 pad_h: 1", (1, 1, 5, 5), 1, "pad_h and pad_w"),
    ("pool: MAX kernel_size: 2", (1, 5, 5), 1, "4 axes"),
])
def test_errors_name_the_layer(body, shape, n_top, fragment):
    with pytest.raises(LayerError) as info:
        build(pool_text(body, name="pool_bad"), [numpy.zeros(shape)], n_top=n_top)
    assert "pool_bad" in str(info.value) and fragment in str(info.value)


@pytest.mark.gpu
@pytest.mark.parametrize("shape,body", [(c[0], c[1]) for c in CASES] + [
    ((2, 3, 4, 5), "pool: MAX global_pooling: true"), ((2, 3, 4, 5), "pool: AVE global_pooling: true")])
def test_cupy_matches_numpy(shape, body):
    n_top = 2 if "MAX" in body else 1
    gpu_matches_cpu(pool_text(body), [distinct(shape).astype(numpy.float32)], n_top=n_top)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [numpy.float32, numpy.float64])
@pytest.mark.parametrize("body", ["kernel_size: 3 stride: 2", "kernel_size: 3 stride: 1 pad: 1",
                                  "kernel_h: 3 kernel_w: 2 stride_h: 2 stride_w: 3 pad_h: 1 pad_w: 1",
                                  "kernel_size: 3 stride: 2 pad: 2"])
def test_cupy_max_pooling_is_bitwise_the_host_kernel(dtype, body):
    """Caffe's GPU MAX kernels (one launch each way) against the host C kernel: the same tops,
    the same argmax mask (first maximum in row-major order: the input has many ties) and the
    same bottom diff, bit for bit, where overlapping windows pick one input several times."""
    rng = numpy.random.default_rng(3)
    x = numpy.round(rng.standard_normal((2, 3, 9, 11)) * 2).astype(dtype)     # many ties
    dy = rng.standard_normal((2, 3, 9, 11)).astype(dtype)                      # cut to top shape
    text = pool_text("pool: MAX " + body)
    runs = []
    for xp in (numpy, backend.cupy):
        layer, bottom, top = build(text, [x], n_top=2, dtype=dtype, xp=xp)
        outs = forward(layer, bottom, top)
        top[0].diff[...] = xp.asarray(numpy.ascontiguousarray(dy[:, :, :top[0].shape[2],
                                                                  :top[0].shape[3]]))
        layer.backward(top, [True], bottom)
        runs.append(outs + [backend.to_numpy(bottom[0].diff)])
    assert numpy.count_nonzero(runs[0][1] < 0) < runs[0][1].size                # masks exist
    for host, dev in zip(*runs):
        assert host.dtype == dev.dtype and numpy.array_equal(host, dev)
