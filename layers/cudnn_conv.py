"""Convolution on cuDNN (Caffe's ``CuDNNConvolutionLayer``): engine choice and execution.

``convolution_param.engine`` DEFAULT means cuDNN when the arrays are CuPy arrays and the
library loads, else the im2col + GEMM path of ``layers.conv`` (CAFFE, also the test reference).
CUDNN asked for where it cannot run (CPU arrays, no library, more than 3 spatial axes, an
unsupported dtype) falls back to CAFFE with a one-time log note. Weight and bias diffs
accumulate (beta = 1), bottom diffs are overwritten (beta = 0), as in Caffe.
"""
import weakref

import numpy

from caffe8.engine import backend
from caffe8.layers import cudnn
from caffe8.layers.cudnn import (BACKWARD_DATA, BACKWARD_FILTER, FORWARD, ConvolutionDescriptor,
                          FilterDescriptor, Geometry, TensorDescriptor, math_type)

NOTE_CPU = cudnn.cpu_note("convolution_param", "Convolution")


def choose_engine(requested, on_device, num_spatial, dtype, lib_error=None):
    """``(engine, note)``: "CUDNN" or "CAFFE", and the line to log once when a request for
    cuDNN cannot be honoured (None when nothing needs saying). ``lib_error`` is
    ``cudnn.library_error()``, only consulted for device arrays."""
    if requested == "CAFFE":
        return "CAFFE", None
    explicit = requested == "CUDNN"
    if not on_device:
        return "CAFFE", NOTE_CPU if explicit else None
    if lib_error is not None:
        return "CAFFE", f"cuDNN unavailable, Convolution layers use the CAFFE engine: {lib_error}"
    if not 1 <= num_spatial <= 3:
        return "CAFFE", (f"cuDNN convolutions take 1 to 3 spatial axes; a {num_spatial}-axis "
                         f"Convolution uses the CAFFE engine") if explicit else None
    if cudnn.data_type(dtype) is None:
        return "CAFFE", (f"cuDNN has no {numpy.dtype(dtype)} convolution; using the CAFFE "
                         f"engine") if explicit else None
    return "CUDNN", None


_engine_of = weakref.WeakKeyDictionary()


def wants(layer, array):
    """True when ``layer`` (a ConvolutionLayer) runs on cuDNN for ``array``'s module (decided
    once per layer and module; the library is only loaded for device arrays)."""
    def decide(on_device):
        requested = layer.layer_param.convolution_param.engine
        lib_error = cudnn.library_error() if on_device and requested != "CAFFE" else None
        return choose_engine(requested, on_device, layer.num_spatial, array.dtype, lib_error)
    return cudnn.engine_for(_engine_of, layer, array, decide) == "CUDNN"


class _Plan:
    """Descriptors for one (layer, input shape, dtype): x/w/y/bias and one convolution
    descriptor per operation (each carries the math type of its chosen algorithm)."""

    def __init__(self, geometry, dtype):
        self.geometry = geometry
        self.dtype = numpy.dtype(dtype)
        self.x_desc = TensorDescriptor(geometry.x, dtype)
        self.y_desc = TensorDescriptor(geometry.y, dtype)
        self.b_desc = TensorDescriptor(geometry.bias, dtype)
        self.w_desc = FilterDescriptor(geometry.w, dtype)
        math = math_type(dtype, backend.tf32_enabled())
        self.conv = {op: ConvolutionDescriptor(geometry, dtype, math)
                     for op in (FORWARD, BACKWARD_DATA, BACKWARD_FILTER)}
        self.chosen = {}

    def candidates(self, op, buffers):
        """op's usable algorithms, best first (shared through the algorithm cache)."""
        return cudnn.algorithms.get(op, backend.cuda_device_id(), self.dtype, self.geometry,
                                    backend.tf32_enabled(), cudnn.search_mode(), self, buffers)

    def algorithm(self, op, buffers):
        """``(algo, workspace bytes, math type)``: the best candidate not rejected."""
        candidates = self.candidates(op, buffers)
        if not candidates:
            raise cudnn.CudnnError(f"every cuDNN {op} algorithm for x {self.geometry.x}, "
                                   f"w {self.geometry.w} failed when run")
        chosen = candidates[0]
        if self.chosen.get(op) != chosen:  # first use, a TF32 switch or a retry: retune
            self.conv[op].set_math(chosen[2])
            self.chosen[op] = chosen
        return chosen

    def reject(self, op, buffers, chosen):
        """Drop ``chosen``, which failed when run, so the next candidate is used."""
        candidates = self.candidates(op, buffers)
        if chosen in candidates:
            candidates.remove(chosen)

    @staticmethod
    def find_workspace(limit):
        """The workspace the find mode benchmarks in: one per GPU, shared by every plan (the
        searches run one at a time). A plan that kept its own until its backward had chosen
        held one per convolution at a net's first forward (1 GiB each by default: ~59 GiB for
        GoogLeNet)."""
        device = backend.cuda_device_id()
        ws = _find_workspaces.get(device)
        if ws is None or ws.size < max(limit, 1):
            _find_workspaces[device] = None           # the old one goes before the new comes
            ws = _find_workspaces[device] = backend.device_workspace(limit)
        return ws


#: GPU -> the find mode's workspace (``_Plan.find_workspace``)
_find_workspaces = {}


_plans = weakref.WeakKeyDictionary()


