"""Caffe's ``Datum`` and ``BlobProto`` in the protobuf *binary* wire format, written by hand.

No protobuf dependency: the two messages are small and fixed (caffe.proto, proto2):

* ``Datum``: channels(1, int32), height(2), width(3), data(4, bytes), label(5, int32),
  float_data[](6, float; not packed in caffe.proto), encoded(7, bool).
* ``BlobProto``: num(1)/channels(2)/height(3)/width(4) (legacy 4-D, int32), data[](5, float,
  packed), diff[](6, packed), shape(7, BlobShape{dim[](1, int64, packed)}), double_data[](8),
  double_diff[](9).

Wire format: every field is ``key = field_number << 3 | wire_type`` (a varint) followed by a
varint (type 0), 8 bytes (type 1), a varint length plus that many bytes (type 2) or 4 bytes
(type 5), all little-endian. Encoders write fields in field-number order, as protobuf does, so
the bytes equal what Caffe's ``SerializeToString`` writes; decoders accept packed and unpacked
repeated fields and skip unknown fields, as protobuf parsers must.
"""
import os
from dataclasses import dataclass, field

import numpy

from engine.errors import DataError

VARINT, FIXED64, LENGTH, FIXED32 = 0, 1, 2, 5


# --- wire primitives ----------------------------------------------------------------------------
def encode_varint(value):
    """Base-128 varint of a non-negative int, or of a negative int as its 64-bit two's complement
    (how protobuf writes negative int32/int64: always 10 bytes)."""
    if value < 0:
        value += 1 << 64
    out = bytearray()
    while True:
        low = value & 0x7F
        value >>= 7
        if value:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def _key(number, wire_type):
    return encode_varint(number << 3 | wire_type)


def _varint_field(number, value):
    return _key(number, VARINT) + encode_varint(int(value))


def _bytes_field(number, payload):
    return _key(number, LENGTH) + encode_varint(len(payload)) + bytes(payload)


def _read_varint(buf, pos, where):
    result, shift = 0, 0
    while True:
        if pos >= len(buf):
            raise DataError(f"{where}: truncated protobuf varint at byte {pos}")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift >= 70:
            raise DataError(f"{where}: malformed protobuf varint ending at byte {pos}")


def _as_int32(v):
    """A decoded varint as a signed 32-bit value: protobuf keeps the low 32 bits of an int32
    (negatives arrive sign-extended to 64 bits)."""
    v &= 0xFFFFFFFF
    return v - (1 << 32) if v >= 1 << 31 else v


def iter_fields(buf, where="<bytes>"):
    """Yield ``(field_number, wire_type, value)``: ints for varints, ``bytes`` otherwise."""
    buf = memoryview(buf).cast("B")
    pos, n = 0, len(buf)
    while pos < n:
        key, pos = _read_varint(buf, pos, where)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise DataError(f"{where}: invalid protobuf field number 0 at byte {pos}")
        if wire == VARINT:
            value, pos = _read_varint(buf, pos, where)
        elif wire in (FIXED64, FIXED32, LENGTH):
            if wire == LENGTH:
                size, pos = _read_varint(buf, pos, where)
            else:
                size = 8 if wire == FIXED64 else 4
            if pos + size > n:
                raise DataError(f"{where}: field {number} runs past the end of the record "
                                f"({pos + size} > {n} bytes)")
            value, pos = bytes(buf[pos:pos + size]), pos + size
        else:
            raise DataError(f"{where}: unsupported protobuf wire type {wire} (field {number})")
        yield number, wire, value


def _repeated_numbers(chunks, dtype, where, name):
    """Join packed (LENGTH) and unpacked (fixed) pieces of a repeated float/double field."""
    dtype = numpy.dtype(dtype).newbyteorder("<")
    parts = []
    for wire, value in chunks:
        if len(value) % dtype.itemsize:
            raise DataError(f"{where}: field '{name}' has {len(value)} bytes, not a multiple of "
                            f"{dtype.itemsize}")
        parts.append(numpy.frombuffer(value, dtype=dtype))
    if not parts:
        return numpy.zeros(0, dtype=dtype.newbyteorder("="))
    return numpy.concatenate(parts).astype(dtype.newbyteorder("="))


# --- Datum ----------------------------------------------------------------------------------------
@dataclass
class Datum:
    """One record of a Caffe LMDB. ``data`` holds raw uint8 pixels (C×H×W order) or, when
    ``encoded``, a whole JPEG/PNG file; ``float_data`` holds float pixels instead of ``data``."""
    channels: int = 0
    height: int = 0
    width: int = 0
    data: bytes = b""
    label: int = 0
    float_data: numpy.ndarray = field(default_factory=lambda: numpy.zeros(0, numpy.float32))
    encoded: bool = False
    has_label: bool = True


def encode_datum(channels=0, height=0, width=0, data=None, label=None, float_data=None,
                 encoded=None):
    """Serialise a Datum; fields given as ``None`` are left unset (proto2 has-bits).

    ``float_data`` is written unpacked (one fixed32 per value), as caffe.proto declares it.
    """
    out = bytearray()
    for number, v in ((1, channels), (2, height), (3, width)):
        if v is not None:
            out += _varint_field(number, v)
    if data is not None:
        out += _bytes_field(4, data)
    if label is not None:
        out += _varint_field(5, label)
    if float_data is not None:
        for v in numpy.asarray(float_data, dtype="<f4").ravel():
            out += _key(6, FIXED32) + v.tobytes()
    if encoded is not None:
        out += _varint_field(7, bool(encoded))
    return bytes(out)


