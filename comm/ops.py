"""MPI datatypes and reduction ops for the wire formats, and padding helpers.

MPI has no 8-bit float, so fp8 travels as a 16-byte contiguous datatype (16 fp8 values, the
Oyama et al.'s 128-bit vector) reduced by a commutative user op; half travels the same way (8 values per
16-byte item) with its own op. float32 uses MPI_FLOAT and the built-in MPI_SUM.

A :class:`WireOp` bundles everything an allreduce algorithm needs to move and add one format:
the numpy dtype of the wire buffer, how many elements make one MPI item, the MPI datatype and
op, and ``local_sum(src, dst)`` -- the same arithmetic as the MPI op, for the sums that the
algorithms do themselves in a fixed order (comm/allreduce.py).

The user-op callbacks turn MPI's buffers into numpy views (no copy) and call the C kernels of
``comm.kernels`` (``fp8_sum(src, dst)``/``half_sum(src, dst)``: dst = sat(src + dst), in place,
GIL released). With the comm block's ``rounding: "oyama"`` the fp8 op is FP8_OYAMA_SUM instead,
the sum of Oyama, Nomura, Sato and Matsuoka's Algorithm 2 (truncating to fp8 after a half).
"""
import functools
from dataclasses import dataclass

import numpy

from caffe8.comm import kernels
from caffe8.comm.mpi import mpi_module

ITEM_BYTES = 16  # one MPI item: 128 bits, as in Oyama et al.'s AVX kernels
#: each wire format's element as the buffers hold it (fp8 as bytes, half as its bits): the one
#: table of wire sizes (the perf model's bytes per element too)
WIRE_DTYPES = {"fp8": numpy.dtype(numpy.uint8), "fp16": numpy.dtype(numpy.uint16),
               "fp32": numpy.dtype(numpy.float32)}


@dataclass(frozen=True)
class WireOp:
    """How one wire format is summed. ``unit`` elements of ``dtype`` make one MPI item. Its MPI
    datatype and op are made on first use (``mpi()``), so a caller whose own transport moves the
    bytes (caffe8.ddp's torch.distributed) never initialises MPI."""
    name: str
    dtype: numpy.dtype
    unit: int
    local_sum: object     # fn(src, dst): dst <- src + dst, same rounding as ``op``
    mpi: object           # fn() -> (mpi4py Datatype of one item, mpi4py Op); None without MPI

    @functools.cached_property
    def datatype(self):
        return self.mpi()[0]

    @functools.cached_property
    def op(self):
        return self.mpi()[1]

    def items(self, n):
        """Number of MPI items in ``n`` wire elements (n must be a multiple of ``unit``)."""
        if n % self.unit:
            raise ValueError(f"{self.name}: {n} elements is not a multiple of {self.unit}")
        return n // self.unit

    def spec(self, buf):
        """mpi4py buffer spec ``[buf, items, datatype]`` for a whole contiguous wire array."""
        return [buf, self.items(buf.size), self.datatype]


def fp8_local_sum(src, dst):
    """dst <- sat(src + dst) on uint8 fp8 arrays (C kernel)."""
    kernels.fp8_sum(src, dst)


def fp8_oyama_local_sum(src, dst):
    """dst <- sat(src + dst) on uint8 fp8 arrays, Algorithm 2's truncating sum (C kernel)."""
    kernels.fp8_sum(src, dst, rounding="oyama")


def half_local_sum(src, dst):
    """dst <- src + dst on uint16 views of float16 arrays (C kernel)."""
    kernels.half_sum(src, dst)


def float_local_sum(src, dst):
    """dst <- src + dst in float32 (what MPI_SUM does on MPI_FLOAT)."""
    numpy.add(src, dst, out=dst)


def _fp8_op_function(inbuf, inoutbuf, datatype):
    # Views over MPI's buffers: the op must not copy, it runs on every received chunk.
    fp8_local_sum(numpy.frombuffer(inbuf, dtype=numpy.uint8),
                  numpy.frombuffer(inoutbuf, dtype=numpy.uint8))


