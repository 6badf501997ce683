"""Gradient codecs: how a float32 gradient becomes a wire buffer and back (SPEC §3.2-3.3, §3.7).

A codec is separate from the algorithm that moves the bytes (comm/allreduce.py), in the manner of
Horovod's compressors: ``compress(grad, plan) -> (wire, ctx)`` and ``decompress(wire, ctx, out)``,
plus ``between_stages(piece, ctx)`` for the hierarchical sum's step between the intra-node and
the inter-node sums. Every codec returns the MEAN gradient over all P processes.

``plan`` (:class:`TensorPlan`) says what the algorithm will do with the wire buffer: the number
of addends in each stage (P', P/P' for the hierarchical sum; P, 1 for single-stage algorithms),
the padding granularity, the communicator (for the fp8 scale's MAX-allreduce), the iteration,
the tensor's key and its weights W (for the ratio D = grad / (|W| + eps)).

Registry: ``create_codec(name, **options)``; names in ``CODECS``.
"""
import time
from dataclasses import dataclass

import numpy

from engine import backend
from engine.registry import registrar
from comm.ops import padded_length, wire_op
from comm.quantile import QuantileTracker

FP8_MAX = 57344.0
CODECS = {}


register_codec = registrar(CODECS, "codec", "name")


def create_codec(name, **options):
    """Instantiate codec ``name`` with its options (e.g. ``relative=True`` for fp8)."""
    if name not in CODECS:
        raise ValueError(f"Unrecognized codec: {name!r}, valid: " + ", ".join(sorted(CODECS)))
    return CODECS[name](**options)


@dataclass
class TensorPlan:
    """What the exchange knows about one tensor's trip (see the module docstring)."""
    stages: tuple          # (addends before between_stages, addends after); product = P
    parts: int             # wire length must be a multiple of wire.unit * parts
    comm: object = None    # communicator of the whole job (None: single process)
    key: object = None     # stable id of the tensor (e.g. its slice bounds)
    weight: object = None  # W (same shape as grad) for relative codecs
    iteration: int = 0

    @property
    def processes(self):
        return self.stages[0] * self.stages[1]


def _host_float32(x):
    return numpy.ascontiguousarray(backend.to_numpy(x).ravel(), dtype=numpy.float32)


class Codec:
    """Base: ``wire`` names the comm.ops wire format; ``preferred_algorithm`` the default
    transport when the solver does not name one (None: decided by ``comm.hierarchical``)."""
    wire_name = None
    preferred_algorithm = None
    # Running totals for the timing log: scale estimation and device<->host copies (the copies
    # are synchronous, so they include waiting for the kernels that produce their data).
    quantile_seconds = 0.0
    d2h_seconds = 0.0
    h2d_seconds = 0.0

    def to_host(self, x, out=None):
        """``x`` (numpy or cupy) as a flat host array (into ``out`` when given); times the copy."""
        if isinstance(x, numpy.ndarray):
            flat = x.ravel()
            if out is None:
                return flat
            out[...] = flat
            return out
        t = time.perf_counter()
        if out is None:
            out = backend.to_numpy(x).ravel()
        else:
            x.ravel().get(out=out)
        self.d2h_seconds += time.perf_counter() - t
        return out

    def write_back(self, out, values):
        """Copy host ``values`` (flat) into ``out`` (numpy or cupy, any shape) in place."""
        if isinstance(out, numpy.ndarray):
            out[...] = values.reshape(out.shape)
            return
        t = time.perf_counter()
        out[...] = backend.to_device(values.reshape(out.shape), like=out)
        self.h2d_seconds += time.perf_counter() - t

    @property
    def wire(self):
        return wire_op(self.wire_name)

    between_stages = None  # only codecs whose stages need rescaling define it

    def wire_buffer(self, plan, n):
        """The tensor's padded wire buffer, kept from one iteration to the next.

        Fresh buffers of tens of MB cost page faults on every call. The padding stays zero:
        encoders write only ``[:n]`` and the sums add zeros to zeros there. The buffer is free
        again once ``decompress`` has read it (the exchange runs both on one thread).
        """
        if not hasattr(self, "_buffers"):
            self._buffers = {}
        length = padded_length(n, self.wire.unit, plan.parts)
        buf = self._buffers.get(plan.key)
        if buf is None or buf.size != length or plan.key is None:
            buf = backend.host_buffer(length, self.wire.dtype)
            if plan.key is not None:
                self._buffers[plan.key] = buf
        return buf


