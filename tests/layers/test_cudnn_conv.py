"""Convolution on cuDNN: engine selection on the CPU, the binding's calls against a host
emulation of the C API, and cuDNN against the CAFFE engine (im2col + GEMM) on a GPU."""
import itertools

import numpy
import pytest

from caffe8.engine import backend
from caffe8.layers import cudnn, cudnn_conv
from tests.layers import naive
from tests.layers.fake_cudnn import fake_cudnn  # noqa: F401  (fixture)
from tests.layers.spatial_helpers import build, forward, set_params


def conv_text(body, engine=None, name="c"):
    extra = f" engine: {engine}" if engine else ""
    return f'name: "{name}" type: "Convolution" convolution_param {{ {body}{extra} }}'


# --- engine selection -------------------------------------------------------------------------
@pytest.mark.parametrize("requested", ["DEFAULT", "CAFFE", "CUDNN"])
def test_cpu_arrays_always_get_the_caffe_engine(requested):
    engine, note = cudnn_conv.choose_engine(requested, False, 2, numpy.float32)
    assert engine == "CAFFE"
    assert (note == cudnn_conv.NOTE_CPU) if requested == "CUDNN" else note is None


def test_device_arrays_get_cudnn_unless_it_cannot_run():
    assert cudnn_conv.choose_engine("DEFAULT", True, 2, numpy.float32) == ("CUDNN", None)
    assert cudnn_conv.choose_engine("CUDNN", True, 3, numpy.float64) == ("CUDNN", None)
    assert cudnn_conv.choose_engine("CAFFE", True, 2, numpy.float32) == ("CAFFE", None)
    engine, note = cudnn_conv.choose_engine("DEFAULT", True, 2, numpy.float32, lib_error="no lib")
    assert engine == "CAFFE" and "no lib" in note and "CAFFE engine" in note
    assert cudnn_conv.choose_engine("CUDNN", True, 4, numpy.float32)[0] == "CAFFE"
    assert "4-axis" in cudnn_conv.choose_engine("CUDNN", True, 4, numpy.float32)[1]
    assert cudnn_conv.choose_engine("DEFAULT", True, 4, numpy.float32) == ("CAFFE", None)
    assert cudnn_conv.choose_engine("CUDNN", True, 2, numpy.int32)[0] == "CAFFE"


def test_cudnn_requested_on_the_cpu_runs_caffe_and_notes_it_once(monkeypatch):
    notes = []
    monkeypatch.setattr(backend, "_notes_given", set())
    monkeypatch.setattr(backend, "_note_sink", notes.append)
    monkeypatch.setattr(cudnn, "library", lambda: pytest.fail("no library load for CPU arrays"))
    rng = numpy.random.default_rng(3)
    x = rng.standard_normal((2, 4, 7, 6))
    body = "num_output: 6 kernel_size: 3 group: 2 dilation: 2 pad: 2 stride: 2"
    outs = []
    for engine, name in [("CUDNN", "a"), ("CUDNN", "b"), ("CAFFE", "c"), (None, "d")]:
        layer, bottom, top = build(conv_text(body, engine, name), [x])
        set_params(layer)
        outs.append(forward(layer, bottom, top)[0])
        top[0].diff[...] = 1.0
        layer.backward(top, [True], bottom)
        outs.append(bottom[0].diff.copy())
    assert notes == [cudnn_conv.NOTE_CPU]
    for got in outs[2::2]:
        assert numpy.array_equal(got, outs[0])
    for got in outs[3::2]:
        assert numpy.array_equal(got, outs[1])
    expected = naive.conv_forward(x, layer.blobs[0].data, layer.blobs[1].data, (2, 2), (2, 2),
                                  (2, 2), 2)
    numpy.testing.assert_allclose(outs[0], expected, rtol=1e-12, atol=1e-12)


# --- on a GPU: cuDNN against the CAFFE engine -------------------------------------------------
# (bottom shape, convolution_param body): groups, dilation, stride, pad, 1-D/2-D/3-D, no bias
GPU_CASES = [
    ((2, 3, 9, 8), "num_output: 4 kernel_size: 3 pad: 1"),
    ((2, 4, 11, 10), "num_output: 6 kernel_size: 3 group: 2 dilation: 2 pad: 2 stride: 2"),
    ((1, 6, 8, 9), "num_output: 3 kernel_size: 2 kernel_size: 3 stride: 1 stride: 3 pad: 1 "
                   "pad: 2 dilation: 1 dilation: 2 group: 3"),
    ((3, 5, 7, 7), "num_output: 5 kernel_size: 1 bias_term: false"),
    ((2, 4, 13), "num_output: 4 kernel_size: 4 stride: 2 pad: 1 dilation: 2 group: 2"),
    ((1, 2, 5, 6, 7), "num_output: 4 kernel_size: 3 pad: 1 stride: 2"),
    ((4, 8, 16, 16), "num_output: 8 kernel_size: 5 group: 8 pad: 2"),  # depthwise
]


