"""Shared pieces of the rank programs: start-up and the independent ml_dtypes fp8 reference.

The reference does fp8 arithmetic the way the spec defines it -- widen to float32, add, round to
nearest even at 8 bits (ml_dtypes.float8_e5m2), saturate to +-57344 instead of Inf -- with no
code from comm/.
"""
import os
import sys

import ml_dtypes
import numpy

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

E5M2 = ml_dtypes.float8_e5m2


def start(standin=False):
    """World of this job with the abort hook installed (a failed assert ends every rank).
    ``standin``: CuPy is the stand-in device (tests/device_standin), put in place before
    caffe8 is imported."""
    if standin:
        from tests.device_standin import install
        install()
    from caffe8.comm.mpi import get_world, install_excepthook
    world = get_world()
    install_excepthook(world)
    return world


def saturate(codes):
    """ml_dtypes overflows to +-Inf (0x7C/0xFC); the spec saturates to +-57344 (0x7B/0xFB)."""
    codes = codes.copy()
    codes[(codes & 0x7F) == 0x7C] -= 1
    return codes


def to_fp8(x):
    """float32 -> fp8 codes, round to nearest even, saturating."""
    return saturate(numpy.asarray(x, numpy.float32).astype(E5M2).view(numpy.uint8))


def from_fp8(codes):
    return codes.view(E5M2).astype(numpy.float32)


def fp8_add(a, b):
    """Reference of one application of the FP8_SUM op."""
    return to_fp8(from_fp8(a) + from_fp8(b))


def random_fp8(rng, n):
    """fp8 codes of float32 values spread over the format's range, some near saturation."""
    x = rng.standard_normal(n).astype(numpy.float32) * numpy.float32(2.0) ** rng.integers(
        -14, 16, n).astype(numpy.float32)
    return to_fp8(x)


def ranks_agree(world, array):
    """True on every rank when all ranks hold the same bytes."""
    return len(set(world.comm.allgather(array.tobytes()))) == 1


def done(world, name):
    world.comm.Barrier()
    if world.rank == 0:
        print(f"{name}: OK", flush=True)


# --- APS: the small-format rank-order sum, independently of comm/ ------------------------------

def format_table(name):
    """(finite non-negative values ascending, their codes) of an APS format: from ml_dtypes'
    bit patterns, E3M0 (no ml_dtypes type) listed by hand: code e holds 2**(e - 3), 0 holds 0."""
    if name == "E3M0":
        return numpy.array([0.0] + [2.0 ** (e - 3) for e in range(1, 7)]), numpy.arange(7)
    dtype = {"E5M2": E5M2, "E4M3": ml_dtypes.float8_e4m3fn,
             "E4M3_APS": ml_dtypes.float8_e4m3}[name]
    codes = numpy.arange(128, dtype=numpy.uint8)
    values = codes.view(dtype).astype(numpy.float64)
    keep = numpy.isfinite(values)
    order = numpy.argsort(values[keep])
    return values[keep][order], codes[keep][order].astype(numpy.int64)


def round_to_table(x, table):
    """float64 array -> nearest table value, ties to the even code, saturating at +-max."""
    values, codes = table
    a = numpy.abs(x)
    i = numpy.clip(numpy.searchsorted(values, a), 1, len(values) - 1)
    lo, hi = values[i - 1], values[i]
    down, up = a - lo, hi - a
    r = numpy.where(down < up, lo, numpy.where(up < down, hi,
                                                numpy.where(codes[i - 1] % 2 == 0, lo, hi)))
    r = numpy.where(a >= values[-1], values[-1], r)
    return numpy.where(x < 0, -r, r)


def small_sum_reference(rows, name, kahan):
    """The rows (values of format ``name``) summed in order, every addition rounded to the
    format; Kahan's y, t and compensation rounded too."""
    table = format_table(name)
    s = numpy.zeros(numpy.shape(rows[0]))
    c = numpy.zeros_like(s)
    for x in rows:
        x = numpy.asarray(x, numpy.float64)
        if kahan:
            y = round_to_table(x - c, table)
            t = round_to_table(s + y, table)
            c = round_to_table(round_to_table(t - s, table) - y, table)
            s = t
        else:
            s = round_to_table(s + x, table)
    return s
