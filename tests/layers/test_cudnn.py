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


# --- the binding's call sequence against a host emulation of the cuDNN C API ------------------------
def _window_slices(offsets, out, stride, dilation):
    return tuple(slice(o * d, o * d + s * (n - 1) + 1, s)
                 for o, n, s, d in zip(offsets, out, stride, dilation))


class FakeCudnn:
    """The cuDNN entry points the binding calls, emulated on host memory with direct N-d
    cross-correlation loops, honouring descriptors, alpha/beta, groups and the math type.
    Descriptor handles are small integers; data pointers are host addresses."""

    FLOAT_TYPES = {0: (numpy.float32, ctypes.c_float), 1: (numpy.float64, ctypes.c_double)}

    def __init__(self):
        self.objects, self.next_id = {}, 100
        self.streams, self.launches, self.algos, self.finds = [], [], [], []
        self.destroyed = 0

    def __getattr__(self, name):
        if name.startswith("cudnnDestroy"):
            return self._destroy
        if name.startswith("cudnnCreate"):
            return self._create
        if name.endswith("MaxCount"):
            return self._max_count
        if name.endswith("Algorithm_v7"):
            return self._heuristic
        if name.endswith("AlgorithmEx"):
            return self._find
        if name.endswith("WorkspaceSize"):
            return self._workspace_size
        raise AttributeError(name)

    # handles and descriptors
    def _create(self, out):
        self.next_id += 1
        out._obj.value = self.next_id
        self.objects[self.next_id] = {}
        return 0

    def _destroy(self, desc):
        self.destroyed += 1
        return 0

    def cudnnSetStream(self, handle, stream):
        self.streams.append(stream.value)
        return 0

    def cudnnSetTensorNdDescriptor(self, desc, dtype, n, dims, strides):
        dims = tuple(dims[:n])
        assert tuple(strides[:n]) == tuple(s // 8 for s in numpy.zeros(dims).strides)
        self.objects[desc.value].update(kind="tensor", dtype=dtype, dims=dims)
        return 0

    def cudnnSetFilterNdDescriptor(self, desc, dtype, fmt, n, dims):
        assert fmt == cudnn.TENSOR_NCHW
        self.objects[desc.value].update(kind="filter", dtype=dtype, dims=tuple(dims[:n]))
        return 0

    def cudnnSetConvolutionNdDescriptor(self, desc, n, pad, stride, dilation, mode, ctype):
        assert mode == cudnn.CROSS_CORRELATION
        self.objects[desc.value].update(kind="conv", pad=tuple(pad[:n]),
                                        stride=tuple(stride[:n]), dilation=tuple(dilation[:n]),
                                        group=1, math=None, compute=ctype)
        return 0

    def cudnnSetConvolutionGroupCount(self, desc, group):
        self.objects[desc.value]["group"] = group
        return 0

    def cudnnSetConvolutionMathType(self, desc, math):
        self.objects[desc.value]["math"] = math
        return 0

    # algorithm queries: for float compute a faster tensor-op candidate first (as on Ampere and
    # newer), then an FMA one; for double only the FMA one
    def _max_count(self, handle, count):
        count._obj.value = 3
        return 0

    def _heuristic(self, handle, d1, d2, conv, d3, requested, returned, perfs):
        candidates = [(1, 64, cudnn.FMA_MATH)]
        if self.objects[conv.value]["compute"] == cudnn.DATA_FLOAT:
            candidates.insert(0, (7, 0, cudnn.TENSOR_OP_MATH))
        assert requested >= len(candidates)
        for p, (algo, memory, math) in zip(perfs, candidates):
            p.algo, p.status, p.memory, p.mathType = algo, 0, memory, math
        returned._obj.value = len(candidates)
        return 0

    def _find(self, handle, d1, p1, d2, p2, conv, d3, out, requested, returned, perfs, ws, wss):
        self.finds.append((out.value, wss))
        return self._heuristic(handle, d1, d2, conv, d3, requested, returned, perfs)

    def _workspace_size(self, handle, d1, d2, conv, d3, algo, size):
        size._obj.value = 96
        return 0

    # data access
    def _array(self, desc, ptr):
        info = self.objects[desc.value]
        dtype, ctype = self.FLOAT_TYPES[info["dtype"]]
        count = int(numpy.prod(info["dims"]))
        return numpy.ctypeslib.as_array((ctype * count).from_address(ptr.value)).reshape(
            info["dims"])

    @staticmethod
    def _scalar(ref):
        return ref._obj.value

    def _geometry(self, conv, x, w):
        c = self.objects[conv.value]
        out = tuple((n + 2 * p - (d * (k - 1) + 1)) // s + 1 for n, k, p, s, d in
                    zip(x.shape[2:], w.shape[2:], c["pad"], c["stride"], c["dilation"]))
        return c, out

    def _padded(self, x, pad):
        buf = numpy.zeros(x.shape[:2] + tuple(n + 2 * p for n, p in zip(x.shape[2:], pad)))
        buf[(slice(None), slice(None)) + tuple(slice(p, p + n) for n, p in
                                               zip(x.shape[2:], pad))] = x
        return buf

    def _correlate(self, conv, x, w, dy=None, mode="forward"):
        """forward: y; data: dx from dy; filter: dw from x, dy (all float64)."""
        c, out = self._geometry(conv, x, w)
        g = c["group"]
        cg, og = w.shape[1], w.shape[0] // g
        xp_ = self._padded(x.astype(numpy.float64), c["pad"])
        y = numpy.zeros((x.shape[0], w.shape[0]) + out)
        dxp = numpy.zeros_like(xp_)
        dw = numpy.zeros(w.shape)
        for offsets in itertools.product(*(range(k) for k in w.shape[2:])):
            win = (slice(None), slice(None)) + _window_slices(offsets, out, c["stride"],
                                                              c["dilation"])
            for gi in range(g):
                cs, os_ = slice(gi * cg, (gi + 1) * cg), slice(gi * og, (gi + 1) * og)
                wk = w[(os_, slice(None)) + offsets].astype(numpy.float64)
                xs = xp_[win][:, cs]
                if mode == "forward":
                    y[:, os_] += numpy.einsum("nc...,oc->no...", xs, wk)
                elif mode == "data":  # basic slices: the += writes through the view
                    dxp[win][:, cs] += numpy.einsum("no...,oc->nc...", dy[:, os_], wk)
                else:
                    n = xs.shape[0]
                    dw[(os_, slice(None)) + offsets] += numpy.einsum(
                        "ncp,nop->oc", xs.reshape(n, cg, -1), dy[:, os_].reshape(n, og, -1))
        if mode == "forward":
            return y
        if mode == "data":
            return dxp[(slice(None), slice(None)) + tuple(slice(p, p + n) for n, p in
                                                          zip(x.shape[2:], c["pad"]))]
        return dw

    def _record(self, op, conv, algo, wss):
        self.launches.append(op)
        self.algos.append((op, algo, self.objects[conv.value]["math"], wss))

    def cudnnConvolutionForward(self, h, alpha, xd, x, wd, w, conv, algo, ws, wss, beta, yd, y):
        self._record("forward", conv, algo, wss)
        xa, wa, ya = self._array(xd, x), self._array(wd, w), self._array(yd, y)
        ya[...] = self._scalar(alpha) * self._correlate(conv, xa, wa) + self._scalar(beta) * ya
        return 0

    def cudnnConvolutionBackwardData(self, h, alpha, wd, w, dyd, dy, conv, algo, ws, wss, beta,
                                     dxd, dx):
        self._record("backward_data", conv, algo, wss)
        wa, dya, dxa = self._array(wd, w), self._array(dyd, dy), self._array(dxd, dx)
        grad = self._correlate(conv, dxa, wa, dya.astype(numpy.float64), "data")
        dxa[...] = self._scalar(alpha) * grad + self._scalar(beta) * dxa
        return 0

    def cudnnConvolutionBackwardFilter(self, h, alpha, xd, x, dyd, dy, conv, algo, ws, wss,
                                       beta, dwd, dw):
        self._record("backward_filter", conv, algo, wss)
        xa, dya, dwa = self._array(xd, x), self._array(dyd, dy), self._array(dwd, dw)
        grad = self._correlate(conv, xa, dwa, dya.astype(numpy.float64), "filter")
        dwa[...] = self._scalar(alpha) * grad + self._scalar(beta) * dwa
        return 0

    def cudnnConvolutionBackwardBias(self, h, alpha, dyd, dy, beta, dbd, db):
        self.launches.append("backward_bias")
        dya, dba = self._array(dyd, dy), self._array(dbd, db)
        axes = (0,) + tuple(range(2, dya.ndim))
        dba[...] = self._scalar(alpha) * dya.sum(axis=axes, keepdims=True) + \
            self._scalar(beta) * dba
        return 0

    def cudnnAddTensor(self, h, alpha, ad, a, beta, cd, c):
        self.launches.append("bias")
        aa, ca = self._array(ad, a), self._array(cd, c)
        ca[...] = self._scalar(alpha) * aa + self._scalar(beta) * ca
        return 0


    # pooling: average over the zero-padded window, divided by the full window size
    def cudnnSetPoolingNdDescriptor(self, desc, mode, nan_opt, n, window, pad, stride):
        assert mode == cudnn.POOLING_AVERAGE_COUNT_INCLUDE_PADDING
        self.objects[desc.value].update(kind="pool", window=tuple(window[:n]), pad=tuple(pad[:n]),
                                        stride=tuple(stride[:n]))
        return 0

    def _pool_windows(self, pool, x_shape, y_shape):
        p = self.objects[pool.value]
        out = tuple((n + 2 * q - k) // s + 1 for n, k, q, s in
                    zip(x_shape[2:], p["window"], p["pad"], p["stride"]))
        assert out == tuple(y_shape[2:]), "y descriptor is not cuDNN's own output size"
        return p, [_window_slices(o, out, p["stride"], (1,) * len(out))
                   for o in itertools.product(*(range(k) for k in p["window"]))]

    def cudnnPoolingForward(self, h, pool, alpha, xd, x, beta, yd, y):
        self.launches.append("pool_forward")
        xa, ya = self._array(xd, x), self._array(yd, y)
        p, windows = self._pool_windows(pool, xa.shape, ya.shape)
        padded = self._padded(xa, p["pad"])
        total = sum(padded[(slice(None), slice(None)) + w] for w in windows)
        ya[...] = self._scalar(alpha) * total / len(windows) + self._scalar(beta) * ya
        return 0

    def cudnnPoolingBackward(self, h, pool, alpha, yd, y, dyd, dy, xd, x, beta, dxd, dx):
        self.launches.append("pool_backward")
        xa, dya, dxa = self._array(xd, x), self._array(dyd, dy), self._array(dxd, dx)
        p, windows = self._pool_windows(pool, xa.shape, dya.shape)
        acc = self._padded(numpy.zeros(xa.shape), p["pad"])
        for w in windows:
            acc[(slice(None), slice(None)) + w] += dya / len(windows)
        inner = acc[(slice(None), slice(None)) + tuple(slice(q, q + n) for n, q in
                                                       zip(xa.shape[2:], p["pad"]))]
        dxa[...] = self._scalar(alpha) * inner + self._scalar(beta) * dxa
        return 0


    # LRN across channels: scale = k + alpha/n * (sum of x^2 over n neighbouring channels)
    def cudnnSetLRNDescriptor(self, desc, n, alpha, beta, k):
        self.objects[desc.value].update(kind="lrn", n=n, alpha=alpha, beta=beta, k=k)
        return 0

    def _channel_sum(self, a, n):
        half = (n - 1) // 2
        padded = numpy.concatenate([numpy.zeros_like(a[:, :half]), a,
                                    numpy.zeros_like(a[:, :n - 1 - half])], axis=1)
        return sum(padded[:, i:i + a.shape[1]] for i in range(n))

    def _lrn_scale(self, lrn, x):
        p = self.objects[lrn.value]
        return p, p["k"] + p["alpha"] / p["n"] * self._channel_sum(x * x, p["n"])

    def cudnnLRNCrossChannelForward(self, h, lrn, mode, alpha, xd, x, beta, yd, y):
        assert mode == cudnn.LRN_CROSS_CHANNEL_DIM1
        self.launches.append("lrn_forward")
        xa, ya = self._array(xd, x), self._array(yd, y)
        p, scale = self._lrn_scale(lrn, xa.astype(numpy.float64))
        ya[...] = self._scalar(alpha) * xa * scale ** -p["beta"] + self._scalar(beta) * ya
        return 0

    def cudnnLRNCrossChannelBackward(self, h, lrn, mode, alpha, yd, y, dyd, dy, xd, x, beta,
                                     dxd, dx):
        self.launches.append("lrn_backward")
        ya, dya, xa = self._array(yd, y), self._array(dyd, dy), self._array(xd, x)
        dxa = self._array(dxd, dx)
        p, scale = self._lrn_scale(lrn, xa.astype(numpy.float64))
        grad = dya * scale ** -p["beta"] - 2 * p["alpha"] / p["n"] * p["beta"] * xa * \
            self._channel_sum(dya * ya / scale, p["n"])
        dxa[...] = self._scalar(alpha) * grad + self._scalar(beta) * dxa
        return 0


@pytest.fixture
def fake_cudnn(monkeypatch):
    fake = FakeCudnn()
    monkeypatch.setattr(cudnn, "library", lambda: fake)
    monkeypatch.setattr(cudnn, "_lib", fake)
    monkeypatch.setattr(cudnn, "algorithms", cudnn.AlgorithmCache(cudnn._search))
    monkeypatch.setattr(cudnn, "_handles", __import__("threading").local())
    monkeypatch.setattr(cudnn, "_ptr", lambda a: ctypes.c_void_p(a.ctypes.data))
    monkeypatch.setattr(backend, "is_device_array", lambda a: True)
    monkeypatch.setattr(backend, "cuda_device_id", lambda: 0)
    monkeypatch.setattr(backend, "cuda_stream_ptr", lambda: 4242)
    monkeypatch.setattr(backend, "device_workspace", lambda n: numpy.empty(max(n, 1), numpy.uint8))
    monkeypatch.setattr(backend, "_tf32", False)
    return fake


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
        assert cudnn.wants(layer, bottom[0].data) == (engine == "CUDNN")
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


# --- pooling ---------------------------------------------------------------------------------------
def pool_text(body, engine=None, name="p", tops=1):
    extra = f" engine: {engine}" if engine else ""
    top = "".join(f' top: "t{i}"' for i in range(tops))
    return f'name: "{name}" type: "Pooling"{top} pooling_param {{ {body}{extra} }}'


def caffe_pool_divisors(size, k, pad, stride, out):
    """Caffe's AVE divisors along one axis (window clipped at size + pad, not at the padding)."""
    return [min(o * stride - pad + k, size + pad) - (o * stride - pad) for o in range(out)]


@pytest.mark.parametrize("size,k,pad,stride", [(7, 3, 1, 2), (8, 3, 1, 2), (6, 2, 0, 2),
                                               (7, 2, 0, 2), (13, 3, 0, 2), (5, 5, 0, 1),
                                               (10, 3, 2, 3), (9, 4, 1, 3)])
def test_pooling_exactness_rule_is_caffes_full_window_condition(size, k, pad, stride):
    from layers.pooling import pooled_size
    out = pooled_size(size, k, pad, stride, True)
    full = all(d == k for d in caffe_pool_divisors(size, k, pad, stride, out))
    assert cudnn.pooling_matches_caffe((size,), (k,), (pad,), (stride,), (out,)) == full
    if full:  # and then cuDNN's floor-mode size is Caffe's
        assert (size + 2 * pad - k) // stride + 1 == out


def test_pooling_engine_follows_caffes_factory():
    ch = cudnn.choose_pooling_engine
    assert ch("DEFAULT", "AVE", 1, True, numpy.float32) == ("CUDNN", None)
    assert ch("CUDNN", "AVE", 1, True, numpy.float64) == ("CUDNN", None)
    assert ch("CUDNN", "MAX", 1, True, numpy.float32) == ("CAFFE", None)
    assert ch("DEFAULT", "STOCHASTIC", 1, True, numpy.float32) == ("CAFFE", None)
    assert ch("CAFFE", "AVE", 1, True, numpy.float32) == ("CAFFE", None)
    engine, note = ch("CUDNN", "AVE", 2, True, numpy.float32)
    assert engine == "CAFFE" and "single top" in note
    engine, note = ch("CUDNN", "AVE", 1, False, numpy.float32)
    assert engine == "CAFFE" and "pooling_param.engine CUDNN" in note and "CPU" in note
    assert ch("DEFAULT", "AVE", 1, False, numpy.float32) == ("CAFFE", None)
    assert ch("DEFAULT", "AVE", 1, True, numpy.float32, lib_error="x")[0] == "CAFFE"


POOL_CASES = [((2, 3, 7, 7), "pool: AVE kernel_size: 3 stride: 2 pad: 1"),     # exact
              ((2, 3, 8, 8), "pool: AVE kernel_size: 3 stride: 2 pad: 1"),     # overhang
              ((1, 4, 6, 9), "pool: AVE kernel_h: 2 kernel_w: 3 stride_h: 2 stride_w: 3"),
              ((2, 2, 5, 5), "pool: AVE global_pooling: true"),
              ((2, 2, 13, 13), "pool: AVE kernel_size: 3 stride: 2")]


@pytest.mark.parametrize("shape,body", POOL_CASES)
def test_pooling_binding_matches_caffe_engine_on_an_emulated_library(fake_cudnn, shape, body):
    from layers.pooling import pooled_size
    x = numpy.random.default_rng(21).standard_normal(shape)
    runs = []
    for engine in ("CAFFE", "CUDNN"):
        layer, bottom, top = build(pool_text(body, engine), [x])
        y = forward(layer, bottom, top)[0].copy()
        top[0].diff[...] = numpy.random.default_rng(22).standard_normal(top[0].shape)
        layer.backward(top, [True], bottom)
        runs.append([y, bottom[0].diff.copy()])
    for got, want in zip(runs[1], runs[0]):
        numpy.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    exact = cudnn.pooling_matches_caffe(shape[2:], layer.k, layer.pad, layer.stride, layer.out)
    assert fake_cudnn.launches == (["pool_forward", "pool_backward"] if exact else [])
    assert exact == (shape != (2, 3, 8, 8))
    assert layer.out == tuple(pooled_size(n, k, q, s, True) for n, k, q, s in
                              zip(shape[2:], layer.k, layer.pad, layer.stride))


def test_max_pooling_never_uses_cudnn(fake_cudnn):
    layer, bottom, top = build(pool_text("pool: MAX kernel_size: 2 stride: 2", "CUDNN"),
                               [numpy.ones((1, 1, 4, 4))])
    forward(layer, bottom, top)
    assert fake_cudnn.launches == []


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, rtol, atol", [(numpy.float64, 1e-12, 1e-12),
                                               (numpy.float32, 1e-5, 1e-6)])