def _gpu_pair(shape, body, dtype):
    rng = numpy.random.default_rng(abs(hash((shape, body))) % (2 ** 32))
    x = rng.standard_normal(shape).astype(dtype)
    backend.use_gpu()
    try:
        runs = [build(conv_text(body, engine), [x], dtype=dtype, xp=backend.cupy)
                for engine in ("CAFFE", "CUDNN")]
    finally:
        backend.use_cpu()
    for layer, _, _ in runs:
        set_params(layer, seed=5)
    return runs, rng


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, rtol, atol", [(numpy.float64, 1e-10, 1e-10),
                                               (numpy.float32, 2e-4, 2e-4)])
@pytest.mark.parametrize("shape,body", GPU_CASES)
def test_cudnn_matches_caffe_engine(shape, body, dtype, rtol, atol):
    (ref, dev), rng = _gpu_pair(shape, body, dtype)
    assert not cudnn_conv.wants(ref[0], ref[1][0].data) and cudnn_conv.wants(dev[0], dev[1][0].data)
    outs = [forward(*run) for run in (ref, dev)]
    numpy.testing.assert_allclose(outs[1][0], outs[0][0], rtol=rtol, atol=atol)
    dy = rng.standard_normal(ref[2][0].shape).astype(dtype)
    for layer, bottom, top in (ref, dev):
        top[0].diff[...] = backend.cupy.asarray(dy)
        for p in layer.blobs:
            p.diff[...] = 0.25  # parameter diffs must accumulate onto what is there
        layer.backward(top, [True], bottom)
        layer.backward(top, [True], bottom)  # twice: bottom diff overwritten, params += again
    for a, b in zip(ref[1] + ref[0].blobs, dev[1] + dev[0].blobs):
        numpy.testing.assert_allclose(backend.to_numpy(b.diff), backend.to_numpy(a.diff),
                                      rtol=rtol, atol=atol * 10)


@pytest.mark.gpu
def test_algorithms_are_chosen_once_per_shape():
    (_, dev), _ = _gpu_pair((2, 3, 10, 10), "num_output: 7 kernel_size: 3 pad: 1 stride: 1",
                            numpy.float32)
    layer, bottom, top = dev
    forward(layer, bottom, top)
    top[0].diff[...] = 1.0
    layer.backward(top, [True], bottom)
    misses = cudnn.algorithms.misses
    for _ in range(3):
        forward(layer, bottom, top)
        layer.backward(top, [True], bottom)
    assert cudnn.algorithms.misses == misses
    bottom[0].reshape((5, 3, 10, 10))  # a new batch size is a new shape: one more search per op
    forward(layer, bottom, top)
    layer.backward(top, [True], bottom)
    assert cudnn.algorithms.misses == misses + 3


@pytest.mark.gpu
def test_handle_follows_cupys_current_stream():
    cp = backend.cupy
    (ref, dev), _ = _gpu_pair((2, 3, 12, 12), "num_output: 4 kernel_size: 3", numpy.float32)
    stream = cp.cuda.Stream(non_blocking=True)
    # the inputs were written on the legacy stream, which a non-blocking one does not follow
    stream.wait_event(cp.cuda.get_current_stream().record())
    with stream:
        got = forward(*dev)[0]
    stream.synchronize()
    want = forward(*ref)[0]
    numpy.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-4)


