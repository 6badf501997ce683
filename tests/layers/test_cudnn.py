"""layers.cudnn on the CPU: descriptor arithmetic, algorithm choice and caching, the engine
decision helper and the library loader."""
import ctypes
import importlib
import sys
import weakref
from types import SimpleNamespace

import numpy
import pytest

from caffe8.engine import backend
from caffe8.layers import cudnn
from tests.layers.fake_cudnn import fake_cudnn  # noqa: F401  (fixture)
from tests.layers.spatial_helpers import build, forward, set_params


def caffe_out(size, k, p, s, d):
    """Caffe's output length, written out independently of layers.im2col."""
    return (size + 2 * p - (d * (k - 1) + 1)) // s + 1


# --- descriptor arithmetic --------------------------------------------------------------------
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


# --- algorithm choice and cache ---------------------------------------------------------------
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


# --- the loader -------------------------------------------------------------------------------
def test_wheel_folders_are_found_cudnn_first(tmp_path):
    for pkg in ("cu13", "cudnn", "cublas"):
        (tmp_path / pkg / "lib").mkdir(parents=True)
    (tmp_path / "cu13" / "lib" / "libcudnn.so.9").write_bytes(b"")
    (tmp_path / "cudnn" / "lib" / "libcudnn.so.9").write_bytes(b"")
    assert cudnn.wheel_library_dirs([str(tmp_path)]) == [str(tmp_path / "cudnn" / "lib"),
                                                          str(tmp_path / "cu13" / "lib")]
    assert cudnn.wheel_library_dirs([str(tmp_path / "cublas")]) == []


def test_the_cudnn_wheel_is_found_on_the_import_path_behind_a_regular_nvidia_package(
        tmp_path, monkeypatch):
    """The layout of nvidia-cudnn-cu12 and -cu13 (nvidia/cudnn/lib/libcudnn.so.9) in one
    site folder is found with no argument, also when an earlier site folder holds an older
    NVIDIA wheel whose nvidia/__init__.py makes ``nvidia`` a regular package there."""
    older, site = tmp_path / "user_site", tmp_path / "site"
    (older / "nvidia" / "cublas" / "lib").mkdir(parents=True)
    (older / "nvidia" / "__init__.py").write_text("")
    (site / "nvidia" / "cudnn" / "lib").mkdir(parents=True)
    (site / "nvidia" / "cudnn" / "lib" / "libcudnn.so.9").write_bytes(b"")
    monkeypatch.delitem(sys.modules, "nvidia", raising=False)
    monkeypatch.setattr(sys, "path", [str(older), str(site)] + sys.path)
    importlib.invalidate_caches()
    assert str(site / "nvidia") in cudnn.nvidia_roots()
    assert str(site / "nvidia" / "cudnn" / "lib") in cudnn.wheel_library_dirs()


def test_loader_names_a_missing_explicit_path(tmp_path):
    missing = tmp_path / "nowhere" / "libcudnn.so.9"
    with pytest.raises(cudnn.CudnnUnavailable) as info:
        cudnn.load_library(path=str(missing))
    text = str(info.value)
    assert str(missing) in text and "no such file" in text
    assert "pip install nvidia-cudnn-cuNN, NN your CUDA major version" in text \
        or f"pip install nvidia-cudnn-cu{backend.cuda_runtime_major()}" in text


@pytest.mark.parametrize("major", [12, 13])
def test_install_hint_names_the_wheel_of_the_cuda_major_version(tmp_path, monkeypatch, major):
    monkeypatch.setattr(backend, "cuda_runtime_major", lambda: major)
    with pytest.raises(cudnn.CudnnUnavailable) as info:
        cudnn.load_library(path=str(tmp_path / "libcudnn.so.9"))
    assert f"'pip install nvidia-cudnn-cu{major}'" in str(info.value)


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


def test_loader_refuses_a_library_that_is_not_cudnn():
    import ctypes.util
    libm = ctypes.util.find_library("m")
    if libm is None:
        pytest.skip("no C math library to stand in for a wrong library")
    with pytest.raises(cudnn.CudnnUnavailable, match="missing symbol"):
        cudnn.load_library(path=libm)


def test_loader_honours_the_environment_variable(tmp_path, monkeypatch):
    monkeypatch.setenv(cudnn.LIBRARY_ENV, str(tmp_path / "custom.so"))
    with pytest.raises(cudnn.CudnnUnavailable) as info:
        cudnn.load_library()
    assert str(tmp_path / "custom.so") in str(info.value)
    assert f"check {cudnn.LIBRARY_ENV}" in str(info.value)


# --- the engine decision shared by the layer engines ------------------------------------------
class _Layer:
    """Stands in for a layer: engine_for only keys on identity."""


