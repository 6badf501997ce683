"""Im2col (Caffe's im2col_layer): shapes as BVLC's test_im2col_layer.cpp expects them, forward
against a naive loop over every output element (2-D, rectangular and dilated, 3-D, a channel
axis after two item axes), backward against the naive adjoint and by finite differences."""
import itertools

import numpy
import pytest

from caffe8.engine.errors import LayerError
from caffe8.engine.gradcheck import check_layer_gradient
from caffe8.engine.net import Net
from caffe8.engine.prototxt import parse_text
from layer_util import blob, make, run, run_backward, tops


def im2col_text(conv):
    return f'name: "i2c" type: "Im2col" bottom: "x" top: "y" convolution_param {{ {conv} }}'


def naive(x, kernel, stride, pad, dilation, axis=1):
    """Caffe's im2col by the definition, one output element at a time, and its adjoint."""
    lead, c, spatial = x.shape[:axis], x.shape[axis], x.shape[axis + 1:]
    items = x.reshape((-1, c) + spatial)
    out = [(s + 2 * p - (d * (k - 1) + 1)) // st + 1
           for s, k, st, p, d in zip(spatial, kernel, stride, pad, dilation)]
    y = numpy.zeros((len(items), c * int(numpy.prod(kernel))) + tuple(out))
    where = {}  # top index -> bottom index it copies (for the adjoint)
    for n, ch in itertools.product(range(len(items)), range(c)):
        for k, offsets in enumerate(itertools.product(*(range(k) for k in kernel))):
            for pos in itertools.product(*(range(o) for o in out)):
                src = tuple(q * st - p + o * d for q, st, p, o, d in
                            zip(pos, stride, pad, offsets, dilation))
                if all(0 <= s < lim for s, lim in zip(src, spatial)):
                    top = (n, ch * int(numpy.prod(kernel)) + k) + pos
                    y[top] = items[(n, ch) + src]
                    where[top] = (n, ch) + src
    return y.reshape(lead + y.shape[1:]), where


def naive_backward(dy, x_shape, where, axis=1):
    dx = numpy.zeros((int(numpy.prod(x_shape[:axis])),) + tuple(x_shape[axis:]))
    flat = dy.reshape((dx.shape[0],) + dy.shape[axis:])
    for top, bottom in where.items():
        dx[bottom] += flat[top]
    return dx.reshape(x_shape)


def test_setup_shapes_are_bvlcs():
    """test_im2col_layer.cpp TestSetup: 2x3x10x11, kernel 3, stride 2, dilation 3 → 2x27x2x3;
    TestRect: kernel_h 5, kernel_w 3, stride 2 on 2x3x6x5 → 2x45x1x2."""
    x = numpy.zeros((2, 3, 10, 11))
    _, top = run(make(im2col_text("kernel_size: 3 stride: 2 dilation: 3")), [x])
    assert top[0].data.shape == (2, 27, 2, 3)
    _, top = run(make(im2col_text("kernel_h: 5 kernel_w: 3 stride: 2")), [numpy.zeros((2, 3, 6, 5))])
    assert top[0].data.shape == (2, 45, 1, 2)


GEOMETRIES = [
    ((2, 3, 6, 5), "kernel_size: 3 stride: 2", (3, 3), (2, 2), (0, 0), (1, 1), 1),
    ((2, 3, 7, 6), "kernel_h: 2 kernel_w: 3 stride: 1 stride: 2 pad_h: 1 pad_w: 2",
     (2, 3), (1, 2), (1, 2), (1, 1), 1),
    ((2, 2, 10, 9), "kernel_size: 3 stride: 2 dilation: 3 pad: 1", (3, 3), (2, 2), (1, 1),
     (3, 3), 1),
    ((1, 4, 5, 5), "kernel_size: 1", (1, 1), (1, 1), (0, 0), (1, 1), 1),
    ((2, 2, 4, 5, 4), "kernel_size: 2 kernel_size: 3 kernel_size: 2 stride: 2 pad: 1",
     (2, 3, 2), (2, 2, 2), (1, 1, 1), (1, 1, 1), 1),
    ((2, 3, 2, 5, 6), "axis: 2 kernel_size: 3 pad: 1", (3, 3), (1, 1), (1, 1), (1, 1), 2),
]


@pytest.mark.parametrize("shape,conv,kernel,stride,pad,dilation,axis", GEOMETRIES)
def test_forward_and_backward_match_the_naive_loops(shape, conv, kernel, stride, pad, dilation,
                                                    axis):
    rng = numpy.random.default_rng(0)
    x = rng.standard_normal(shape)
    layer = make(im2col_text(conv))
    bottom, top = run(layer, [x])
    want, where = naive(x, kernel, stride, pad, dilation, axis)
    assert top[0].data.shape == want.shape
    numpy.testing.assert_array_equal(top[0].data, want)
    dy = rng.standard_normal(want.shape)
    bottom[0].diff[...] = 7.0  # Caffe's col2im overwrites the bottom's diff
    (dx,) = run_backward(layer, bottom, top, [dy])
    numpy.testing.assert_allclose(dx, naive_backward(dy, shape, where, axis), rtol=1e-12,
                                  atol=1e-12)


@pytest.mark.parametrize("conv,shape", [("kernel_size: 3 stride: 2", (2, 3, 6, 5)),
                                        ("kernel_size: 3 stride: 2 dilation: 3", (2, 3, 10, 9)),
                                        ("kernel_h: 5 kernel_w: 3 stride: 2 pad: 1", (2, 2, 6, 5))])
def test_gradcheck(conv, shape):
    x = numpy.random.default_rng(3).standard_normal(shape)
    check_layer_gradient(make(im2col_text(conv)), [blob(x)], tops(1))


def test_in_a_net_and_the_errors_name_the_layer():
    net = Net(parse_text('layer { name: "in" type: "Input" top: "x" '
                         'input_param { shape { dim: 1 dim: 2 dim: 4 dim: 4 } } }\n'
                         'layer { ' + im2col_text("kernel_size: 2 stride: 2") + ' }',
                         "i2c.prototxt"))
    assert net.blobs["y"].shape == (1, 8, 2, 2)
    with pytest.raises(LayerError, match=r"layer 'i2c'.*kernel_size.*required"):
        run(make(im2col_text("stride: 2")), [numpy.zeros((1, 1, 4, 4))])
    with pytest.raises(LayerError, match=r"layer 'i2c'.*does not fit"):
        run(make(im2col_text("kernel_size: 5")), [numpy.zeros((1, 1, 4, 4))])
    with pytest.raises(LayerError, match=r"layer 'i2c'.*spatial axis"):
        run(make(im2col_text("kernel_size: 1")), [numpy.zeros((2, 3))])
