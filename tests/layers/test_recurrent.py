"""RNN and LSTM: forward against PyTorch's nn.RNN / nn.LSTM with the weights copied in, against a
naive per-stream, per-step loop that implements cont resets, static input and exposed state;
state carried across forwards; float64 gradient checks of every bottom, exposed state and
parameter; parameter diffs accumulate; Caffe's parameter order and shapes; errors."""
import math

import numpy
import pytest

from caffe8.engine.blob import Blob
from caffe8.engine.errors import LayerError
from caffe8.engine.gradcheck import check_layer_gradient
from layer_util import blob, built_on, make, tops

FILLER = 'type: "uniform" min: -0.5 max: 0.5'


def text(kind, hidden=3, expose=False, static=False):
    bottoms = 'bottom: "x" bottom: "cont" ' + ('bottom: "xs" ' if static else "")
    top = 'top: "o" '
    if expose:
        bottoms += 'bottom: "h0" ' + ('bottom: "c0" ' if kind == "LSTM" else "")
        top += 'top: "hT" ' + ('top: "cT" ' if kind == "LSTM" else "")
    return (f'name: "rec" type: "{kind}" {bottoms} {top} recurrent_param {{ num_output: {hidden} '
            f'weight_filler {{ {FILLER} }} bias_filler {{ {FILLER} }} '
            f'expose_hidden: {str(expose).lower()} }}')


def sig(a):
    return 1.0 / (1.0 + math.exp(-a))


def naive(kind, params, x, cont, xs=None, h0=None, c0=None):
    """Per stream, per step, per unit loops written from the equations. Returns (out, hT, cT)."""
    t_len, n_len = x.shape[:2]
    x = x.reshape(t_len, n_len, -1)
    params = list(params)
    w_x, b = params[0], params[1]
    w_s = params[2] if xs is not None else None
    w_h = params[3 if xs is not None else 2]
    hd = w_h.shape[1]
    out = numpy.zeros((t_len, n_len, hd))
    h_fin, c_fin = numpy.zeros((n_len, hd)), numpy.zeros((n_len, hd))
    for n in range(n_len):
        h = numpy.zeros(hd) if h0 is None else h0[0, n].copy()
        c = numpy.zeros(hd) if c0 is None else c0[0, n].copy()
        for t in range(t_len):
            keep = cont[t, n]
            hc = keep * h
            rows = w_x.shape[0]
            a = [sum(w_x[r, k] * x[t, n, k] for k in range(x.shape[2])) + b[r]
                 + sum(w_h[r, k] * hc[k] for k in range(hd)) for r in range(rows)]
            if w_s is not None:
                s = xs.reshape(n_len, -1)[n]
                a = [a[r] + sum(w_s[r, k] * s[k] for k in range(s.size)) for r in range(rows)]
            if kind == "RNN":
                h = numpy.array([math.tanh(v) for v in a])
                w_o, b_o = params[-2], params[-1]
                out[t, n] = [math.tanh(sum(w_o[r, k] * h[k] for k in range(hd)) + b_o[r])
                             for r in range(hd)]
            else:
                new_c = numpy.zeros(hd)
                new_h = numpy.zeros(hd)
                for u in range(hd):
                    i_g, f_g = sig(a[u]), (0.0 if keep == 0 else keep * sig(a[hd + u]))
                    o_g, g_g = sig(a[2 * hd + u]), math.tanh(a[3 * hd + u])
                    new_c[u] = f_g * c[u] + i_g * g_g
                    new_h[u] = o_g * math.tanh(new_c[u])
                c, h = new_c, new_h
                out[t, n] = h
        h_fin[n], c_fin[n] = h, c
    return out, h_fin[None], c_fin[None]


def setup(layer, arrays, n_top):
    bottom = [blob(a) for a in arrays]
    top = tops(n_top)
    layer.setup(bottom, top)
    return bottom, top


def forward(layer, bottom, top):
    layer.reshape(bottom, top)
    layer.forward(bottom, top)
    return [t.data.copy() for t in top]