@pytest.mark.gpu
def test_conv_geometries_exhaustive_small():
    """Every combination of stride/pad/dilation/group on one small shape, forward only."""
    for stride, pad, dil, group in itertools.product((1, 2), (0, 1), (1, 2), (1, 2)):
        body = (f"num_output: 4 kernel_size: 3 stride: {stride} pad: {pad} dilation: {dil} "
                f"group: {group}")
        (ref, dev), _ = _gpu_pair((2, 4, 9, 9), body, numpy.float64)
        numpy.testing.assert_allclose(forward(*dev)[0], forward(*ref)[0], rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("shape,body", GPU_CASES)
def test_binding_calls_match_the_caffe_engine_on_an_emulated_library(fake_cudnn, shape, body):
    """The binding's descriptors, argument order, alpha/beta and accumulation, run against a
    host emulation of the C API: the CUDNN engine gives the CAFFE engine's results."""
    rng = numpy.random.default_rng(len(shape) * 7 + len(body))
    x = rng.standard_normal(shape)
    runs = []
    for engine in ("CAFFE", "CUDNN"):
        layer, bottom, top = build(conv_text(body, engine), [x])
        set_params(layer, seed=2)
        assert cudnn_conv.wants(layer, bottom[0].data) == (engine == "CUDNN")
        y = forward(layer, bottom, top)[0].copy()
        top[0].diff[...] = numpy.random.default_rng(9).standard_normal(top[0].shape)
        for p in layer.blobs:
            p.diff[...] = 0.5
        layer.backward(top, [True], bottom)
        layer.backward(top, [True], bottom)
        runs.append([y, bottom[0].diff.copy()] + [p.diff.copy() for p in layer.blobs])
    for got, want in zip(runs[1], runs[0]):
        numpy.testing.assert_allclose(got, want, rtol=1e-11, atol=1e-11)
    has_bias = "bias_term: false" not in body
    assert fake_cudnn.launches[:2] == ["forward", "bias"] if has_bias else \
        fake_cudnn.launches[:1] == ["forward"]
    per_backward = ["backward_bias"] * has_bias + ["backward_filter", "backward_data"]
    assert fake_cudnn.launches[1 + has_bias:] == per_backward * 2
    assert set(fake_cudnn.streams) == {4242}
    assert cudnn.algorithms.misses == 3  # one search per operation for this one shape
    # float64: the FMA candidate, its own workspace size, the descriptor retuned to its math
    assert {a[1:] for a in fake_cudnn.algos} == {(1, cudnn.FMA_MATH, 96)}


def test_tf32_switch_gives_a_new_search_and_keeps_fp32_math_off(fake_cudnn, monkeypatch):
    x = numpy.random.default_rng(4).standard_normal((2, 2, 5, 5)).astype(numpy.float32)
    layer, bottom, top = build(conv_text("num_output: 3 kernel_size: 3", "CUDNN"), [x],
                               dtype=numpy.float32)
    set_params(layer)
    got = forward(layer, bottom, top)[0]
    forward(layer, bottom, top)
    assert cudnn.algorithms.misses == 1
    want = naive.conv_forward(x.astype(numpy.float64), layer.blobs[0].data.astype(numpy.float64),
                              layer.blobs[1].data, (1, 1), (0, 0), (1, 1), 1)
    numpy.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert fake_cudnn.algos == [("forward", 1, cudnn.FMA_MATH, 96)] * 2  # no TF32 by default
    monkeypatch.setattr(backend, "_tf32", True)
    forward(layer, bottom, top)
    assert cudnn.algorithms.misses == 2
    assert fake_cudnn.algos[-1] == ("forward", 7, cudnn.TENSOR_OP_MATH, 96)
    monkeypatch.setattr(backend, "_tf32", False)
    forward(layer, bottom, top)
    assert cudnn.algorithms.misses == 2  # back to the cached fp32 choice
    assert fake_cudnn.algos[-1] == ("forward", 1, cudnn.FMA_MATH, 96)


def test_find_mode_times_candidates_on_scratch_outputs(fake_cudnn, monkeypatch):
    monkeypatch.setenv(cudnn.ALGO_ENV, "find")
    monkeypatch.setenv(cudnn.WORKSPACE_ENV, "2")
    rng = numpy.random.default_rng(8)
    x = rng.standard_normal((2, 4, 6, 6))
    layer, bottom, top = build(conv_text("num_output: 4 kernel_size: 3 group: 2", "CUDNN"), [x])
    set_params(layer)
    ref, rbottom, rtop = build(conv_text("num_output: 4 kernel_size: 3 group: 2", "CAFFE"), [x])
    set_params(ref)
    numpy.testing.assert_allclose(forward(layer, bottom, top)[0], forward(ref, rbottom, rtop)[0],
                                  rtol=1e-12, atol=1e-12)
    for lay, bot, tp in ((layer, bottom, top), (ref, rbottom, rtop)):
        tp[0].diff[...] = 1.0
        lay.backward(tp, [True], bot)
    for a, b in zip([bottom[0]] + layer.blobs, [rbottom[0]] + ref.blobs):
        numpy.testing.assert_allclose(a.diff, b.diff, rtol=1e-12, atol=1e-12)
    real = {top[0].data.ctypes.data, bottom[0].diff.ctypes.data, layer.blobs[0].diff.ctypes.data}
    assert len(fake_cudnn.finds) == 3 and cudnn.algorithms.misses == 3
    assert all(out not in real and wss == 2 << 20 for out, wss in fake_cudnn.finds)


def test_find_mode_holds_one_workspace_however_many_convolutions(fake_cudnn, monkeypatch):
    """Issue 41, defect 9: each plan kept its own find workspace (CAFFE8_CUDNN_WORKSPACE_MB,
    1 GiB by default) until its backward had chosen, so a net's first forward held one per
    convolution (~59 GiB for GoogLeNet). Six convolutions forward in find mode: at no time is
    more than one find workspace alive."""
    import gc
    import weakref
    monkeypatch.setenv(cudnn.ALGO_ENV, "find")
    monkeypatch.setenv(cudnn.WORKSPACE_ENV, "2")
    live, most = [], [0]

    def workspace(n):
        gc.collect()
        live[:] = [r for r in live if r() is not None]
        ws = numpy.empty(max(n, 1), numpy.uint8)
        if n == 2 << 20:
            live.append(weakref.ref(ws))
            most[0] = max(most[0], len(live))
        return ws
    monkeypatch.setattr(backend, "device_workspace", workspace)
    x = numpy.random.default_rng(9).standard_normal((2, 4, 6, 6))
    layers = []
    for k in range(6):
        layer, bottom, top = build(conv_text(f"num_output: {4 + k} kernel_size: 3 pad: 1",
                                             "CUDNN", f"c{k}"), [x])     # a shape each: a search
        set_params(layer, seed=k)
        forward(layer, bottom, top)
        layers.append(layer)
    assert len(fake_cudnn.finds) == 6 and most[0] == 1


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["heuristic", "find"])
@pytest.mark.parametrize("tf32", [False, True])
def test_search_modes_and_tf32_on_the_real_library(monkeypatch, mode, tf32):
    """find mode and TF32 on the device: cuDNN chosen, results within fp32 (or TF32) reach of
    the CAFFE engine, and with TF32 off no tensor-op or (on Ampere and newer) default math."""
    monkeypatch.setenv(cudnn.ALGO_ENV, mode)
    monkeypatch.setattr(backend, "_tf32", tf32)
    (ref, dev), _ = _gpu_pair((4, 8, 16, 16), "num_output: 16 kernel_size: 3 pad: 1",
                              numpy.float32)
    assert cudnn_conv.wants(dev[0], dev[1][0].data)
    got, want = forward(*dev)[0], forward(*ref)[0]
    tol = 5e-3 if tf32 else 2e-4
    numpy.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    for op, (algo, _, math) in cudnn_conv._plans[dev[0]][next(iter(cudnn_conv._plans[dev[0]]))] \
            .chosen.items():
        assert cudnn.allowed_math(numpy.float32, tf32, math,
                                  backend.cuda_compute_capability() >= (8, 0)), (op, algo, math)


