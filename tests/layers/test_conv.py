"""Convolution: forward against direct loops, float64 gradient checks, shapes, errors, CuPy."""
import numpy
import pytest

from caffe8.engine.errors import LayerError
from caffe8.engine.gradcheck import check_layer_gradient
from caffe8.layers import conv as conv_module
from tests.layers import naive
from tests.layers.spatial_helpers import (assert_param_diffs_accumulate, build, forward,
                                          gpu_matches_cpu, set_params)

RNG = numpy.random.default_rng(42)


def conv_text(body, name="c"):
    return f'name: "{name}" type: "Convolution" convolution_param {{ {body} }}'


# (bottom shape, convolution_param body, stride, pad, dilation, group)
CASES = [
    ((2, 3, 6, 5), "num_output: 4 kernel_size: 3 pad: 1", (1, 1), (1, 1), (1, 1), 1),
    ((1, 2, 7, 8), "num_output: 3 kernel_h: 3 kernel_w: 2 stride_h: 2 stride_w: 1 pad_h: 1 pad_w: 0",
     (2, 1), (1, 0), (1, 1), 1),
    ((2, 4, 9, 9), "num_output: 6 kernel_size: 3 group: 2 dilation: 2 pad: 2 stride: 2",
     (2, 2), (2, 2), (2, 2), 2),
    ((1, 6, 8, 9), "num_output: 3 kernel_size: 2 kernel_size: 3 stride: 1 stride: 3 pad: 1 pad: 2 "
     "dilation: 1 dilation: 2 group: 3", (1, 3), (1, 2), (1, 2), 3),
    ((2, 3, 5, 4), "num_output: 5 kernel_size: 1 bias_term: false", (1, 1), (0, 0), (1, 1), 1),
    ((1, 2, 7, 7), "num_output: 2 kernel_size: 2 stride: 3", (3, 3), (0, 0), (1, 1), 1),
    # depthwise (group = channels = outputs): the direct C kernels
    ((2, 4, 7, 6), "num_output: 4 kernel_size: 3 pad: 1 group: 4", (1, 1), (1, 1), (1, 1), 4),
    ((2, 3, 9, 8), "num_output: 3 kernel_h: 3 kernel_w: 5 stride_h: 2 stride_w: 1 pad_h: 1 "
     "pad_w: 2 dilation: 2 group: 3", (2, 1), (1, 2), (2, 2), 3),
]


@pytest.mark.parametrize("shape,body,stride,pad,dilation,group", CASES)
def test_forward_matches_direct_loops(shape, body, stride, pad, dilation, group):
    x = RNG.standard_normal(shape)
    layer, bottom, top = build(conv_text(body), [x])
    set_params(layer)
    w = layer.blobs[0].data
    b = layer.blobs[1].data if len(layer.blobs) > 1 else None
    expected = naive.conv_forward(x, w, b, stride, pad, dilation, group)
    (got,) = forward(layer, bottom, top)
    assert got.shape == expected.shape
    numpy.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("shape,body", [(c[0], c[1]) for c in CASES[:5] + CASES[6:]])
def test_gradients(shape, body):
    layer, bottom, top = build(conv_text(body), [RNG.standard_normal(shape)])
    set_params(layer)
    check_layer_gradient(layer, bottom, top, setup=False)


def test_two_bottoms_share_weights_and_accumulate():
    body = "num_output: 3 kernel_size: 3 pad: 1 group: 1"
    x0, x1 = RNG.standard_normal((1, 2, 4, 4)), RNG.standard_normal((1, 2, 4, 4))
    layer, bottom, top = build(conv_text(body), [x0, x1], n_top=2)
    set_params(layer)
    w, b = layer.blobs[0].data, layer.blobs[1].data
    got = forward(layer, bottom, top)
    for x, y in zip((x0, x1), got):
        numpy.testing.assert_allclose(y, naive.conv_forward(x, w, b, (1, 1), (1, 1), (1, 1), 1),
                                      rtol=1e-12, atol=1e-12)
    check_layer_gradient(layer, bottom, top, setup=False)


def test_param_diffs_accumulate_bottom_diff_overwritten():
    assert_param_diffs_accumulate(conv_text("num_output: 2 kernel_size: 2"), [RNG.standard_normal((2, 2, 3, 3))], RNG)