def case(seed, t_len=5, n=3, d=4, hidden=3, static=False, expose=False):
    rng = numpy.random.default_rng(seed)
    x = rng.standard_normal((t_len, n, d))
    cont = numpy.ones((t_len, n))
    cont[0] = 0
    cont[2, 1] = 0   # a mid-sequence reset in stream 1
    cont[3, 0] = 0
    arrays = [x, cont]
    if static:
        arrays.append(rng.standard_normal((n, 2)))
    if expose:
        arrays.append(rng.standard_normal((1, n, hidden)) * 0.5)
    return arrays, rng


@pytest.mark.parametrize("kind", ["RNN", "LSTM"])
def test_parameter_order_and_shapes_are_caffes(kind):
    arrays, _ = case(0, d=4, static=True)
    layer = make(text(kind, hidden=3, static=True))
    setup(layer, arrays, 1)
    shapes = [b.shape for b in layer.blobs]
    if kind == "LSTM":
        assert shapes == [(12, 4), (12,), (12, 2), (12, 3)]
    else:
        assert shapes == [(3, 4), (3,), (3, 2), (3, 3), (3, 3), (3,)]


@pytest.mark.parametrize("kind", ["RNN", "LSTM"])
@pytest.mark.parametrize("static", [False, True])
def test_forward_matches_naive_loop_with_resets(kind, static):
    arrays, _ = case(1, static=static)
    layer = make(text(kind, static=static))
    bottom, top = setup(layer, arrays, 1)
    (out,) = forward(layer, bottom, top)
    ref, _, _ = naive(kind, [b.data for b in layer.blobs], arrays[0], arrays[1],
                      xs=arrays[2] if static else None)
    numpy.testing.assert_allclose(out, ref, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kind", ["RNN", "LSTM"])
def test_exposed_state_in_and_out(kind):
    arrays, rng = case(2, expose=True)
    if kind == "LSTM":
        arrays.append(rng.standard_normal((1, 3, 3)) * 0.5)
    arrays[1][0] = 1  # continue from h0 (and c0)
    layer = make(text(kind, expose=True))
    n_top = 3 if kind == "LSTM" else 2
    bottom, top = setup(layer, arrays, n_top)
    outs = forward(layer, bottom, top)
    ref, h_t, c_t = naive(kind, [b.data for b in layer.blobs], arrays[0], arrays[1],
                          h0=arrays[2], c0=arrays[3] if kind == "LSTM" else None)
    numpy.testing.assert_allclose(outs[0], ref, rtol=1e-12, atol=1e-12)
    numpy.testing.assert_allclose(outs[1], h_t, rtol=1e-12, atol=1e-12)
    if kind == "LSTM":
        numpy.testing.assert_allclose(outs[2], c_t, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kind", ["RNN", "LSTM"])
def test_state_carries_to_the_next_forward(kind):
    arrays, rng = case(3)
    layer = make(text(kind))
    bottom, top = setup(layer, arrays, 1)
    forward(layer, bottom, top)
    params = [b.data for b in layer.blobs]
    _, h_t, c_t = naive(kind, params, arrays[0], arrays[1])
    x2 = rng.standard_normal(arrays[0].shape)
    cont2 = numpy.ones_like(arrays[1])
    cont2[0, 2] = 0  # stream 2 restarts, streams 0 and 1 continue
    bottom[0].data[...] = x2
    bottom[1].data[...] = cont2
    (out,) = forward(layer, bottom, top)
    ref, _, _ = naive(kind, params, x2, cont2, h0=h_t, c0=c_t)
    numpy.testing.assert_allclose(out, ref, rtol=1e-12, atol=1e-12)


def test_lstm_matches_torch():
    torch = pytest.importorskip("torch")
    arrays, _ = case(4)
    x, cont = arrays
    cont[:] = 1
    cont[0] = 0
    layer = make(text("LSTM", hidden=3))
    bottom, top = setup(layer, arrays, 1)
    (out,) = forward(layer, bottom, top)
    w_xc, b_c, w_hc = (b.data for b in layer.blobs)
    # Caffe's gate blocks are i, f, o, g; torch's are i, f, g, o
    perm = numpy.concatenate([numpy.arange(0, 6), numpy.arange(9, 12), numpy.arange(6, 9)])
    ref = torch.nn.LSTM(4, 3).double()
    with torch.no_grad():
        ref.weight_ih_l0.copy_(torch.as_tensor(w_xc[perm]))
        ref.weight_hh_l0.copy_(torch.as_tensor(w_hc[perm]))
        ref.bias_ih_l0.copy_(torch.as_tensor(b_c[perm]))
        ref.bias_hh_l0.zero_()
        expected, _ = ref(torch.as_tensor(x))
    numpy.testing.assert_allclose(out, expected.numpy(), rtol=1e-12, atol=1e-12)


def test_rnn_matches_torch():
    torch = pytest.importorskip("torch")
    arrays, _ = case(5)
    x, cont = arrays
    cont[:] = 1
    cont[0] = 0
    layer = make(text("RNN", hidden=3))
    bottom, top = setup(layer, arrays, 1)
    (out,) = forward(layer, bottom, top)
    w_xh, b_h, w_hh, w_ho, b_o = (b.data for b in layer.blobs)
    ref = torch.nn.RNN(4, 3, nonlinearity="tanh").double()
    with torch.no_grad():
        ref.weight_ih_l0.copy_(torch.as_tensor(w_xh))
        ref.weight_hh_l0.copy_(torch.as_tensor(w_hh))
        ref.bias_ih_l0.copy_(torch.as_tensor(b_h))
        ref.bias_hh_l0.zero_()
        hidden, _ = ref(torch.as_tensor(x))
        expected = torch.tanh(hidden @ torch.as_tensor(w_ho).T + torch.as_tensor(b_o))
    numpy.testing.assert_allclose(out, expected.numpy(), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kind", ["RNN", "LSTM"])
@pytest.mark.parametrize("static,expose", [(False, False), (True, True)])
def test_gradients(kind, static, expose):
    arrays, rng = case(6, t_len=4, n=2, d=3, hidden=2, static=static, expose=expose)
    if expose and kind == "LSTM":
        arrays.append(rng.standard_normal((1, 2, 2)) * 0.5)
    if expose:
        arrays[1][0] = 1  # let the exposed initial state matter
    layer = make(text(kind, hidden=2, static=static, expose=expose))
    bottom = [blob(a) for a in arrays]
    n_top = 1 + (2 if kind == "LSTM" else 1) * int(expose)
    checked = [i for i in range(len(bottom)) if i != 1]
    check_layer_gradient(layer, bottom, tops(n_top), check_bottom=checked)


@pytest.mark.parametrize("kind", ["RNN", "LSTM"])
def test_param_diffs_accumulate_and_bottom_diff_is_overwritten(kind):
    arrays, rng = case(7, static=True)
    layer = make(text(kind, static=True))
    bottom, top = setup(layer, arrays, 1)
    forward(layer, bottom, top)
    top[0].diff[...] = rng.standard_normal(top[0].shape)
    prop = [True, False, True]
    layer.backward(top, prop, bottom)
    once = [p.diff.copy() for p in layer.blobs]
    dx = [bottom[0].diff.copy(), bottom[2].diff.copy()]
    layer.backward(top, prop, bottom)
    for p, g in zip(layer.blobs, once):
        assert numpy.abs(g).sum() > 0
        numpy.testing.assert_allclose(p.diff, 2 * g, rtol=1e-12)
    numpy.testing.assert_allclose(bottom[0].diff, dx[0], rtol=1e-12)
    numpy.testing.assert_allclose(bottom[2].diff, dx[1], rtol=1e-12)


@pytest.mark.parametrize("kind", ["RNN", "LSTM"])
def test_errors(kind):
    x = numpy.zeros((3, 2, 4))
    with pytest.raises(LayerError, match="cont"):
        setup(make(text(kind)), [x, numpy.zeros((3, 3))], 1)
    with pytest.raises(LayerError, match="bottoms"):
        setup(make(text(kind)), [x], 1)
    with pytest.raises(LayerError, match="top"):
        setup(make(text(kind, expose=True)), [x, numpy.zeros((3, 2)), numpy.zeros((1, 2, 3)),
                                              numpy.zeros((1, 2, 3))][:4 if kind == "LSTM" else 3], 1)
    with pytest.raises(LayerError, match="num_output"):
        setup(make(text(kind, hidden=0)), [x, numpy.zeros((3, 2))], 1)
    layer = make(text(kind))
    bottom, top = setup(layer, [x, numpy.zeros((3, 2))], 1)
    forward(layer, bottom, top)
    assert not layer.allow_force_backward(1)
    with pytest.raises(LayerError, match="sequence indicators"):
        layer.backward(top, [True, True], bottom)
    bottom[0] = Blob((3, 2, 5), numpy.float64)
    with pytest.raises(LayerError, match="input width"):
        layer.reshape(bottom, top)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["RNN", "LSTM"])
def test_cupy_matches_numpy(kind):
    from caffe8.engine import backend
    arrays, rng = case(8, static=True, expose=True)
    if kind == "LSTM":
        arrays.append(rng.standard_normal((1, 3, 3)) * 0.5)
    n_top = 3 if kind == "LSTM" else 2
    runs = []
    for xp in (numpy, backend.cupy):
        with built_on(xp):
            layer = make(text(kind, static=True, expose=True), dtype=numpy.float64)
            bottom = [blob(a, xp=xp) for a in arrays]
            top = tops(n_top, xp=xp)
            layer.setup(bottom, top)
        for j, p in enumerate(layer.blobs):
            p.data[...] = backend.to_device(numpy.random.default_rng(j).uniform(-0.5, 0.5, p.shape),
                                            like=p.data)
        layer.forward(bottom, top)
        for k, t in enumerate(top):
            t.diff[...] = backend.to_device(numpy.random.default_rng(10 + k).standard_normal(t.shape),
                                            like=t.diff)
        layer.backward(top, [i != 1 for i in range(len(bottom))], bottom)
        runs.append([backend.to_numpy(a) for a in [t.data for t in top] +
                     [b.diff for i, b in enumerate(bottom) if i != 1] +
                     [p.diff for p in layer.blobs]])
    for cpu, gpu in zip(*runs):
        numpy.testing.assert_allclose(gpu, cpu, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("kind", ["RNN", "LSTM"])
def test_caffe_hdf5_model_blobs_load_into_the_same_positions(kind, tmp_path):
    """A model file in Caffe's HDF5 layout (/data/<layer>/<i>, Caffe's shapes for H = 3, D = 4,
    static width 2) loads blob i into parameter i and drives the equations as Caffe's order says."""
    import h5py
    from caffe8.engine.net import Net
    from caffe8.engine.prototxt import parse_text
    rng = numpy.random.default_rng(9)
    rows = 12 if kind == "LSTM" else 3
    shapes = [(rows, 4), (rows,), (rows, 2), (rows, 3)] + ([(3, 3), (3,)] if kind == "RNN" else [])
    stored = [rng.uniform(-0.5, 0.5, s) for s in shapes]
    model = tmp_path / "rec.caffemodel.h5"
    with h5py.File(model, "w") as f:
        for i, a in enumerate(stored):
            f.create_dataset(f"data/rec/{i}", data=a.astype(numpy.float32))
    net = Net(parse_text(f"""
        layer {{ name: "in" type: "Input" top: "x" top: "cont" top: "xs"
          input_param {{ shape {{ dim: 5 dim: 3 dim: 4 }} shape {{ dim: 5 dim: 3 }}
                         shape {{ dim: 3 dim: 2 }} }} }}
        layer {{ {text(kind, static=True)} }}
    """, "rec.prototxt"), dtype=numpy.float64)
    net.copy_trained_layers_from(str(model))
    arrays, _ = case(10, static=True)
    for name, a in zip(("x", "cont", "xs"), arrays):
        net.blobs[name].data[...] = a
    net.forward()
    expected, _, _ = naive(kind, [a.astype(numpy.float32).astype(float) for a in stored],
                           arrays[0], arrays[1], xs=arrays[2])
    numpy.testing.assert_allclose(net.blobs["o"].data, expected, rtol=1e-12, atol=1e-12)
