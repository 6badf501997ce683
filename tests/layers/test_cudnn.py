"""cuDNN convolution: descriptor arithmetic, algorithm choice and caching, engine selection and
the library loader on the CPU; cuDNN against the CAFFE engine (im2col + GEMM) on a GPU."""
import ctypes
import itertools
from types import SimpleNamespace

import numpy
import pytest

from engine import backend
from layers import cudnn
from tests.layers import naive
from tests.layers.spatial_helpers import build, forward, set_params


def conv_text(body, engine=None, name="c"):
    extra = f" engine: {engine}" if engine else ""
    return f'name: "{name}" type: "Convolution" convolution_param {{ {body}{extra} }}'


def caffe_out(size, k, p, s, d):
    """Caffe's output length, written out independently of layers.im2col."""
    return (size + 2 * p - (d * (k - 1) + 1)) // s + 1


# --- descriptor arithmetic -------------------------------------------------------------------------
def test_geometry_2d_dims_match_caffe_output_size():
    g = cudnn.Geometry((2, 6, 9, 8), (4, 3, 3, 2), pad=(2, 1), stride=(2, 3), dilation=(2, 1),
                       group=2)
    assert g.x == (2, 6, 9, 8) and g.w == (4, 3, 3, 2)
    assert g.y == (2, 4, caffe_out(9, 3, 2, 2, 2), caffe_out(8, 2, 1, 3, 1)) == (2, 4, 5, 3)
    assert g.bias == (1, 4, 1, 1)
    assert g.pad == (2, 1) and g.stride == (2, 3) and g.dilation == (2, 1) and g.group == 2


def test_geometry_lifts_1d_to_2d_with_a_unit_axis():
    g = cudnn.Geometry((3, 2, 11), (5, 2, 4), pad=(1,), stride=(2,), dilation=(3,), group=1)
    assert g.x == (3, 2, 11, 1) and g.w == (5, 2, 4, 1)
    assert g.pad == (1, 0) and g.stride == (2, 1) and g.dilation == (3, 1)
    assert g.y == (3, 5, caffe_out(11, 4, 1, 2, 3), 1)
    assert g.bias == (1, 5, 1, 1)


def test_geometry_3d_and_the_axis_limits():
    g = cudnn.Geometry((1, 2, 5, 6, 7), (3, 2, 2, 3, 1), (0, 1, 0), (1, 2, 1), (1, 1, 2), 1)
    assert g.y == (1, 3, 4, 3, 7) and g.bias == (1, 3, 1, 1, 1)
    with pytest.raises(ValueError, match="1 to 3 spatial axes"):
        cudnn.Geometry((1, 1, 3, 3, 3, 3), (1, 1, 1, 1, 1, 1), (0,) * 4, (1,) * 4, (1,) * 4, 1)
    assert cudnn.Geometry((1, 1, 4, 4), (1, 1, 3, 3), (0, 0), (1, 1), (1, 1), 1).key() != \
        cudnn.Geometry((1, 1, 4, 4), (1, 1, 3, 3), (1, 1), (1, 1), (1, 1), 1).key()


