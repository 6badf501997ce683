"""Caffe's ``Datum`` (LMDB records) and ``BlobProto`` mean files, through the protobuf library.

The messages come from ``engine/proto/caffe.proto`` (``caffe_pb2``), so the bytes are what
Caffe's ``SerializeToString`` writes (fields in number order; Datum's ``float_data`` unpacked, as
caffe.proto declares it; BlobProto's ``data`` packed) and parsing accepts packed and unpacked
repeated fields and skips unknown ones, as protobuf parsers do. Errors name the record or file.
"""
import os
from dataclasses import dataclass, field

import numpy

from caffe8.engine.errors import DataError, relative_to_cwd
from caffe8.engine.proto import caffe_pb2
from caffe8.engine.proto.blobs import array_to_blob, blob_to_array, encode_varint  # noqa: F401


def _parse(message, buf, where, what):
    try:
        message.ParseFromString(bytes(buf))
    except Exception as e:  # protobuf's DecodeError, or an error of the C extension
        raise DataError(f"{where}: not a valid {what} record: it is truncated or a field runs "
                        f"past its end ({e})") from None
    return message


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
    """Serialise a Datum; fields given as ``None`` are left unset (proto2 has-bits)."""
    d = caffe_pb2.Datum()
    for name, v in (("channels", channels), ("height", height), ("width", width),
                    ("label", label)):
        if v is not None:
            setattr(d, name, int(v))
    if data is not None:
        d.data = bytes(data)
    if float_data is not None:
        d.float_data.extend(numpy.asarray(float_data, dtype=numpy.float32).ravel().tolist())
    if encoded is not None:
        d.encoded = bool(encoded)
    return d.SerializeToString()


def decode_datum(buf, where="<datum>"):
    """Parse a serialised Datum (``where`` names the record in errors)."""
    pb = _parse(caffe_pb2.Datum(), buf, where, "Datum")
    return Datum(channels=pb.channels, height=pb.height, width=pb.width, data=pb.data,
                 label=pb.label, float_data=numpy.array(pb.float_data, dtype=numpy.float32),
                 encoded=pb.encoded, has_label=pb.HasField("label"))


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
    a = numpy.asarray(array, dtype=numpy.float32)
    return array_to_blob(a, caffe_pb2.BlobProto(), legacy_4d=legacy_4d).SerializeToString()


def decode_blob_proto(buf, where="<BlobProto>"):
    """Parse a BlobProto into a float32 array of its shape (``shape`` or legacy 4-D)."""
    blob = _parse(caffe_pb2.BlobProto(), buf, where, "BlobProto")
    return blob_to_array(blob, where).astype(numpy.float32, copy=False)


def read_mean_file(path):
    """The mean image of a ``.binaryproto`` file as a float32 (C, H, W) array."""
    if not os.path.isfile(path):
        raise DataError(f"mean_file '{path}' does not exist{relative_to_cwd(path)}")
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