def test_batch_chunking_gives_the_same_results(monkeypatch):
    body = "num_output: 4 kernel_size: 3 pad: 1 stride: 2 group: 2"
    x = RNG.standard_normal((5, 4, 6, 6))
    results = []
    for limit in (conv_module.MAX_COL_ELEMENTS, 40):  # 40 elements: one image per chunk
        monkeypatch.setattr(conv_module, "MAX_COL_ELEMENTS", limit)
        layer, bottom, top = build(conv_text(body), [x])
        set_params(layer)
        (y,) = forward(layer, bottom, top)
        top[0].diff[...] = numpy.linspace(-1, 1, top[0].count).reshape(top[0].shape)
        layer.backward(top, [True], bottom)
        results.append([y, bottom[0].diff.copy(), layer.blobs[0].diff.copy(), layer.blobs[1].diff.copy()])
    for a, b in zip(*results):
        numpy.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


def test_three_d_convolution_matches_direct_loops():
    x = RNG.standard_normal((1, 2, 4, 3, 5))
    layer, bottom, top = build(conv_text("num_output: 2 kernel_size: 2 kernel_size: 2 kernel_size: 3"), [x])
    set_params(layer)
    assert layer.blobs[0].shape == (2, 2, 2, 2, 3)
    (got,) = forward(layer, bottom, top)
    numpy.testing.assert_allclose(got, naive.conv3d_forward(x, layer.blobs[0].data, layer.blobs[1].data),
                                  rtol=1e-12, atol=1e-12)


def test_float32_default_and_caffenet_shapes():
    """Caffe's output formula on CaffeNet conv1/conv2; float32 params by default."""
    from caffe8.engine.layer import create_layer
    from caffe8.engine.prototxt import parse_layer
    from caffe8.engine.blob import Blob
    for body, shape, wshape, out in [
            ("num_output: 96 kernel_size: 11 stride: 4", (1, 3, 227, 227), (96, 3, 11, 11), (1, 96, 55, 55)),
            ("num_output: 256 pad: 2 kernel_size: 5 group: 2", (1, 96, 27, 27), (256, 48, 5, 5), (1, 256, 27, 27))]:
        layer = create_layer(parse_layer(conv_text(body)))
        bottom, top = [Blob(shape)], [Blob(())]
        layer.setup(bottom, top)
        assert layer.blobs[0].shape == wshape and layer.blobs[0].dtype == numpy.float32
        assert top[0].shape == out


def test_float32_forward_close_to_reference():
    x = RNG.standard_normal((1, 4, 6, 6)).astype(numpy.float32)
    layer, bottom, top = build(conv_text("num_output: 4 kernel_size: 3 group: 2 pad: 1"), [x],
                               dtype=numpy.float32)
    set_params(layer)
    (got,) = forward(layer, bottom, top)
    assert got.dtype == numpy.float32
    expected = naive.conv_forward(x.astype(float), layer.blobs[0].data.astype(float),
                                  layer.blobs[1].data.astype(float), (1, 1), (1, 1), (1, 1), 2)
    numpy.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("body,shape,fragment", [
    ("num_output: 2 kernel_size: 5 pad: 1", (1, 1, 2, 2), "larger than the padded input"),
    ("kernel_size: 3", (1, 2, 5, 5), "num_output"),
    ("num_output: 4 kernel_size: 3 group: 2", (1, 3, 5, 5), "multiple of group"),
    ("num_output: 3 kernel_size: 3 group: 2", (1, 4, 5, 5), "num_output (3) must be a multiple"),
    ("num_output: 2 kernel_size: 3 axis: 2", (1, 4, 5, 5), "axis"),
    ("num_output: 2 kernel_size: 3 kernel_h: 3 kernel_w: 3", (1, 1, 5, 5), "not both"),
    ("num_output: 2", (1, 1, 5, 5), "kernel_size"),
])   # (stride: 0 is caffe.proto's range, refused where the layer is read: engine/test_validate)
def test_errors_name_the_layer(body, shape, fragment):
    with pytest.raises(LayerError) as info:
        build(conv_text(body, name="conv_bad"), [numpy.zeros(shape)])
    assert "conv_bad" in str(info.value) and fragment in str(info.value)