def test_packed_strides_are_c_order_element_strides():
    for dims in [(2, 3, 4, 5), (1, 7, 1, 1), (2, 1, 3, 4, 5)]:
        expected = tuple(s // 8 for s in numpy.zeros(dims).strides)
        assert cudnn.packed_strides(dims) == expected


def test_data_compute_and_math_types():
    assert cudnn.data_type(numpy.float32) == cudnn.DATA_FLOAT == 0
    assert cudnn.data_type(numpy.float64) == cudnn.DATA_DOUBLE == 1
    assert cudnn.data_type(numpy.float16) == cudnn.DATA_HALF == 2
    assert cudnn.data_type(numpy.int32) is None
    assert cudnn.compute_type(numpy.float16) == cudnn.DATA_FLOAT
    assert cudnn.compute_type(numpy.float64) == cudnn.DATA_DOUBLE
    # Caffe's numerics: fp32 convolutions never round to TF32 unless it is asked for
    assert cudnn.math_type(numpy.float32, tf32=False) == cudnn.FMA_MATH == 3
    assert cudnn.math_type(numpy.float32, tf32=True) == cudnn.TENSOR_OP_MATH == 1
    assert cudnn.math_type(numpy.float64, tf32=True) == cudnn.DEFAULT_MATH
    assert not cudnn.allowed_math(numpy.float32, False, cudnn.TENSOR_OP_MATH)
    assert not cudnn.allowed_math(numpy.float32, False, cudnn.TENSOR_OP_MATH_ALLOW_CONVERSION)
    assert cudnn.allowed_math(numpy.float32, False, cudnn.FMA_MATH)
    assert cudnn.allowed_math(numpy.float32, False, cudnn.DEFAULT_MATH)
    assert cudnn.allowed_math(numpy.float32, True, cudnn.TENSOR_OP_MATH)


def test_perf_struct_layout_matches_the_header():
    # algo, status (int), time (float), memory (size_t, 8-aligned), determinism, mathType, int[3]
    assert cudnn.AlgoPerf.time.offset == 8 and cudnn.AlgoPerf.memory.offset == 16
    assert cudnn.AlgoPerf.determinism.offset == 24 and cudnn.AlgoPerf.mathType.offset == 28
    assert cudnn.AlgoPerf.reserved.offset == 32 and ctypes.sizeof(cudnn.AlgoPerf) == 48


# --- algorithm choice and cache ----------------------------------------------------------------------
def perf(algo, status=0, memory=0, math=cudnn.FMA_MATH):
    return SimpleNamespace(algo=algo, status=status, time=0.0, memory=memory, mathType=math)


def test_choose_algorithm_takes_the_first_usable_candidate():
    perfs = [perf(6, status=3000), perf(5, memory=1 << 30), perf(1, math=cudnn.TENSOR_OP_MATH),
             perf(0, memory=64), perf(2)]
    assert cudnn.choose_algorithm(perfs, numpy.float32, False, 1 << 20) == (0, 64, cudnn.FMA_MATH)
    assert cudnn.choose_algorithm(perfs, numpy.float32, True, 1 << 20) == \
        (1, 0, cudnn.TENSOR_OP_MATH)
    assert cudnn.choose_algorithm(perfs, numpy.float32, False, 1 << 31)[0] == 5
    assert cudnn.choose_algorithm(perfs[:3], numpy.float32, False, 1 << 20) is None
    assert cudnn.choose_algorithm([], numpy.float64, False, 1) is None


def test_algorithm_cache_searches_once_per_shape_setting_and_device():
    searched = []

    def fake_search(op, geometry, dtype, tf32, mode, handle_token):
        searched.append((op, geometry.x, tf32, mode, handle_token))
        return (len(searched), 0, cudnn.FMA_MATH)

    cache = cudnn.AlgorithmCache(fake_search)
    g1 = cudnn.Geometry((2, 3, 8, 8), (4, 3, 3, 3), (1, 1), (1, 1), (1, 1), 1)
    g1_again = cudnn.Geometry((2, 3, 8, 8), (4, 3, 3, 3), (1, 1), (1, 1), (1, 1), 1)
    g2 = cudnn.Geometry((4, 3, 8, 8), (4, 3, 3, 3), (1, 1), (1, 1), (1, 1), 1)
    first = cache.get(cudnn.FORWARD, 0, numpy.float32, g1, False, "heuristic", "h")
    assert cache.get(cudnn.FORWARD, 0, numpy.float32, g1_again, False, "heuristic", "h") == first
    assert cache.misses == 1
    keys = [(cudnn.BACKWARD_DATA, 0, numpy.float32, g1, False, "heuristic"),
            (cudnn.FORWARD, 1, numpy.float32, g1, False, "heuristic"),
            (cudnn.FORWARD, 0, numpy.float64, g1, False, "heuristic"),
            (cudnn.FORWARD, 0, numpy.float32, g2, False, "heuristic"),
            (cudnn.FORWARD, 0, numpy.float32, g1, True, "heuristic"),
            (cudnn.FORWARD, 0, numpy.float32, g1, False, "find")]
    for k in keys:
        cache.get(*k, "h")
    assert cache.misses == 1 + len(keys) == len(cache) == len(searched)
    for k in keys:  # all cached now
        cache.get(*k, "h")
    assert cache.misses == 1 + len(keys)


# --- engine selection ----------------------------------------------------------------------------
@pytest.mark.parametrize("requested", ["DEFAULT", "CAFFE", "CUDNN"])
def test_cpu_arrays_always_get_the_caffe_engine(requested):
    engine, note = cudnn.choose_engine(requested, False, 2, numpy.float32)
    assert engine == "CAFFE"
    assert (note == cudnn.NOTE_CPU) if requested == "CUDNN" else note is None


def test_device_arrays_get_cudnn_unless_it_cannot_run():
    assert cudnn.choose_engine("DEFAULT", True, 2, numpy.float32) == ("CUDNN", None)
    assert cudnn.choose_engine("CUDNN", True, 3, numpy.float64) == ("CUDNN", None)
    assert cudnn.choose_engine("CAFFE", True, 2, numpy.float32) == ("CAFFE", None)
    engine, note = cudnn.choose_engine("DEFAULT", True, 2, numpy.float32, lib_error="no lib")
    assert engine == "CAFFE" and "no lib" in note and "CAFFE engine" in note
    assert cudnn.choose_engine("CUDNN", True, 4, numpy.float32)[0] == "CAFFE"
    assert "4-axis" in cudnn.choose_engine("CUDNN", True, 4, numpy.float32)[1]
    assert cudnn.choose_engine("DEFAULT", True, 4, numpy.float32) == ("CAFFE", None)
    assert cudnn.choose_engine("CUDNN", True, 2, numpy.int32)[0] == "CAFFE"


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
    assert notes == [cudnn.NOTE_CPU]
    for got in outs[2::2]:
        assert numpy.array_equal(got, outs[0])
    for got in outs[3::2]:
        assert numpy.array_equal(got, outs[1])
    expected = naive.conv_forward(x, layer.blobs[0].data, layer.blobs[1].data, (2, 2), (2, 2),
                                  (2, 2), 2)
    numpy.testing.assert_allclose(outs[0], expected, rtol=1e-12, atol=1e-12)


# --- the loader ----------------------------------------------------------------------------------------
def test_wheel_folders_are_found_cudnn_first(tmp_path):
    for pkg in ("cu13", "cudnn", "cublas"):
        (tmp_path / pkg / "lib").mkdir(parents=True)
    (tmp_path / "cu13" / "lib" / "libcudnn.so.9").write_bytes(b"")
    (tmp_path / "cudnn" / "lib" / "libcudnn.so.9").write_bytes(b"")
    assert cudnn.wheel_library_dirs([str(tmp_path)]) == [str(tmp_path / "cudnn" / "lib"),
                                                          str(tmp_path / "cu13" / "lib")]
    assert cudnn.wheel_library_dirs([str(tmp_path / "cublas")]) == []


def test_loader_names_a_missing_explicit_path(tmp_path):
    missing = tmp_path / "nowhere" / "libcudnn.so.9"
    with pytest.raises(cudnn.CudnnUnavailable) as info:
        cudnn.load_library(path=str(missing))
    text = str(info.value)
    assert str(missing) in text and "no such file" in text
    assert "pip install nvidia-cudnn-cu13" in text


def test_loader_reports_every_place_it_searched(tmp_path, monkeypatch):
    monkeypatch.delenv(cudnn.LIBRARY_ENV, raising=False)
    (tmp_path / "libcudnn.so.9").write_bytes(b"not a shared object")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(cudnn.CudnnUnavailable) as info:
        cudnn.load_library(search_dirs=[str(tmp_path), str(empty)], system=False)
    text = str(info.value)
    assert str(tmp_path / "libcudnn.so.9") in text            # found but not loadable
    assert str(empty / "libcudnn.so.9") + " (no such file)" in text
    assert f"set {cudnn.LIBRARY_ENV}" in text


def test_loader_honours_the_environment_variable(tmp_path, monkeypatch):
    monkeypatch.setenv(cudnn.LIBRARY_ENV, str(tmp_path / "custom.so"))
    with pytest.raises(cudnn.CudnnUnavailable) as info:
        cudnn.load_library()
    assert str(tmp_path / "custom.so") in str(info.value)
    assert f"check {cudnn.LIBRARY_ENV}" in str(info.value)


# --- on a GPU: cuDNN against the CAFFE engine ----------------------------------------------------------
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
    assert not cudnn.wants(ref[0], ref[1][0].data) and cudnn.wants(dev[0], dev[1][0].data)
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