def test_engine_for_decides_once_per_layer_and_notes_once(fake_cudnn, monkeypatch):
    notes, asked = [], []
    monkeypatch.setattr(backend, "_notes_given", set())
    monkeypatch.setattr(backend, "_note_sink", notes.append)
    table = weakref.WeakKeyDictionary()

    def decide(on_device):
        asked.append(on_device)
        return ("CUDNN", None) if len(asked) == 1 else ("CAFFE", "falls back")

    first, second = _Layer(), _Layer()
    x = numpy.zeros(3)
    assert cudnn.engine_for(table, first, x, decide) == "CUDNN"
    assert cudnn.engine_for(table, first, x, decide) == "CUDNN"
    assert cudnn.engine_for(table, second, x, decide) == "CAFFE"
    assert cudnn.engine_for(table, second, x, decide) == "CAFFE"
    assert asked == [True, True] and notes == ["falls back"]
    assert fake_cudnn.streams == [4242]  # the cuDNN layer's handle was created and bound
    del first
    assert len(table) == 1  # decisions do not keep layers alive


def test_engine_for_falls_back_when_cudnn_cannot_start(fake_cudnn, monkeypatch):
    notes = []
    monkeypatch.setattr(backend, "_notes_given", set())
    monkeypatch.setattr(backend, "_note_sink", notes.append)
    monkeypatch.setattr(fake_cudnn, "_create", lambda out: 4000)  # CUDNN_STATUS_INTERNAL_ERROR
    engine = cudnn.engine_for(weakref.WeakKeyDictionary(), _Layer(), numpy.zeros(1),
                              lambda on_device: ("CUDNN", None))
    assert engine == "CAFFE"
    assert len(notes) == 1 and "could not start" in notes[0] and "4000" in notes[0]


# --- the handle's stream ----------------------------------------------------------------------
def _cudnn_layers():
    """A CUDNN convolution, AVE pooling and LRN, each with its input (float64)."""
    rng = numpy.random.default_rng(3)
    texts = ['name: "c" type: "Convolution" convolution_param { num_output: 4 kernel_size: 3 '
             'engine: CUDNN }',
             'name: "p" type: "Pooling" pooling_param { pool: AVE kernel_size: 3 stride: 2 '
             'engine: CUDNN }',
             'name: "n" type: "LRN" lrn_param { local_size: 3 engine: CUDNN }']
    layers = []
    for text in texts:
        layer, bottom, top = build(text, [rng.standard_normal((2, 4, 9, 9))])
        set_params(layer, seed=1)
        layers.append((layer, bottom, top))
    return layers


def _run(layers):
    for layer, bottom, top in layers:
        forward(layer, bottom, top)
        top[0].diff[...] = 1.0
        layer.backward(top, [True], bottom)


def test_the_handle_is_bound_once_per_stream_change_not_per_call(fake_cudnn, monkeypatch):
    """cudnnSetStream runs when CuPy's current stream differs from the handle's last one: once
    for a whole run on one stream, once at each change, again on going back; a second thread
    has its own handle, bound once."""
    import threading
    layers = _cudnn_layers()
    _run(layers)
    _run(layers)
    launches = len(fake_cudnn.launches)
    assert launches >= 12 and set(fake_cudnn.launches) >= {
        "forward", "backward_data", "pool_forward", "pool_backward", "lrn_forward",
        "lrn_backward"}
    assert fake_cudnn.streams == [4242]
    monkeypatch.setattr(backend, "cuda_stream_ptr", lambda: 5151)
    _run(layers)
    assert fake_cudnn.streams == [4242, 5151]
    monkeypatch.setattr(backend, "cuda_stream_ptr", lambda: 4242)
    _run(layers)
    _run(layers)
    assert fake_cudnn.streams == [4242, 5151, 4242]
    worker = threading.Thread(target=lambda: (cudnn.handle(), cudnn.handle()))
    worker.start()
    worker.join()
    assert fake_cudnn.streams == [4242, 5151, 4242, 4242]
    assert len(fake_cudnn.launches) == 5 * launches // 2   # five runs, one binding each


def test_calls_are_counted_by_name(fake_cudnn):
    """layers.cudnn.CALLS (peer_bench's cuDNN calls per iteration) counts every call made, by
    name: a run's compute calls each time, the one stream binding once."""
    layers = _cudnn_layers()
    _run(layers)
    cudnn.CALLS.clear()
    before = len(fake_cudnn.launches)
    _run(layers)
    launched = len(fake_cudnn.launches) - before
    computing = {"cudnnConvolutionForward", "cudnnConvolutionBackwardData",
                 "cudnnConvolutionBackwardFilter", "cudnnConvolutionBackwardBias",
                 "cudnnAddTensor", "cudnnPoolingForward", "cudnnPoolingBackward",
                 "cudnnLRNCrossChannelForward", "cudnnLRNCrossChannelBackward"}
    assert launched > 0 and sum(cudnn.CALLS[name] for name in computing) == launched
    assert cudnn.CALLS["cudnnSetStream"] == 0           # bound in the first run, not again


def test_a_failed_binding_is_retried_on_the_next_call(fake_cudnn, monkeypatch):
    statuses = iter([4000, 0])                      # CUDNN_STATUS_INTERNAL_ERROR, then success
    bind = fake_cudnn.cudnnSetStream
    monkeypatch.setattr(fake_cudnn, "cudnnSetStream", lambda h, s: bind(h, s) or next(statuses))
    with pytest.raises(cudnn.CudnnError, match="cudnnSetStream"):
        cudnn.handle()
    cudnn.handle()
    cudnn.handle()
    assert fake_cudnn.streams == [4242, 4242]