def test_reshape_rejects_changed_channels():
    layer, bottom, top = build(conv_text("num_output: 2 kernel_size: 1", name="cc"), [numpy.zeros((1, 3, 4, 4))])
    bottom[0].reshape((1, 4, 4, 4))
    with pytest.raises(LayerError, match="cc"):
        layer.reshape(bottom, top)


@pytest.mark.gpu
@pytest.mark.parametrize("shape,body", [(c[0], c[1]) for c in CASES])
def test_cupy_matches_numpy(shape, body):
    gpu_matches_cpu(conv_text(body), [RNG.standard_normal(shape).astype(numpy.float32)])


# --- Deconvolution -----------------------------------------------------------------------------
def deconv_text(body, name="d"):
    return f'name: "{name}" type: "Deconvolution" convolution_param {{ {body} }}'


def naive_deconv(x, w, b, stride, pad, dilation, group):
    """Direct transposed convolution: every input pixel scatters ``x * w`` into the output."""
    n_, c_, h_, w_ = x.shape
    kh, kw = w.shape[2:]
    og = w.shape[1]
    oh = stride[0] * (h_ - 1) + dilation[0] * (kh - 1) + 1 - 2 * pad[0]
    ow = stride[1] * (w_ - 1) + dilation[1] * (kw - 1) + 1 - 2 * pad[1]
    y = numpy.zeros((n_, og * group, oh, ow))
    for n in range(n_):
        for c in range(c_):
            g = c // (c_ // group)
            for i in range(h_):
                for j in range(w_):
                    for o in range(og):
                        for ki in range(kh):
                            for kj in range(kw):
                                yy = i * stride[0] - pad[0] + ki * dilation[0]
                                xx = j * stride[1] - pad[1] + kj * dilation[1]
                                if 0 <= yy < oh and 0 <= xx < ow:
                                    y[n, g * og + o, yy, xx] += x[n, c, i, j] * w[c, o, ki, kj]
    if b is not None:
        y += b.reshape(1, -1, 1, 1)
    return y


# (bottom shape, convolution_param body, stride, pad, dilation, group)
DECONV_CASES = [
    ((2, 3, 4, 5), "num_output: 2 kernel_size: 3", (1, 1), (0, 0), (1, 1), 1),
    ((1, 2, 4, 3), "num_output: 3 kernel_size: 4 stride: 2 pad: 1", (2, 2), (1, 1), (1, 1), 1),
    ((2, 4, 3, 4), "num_output: 6 kernel_size: 3 stride: 2 pad: 1 dilation: 2 group: 2",
     (2, 2), (1, 1), (2, 2), 2),
    ((1, 6, 3, 3), "num_output: 3 kernel_h: 2 kernel_w: 3 stride_h: 3 stride_w: 1 pad_h: 1 "
     "pad_w: 0 group: 3 bias_term: false", (3, 1), (1, 0), (1, 1), 3),
    ((2, 3, 4, 4), "num_output: 5 kernel_size: 1", (1, 1), (0, 0), (1, 1), 1),
]


@pytest.fixture(params=["c", "numpy"])
def kernel_path(request):
    """Run a test on the C kernels and on the NumPy fallback."""
    from caffe8.layers import native
    native.use_native(request.param == "c")
    yield request.param
    native.use_native(True)