def _plan(layer, x_shape, dtype):
    per_layer = _plans.setdefault(layer, {})
    key = (tuple(x_shape), numpy.dtype(dtype).str)
    plan = per_layer.get(key)
    if plan is None:
        geometry = Geometry(x_shape, layer.blobs[0].data.shape, layer.pad, layer.stride,
                            layer.dilation, layer.group)
        plan = per_layer[key] = _Plan(geometry, dtype)
    return plan


def chosen_algorithms(layer):
    """``{operation: (algo, workspace bytes, math type)}`` the cuDNN plans of ``layer`` (a
    Convolution or Deconvolution layer) run with: what a profile prints beside each layer's time
    (scripts/peer_bench.py --profile --layers); empty before its first cuDNN run."""
    out = {}
    for plan in _plans.get(layer, {}).values():
        out.update(plan.chosen)
    return out


def _run(op, plan, buffers, *args):
    """Run op with the best candidate; one that fails as not supported or out of memory (before
    writing anything) is dropped and the next one runs (``cudnn.retryable``)."""
    name = {FORWARD: "cudnnConvolutionForward", BACKWARD_DATA: "cudnnConvolutionBackwardData",
            BACKWARD_FILTER: "cudnnConvolutionBackwardFilter"}[op]
    # every operation takes (alpha, in-desc, in, in-desc, in) before the convolution descriptor
    # and algorithm, then (beta, out-desc, out) after the workspace
    pre, post = args[:5], args[5:]
    while True:
        chosen = plan.algorithm(op, buffers)
        algo, ws_size, _ = chosen
        try:
            ws = backend.device_workspace(ws_size)
            cudnn.call(name, cudnn.handle(), *pre, plan.conv[op].ptr, algo, cudnn.device_ptr(ws),
                       ws_size, *post)
            return
        except Exception as e:
            if not cudnn.retryable(e):
                raise
            backend.note_once(f"cuDNN {op} algorithm {algo} failed for x {plan.geometry.x} "
                              f"({e}); using the next candidate")
            plan.reject(op, buffers, chosen)


def forward(layer, bottom, top):
    """top = conv(bottom, W) + b on cuDNN, for every bottom/top pair (shared weights)."""
    w = layer.blobs[0].data
    xp = backend.get_array_module(w)
    one, zero = cudnn.scaling(w.dtype)
    w = cudnn.contiguous(xp, w)
    for b, t in zip(bottom, top):
        x = cudnn.contiguous(xp, b.data)
        plan = _plan(layer, x.shape, x.dtype)
        y = t.data if t.data.flags.c_contiguous else xp.empty_like(t.data)
        _run(FORWARD, plan, (x, w, y), one, plan.x_desc.ptr, cudnn.device_ptr(x),
             plan.w_desc.ptr, cudnn.device_ptr(w), zero, plan.y_desc.ptr, cudnn.device_ptr(y))
        if len(layer.blobs) > 1:
            bias = cudnn.contiguous(xp, layer.blobs[1].data)
            cudnn.call("cudnnAddTensor", cudnn.handle(), one, plan.b_desc.ptr,
                       cudnn.device_ptr(bias), one, plan.y_desc.ptr, cudnn.device_ptr(y))
        if y is not t.data:
            t.data[...] = y


def backward(layer, top, propagate_down, bottom):
    """Caffe's semantics on cuDNN: weight and bias diffs accumulate (beta = 1), bottom diffs are
    overwritten (beta = 0)."""
    w_blob = layer.blobs[0]
    xp = backend.get_array_module(w_blob.data)
    one, zero = cudnn.scaling(w_blob.data.dtype)
    want_w = layer.param_propagate_down[0]
    want_b = len(layer.blobs) > 1 and layer.param_propagate_down[1]
    w = cudnn.contiguous(xp, w_blob.data)
    for i, (t, b) in enumerate(zip(top, bottom)):
        want_x = bool(propagate_down[i]) if i < len(propagate_down) else False
        if not (want_w or want_b or want_x):
            continue
        x = cudnn.contiguous(xp, b.data)
        dy = cudnn.contiguous(xp, t.diff)
        plan = _plan(layer, x.shape, x.dtype)
        if want_b:
            db = layer.blobs[1].diff
            acc = db if db.flags.c_contiguous else xp.ascontiguousarray(db)
            cudnn.call("cudnnConvolutionBackwardBias", cudnn.handle(), one, plan.y_desc.ptr,
                       cudnn.device_ptr(dy), one, plan.b_desc.ptr, cudnn.device_ptr(acc))
            if acc is not db:
                db[...] = acc
        if want_w:
            dw = w_blob.diff
            acc = dw if dw.flags.c_contiguous else xp.ascontiguousarray(dw)
            _run(BACKWARD_FILTER, plan, (x, w, dy), one, plan.x_desc.ptr, cudnn.device_ptr(x),
                 plan.y_desc.ptr, cudnn.device_ptr(dy), one, plan.w_desc.ptr, cudnn.device_ptr(acc))
            if acc is not dw:
                dw[...] = acc
        if want_x:
            dx = b.diff if b.diff.flags.c_contiguous else xp.empty_like(x)
            _run(BACKWARD_DATA, plan, (x, w, dy), one, plan.w_desc.ptr, cudnn.device_ptr(w),
                 plan.y_desc.ptr, cudnn.device_ptr(dy), zero, plan.x_desc.ptr, cudnn.device_ptr(dx))
            if dx is not b.diff:
                b.diff[...] = dx