@register_codec("fp32")
class Float32Codec(Codec):
    """float32 with MPI_SUM; the mean is taken after the sum (the Caffe/MPI baseline)."""
    wire_name = "fp32"
    preferred_algorithm = "flat"

    def __init__(self, **_):
        pass

    def compress(self, grad, plan):
        wire = self.wire_buffer(plan, grad.size)
        self.to_host(grad, wire[:grad.size])
        return wire, (grad.size, plan.processes)

    def decompress(self, wire, ctx, out):
        n, p = ctx
        self.write_back(out, wire[:n] / numpy.float32(p))


@register_codec("fp16")
class HalfCodec(Codec):
    """float16 with the half user op; divides by P before casting down, as PyTorch's fp16 hook
    does, so the sum cannot overflow where the mean does not."""
    wire_name = "fp16"

    def __init__(self, **_):
        pass

    def compress(self, grad, plan):
        wire = self.wire_buffer(plan, grad.size)
        host = self.to_host(grad).astype(numpy.float32, copy=False) / numpy.float32(plan.processes)
        wire[:grad.size] = host.astype(numpy.float16).view(numpy.uint16)
        return wire, grad.size

    def decompress(self, wire, ctx, out):
        self.write_back(out, wire[:ctx].view(numpy.float16).astype(numpy.float32))


@dataclass
class _Fp8Context:
    n: int
    q: float
    nodes: int
    weight: object


