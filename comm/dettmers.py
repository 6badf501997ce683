"""Dettmers' four 8-bit data types ("8-bit approximations for parallelism in deep learning", §3.1).

Each type is a table of representable values; a code is the value's index in the ascending table
(the paper's implementation does the same: a binary search in a sorted table of the values).
Encoding picks the nearest table value (``searchsorted`` on the midpoints between neighbours;
an exact midpoint goes to the lower value), decoding is a table lookup. The codec normalises a
tensor by its max |value| (so every type works on [-1, 1]) and sends that float32 value with
the codes (signed: see ``peak_scale``).

The four types (sign bit + 7 bits; "decade" d is the paper's exponent offset 10**d, 0 for data
normalised to [-1, 1]):

- ``"linear"`` — linear quantisation (Vanhoucke et al. 2011), the paper's "7-bit bisection tree
  on [0, 1] with no exponent": k / 127, k = -127..127 (255 values, one zero).
- ``"mantissa"`` — 3-bit decimal exponent e = 0..7 and a 4-bit integer mantissa m = 0..15
  ("the mantissa will hold values between 0 and 15"): m * 10**(d - 1 - e). Many codes coincide
  (m = 0; 10 * 10**-e = 1 * 10**(1-e)), so the table has fewer than 256 distinct values.
- ``"static_tree"`` — 3-bit decimal exponent and a 4-bit bisection tree on (0.1, 1): the 16
  midpoints of equal intervals of [0.1, 1], times 10**(d - e). 256 values, zero is not one of
  them (the nearest is +-0.128e-7 * 10**d).
- ``"dynamic_tree"`` — n leading zero bits give 10**-n, then a 1 flag bit, then 6 - n bits of
  bisection tree on (0.1, 1), n = 0..6 (the paper's smallest exponent is 10**-6); the all-zero
  code is 0. The tree values are the 2**(6-n) interval midpoints of [0.1, 1], as in Dettmers'
  later published construction (bitsandbytes' ``create_dynamic_map``), which also gives the
  spare code (the would-be -0) to +1.0 so that the max |value| itself is exact: 256 values.
  ``codebook(kind)`` lists the distinct values; at most 256, so a code fits a uint8.

The paper's worked example ("0.2345678 approximated as 0.236719 instead of 0.23125 or 0.2") does
not follow from any equal-width bisection of (0.1, 1) we could derive, so the midpoint
construction above is the definition used here (docs/dettmers_table2.md).

Rounding: ``Table.encode(x)`` picks the nearest value; ``Table.encode(x, rounding="bisection")``
does what Dettmers' GPU kernel does instead (the binary search of "8-bit approximations for
parallelism", section 3.2, in the form of the author's published kernel): a fixed number of
halving steps over the sorted magnitudes, then a choice between the last pivot and the last
pivot known to lie below |x|. The neighbour above |x| is never compared once the search has moved
up, so for about a quarter of uniform inputs the result is the second nearest value (even a
value equal to a pivot can come back as its neighbour: equality sends the search down).
"""
import numpy

from caffe8.engine import backend

KINDS = ("linear", "mantissa", "static_tree", "dynamic_tree")


def _tree_midpoints(bits):
    """Midpoints of the 2**bits equal intervals of [0.1, 1] (a ``bits``-deep bisection tree)."""
    edges = numpy.linspace(0.1, 1.0, (1 << bits) + 1)
    return (edges[:-1] + edges[1:]) / 2.0


def _positive_values(kind, decade):
    if kind == "linear":
        return numpy.arange(128) / 127.0
    if kind == "mantissa":
        # m * 10**p as one correctly rounded operation on exact integers, so that equal
        # rationals (10 * 10**-2 and 1 * 10**-1) give equal floats and merge in the table.
        m = numpy.arange(16, dtype=numpy.float64)
        powers = [decade - 1 - e for e in range(8)]
        return numpy.concatenate([m * 10.0 ** p if p >= 0 else m / 10.0 ** -p for p in powers])
    if kind == "static_tree":
        t = _tree_midpoints(4)
        return numpy.concatenate([t * 10.0 ** (decade - e) for e in range(8)])
    if kind == "dynamic_tree":
        parts = [_tree_midpoints(6 - n) * 10.0 ** (-n) for n in range(7)]
        return numpy.concatenate(parts + [[0.0]])
    raise ValueError(f"Unrecognized Dettmers data type: {kind!r}; valid: {', '.join(KINDS)}")


def codebook(kind, decade=0):
    """Sorted float64 array of the distinct representable values of ``kind`` (at most 256).

    ``decade``: exponent offset 10**decade of the exponent types (ignored by "linear" and
    "dynamic_tree", which always work on normalised data in [-1, 1]).
    """
    pos = _positive_values(kind, decade)
    values = numpy.concatenate([pos, -pos])
    if kind == "dynamic_tree":
        values = numpy.concatenate([values, [1.0]])
    return numpy.unique(values)


