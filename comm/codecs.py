"""Gradient codecs: one protocol and one registry for every way a gradient travels.

As Horovod's compressors, a codec is separate from the transport that moves its bytes
(comm/allreduce.py). Per tensor and iteration the exchange (comm/exchange.py) runs:

``device_stat(grad, t)`` (compute side)
    a statistic the ranks must agree on before encoding, or None, left where grad lives: the
    compute thread only launches its kernels. The fp8 codec's quantile estimate on the
    iterations it refreshes q; APS' peak |g| every iteration.
``host_stat(stat)`` (communication side)
    the number to agree on (the one read of the device), e.g. APS' exponent of the peak.
    ``local_stat(grad, t)`` is the two in one, for callers outside the exchange.
``agree(t, value)`` (communication side)
    the MAX over ranks of ``host_stat``, handed back to the codec.
``encode(grad, t) -> (payload, ctx)`` (on grad's device)
    sum codecs write into ``t.out``, the tensor's span of a zero-padded wire buffer (dtype
    ``wire.dtype``, length grad.size) that the transport sums in place; gather codecs return
    any 1-D payload.
the reduction (communication side, on the host)
    ``reduction = "sum"``: the transport sums the payloads with the codec's wire op
    (``wire_name``: an MPI op registered in comm/ops.py); ``"gather"``: every rank receives every
    rank's payload, in rank order.
``decode(reduced, ctx, out)`` (on out's device)
    writes the MEAN gradient over the P processes into ``out``; ``reduced`` is the summed payload
    (sum codecs) or the list of the P payloads (gather codecs).

A codec is one class: its steps above as methods, each one call whatever the device (the fp8
codec's kernels choose their device in comm/fp8.py), and ``details()``, the settings it was made
with as the log line ``Gradient exchange: ...`` names them (caffe8/wiring.exchange_summary).
Codecs read their settings from the solver's parsed ``comm`` block (defaults: the schema);
``create_codec(name, comm, rank)`` instantiates one, ``CODECS`` lists them all.
"""
from dataclasses import dataclass

import numpy

from caffe8.engine import backend
from caffe8.engine.errors import SolverError
from caffe8.engine.glog import fmt
from caffe8.engine.registry import registrar
from caffe8.comm import fp8, kernels
from caffe8.comm.aps import NO_EXPONENT, ApsCompressor, local_peak, peak_exponent
from caffe8.comm.dettmers import DettmersCompressor
from caffe8.comm.ops import wire_op
from caffe8.comm.quantile import QuantileTracker, device_quantile
from caffe8.comm.strom import StromCompressor, scatter_words

CODECS = {}
register_codec = registrar(CODECS, "codec", "name")


def create_codec(name, comm, rank=0):
    """Codec ``name`` configured from ``comm`` (a parsed CommParameter) for process ``rank``."""
    if name not in CODECS:
        raise SolverError(f"Unrecognized codec: {name!r}, valid: " + ", ".join(sorted(CODECS)))
    return CODECS[name](comm, rank)


@dataclass
class Tensor:
    """What a codec knows about one tensor's trip (see the module docstring)."""
    key: tuple             # (start, stop) in the net's flat buffers: a stable id
    weight: object         # W, same shape and device as the gradient
    iteration: int
    processes: int         # P
    stages: tuple          # addends before the transport's between-stages step, and after
    out: object = None     # sum codecs: the wire buffer to encode into (gradient's device)


class Codec:
    """Base of the protocol (module docstring); codecs without an agreement inherit its no-op."""
    name = None
    reduction = "sum"
    wire_name = None
    between_stages = None          # fn(piece, ctx): only codecs whose stages need rescaling
    varying = False                # gather codecs: payload lengths differ between ranks
    quantile_interval = 1          # iterations between two range estimates (timing: 1/N each)

    def __init__(self, comm, rank=0):
        self.rank = rank

    def device_stat(self, grad, t):
        return None

    def host_stat(self, stat):
        return float(stat)

    def local_stat(self, grad, t):
        stat = self.device_stat(grad, t)
        return None if stat is None else self.host_stat(stat)

    def agree(self, t, value):
        pass

    @property
    def wire(self):
        return wire_op(self.wire_name)

    def state(self):
        """JSON-able state an exact resume needs (see the exchange's ``state``)."""
        return {}

    def restore(self, state):
        pass

    def bind(self, keys):
        """The keys of every tensor the exchange will send (codecs that treat some differently)."""

    def details(self):
        """The settings this codec was made with, as the exchange's log line names them, e.g.
        ``["ratio", "q=0.95"]`` (none for a codec without settings)."""
        return []