@pytest.mark.parametrize("shape,body", POOL_CASES)
def test_cudnn_pooling_matches_caffe_engine(shape, body, dtype, rtol, atol):
    x = numpy.random.default_rng(23).standard_normal(shape).astype(dtype)
    runs = []
    backend.use_gpu()
    try:
        for engine in ("CAFFE", "CUDNN"):
            layer, bottom, top = build(pool_text(body, engine), [x], dtype=dtype,
                                       xp=backend.cupy)
            y = forward(layer, bottom, top)[0]
            top[0].diff[...] = backend.cupy.asarray(
                numpy.random.default_rng(24).standard_normal(top[0].shape).astype(dtype))
            layer.backward(top, [True], bottom)
            runs.append([y, backend.to_numpy(bottom[0].diff)])
    finally:
        backend.use_cpu()
    for got, want in zip(runs[1], runs[0]):
        numpy.testing.assert_allclose(got, want, rtol=rtol, atol=atol)


# --- LRN -------------------------------------------------------------------------------------------
def lrn_text(body, engine=None, name="n"):
    extra = f" engine: {engine}" if engine else ""
    return f'name: "{name}" type: "LRN" lrn_param {{ {body}{extra} }}'


def test_lrn_engine_follows_caffes_factory():
    ch = cudnn.choose_lrn_engine
    assert ch("DEFAULT", "ACROSS_CHANNELS", 5, 1.0, 0.75, True, numpy.float32) == ("CUDNN", None)
    assert ch("DEFAULT", "ACROSS_CHANNELS", 17, 1.0, 0.75, True, numpy.float32) == ("CAFFE", None)
    engine, note = ch("CUDNN", "ACROSS_CHANNELS", 17, 1.0, 0.75, True, numpy.float32)
    assert engine == "CAFFE" and "local_size 17" in note
    assert ch("CUDNN", "ACROSS_CHANNELS", 5, 0.0, 0.75, True, numpy.float32)[0] == "CAFFE"
    assert ch("CUDNN", "ACROSS_CHANNELS", 5, 1.0, 0.001, True, numpy.float32)[0] == "CAFFE"
    engine, note = ch("CUDNN", "WITHIN_CHANNEL", 5, 1.0, 0.75, True, numpy.float32)
    assert engine == "CAFFE" and "WITHIN_CHANNEL" in note
    assert ch("DEFAULT", "WITHIN_CHANNEL", 5, 1.0, 0.75, True, numpy.float32) == ("CAFFE", None)
    engine, note = ch("CUDNN", "ACROSS_CHANNELS", 5, 1.0, 0.75, False, numpy.float32)
    assert engine == "CAFFE" and "lrn_param.engine CUDNN" in note
    assert ch("CAFFE", "ACROSS_CHANNELS", 5, 1.0, 0.75, True, numpy.float32) == ("CAFFE", None)