@register_codec("fp8")
class Fp8Codec(Codec):
    """The seed's method: fp8 (E5M2) of D x 57344 / q / P', /(P/P') between the stages,
    x q / 57344 after; D = grad / (|W| + eps) when ``relative`` else grad.

    Conversions are comm.kernels' ``encode_fp8``/``decode_fp8`` (float32 multiply by the scale,
    then fp8 with ``rounding`` "nearest" | "truncate", saturating: never Inf); with ``relative``
    on the host, ``encode_ratio_fp8``/``decode_ratio_fp8`` do the ratio in the same pass (SPEC §4),
    with the bits of the NumPy float32 sequence. q comes from a :class:`QuantileTracker`.
    """
    wire_name = "fp8"

    def __init__(self, relative=True, epsilon=1e-5, rounding="nearest", quantile=0.95,
                 quantile_interval=100, samples=1024, seed=0, rank=0, shared_seed=True, **_):
        if rounding not in ("nearest", "truncate", "seed"):
            raise ValueError(f"comm.rounding: {rounding!r}, valid: nearest, truncate, seed")
        self.relative, self.epsilon, self.rounding = relative, epsilon, rounding
        self.tracker = QuantileTracker(quantile, quantile_interval, samples, seed, rank,
                                       shared_seed)

    @property
    def quantile_interval(self):
        """N: iterations between two estimates of q (the trainer logs quantile time over N)."""
        return self.tracker.interval

    @property
    def wire(self):
        # rounding "seed" also sums as Oyama et al.'s Algorithm 2 (the op truncates)
        return wire_op(self.wire_name, self.rounding)

    def ratio(self, grad, weight):
        """D = grad / (|W| + eps) (elementwise, on grad's device), or grad when not relative."""
        if not self.relative:
            return grad
        xp = backend.get_array_module(grad)
        return grad / (xp.abs(weight) + xp.float32(self.epsilon))

    def compress(self, grad, plan):
        from comm import kernels
        key = plan.key
        if self.tracker.due(key, plan.iteration):
            t = time.perf_counter()
            self.tracker.update(key, self.ratio(grad, plan.weight), plan.comm, plan.iteration)
            self.quantile_seconds += time.perf_counter() - t
        q = self.tracker.get(key)
        # float32(D * scale) then fp8, fused in the kernel; scale is rounded to float32 once.
        scale = float(numpy.float32(FP8_MAX / q / plan.stages[0]))
        wire = self.wire_buffer(plan, grad.size)
        xp = backend.get_array_module(grad)
        if xp is numpy:
            weight = _fused_weight(self.relative, grad, plan.weight)
            if weight is not None:
                # SPEC §4 on the host: ratio, scale and fp8 in one pass, no float32 temporaries
                kernels.encode_ratio_fp8(_host_float32(grad), weight, self._eps32, scale,
                                         wire[:grad.size], self.rounding)
            else:
                kernels.encode_fp8(_host_float32(self.ratio(grad, plan.weight)),
                                   wire[:grad.size], scale, self.rounding)
        else:
            # SPEC §4: ratio, scale and fp8 in one fused kernel on the device; only the bytes
            # cross to (pinned) host memory.
            from comm import fp8
            codes = fp8.encode_ratio(grad, plan.weight, self.epsilon, scale, self.rounding) \
                if self.relative else fp8.encode(grad * xp.float32(scale), self.rounding)
            self.to_host(codes, wire[:grad.size])
        return wire, _Fp8Context(grad.size, q, plan.stages[1], plan.weight)

    def between_stages(self, piece, ctx):
        """Multiply an intra-node partial sum by float32(1 / nodes), in place (fp8 -> fp8)."""
        from comm import kernels
        values = kernels.decode_fp8(piece, numpy.empty(piece.size, numpy.float32))
        kernels.encode_fp8(values, piece, float(numpy.float32(1.0 / ctx.nodes)), self.rounding)

    def decompress(self, wire, ctx, out):
        from comm import kernels
        inv_scale = float(numpy.float32(ctx.q / FP8_MAX))
        xp = backend.get_array_module(out)
        if xp is not numpy:
            from comm import fp8
            t = time.perf_counter()
            codes = xp.asarray(wire[:ctx.n]).reshape(out.shape)
            self.h2d_seconds += time.perf_counter() - t
            out[...] = fp8.decode_ratio(codes, ctx.weight, self.epsilon, inv_scale) \
                if self.relative else fp8.decode(codes) * xp.float32(inv_scale)
            return
        weight = _fused_weight(self.relative, out, ctx.weight)
        if weight is not None:
            # (decode * inv_scale) * (|W| + eps) in one pass, straight into ``out`` when it is a
            # plain float32 array (write_back would copy the same values there)
            if out.dtype == numpy.float32 and out.flags.c_contiguous \
                    and not numpy.may_share_memory(out, weight):
                kernels.decode_ratio_fp8(wire[:ctx.n], weight, self._eps32, inv_scale,
                                         out.reshape(-1))
            else:
                self.write_back(out, kernels.decode_ratio_fp8(
                    wire[:ctx.n], weight, self._eps32, inv_scale,
                    numpy.empty(ctx.n, numpy.float32)))
            return
        d = kernels.decode_fp8(wire[:ctx.n], numpy.empty(ctx.n, numpy.float32), inv_scale)
        if self.relative:
            w = _host_float32(ctx.weight)
            d *= numpy.abs(w) + numpy.float32(self.epsilon)
        self.write_back(out, d)

    @property
    def _eps32(self):
        return float(numpy.float32(self.epsilon))


def _fused_weight(relative, x, weight):
    """W as a flat float32 host array when the fused ratio kernels give exactly the bits of the
    NumPy sequence for ``x`` (a float32 host array with W of the same size and dtype), else None
    (then the codec takes the NumPy ratio + conversion kernel route)."""
    if not (relative and isinstance(x, numpy.ndarray) and isinstance(weight, numpy.ndarray)):
        return None
    if x.dtype != numpy.float32 or weight.dtype != numpy.float32 or weight.size != x.size:
        return None
    return _host_float32(weight)