def _xp(a):
    return backend.get_array_module(a)


@register_codec("fp32")
class Float32Codec(Codec):
    """float32 sum; the mean is taken after the sum (the Caffe/MPI baseline). Summed by the
    explicit schedule like every sum codec (``algorithm: "flat"`` asks for MPI_Allreduce with
    MPI_SUM, Oyama et al.'s float baseline): it moves the same bytes, ran at 90 % of a 10 Gbit/s
    link where MPI_Allreduce reached 78 % (docs/BENCHMARKS.md, emulated cluster), and its sum
    order is fixed rather than whatever algorithm MPICH picks from call to call."""
    wire_name = "fp32"

    def encode(self, grad, t):
        wire = t.out
        wire[...] = grad.ravel()
        return wire, t.processes

    def decode(self, wire, processes, out):
        xp = _xp(wire)
        if out.dtype == numpy.float32 and out.flags.c_contiguous:    # in place: no temporary
            xp.divide(wire, xp.float32(processes), out=out.reshape(-1))
        else:
            out[...] = (wire / xp.float32(processes)).reshape(out.shape)


@register_codec("fp16")
class HalfCodec(Codec):
    """float16 with the half user op; divides by P before casting down, as PyTorch's fp16 hook
    does, so the sum cannot overflow where the mean does not."""
    wire_name = "fp16"

    def encode(self, grad, t):
        xp = _xp(grad)
        wire = t.out
        if isinstance(grad, numpy.ndarray) and grad.dtype == numpy.float32:
            kernels.encode_half(numpy.ascontiguousarray(grad).reshape(-1), wire,
                                float(t.processes))
            return wire, None
        scaled = grad.ravel().astype(xp.float32, copy=False) / xp.float32(t.processes)
        wire[...] = scaled.astype(xp.float16).view(xp.uint16)
        return wire, None

    def decode(self, wire, ctx, out):
        if isinstance(out, numpy.ndarray) and out.dtype == numpy.float32 and \
                out.flags.c_contiguous:
            kernels.decode_half(wire, out.reshape(-1))
            return
        out[...] = wire.view(_xp(wire).float16).astype(out.dtype).reshape(out.shape)


@dataclass
class _Fp8Context:
    q: float
    nodes: int
    weight: object