LRN_CASES = [((2, 7, 4, 5), "local_size: 5 alpha: 0.0001 beta: 0.75"),
             ((1, 3, 3, 3), "local_size: 3 alpha: 2.0 beta: 0.5 k: 2.0"),
             ((2, 4, 3, 2), "local_size: 9 alpha: 0.5 beta: 1.25 k: 0.5"),
             ((1, 4, 5, 5), "local_size: 3 alpha: 0.5 norm_region: WITHIN_CHANNEL")]


@pytest.mark.parametrize("shape,body", LRN_CASES)
def test_lrn_binding_matches_caffe_engine_on_an_emulated_library(fake_cudnn, shape, body):
    x = numpy.random.default_rng(31).standard_normal(shape)
    runs = []
    for engine in ("CAFFE", "CUDNN"):
        layer, bottom, top = build(lrn_text(body, engine), [x])
        y = forward(layer, bottom, top)[0].copy()
        top[0].diff[...] = numpy.random.default_rng(32).standard_normal(top[0].shape)
        layer.backward(top, [True], bottom)
        runs.append([y, bottom[0].diff.copy()])
    for got, want in zip(runs[1], runs[0]):
        numpy.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    across = "WITHIN_CHANNEL" not in body
    assert fake_cudnn.launches == (["lrn_forward", "lrn_backward"] if across else [])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, rtol, atol", [(numpy.float64, 1e-10, 1e-12),
                                               (numpy.float32, 1e-4, 1e-5)])
@pytest.mark.parametrize("shape,body", LRN_CASES)
def test_cudnn_lrn_matches_caffe_engine(shape, body, dtype, rtol, atol):
    x = numpy.random.default_rng(33).standard_normal(shape).astype(dtype)
    runs = []
    backend.use_gpu()
    try:
        for engine in ("CAFFE", "CUDNN"):
            layer, bottom, top = build(lrn_text(body, engine), [x], dtype=dtype, xp=backend.cupy)
            y = forward(layer, bottom, top)[0]
            top[0].diff[...] = backend.cupy.asarray(
                numpy.random.default_rng(34).standard_normal(top[0].shape).astype(dtype))
            layer.backward(top, [True], bottom)
            runs.append([y, backend.to_numpy(bottom[0].diff)])
    finally:
        backend.use_cpu()
    for got, want in zip(runs[1], runs[0]):
        numpy.testing.assert_allclose(got, want, rtol=rtol, atol=atol)