@pytest.mark.parametrize("shape,body,stride,pad,dilation,group", DECONV_CASES)
def test_deconv_forward_matches_direct_loops(shape, body, stride, pad, dilation, group,
                                             kernel_path):
    x = RNG.standard_normal(shape)
    layer, bottom, top = build(deconv_text(body), [x])
    set_params(layer)
    assert layer.blobs[0].shape[:2] == (shape[1], layer.num_output // group)
    b = layer.blobs[1].data if len(layer.blobs) > 1 else None
    expected = naive_deconv(x, layer.blobs[0].data, b, stride, pad, dilation, group)
    (got,) = forward(layer, bottom, top)
    assert got.shape == expected.shape
    numpy.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("shape,body,stride,pad,dilation,group", DECONV_CASES)
def test_deconv_matches_torch_conv_transpose2d(shape, body, stride, pad, dilation, group):
    torch = pytest.importorskip("torch")
    x = RNG.standard_normal(shape)
    layer, bottom, top = build(deconv_text(body), [x])
    set_params(layer)
    xt = torch.tensor(x, requires_grad=True)
    wt = torch.tensor(layer.blobs[0].data, requires_grad=True)
    bt = torch.tensor(layer.blobs[1].data, requires_grad=True) if len(layer.blobs) > 1 else None
    yt = torch.nn.functional.conv_transpose2d(xt, wt, bt, stride, pad, 0, group, dilation)
    (got,) = forward(layer, bottom, top)
    numpy.testing.assert_allclose(got, yt.detach().numpy(), rtol=1e-10, atol=1e-10)
    dy = RNG.standard_normal(got.shape)
    yt.backward(torch.tensor(dy))
    top[0].diff[...] = dy
    layer.backward(top, [True], bottom)
    numpy.testing.assert_allclose(bottom[0].diff, xt.grad.numpy(), rtol=1e-10, atol=1e-10)
    numpy.testing.assert_allclose(layer.blobs[0].diff, wt.grad.numpy(), rtol=1e-10, atol=1e-10)
    if bt is not None:
        numpy.testing.assert_allclose(layer.blobs[1].diff, bt.grad.numpy(), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("shape,body", [(c[0], c[1]) for c in DECONV_CASES])
def test_deconv_gradients(shape, body, kernel_path):
    layer, bottom, top = build(deconv_text(body), [RNG.standard_normal(shape)])
    set_params(layer)
    check_layer_gradient(layer, bottom, top, setup=False)


def test_deconv_float32_close_to_reference(kernel_path):
    x = RNG.standard_normal((2, 4, 5, 5)).astype(numpy.float32)
    body = "num_output: 4 kernel_size: 3 stride: 2 pad: 1 group: 2"
    layer, bottom, top = build(deconv_text(body), [x], dtype=numpy.float32)
    set_params(layer)
    (got,) = forward(layer, bottom, top)
    assert got.dtype == numpy.float32 and got.shape == (2, 4, 9, 9)
    expected = naive_deconv(x.astype(float), layer.blobs[0].data.astype(float),
                            layer.blobs[1].data.astype(float), (2, 2), (1, 1), (1, 1), 2)
    numpy.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_deconv_param_diffs_accumulate():
    assert_param_diffs_accumulate(deconv_text("num_output: 2 kernel_size: 2 stride: 2"),
                                  [RNG.standard_normal((2, 3, 3, 3))], RNG)


def test_deconv_output_size_error_names_the_layer():
    with pytest.raises(LayerError) as info:
        build(deconv_text("num_output: 2 kernel_size: 1 pad: 2", name="up_bad"),
              [numpy.zeros((1, 1, 2, 2))])
    assert "up_bad" in str(info.value) and "not positive" in str(info.value)


@pytest.mark.parametrize("shape,body,stride,pad,dilation,group", CASES)
def test_forward_matches_direct_loops_on_both_paths(shape, body, stride, pad, dilation, group,
                                                    kernel_path):
    x = RNG.standard_normal(shape).astype(numpy.float32)
    layer, bottom, top = build(conv_text(body), [x], dtype=numpy.float32)
    set_params(layer)
    b = layer.blobs[1].data if len(layer.blobs) > 1 else None
    expected = naive.conv_forward(x.astype(float), layer.blobs[0].data.astype(float),
                                  None if b is None else b.astype(float), stride, pad, dilation,
                                  group)
    (got,) = forward(layer, bottom, top)
    numpy.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("shape,body", [(c[0], c[1]) for c in DECONV_CASES])
def test_deconv_cupy_matches_numpy(shape, body):
    gpu_matches_cpu(deconv_text(body), [RNG.standard_normal(shape).astype(numpy.float32)])


@pytest.mark.parametrize("shape,body,stride,pad,dilation,group", CASES[:5])
def test_per_image_gemm_layout(shape, body, stride, pad, dilation, group, monkeypatch):
    """Forced per-image GEMMs (the layout large outputs take) against direct loops and gradients."""
    monkeypatch.setattr(conv_module, "PER_IMAGE_MIN_POSITIONS", 1)
    x = RNG.standard_normal(shape)
    layer, bottom, top = build(conv_text(body), [x])
    set_params(layer)
    b = layer.blobs[1].data if len(layer.blobs) > 1 else None
    expected = naive.conv_forward(x, layer.blobs[0].data, b, stride, pad, dilation, group)
    (got,) = forward(layer, bottom, top)
    numpy.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)
    check_layer_gradient(layer, bottom, top, setup=False)
    d_layer, d_bottom, d_top = build(deconv_text(body), [x])
    set_params(d_layer)
    b = d_layer.blobs[1].data if len(d_layer.blobs) > 1 else None
    (got,) = forward(d_layer, d_bottom, d_top)
    numpy.testing.assert_allclose(got, naive_deconv(x, d_layer.blobs[0].data, b, stride, pad,
                                                    dilation, group), rtol=1e-12, atol=1e-12)
    check_layer_gradient(d_layer, d_bottom, d_top, setup=False)


@pytest.mark.parametrize("shape", [(4, 3, 5, 6), (2, 7, 1, 1), (3, 2, 9), (0, 3, 2, 2)])
def test_channel_sum_equals_a_loop(shape):
    """The bias gradient (one product with a column of ones, then the batch sum) equals the sum
    of every element of each channel, done element by element in float64."""
    dy = numpy.random.default_rng(1).standard_normal(shape).astype(numpy.float32)
    ref = numpy.zeros(shape[1])
    for idx in numpy.ndindex(*shape):
        ref[idx[1]] += float(dy[idx])
    got = conv_module.channel_sum(dy)
    assert got.shape == (shape[1],) and got.dtype == numpy.float32
    numpy.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


# --- the columns forward made, reused by the weight gradient in the trainer's step ------------
_CONV_NET = """
name: "c"
layer { name: "in" type: "Input" top: "x" input_param { shape { dim: 6 dim: 3 dim: 9 dim: 9 } } }
layer { name: "c1" type: "Convolution" bottom: "x" top: "y"
  convolution_param { num_output: 4 kernel_size: 3 weight_filler { type: "gaussian" std: 0.3 }
                      bias_filler { type: "constant" value: 0.1 } } }
layer { name: "c2" type: "Convolution" bottom: "y" top: "z"
  convolution_param { num_output: 5 kernel_size: 3 stride: 2
                      weight_filler { type: "gaussian" std: 0.3 } } }
%s
layer { name: "loss" type: "EuclideanLoss" bottom: "z" bottom: "t" }
layer { name: "tin" type: "Input" top: "t" input_param { shape { dim: 6 dim: 5 dim: 3 dim: 3 } } }
"""


def _conv_net(extra="", before_c2=""):
    from caffe8.engine.net import Net
    from caffe8.engine.prototxt import parse_text
    text = (_CONV_NET % extra).replace('layer { name: "c2"', before_c2 + 'layer { name: "c2"')
    # the target input must come first in the file: move it before the loss
    head, tin = text.split('layer { name: "tin"')
    text = head.replace('layer { name: "loss"', 'layer { name: "tin"' + tin.strip()[:-1].rstrip()
                        + '\n}\nlayer { name: "loss"', 1)
    net = Net(parse_text(text, "c.prototxt"))
    rng = numpy.random.default_rng(5)
    net.blobs["x"].data[...] = rng.standard_normal(net.blobs["x"].shape)
    net.blobs["t"].data[...] = rng.standard_normal(net.blobs["t"].shape)
    return net


def _weight_diffs(net, keep, change_y=False):
    net.clear_param_diffs()
    net.keep_forward_work(keep)
    net.forward_loss()
    if change_y:  # a user writing a blob between pycaffe's forward() and backward()
        net.blobs["y"].data[...] *= 2
    net.backward()
    net.keep_forward_work(False)
    return [p.diff.copy() for p in net.learnable_params]


def test_weight_gradient_reusing_forward_columns_is_bit_identical():
    net = _conv_net()
    assert net.layers[2]._geometry_for(net.blobs["y"].shape).positions < \
        conv_module.PER_IMAGE_MIN_POSITIONS   # c2 takes the batch path whose columns are kept
    kept, redone = _weight_diffs(net, True), _weight_diffs(net, False)
    for a, b in zip(kept, redone):
        assert numpy.array_equal(a, b)


def test_without_the_trainers_promise_a_changed_bottom_is_read_again():
    """As Caffe, which redoes im2col in backward: a bottom written between forward and backward
    counts (its columns are made again); the kept columns would give the old gradient."""
    net = _conv_net()
    changed = _weight_diffs(net, False, change_y=True)
    plain = _weight_diffs(net, False)
    c2_weight = 2  # c1 weight, c1 bias, c2 weight
    assert not numpy.allclose(changed[c2_weight], plain[c2_weight])
    net.blobs["y"].data[...] *= 1  # the same check with a fresh forward: equal again
    assert all(numpy.array_equal(a, b) for a, b in zip(_weight_diffs(net, False), plain))


def test_in_place_layer_between_forward_and_its_reader_keeps_the_columns_right():
    """c1's top rewritten in place (ReLU) before c2 reads it, c2's top after: bit-identical."""
    net = _conv_net('layer { name: "r2" type: "ReLU" bottom: "z" top: "z" }',
                    before_c2='layer { name: "r1" type: "ReLU" bottom: "y" top: "y" }\n')
    assert [layer.name for layer in net.layers][:5] == ["in", "c1", "r1", "c2", "r2"]
    kept, redone = _weight_diffs(net, True), _weight_diffs(net, False)
    assert all(numpy.array_equal(a, b) for a, b in zip(kept, redone))


def test_a_counted_write_of_the_bottom_makes_the_columns_again():
    """The trainer's promise is not enough on its own: a write the Net counts (a layer's
    forward into the blob, Blob.touch) between forward and backward makes the layer read its
    bottom again, as Caffe's backward does."""
    net = _conv_net()
    c2, y = net.layers[2], net.blobs["y"]
    assert c2._geometry_for(y.shape).positions < conv_module.PER_IMAGE_MIN_POSITIONS
    net.clear_param_diffs()
    net.keep_forward_work(True)
    net.forward_loss()
    y.data[...] *= 2
    y.touch()
    net.backward()
    net.keep_forward_work(False)
    kept = [p.diff.copy() for p in net.learnable_params]
    net.clear_param_diffs()
    net.backward()             # the same top diffs, the columns made from y as it is now
    assert all(numpy.array_equal(a, b) for a, b in zip(kept, [p.diff for p in net.learnable_params]))


def test_columns_are_not_kept_across_a_forward_of_the_per_image_layout():
    """The stale-columns bug: batch columns made by one backward must not serve the next
    forward + backward when that forward took the per-image layout (it never made them)."""
    geo = conv_module.ConvGeometry((2, 3, 24, 24), 4, 1, (1, 1), (0, 0), (1, 1), (1, 1))
    rng = numpy.random.default_rng(0)
    w = rng.standard_normal((4, 3, 1, 1)).astype(numpy.float32)
    x = numpy.empty((2, 3, 24, 24), numpy.float32)
    y = numpy.empty((2, 4, 24, 24), numpy.float32)
    dy = rng.standard_normal(y.shape).astype(numpy.float32)
    for _ in range(2):
        x[...] = rng.standard_normal(x.shape)
        token = geo.forward(x, w, y)
        kept, plain = numpy.zeros_like(w), numpy.zeros_like(w)
        geo.weight_gradient(x, dy, kept, kept=token)
        geo.weight_gradient(x, dy, plain)
        assert numpy.array_equal(kept, plain)


@pytest.mark.parametrize("kind", ["Convolution", "Deconvolution"])
def test_depthwise_direct_kernels_agree_with_im2col_over_steps(kind, monkeypatch):
    """Depthwise layers (group = channels = outputs) run the direct C kernels (forward,
    backward-data, weight gradient); over steps of changing data, float32 as in training, their
    outputs and gradients equal the plain path's (NumPy im2col + GEMM) to float32 rounding, and
    the weight gradient accumulates across steps as the plain path's does."""
    from caffe8.layers import native
    ran = []
    direct = native.depthwise_forward
    monkeypatch.setattr(native, "depthwise_forward", lambda *a: ran.append(1) or direct(*a))
    text = (f'name: "dw" type: "{kind}" convolution_param {{ num_output: 6 kernel_size: 3 '
            'stride: 2 pad: 1 group: 6 weight_filler { type: "gaussian" std: 0.3 } '
            'bias_filler { type: "gaussian" std: 0.1 } }')
    rng = numpy.random.default_rng(8)
    xs = rng.standard_normal((3, 3, 6, 13, 11)).astype(numpy.float32)   # a batch a step
    runs = []
    for plain in (False, True):
        saved = native.use_native(not plain)
        try:
            layer, bottom, top = build(text, [xs[0]], dtype=numpy.float32)
            set_params(layer)
            out = []
            for step, x in enumerate(xs):
                bottom[0].data[...] = x
                (y,) = forward(layer, bottom, top)
                top[0].diff[...] = numpy.random.default_rng(step).standard_normal(y.shape)
                layer.backward(top, [True], bottom)
                out.append([y.copy(), bottom[0].diff.copy(), layer.blobs[0].diff.copy(),
                            layer.blobs[1].diff.copy()])
            runs.append(out)
        finally:
            native.use_native(saved)
    assert ran                                              # the direct path ran
    for fast, ref in zip(*runs):
        for a, b in zip(fast, ref):
            numpy.testing.assert_allclose(a, b, rtol=0, atol=2e-6 * max(1, numpy.abs(b).max()))


@pytest.mark.parametrize("group", [1, 2])
def test_pointwise_weight_gradient_per_image_agrees_with_batch_columns(group, monkeypatch):
    """A 1x1 convolution of at least PER_IMAGE_MIN_POSITIONS outputs accumulates its weight
    gradient one image at a time (x is its own columns, as Caffe's loop); over steps whose
    gradients accumulate into the same diff, float32, it equals the batch-columns product to
    rounding."""
    text = (f'name: "pw" type: "Convolution" convolution_param {{ num_output: 6 kernel_size: 1 '
            f'group: {group} bias_term: false }}')
    rng = numpy.random.default_rng(5)
    xs = rng.standard_normal((3, 2, 4, 24, 24)).astype(numpy.float32)     # 576 positions
    dys = rng.standard_normal((3, 2, 6, 24, 24)).astype(numpy.float32)
    diffs = []
    for threshold in (conv_module.PER_IMAGE_MIN_POSITIONS, 10 ** 9):     # per image, batch
        monkeypatch.setattr(conv_module, "PER_IMAGE_MIN_POSITIONS", threshold)
        layer, bottom, top = build(text, [xs[0]], dtype=numpy.float32)
        set_params(layer)
        out = []
        for x, dy in zip(xs, dys):
            bottom[0].data[...] = x
            forward(layer, bottom, top)
            top[0].diff[...] = dy
            layer.backward(top, [False], bottom)
            out.append(layer.blobs[0].diff.copy())
        diffs.append(out)
    for fast, ref in zip(*diffs):
        assert numpy.abs(ref).max() > 1
        numpy.testing.assert_allclose(fast, ref, rtol=0, atol=3e-6 * numpy.abs(ref).max())


def test_depthwise_bits_do_not_depend_on_the_thread_count():
    """The depthwise kernels split their planes (and the weight gradient its channels) over the
    host GEMM's worker count, each item whole on one thread: 1, 2 and 3 workers, same bits."""
    from caffe8.engine import blas
    rng = numpy.random.default_rng(6)
    x = rng.standard_normal((3, 5, 17, 15)).astype(numpy.float32)
    text = ('name: "dw" type: "Convolution" convolution_param { num_output: 5 kernel_size: 3 '
            'pad: 1 group: 5 }')
    results = []
    saved = blas.threads()
    try:
        for workers in (1, 2, 3):
            blas.set_num_threads(workers)
            layer, bottom, top = build(text, [x], dtype=numpy.float32)
            set_params(layer)
            (y,) = forward(layer, bottom, top)
            top[0].diff[...] = y * 0.5 - 1
            layer.backward(top, [True], bottom)
            results.append(b"".join(a.tobytes() for a in (y, bottom[0].diff,
                                                         layer.blobs[0].diff)))
    finally:
        blas.set_num_threads(saved)
    assert results[0] == results[1] == results[2]
