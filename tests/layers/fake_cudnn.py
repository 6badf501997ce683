"""A host emulation of the cuDNN C API entry points the binding calls, for CPU tests of
layers.cudnn and the layer engines on it (``fake_cudnn`` fixture)."""
import ctypes
import itertools
import threading

import numpy
import pytest

from caffe8.engine import backend
from caffe8.layers import cudnn, cudnn_conv


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

    def cudnnGetErrorString(self, status):
        return b"CUDNN_STATUS_EMULATED_ERROR"

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
    """Route the binding to a fresh ``FakeCudnn``: host arrays pass as device arrays, the
    algorithm cache, handles and find workspaces start empty, TF32 is off."""
    fake = FakeCudnn()
    monkeypatch.setattr(cudnn, "library", lambda: fake)
    monkeypatch.setattr(cudnn, "_lib", fake)
    monkeypatch.setattr(cudnn, "algorithms", cudnn.AlgorithmCache(cudnn._search))
    monkeypatch.setattr(cudnn, "_handles", threading.local())
    monkeypatch.setattr(cudnn_conv, "_find_workspaces", {})
    monkeypatch.setattr(cudnn, "device_ptr", lambda a: ctypes.c_void_p(a.ctypes.data))
    monkeypatch.setattr(backend, "is_device_array", lambda a: True)
    monkeypatch.setattr(backend, "cuda_device_id", lambda: 0)
    monkeypatch.setattr(backend, "cuda_stream_ptr", lambda: 4242)
    monkeypatch.setattr(backend, "device_workspace", lambda n: numpy.empty(max(n, 1), numpy.uint8))
    monkeypatch.setattr(backend, "_tf32", False)
    monkeypatch.setattr(backend, "cuda_compute_capability", lambda: (9, 0))
    return fake