@register_codec("fp8")
class Fp8Codec(Codec):
    """Oyama et al.'s method: fp8 (E5M2) of D x 57344 / q / P', /(P/P') between the stages,
    x q / 57344 after; D = grad / (|W| + eps) when ``relative`` else grad. With one process per
    node (P' = 1) there is no intra-node sum, and the /(P/P') is folded into the encode's scale:
    one rounding instead of two, and no pass over the tensor while the link waits.

    Host arrays use comm.kernels' fused ratio/scale/convert passes, device arrays the fused CUDA
    kernels of comm.fp8 (the same float32 operations, so the same bits). q comes from a
    :class:`QuantileTracker` refreshed every ``quantile_interval`` iterations, agreed as the MAX
    over ranks.
    """
    wire_name = "fp8"

    def __init__(self, comm, rank=0):
        super().__init__(comm, rank)
        kernels.check_rounding(comm.rounding, "comm.rounding")
        self.relative, self.epsilon, self.rounding = comm.relative, comm.epsilon, comm.rounding
        self._between_tables = {}
        self.tracker = QuantileTracker(comm.quantile, comm.quantile_interval, comm.samples,
                                       seed=0, rank=rank,
                                       shared_seed=comm.quantile_positions == "shared")

    @property
    def quantile_interval(self):
        return self.tracker.interval

    def details(self):
        rounding = [] if self.rounding == "nearest" else [f"{self.rounding} rounding"]
        return ["ratio" if self.relative else "absolute", f"q={fmt(self.tracker.quantile)}"] + \
            rounding

    @property
    def wire(self):
        # rounding "oyama" also sums as Oyama et al.'s Algorithm 2 (the op truncates)
        return wire_op(self.wire_name, self.rounding)

    def ratio(self, grad, weight):
        """D = grad / (|W| + eps) (elementwise, on grad's device), or grad when not relative."""
        if not self.relative:
            return grad
        xp = _xp(grad)
        return grad / (xp.abs(weight) + xp.float32(self.epsilon))

    def device_stat(self, grad, t):
        """The quantile of |D| on the refresh iterations, left on grad's device: D computed at
        the tracker's sampled positions only (the encode computes it over the whole tensor)."""
        if not self.tracker.due(t.key, t.iteration):
            return None
        g, w = self.tracker.sample(t.key, t.iteration, grad.ravel(), t.weight.ravel())
        return device_quantile(self.ratio(g, w), self.tracker.quantile) if g.size else 0.0

    def host_stat(self, stat):
        return self.tracker.finite(float(stat))

    def agree(self, t, value):
        self.tracker.store(t.key, value)

    def encode(self, grad, t):
        q = self.tracker.get(t.key)
        # float32(D * scale) then fp8, fused in the kernel; scale is rounded to float32 once.
        # With one process per node the intra-node sum is the identity, so the division by
        # the node count that Oyama et al. apply between the stages is applied here, in the
        # one rounding of the encode, instead of decoding and rounding a second time on the
        # communication thread while the link waits (ctx.nodes = 1: nothing left between).
        folded = t.stages[0] == 1
        per = t.stages[0] * t.stages[1] if folded else t.stages[0]
        scale = float(numpy.float32(kernels.FP8_MAX / q / per))
        wire = t.out
        # ratio, scale and fp8 in one fused kernel into the wire (only bytes cross the bus), or
        # float32(float32(grad) * scale): float64 nets too, on either device
        if self.relative:
            fp8.encode_ratio(grad.ravel(), t.weight.ravel(), self.epsilon, scale, self.rounding,
                             out=wire)
        else:
            fp8.encode_scaled(grad.ravel(), scale, self.rounding, out=wire)
        return wire, _Fp8Context(q, 1 if folded else t.stages[1], t.weight)

    def between_stages(self, piece, ctx):
        """Multiply an intra-node partial sum by float32(1 / nodes), in place (fp8 -> fp8). Every
        code maps to one code, so the decode, multiply and re-encode are tabulated once per node
        count (with the very conversions of the encode) and applied in one pass and one C call:
        on the communication thread, while the link waits for it."""
        if ctx.nodes == 1:
            return
        table = self._between_tables.get(ctx.nodes)
        if table is None:
            codes = numpy.arange(256, dtype=numpy.uint8)
            values = kernels.decode_fp8(codes, numpy.empty(256, numpy.float32))
            table = kernels.encode_fp8(values, numpy.empty(256, numpy.uint8),
                                       float(numpy.float32(1.0 / ctx.nodes)), self.rounding)
            self._between_tables[ctx.nodes] = table
        kernels.fp8_map(table, piece)

    def decode(self, wire, ctx, out):
        inv_scale = float(numpy.float32(ctx.q / kernels.FP8_MAX))
        codes = wire.reshape(out.shape)
        if self.relative:
            fp8.decode_ratio(codes, ctx.weight.reshape(out.shape), self.epsilon, inv_scale,
                             out=out)
        else:
            fp8.decode_scaled(codes, inv_scale, out=out)

    def state(self):
        return {"quantiles": [[int(k[0]), int(k[1]), float(q)]
                              for k, q in self.tracker.values.items()]}

    def restore(self, state):
        self.tracker.values = {(a, b): q for a, b, q in state.get("quantiles", [])}


