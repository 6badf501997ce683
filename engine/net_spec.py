"""pycaffe's ``caffe.NetSpec``, ``caffe.layers`` (``L``) and ``caffe.params`` (``P``).

    n = caffe.NetSpec()
    n.data, n.label = L.Data(source="train_lmdb", backend=P.Data.LMDB, batch_size=64, ntop=2)
    n.ip = L.InnerProduct(n.data, num_output=10, weight_filler=dict(type="xavier"))
    n.loss = L.SoftmaxWithLoss(n.ip, n.label)
    open("net.prototxt", "w").write(str(n.to_proto()))

``to_proto()`` returns a ``caffe_pb2.NetParameter``. A keyword goes to the layer's own parameter message when that message has the field
(``num_output`` → ``inner_product_param``), else to LayerParameter (``param``, ``include``,
``loss_weight`` ...); ``*_param`` keywords name the message directly. Dicts fill sub-messages,
lists of dicts repeated ones. Layers are named after the NetSpec attribute of their first top;
unnamed tops get the layer type and a counter (``Convolution1``).
"""
from collections import Counter, OrderedDict

from caffe8.engine.errors import CaffeError
from caffe8.engine.proto.convert import to_pb
from caffe8.engine.prototxt import Message
from caffe8.engine.schema import ENUMS, SCHEMA
from caffe8.engine.validate import validate


class SpecTypeError(CaffeError, TypeError):
    """A value of the wrong Python type given to a layer function or a NetSpec: a TypeError, as
    pycaffe raises, and a CaffeError (one clear line from the tools)."""


def _param_fields():
    """Layer type → the LayerParameter field holding its parameters (``InnerProduct`` →
    ``inner_product_param``), read from the schema's ``<Type>Parameter`` message names."""
    out = {}
    for name, spec in SCHEMA["LayerParameter"].items():
        if name.endswith("_param") and spec.is_message and spec.type.endswith("Parameter"):
            out[spec.type[:-len("Parameter")]] = name
    return out


def _enum_value(spec, value, where):
    """An enum field's value as its name (pycaffe passes the integers, e.g. caffe.TEST = 1)."""
    names = ENUMS[spec.type]
    if isinstance(value, str) and value in names:
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        for k, v in names.items():
            if v == value:
                return k
    raise CaffeError(f"{where}: {value!r} is not a value of {spec.type} ({', '.join(names)})")


def _scalar(spec, value, where):
    if spec.type in ENUMS:
        return _enum_value(spec, value, where)
    if spec.type in ("float", "double"):
        return float(value)
    if spec.type == "bool":
        return bool(value)
    if spec.type in ("string", "bytes"):
        return str(value)
    return int(value)


def assign_proto(msg, name, value, where=None):
    """Set field ``name`` of ``msg`` from a Python value (dicts fill sub-messages, lists
    repeated fields), as pycaffe's ``assign_proto``."""
    where = where or f"{msg.type_name}.{name}"
    specs = SCHEMA[msg.type_name]
    if name not in specs:
        raise CaffeError(f"{where}: {msg.type_name} has no field '{name}'")
    spec = specs[name]
    values = value if isinstance(value, (list, tuple)) else [value]
    if spec.repeated:
        items = []
        for v in values:
            items.append(_message(spec.type, v, where) if spec.is_message else
                         _scalar(spec, v, where))
        setattr(msg, name, list(getattr(msg, name)) + items)
    elif spec.is_message:
        sub = getattr(msg, name)
        if not isinstance(value, dict):
            raise SpecTypeError(f"{where}: {spec.type} is set from a dict, got {value!r}")
        for k, v in value.items():
            assign_proto(sub, k, v, f"{where}.{k}")
        setattr(msg, name, sub)
    else:
        if isinstance(value, (list, tuple)):
            raise SpecTypeError(f"{where}: not a repeated field, got a list")
        setattr(msg, name, _scalar(spec, value, where))


def _message(type_name, value, where):
    if isinstance(value, Message):
        return value.copy()
    if hasattr(value, "DESCRIPTOR"):  # a caffe_pb2 message
        from caffe8.engine.proto.convert import from_pb
        return from_pb(value, where)
    if not isinstance(value, dict):
        raise SpecTypeError(f"{where}: {type_name} is set from a dict, got {value!r}")
    msg = Message(type_name)
    for k, v in value.items():
        assign_proto(msg, k, v, f"{where}.{k}")
    return msg


class Top:
    """One output of a layer function (what ``L.Type(...)`` returns)."""

    def __init__(self, fn, n):
        self.fn, self.n = fn, n

    def to_proto(self):
        """A NetParameter holding this top's layer and everything it depends on."""
        return to_proto(self)

    def _to_proto(self, layers, names, autonames):
        return self.fn._to_proto(layers, names, autonames)