class Table:
    """One data type's tables on one array module: values (float64, float32) and midpoints."""

    def __init__(self, kind, decade=0):
        self.kind, self.decade = kind, decade
        self.values = codebook(kind, decade)
        self.midpoints = (self.values[1:] + self.values[:-1]) / 2.0
        self._on = {}

    def on(self, xp):
        """(midpoints float64, values float32) as arrays of module ``xp`` (cached)."""
        key = xp.__name__
        if key not in self._on:
            tables = (xp.asarray(self.midpoints), xp.asarray(self.values, xp.float32))
            if xp is not numpy:     # copied on this stream, read on every layer's: wait once
                xp.cuda.get_current_stream().synchronize()
            self._on[key] = tables
        return self._on[key]

    def encode(self, x, rounding="nearest"):
        """Float array → uint8 codes (indices of the nearest table value), same shape.

        ``rounding="bisection"``: the index the paper's binary search returns (module docstring).
        """
        xp = backend.get_array_module(x)
        if rounding == "bisection":
            return self._encode_bisection(xp.asarray(x, xp.float64), xp)
        if rounding != "nearest":
            raise ValueError(f"comm.dettmers: rounding must be 'nearest' or 'bisection', "
                             f"got {rounding!r}")
        mids, _ = self.on(xp)
        return xp.searchsorted(mids, xp.asarray(x, xp.float64), side="left").astype(xp.uint8)

    def _encode_bisection(self, x, xp):
        # Magnitudes searched in the non-negative values of the sign's side; the chosen
        # magnitude is in the table with that sign, so the final searchsorted is exact.
        values = xp.asarray(self.values)
        out = xp.empty(x.shape, xp.float64)
        neg = x < 0
        for side, sign in ((~neg, 1.0), (neg, -1.0)):
            mags = xp.sort(sign * values[sign * values >= 0])
            out[side] = sign * bisection_search(mags, xp.abs(x[side]), xp)
        return xp.searchsorted(values, out).astype(xp.uint8)

    def decode(self, codes):
        """uint8 codes → float32 table values, same shape."""
        xp = backend.get_array_module(codes)
        _, values = self.on(xp)
        return values[codes.astype(xp.intp)]


def bisection_search(table, x, xp=numpy):
    """The value of sorted ``table`` (ascending, float64) that Dettmers' kernel picks for each
    |x| in ``x``: pivots halve a power-of-two range (the table padded with +inf), the search
    tracks the last pivot below x (``lower``) and above or at x (``upper``); after the last step it
    compares the final pivot only with ``lower`` (or, if it never moved up, with ``upper``)."""
    m = int(table.shape[0])
    k = max(1, int(m).bit_length())              # 2**k - 1 >= m: every index reachable
    t = xp.concatenate([table, xp.full((1 << k) - m, xp.inf)])
    pivot = xp.full(x.shape, (1 << (k - 1)) - 1, xp.int64)
    lower = xp.zeros(x.shape, xp.int64)
    upper = xp.full(x.shape, m - 1, xp.int64)
    step = 1 << (k - 2) if k >= 2 else 0
    while step:
        up = x > t[pivot]
        lower = xp.where(up, pivot, lower)
        upper = xp.where(up, upper, pivot)
        pivot = pivot + xp.where(up, step, -step)
        step >>= 1
    tp = t[pivot]
    with numpy.errstate(invalid="ignore"):       # inf - inf never chosen
        pick_from_upper = xp.where(xp.abs(tp - x) < t[upper] - x, pivot, upper)
        pick_from_lower = xp.where(tp - x < xp.abs(t[lower] - x), pivot, lower)
    return t[xp.where(lower == pivot, pick_from_upper, pick_from_lower)]


def peak_scale(x):
    """The float32 element of largest |value|, sign included (1.0 for an all-zero or empty
    tensor). Dividing by it maps that element to +1 exactly: the dynamic tree has +1.0 but not
    -1.0, and the other tables are symmetric, so the sign costs nothing there."""
    xp = backend.get_array_module(x)
    if not x.size:
        return numpy.float32(1.0)
    if xp is numpy:
        m = float(x.ravel()[int(xp.argmax(xp.abs(x)))])
        return numpy.float32(m if m != 0 else 1.0)
    # on the device: a 0-d float32 array, computed without a host read (the same value)
    m = x.ravel()[xp.argmax(xp.abs(x))]
    return xp.where(m != 0, m, 1.0).astype(xp.float32)


class DettmersCompressor:
    """8-bit codec of one of ``KINDS``, normalised by max |value| (Horovod compressor shape).

    ``compress(tensor) -> (codes, ctx)``: codes uint8 of tensor's shape, on tensor's device;
    ctx = (float32 scale, dtype). ``decompress(codes, ctx)`` → codebook value * scale, float32
    (cast to ctx's dtype). The exchange's codec (comm/codecs.py) gathers every rank's codes and
    scale and sums the decoded values in rank order.
    """

    def __init__(self, kind):
        if kind not in KINDS:
            raise ValueError(f"Unrecognized Dettmers data type: {kind!r}; "
                             f"valid: {', '.join(KINDS)}")
        self.kind = kind
        self.table = Table(kind, decade=0)

    def compress(self, tensor):
        xp = backend.get_array_module(tensor)
        scale = peak_scale(tensor)
        # float64 division: the normalised value is rounded once, by the table search.
        codes = self.table.encode(xp.asarray(tensor, xp.float64) / xp.asarray(scale, xp.float64))
        return codes, (scale, tensor.dtype)

    def decompress(self, codes, ctx):
        scale, dtype = ctx
        return (self.table.decode(codes) * scale).astype(dtype, copy=False)
