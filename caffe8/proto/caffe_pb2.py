"""The messages of ``caffe_pb2`` a pycaffe script builds by hand, on caffe8's prototxt schema.

``BlobProto`` and ``Datum`` also read and write Caffe's binary wire format
(``ParseFromString`` / ``SerializeToString``), so mean files and LMDB records interoperate with
Caffe's. Every message prints as prototxt text (``str(msg)``). Enum values are their names.
"""
import numpy

from engine.datum import decode_blob_proto, decode_datum, encode_blob_proto, encode_datum
from engine.prototxt import Message, to_text
from engine.schema import ENUMS, SCHEMA


class _Message(Message):
    """A schema message (keyword arguments set fields) that prints as prototxt text."""

    __slots__ = ()
    _TYPE = None

    def __init__(self, **fields):
        super().__init__(self._TYPE)
        for k, v in fields.items():
            setattr(self, k, v)

    def __str__(self):
        return to_text(self)

    def CopyFrom(self, other):
        for name in SCHEMA[self._TYPE]:
            self.clear(name)
        for name in other.fields():
            setattr(self, name, getattr(other.copy(), name))


class BlobProto(_Message):
    __slots__ = ()
    _TYPE = "BlobProto"

    def SerializeToString(self):
        return encode_blob_proto(_blob_array(self))

    def ParseFromString(self, buf):
        array = decode_blob_proto(bytes(buf))
        for name in SCHEMA[self._TYPE]:
            self.clear(name)
        self.shape.dim = [int(d) for d in array.shape]
        self.data = [float(v) for v in array.ravel()]


def _blob_array(blob):
    """The float32 array a BlobProto message holds (``shape`` or legacy num/c/h/w)."""
    data = numpy.asarray(blob.data, dtype=numpy.float32)
    if blob.has("shape"):
        return data.reshape([int(d) for d in blob.shape.dim])
    return data.reshape(blob.num, blob.channels, blob.height, blob.width)


class Datum(_Message):
    __slots__ = ()
    _TYPE = "Datum"

    def SerializeToString(self):
        return encode_datum(
            channels=self.channels if self.has("channels") else None,
            height=self.height if self.has("height") else None,
            width=self.width if self.has("width") else None,
            data=bytes(self.data) if self.has("data") else None,
            label=self.label if self.has("label") else None,
            float_data=list(self.float_data) if self.float_data else None,
            encoded=self.encoded if self.has("encoded") else None)

    def ParseFromString(self, buf):
        d = decode_datum(bytes(buf))
        for name in SCHEMA[self._TYPE]:
            self.clear(name)
        self.channels, self.height, self.width = d.channels, d.height, d.width
        if len(d.data):
            self.data = bytes(d.data)
        if d.has_label:
            self.label = d.label
        if d.float_data.size:
            self.float_data = [float(v) for v in d.float_data]
        if d.encoded:
            self.encoded = True


def _message_class(type_name):
    attrs = {"__slots__": (), "_TYPE": type_name, "__module__": __name__}
    for spec in SCHEMA[type_name].values():  # nested enum values: SolverParameter.CPU
        if spec.type in ENUMS:
            attrs.update({value: value for value in ENUMS[spec.type]})
    return type(type_name, (_Message,), attrs)


NetParameter = _message_class("NetParameter")
LayerParameter = _message_class("LayerParameter")
SolverParameter = _message_class("SolverParameter")
NetState = _message_class("NetState")
BlobShape = _message_class("BlobShape")

# Enum values at module level, as caffe_pb2 has them (TRAIN, TEST, ...): their names here.
for _enum in ENUMS.values():
    for _value in _enum:
        globals().setdefault(_value, _value)