@pytest.mark.gpu
def test_cudnn_in_a_net_with_the_flat_parameter_buffer():
    """A Net on the GPU (cuDNN convolutions on views of the aligned flat buffers) against the
    same Net on the CPU: outputs and parameter gradients within fp64 rounding."""
    from caffe8.engine.net import Net
    from caffe8.engine.prototxt import parse_text
    text = """
    layer { name: "in" type: "Input" top: "x"
            input_param { shape { dim: 2 dim: 3 dim: 9 dim: 9 } } }
    layer { name: "iny" type: "Input" top: "y"
            input_param { shape { dim: 2 dim: 3 dim: 5 dim: 5 } } }
    layer { name: "c1" type: "Convolution" bottom: "x" top: "c1"
            convolution_param { num_output: 5 kernel_size: 3
                                weight_filler { type: "gaussian" std: 0.1 }
                                bias_filler { type: "constant" value: 0.1 } } }
    layer { name: "c2" type: "Convolution" bottom: "c1" top: "c2"
            convolution_param { num_output: 3 kernel_size: 3
                                weight_filler { type: "gaussian" std: 0.1 } } }
    layer { name: "loss" type: "EuclideanLoss" bottom: "c2" bottom: "y" top: "loss" }
    """
    rng = numpy.random.default_rng(3)
    x, y = rng.standard_normal((2, 3, 9, 9)), rng.standard_normal((2, 3, 5, 5))
    results = []
    for gpu in (False, True):
        if gpu:
            backend.use_gpu()
        try:
            net = Net(parse_text(text), phase="TRAIN", dtype=numpy.float64)
            assert all(sl.start * 8 % 256 == 0 for sl in net.param_slices)
            if gpu:                                 # the CPU net's weights
                net.flat_data[...] = backend.to_device(results[0][0], like=net.flat_data)
                assert cudnn_conv.wants(net.layers[net.layer_names.index("c1")],
                                        net.blobs["x"].data)
            net.blobs["x"].data[...] = backend.to_device(x, like=net.blobs["x"].data)
            net.blobs["y"].data[...] = backend.to_device(y, like=net.blobs["y"].data)
            net.clear_param_diffs()
            net.forward_backward()
            results.append((backend.to_numpy(net.flat_data), backend.to_numpy(net.flat_diff)))
        finally:
            backend.use_cpu()
    numpy.testing.assert_array_equal(results[0][0], results[1][0])
    numpy.testing.assert_allclose(results[1][1], results[0][1], rtol=1e-10, atol=1e-12)