@register_codec("aps")
class ApsCodec(Codec):
    """Auto Precision Scaling (comm/aps.py): the ranks agree on the largest exponent, each sends
    its tensor scaled by the same power of two in a small float (``aps_format``), and every rank
    sums the gathered values in rank order in that small format, rounding after every addition
    (``kahan``: compensated, the compensation in the small format too).

    Hybrid precision: ``fp32_iters`` = K sends float32 for iterations < K; ``fp32_layers`` = N
    sends the last N parameter tensors (the largest offsets in the net's parameter buffer, i.e.
    the net's parameter order) as float32 always. The exchange tells the codec every tensor's
    key with :meth:`bind`."""
    reduction = "gather"

    def __init__(self, comm, rank=0):
        super().__init__(comm, rank)
        self.fp32_layers = comm.fp32_layers
        self.format_name = comm.aps_format
        self.impl = ApsCompressor(comm.aps_format, comm.kahan, fp32_iters=comm.fp32_iters)
        self.exponents = {}

    def details(self):
        return [self.format_name + (", Kahan" if self.impl.kahan else "")]

    def bind(self, keys):
        self.impl.fp32_layers = frozenset(sorted(keys)[max(0, len(keys) - self.fp32_layers):]
                                          if self.fp32_layers else ())

    def device_stat(self, grad, t):
        if self.impl.full_precision(t.iteration, t.key):
            return None                      # float32: no scale, so no exponent to agree on
        return local_peak(grad)

    def host_stat(self, stat):
        return float(peak_exponent(float(stat)))

    def agree(self, t, value):
        self.exponents[t.key] = int(value)

    def encode(self, grad, t):
        payload, (k, _, _) = self.impl.compress(grad, self.exponents.get(t.key, NO_EXPONENT),
                                                t.processes, iteration=t.iteration, name=t.key)
        return payload, (k, grad.size, t.processes)

    def decode(self, rows, ctx, out):
        k, n, processes = ctx
        values = [self.impl.values(row, k, n) for row in rows]          # rank order
        total = self.impl.sum(values, k)
        out[...] = (self.impl.unscale(total, k) / numpy.float32(processes)).reshape(out.shape)


@register_codec("dettmers")
class DettmersCodec(Codec):
    """Dettmers' 8-bit data types (comm/dettmers.py): codes normalised by the tensor's peak,
    the peak's float32 bits appended, every rank decoding and summing all ranks in rank order."""
    reduction = "gather"

    def __init__(self, comm, rank=0):
        super().__init__(comm, rank)
        self.impl = DettmersCompressor(comm.dettmers_type)

    def details(self):
        return [self.impl.kind]

    def encode(self, grad, t):
        xp = _xp(grad)
        codes, (scale, _) = self.impl.compress(grad)
        peak = xp.asarray(scale, xp.float32).reshape(1).view(xp.uint8)   # no host read
        return xp.concatenate([codes.ravel(), peak]), (grad.size, t.processes)

    def decode(self, rows, ctx, out):
        n, processes = ctx
        xp = _xp(out)
        total = xp.zeros(n, xp.float32)
        for row in rows:                       # rank order: the same sum on every rank
            scale = numpy.float32(backend.to_numpy(row[n:]).view(numpy.float32)[0])
            total += self.impl.table.decode(row[:n]) * scale
        out[...] = (total / numpy.float32(processes)).reshape(out.shape)


@register_codec("strom")
class StromCodec(Codec):
    """Strom's threshold quantisation with residuals (comm/strom.py): each rank sends the
    indices of its +-tau updates; every rank scatters all of them in rank order."""
    reduction = "gather"
    varying = True

    def __init__(self, comm, rank=0):
        super().__init__(comm, rank)
        self.impl = StromCompressor(comm.strom_tau)
        self.tau = comm.strom_tau

    def details(self):
        return [f"tau={fmt(self.tau)}"]

    def encode(self, grad, t):
        words, _ = self.impl.compress(grad, t.key)
        return words, (grad.size, t.processes)

    def decode(self, rows, ctx, out):
        n, processes = ctx
        xp = _xp(out)
        total = xp.zeros(n, xp.float32)
        for row in rows:                       # rank order
            scatter_words(total, row, self.impl.tau)
        out[...] = (total / numpy.float32(processes)).reshape(out.shape)