class Function:
    """A layer to be: type, bottom Tops and parameters; ``ntop`` tops (0 for none)."""

    def __init__(self, type_name, inputs, params):
        self.type_name = type_name
        for i, inp in enumerate(inputs):
            if not isinstance(inp, Top):
                # pycaffe's words, which its tests match exactly
                raise SpecTypeError(f"{type_name} input {i} is not a Top (type is {type(inp)})")
        self.inputs = list(inputs)
        self.params = dict(params)
        self.ntop = self.params.pop("ntop", 1)
        self.in_place = self.params.pop("in_place", False)
        if self.in_place and self.ntop != len(self.inputs):
            raise CaffeError(f"L.{type_name}: in_place needs as many tops as bottoms")
        self.tops = tuple(Top(self, n) for n in range(self.ntop))

    def _get_name(self, names, autonames):
        if self not in names and self.ntop > 0:
            names[self] = self._get_top_name(self.tops[0], names, autonames)
        elif self not in names:
            autonames[self.type_name] += 1
            names[self] = f"{self.type_name}{autonames[self.type_name]}"
        return names[self]

    def _get_top_name(self, top, names, autonames):
        if top not in names:
            autonames[top.fn.type_name] += 1
            names[top] = f"{top.fn.type_name}{autonames[top.fn.type_name]}"
        return names[top]

    def _to_proto(self, layers, names, autonames):
        if self in layers:
            return
        bottoms = []
        for inp in self.inputs:
            inp._to_proto(layers, names, autonames)
            bottoms.append(layers[inp.fn].top[inp.n])
        layer = Message("LayerParameter")
        layer.type = self.type_name
        layer.bottom = bottoms
        if self.in_place:
            layer.top = list(bottoms)
        else:
            layer.top = [self._get_top_name(t, names, autonames) for t in self.tops]
        params = dict(self.params)
        layer.name = str(params.pop("name", None) or self._get_name(names, autonames))
        own = _param_fields().get(self.type_name)
        for k, v in params.items():
            where = f"L.{self.type_name}({k}=...)"
            if k.endswith("param") or own is None or k not in SCHEMA[SCHEMA["LayerParameter"][own].type]:
                assign_proto(layer, k, v, where)
            else:
                assign_proto(getattr(layer, own), k, v, where)
                setattr(layer, own, getattr(layer, own))
        layers[self] = layer


def _net(layers):
    """The caffe_pb2 NetParameter of the built layers (``str()`` is its prototxt), checked
    against the schema as a parsed file is (``engine.validate``): a bad value fails here."""
    net = Message("NetParameter")
    net.layer = list(layers.values())
    return to_pb(validate(net))


def to_proto(*tops):
    """A NetParameter holding the layers the given tops depend on."""
    layers = OrderedDict()
    autonames = Counter()
    for top in tops:
        top.fn._to_proto(layers, {}, autonames)
    return _net(layers)


class NetSpec:
    """Tops assigned as attributes (or items) name the blobs and layers; ``to_proto()``."""

    def __init__(self):
        super().__setattr__("tops", OrderedDict())

    def __setattr__(self, name, value):
        # a Function is a layer without tops (``L.Silence(n.acc, ntop=0)``): the name is its own
        if not isinstance(value, (Top, Function)):
            raise SpecTypeError(f"NetSpec.{name}: assign a layer's top (L.Type(...)) or a "
                                f"layer with ntop=0, got {type(value).__name__}")
        self.tops[name] = value

    def __getattr__(self, name):
        try:
            return self.tops[name]
        except KeyError:
            raise AttributeError(f"NetSpec has no top '{name}'") from None

    def __setitem__(self, key, value):
        self.__setattr__(key, value)

    def __getitem__(self, item):
        return self.__getattr__(item)

    def __delattr__(self, name):
        del self.tops[name]

    def keys(self):
        return list(self.tops)

    def to_proto(self):
        names = {v: k for k, v in self.tops.items()}
        autonames = Counter()
        layers = OrderedDict()
        for top in self.tops.values():
            top._to_proto(layers, names, autonames)
        return _net(layers)


class Layers:
    """``L.Type(*bottoms, **params)`` → a Top (or a tuple of ``ntop`` Tops, or the Function
    when ``ntop=0``)."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)

        def layer_fn(*args, **kwargs):
            fn = Function(name, args, kwargs)
            if fn.ntop == 0:
                return fn
            if fn.ntop == 1:
                return fn.tops[0]
            return fn.tops
        return layer_fn


class _EnumValues:
    """``P.Pooling.MAX``: the enum numbers of ``<Type>Parameter`` (caffe_pb2's values)."""

    def __init__(self, type_name, message):
        self._type, self._message = type_name, message

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        for spec in SCHEMA[self._message].values():
            if spec.type in ENUMS and name in ENUMS[spec.type]:
                return ENUMS[spec.type][name]
        raise AttributeError(f"P.{self._type} has no enum value '{name}'")


class Parameters:
    """``P.Pooling.MAX``, ``P.Data.LMDB`` ...: enum values by layer type."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        message = f"{name}Parameter"
        if message not in SCHEMA:
            raise AttributeError(f"no parameter message {message} (P.{name})")
        return _EnumValues(name, message)


layers = Layers()
params = Parameters()