def _fp8_oyama_op_function(inbuf, inoutbuf, datatype):
    fp8_oyama_local_sum(numpy.frombuffer(inbuf, dtype=numpy.uint8),
                       numpy.frombuffer(inoutbuf, dtype=numpy.uint8))


def _half_op_function(inbuf, inoutbuf, datatype):
    half_local_sum(numpy.frombuffer(inbuf, dtype=numpy.uint16),
                   numpy.frombuffer(inoutbuf, dtype=numpy.uint16))


_cache = {}


def item_datatype():
    """The committed 16-byte contiguous datatype (MPI.BYTE x 16) shared by fp8 and half."""
    if "item" not in _cache:
        MPI = mpi_module()
        _cache["item"] = MPI.BYTE.Create_contiguous(ITEM_BYTES).Commit() if MPI else None
    return _cache["item"]


def _user_op(name, function):
    key = "op:" + name
    if key not in _cache:
        MPI = mpi_module()
        _cache[key] = MPI.Op.Create(function, commute=True) if MPI else None
    return _cache[key]


def fp8_sum_op():
    """FP8_SUM: commutative user op over :func:`item_datatype` (16 fp8 values per item)."""
    return _user_op("fp8", _fp8_op_function)


def fp8_oyama_sum_op():
    """FP8_OYAMA_SUM: as :func:`fp8_sum_op` with Algorithm 2's truncating sum."""
    return _user_op("fp8_oyama", _fp8_oyama_op_function)


def half_sum_op():
    """HALF_SUM: commutative user op over :func:`item_datatype` (8 float16 values per item)."""
    return _user_op("half", _half_op_function)


def local_sum(name, rounding="nearest"):
    """``WireOp.local_sum`` of wire format ``name`` ("fp8", "fp16" or "fp32"), without creating
    any MPI object; ``rounding`` as in :func:`wire_op`."""
    _check_wire(name)
    if name == "fp8":
        return fp8_oyama_local_sum if rounding == "oyama" else fp8_local_sum
    return {"fp16": half_local_sum, "fp32": float_local_sum}[name]


def _check_wire(name):
    if name not in WIRE_DTYPES:
        raise ValueError(f"Unrecognized wire format: {name!r}, valid: {', '.join(WIRE_DTYPES)}")


def _float_mpi():
    MPI = mpi_module()
    return (MPI.FLOAT, MPI.SUM) if MPI else (None, None)


def wire_op(name, rounding="nearest"):
    """The :class:`WireOp` for "fp8", "fp16" or "fp32" (MPI objects created on first use).

    ``rounding`` (the comm block's) matters only for fp8: "oyama" selects Algorithm 2's
    truncating sum; "nearest" and "truncate" (a conversion mode) sum to nearest even.
    """
    _check_wire(name)
    oyama = name == "fp8" and rounding == "oyama"
    key = "wire:" + name + (":oyama" if oyama else "")
    if key in _cache:
        return _cache[key]
    dtype, add = WIRE_DTYPES[name], local_sum(name, rounding)
    if name == "fp32":
        w = WireOp(name, dtype, 1, add, _float_mpi)
    else:
        op = {"fp8": fp8_oyama_sum_op if oyama else fp8_sum_op, "fp16": half_sum_op}[name]
        w = WireOp(name, dtype, ITEM_BYTES // dtype.itemsize, add,
                   lambda: (item_datatype(), op()))
    _cache[key] = w
    return w


def padded_length(n, unit, parts):
    """Smallest multiple of ``unit * parts`` that is >= n (0 stays 0).

    ``parts`` is the number of pieces the algorithm splits a vector into (P for the explicit
    schedules, since the hierarchical sum splits by P' inside the node and by P/P' across
    nodes), so every piece is a whole number of MPI items.
    """
    step = unit * parts
    return -(-n // step) * step