def decode_datum(buf, where="<datum>"):
    """Parse a serialised Datum (``where`` names the record in errors)."""
    d = Datum(has_label=False)
    floats = []
    for number, wire, value in iter_fields(buf, where):
        if number in (1, 2, 3, 5, 7) and wire != VARINT:
            raise DataError(f"{where}: Datum field {number} has wire type {wire}, expected varint")
        if number == 1:
            d.channels = _as_int32(value)
        elif number == 2:
            d.height = _as_int32(value)
        elif number == 3:
            d.width = _as_int32(value)
        elif number == 4:
            d.data = value
        elif number == 5:
            d.label, d.has_label = _as_int32(value), True
        elif number == 6:
            floats.append((wire, value))
        elif number == 7:
            d.encoded = bool(value)
    d.float_data = _repeated_numbers(floats, "f4", where, "float_data")
    return d


def datum_to_array(d, where="<datum>"):
    """(C, H, W) pixels of a raw (not encoded) Datum: uint8 from ``data`` or float32 from
    ``float_data``."""
    if d.encoded:
        raise DataError(f"{where}: Datum is encoded; decode it as an image")
    shape = (d.channels, d.height, d.width)
    count = d.channels * d.height * d.width
    if len(d.data):
        values = numpy.frombuffer(d.data, dtype=numpy.uint8)
    else:
        values = d.float_data
    if values.size != count:
        raise DataError(f"{where}: Datum holds {values.size} values but channels×height×width "
                        f"= {d.channels}×{d.height}×{d.width} = {count}")
    return values.reshape(shape)


# --- BlobProto ------------------------------------------------------------------------------------
def encode_blob_proto(array, legacy_4d=False):
    """Serialise ``array`` as a BlobProto with packed float ``data``.

    ``legacy_4d`` writes num/channels/height/width (as Caffe's compute_image_mean does, shape
    padded on the left with 1s to four axes) instead of ``shape``.
    """
    a = numpy.asarray(array, dtype="<f4")
    out = bytearray()
    if legacy_4d:
        if a.ndim > 4:
            raise ValueError(f"legacy BlobProto holds at most 4 axes, got shape {a.shape}")
        dims = (1,) * (4 - a.ndim) + a.shape
        for number, v in zip((1, 2, 3, 4), dims):
            out += _varint_field(number, v)
    out += _bytes_field(5, a.ravel().tobytes())
    if not legacy_4d:
        dims = b"".join(encode_varint(int(s)) for s in a.shape)
        out += _bytes_field(7, _bytes_field(1, dims) if a.shape else b"")
    return bytes(out)


def _blob_shape(payload, where):
    dims = []
    for number, wire, value in iter_fields(payload, where):
        if number != 1:
            continue
        if wire == VARINT:
            dims.append(value)
        else:  # packed int64 varints
            pos, buf = 0, memoryview(value).cast("B")
            while pos < len(buf):
                v, pos = _read_varint(buf, pos, where)
                dims.append(v)
    return tuple(int(d) for d in dims)


def decode_blob_proto(buf, where="<BlobProto>"):
    """Parse a BlobProto into a float32 array of its shape (``shape`` or legacy 4-D)."""
    legacy = {}
    chunks = {5: [], 8: []}
    shape = None
    for number, wire, value in iter_fields(buf, where):
        if number in (1, 2, 3, 4) and wire == VARINT:
            legacy[number] = _as_int32(value)
        elif number in chunks:
            chunks[number].append((wire, value))
        elif number == 7 and wire == LENGTH:
            shape = _blob_shape(value, where)
    data = _repeated_numbers(chunks[5], "f4", where, "data")
    if not data.size and chunks[8]:
        data = _repeated_numbers(chunks[8], "f8", where, "double_data").astype(numpy.float32)
    if shape is None:
        shape = tuple(legacy.get(n, 0) for n in (1, 2, 3, 4)) if legacy else (data.size,)
    count = int(numpy.prod(shape, dtype=numpy.int64))
    if count != data.size:
        raise DataError(f"{where}: BlobProto shape {shape} needs {count} values, "
                        f"but the record holds {data.size}")
    return data.reshape(shape)


def read_mean_file(path):
    """The mean image of a ``.binaryproto`` file as a float32 (C, H, W) array."""
    if not os.path.isfile(path):
        raise DataError(f"mean_file '{path}' does not exist")
    with open(path, "rb") as f:
        mean = decode_blob_proto(f.read(), where=f"mean_file '{path}'")
    if mean.ndim == 4 and mean.shape[0] == 1:
        mean = mean[0]
    if mean.ndim != 3:
        raise DataError(f"mean_file '{path}': expected a 1×C×H×W or C×H×W blob, got shape "
                        f"{mean.shape}")
    return mean


def write_mean_file(path, mean):
    """Write a (C, H, W) mean as Caffe's compute_image_mean does (legacy 4-D BlobProto)."""
    with open(path, "wb") as f:
        f.write(encode_blob_proto(numpy.asarray(mean, dtype=numpy.float32), legacy_4d=True))
