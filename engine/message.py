"""``Message``: a protobuf message of Caffe's schema (``engine.schema``) as caffe8 holds it.

Attribute access gives the value if set, else the field's default (``[]`` for repeated fields, an
empty default ``Message`` for message fields); ``msg.has(name)`` tells whether a field was set;
``msg.location(name)`` gives ``file:line:col`` of the field in the prototxt it came from (the
reason caffe8 keeps its own message class and text parser rather than protobuf's). Enum values
are their names as strings ("MAX", "TRAIN"). ``engine.proto.convert`` turns Messages into
protobuf objects and back for the binary formats.
"""
import contextlib
import gc

from caffe8.engine.schema import SCHEMA

#: per message type: field name -> its position in the schema (the order ``fields()`` gives)
_ORDER = {t: {name: i for i, name in enumerate(fields)} for t, fields in SCHEMA.items()}
_new = object.__new__
_set = object.__setattr__


_freeze = False   # freeze_after_builds


def freeze_after_builds(on=True):
    """Have ``paused_gc`` move what was built into the collector's permanent generation
    (``gc.freeze``) before it turns the collector back on. For a one-shot process (the command
    line tool), whose nets live until it exits: the collector then never walks a 100,000-layer
    net again (three passes of seconds each right after the build, one more at exit). Not for
    pycaffe, which may drop a net and build another: frozen garbage in cycles is never freed."""
    global _freeze
    _freeze = bool(on)


@contextlib.contextmanager
def paused_gc():
    """Python's cyclic garbage collector off while a net's messages and layers are built (as a
    ``with`` block or a decorator), back on after if it was on. Building a net of 100,000
    layers makes millions of objects, none of them garbage, and every full collection on the way
    walks all of them again: a third of the build's time. Nothing is lost: what becomes garbage
    meanwhile is collected once the collector runs again (see ``freeze_after_builds`` too)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            if _freeze:
                gc.freeze()
            gc.enable()


class Message:
    """A parsed protobuf message of schema type ``type_name``.

    Reads are Python's plain attribute lookups wherever they can be: the set fields live in
    ``_values``, which is also the instance's ``__dict__``, and each message type is a subclass
    (``Message(type_name)`` makes one of it) holding its scalar fields' defaults as class
    attributes. Only unset repeated and message fields (made on first read) and unknown names
    reach ``__getattr__``, which on Python 3.11 first formats the AttributeError it replaces:
    ~6,500 instructions a read, 12 % of a small net's training step when every read went
    there. No schema field is named like an attribute of this class
    (tests/engine/test_prototxt.py)."""

    __slots__ = ("__dict__", "_type", "_values", "_locs", "_where", "_parent", "_unset")

    def __new__(cls, type_name, where="<memory>"):
        typed = _TYPED.get(type_name)
        if typed is None:
            raise KeyError(f"unknown message type {type_name}")
        return _new(typed)

    def __init__(self, type_name, where="<memory>"):
        object.__setattr__(self, "_type", type_name)
        object.__setattr__(self, "_values", self.__dict__)
        object.__setattr__(self, "_locs", {})
        object.__setattr__(self, "_where", where)
        # An unset message field reads as a default Message linked to its parent; writing into
        # it attaches it (protobuf's lazy semantics), so `solver.comm.codec = "fp16"` sticks.
        object.__setattr__(self, "_parent", None)
        object.__setattr__(self, "_unset", {})

    # --- reading -------------------------------------------------------------------------------
    @property
    def type_name(self):
        return self._type

    def _spec(self, name):
        spec = SCHEMA[self._type].get(name)
        if spec is None:
            raise AttributeError(
                f"{self._type} has no field '{name}'; valid fields: "
                + ", ".join(sorted(SCHEMA[self._type])))
        return spec

    def __getattr__(self, name):
        values = self._values
        if name in values:  # set, so a field of the schema (the common case: no lookup)
            return values[name]
        if name.startswith("__"):
            raise AttributeError(name)
        spec = self._spec(name)
        if spec.repeated:
            lst = []
            values[name] = lst  # so that append() on the result sticks
            return lst
        if spec.is_message:
            sub = self._unset.get(name)
            if sub is None:
                sub = Message(spec.type, self._where)
                object.__setattr__(sub, "_parent", (self, name))
                self._unset[name] = sub
            return sub
        return spec.default

    def has(self, name):
        """True when the field was set (for repeated fields: non-empty)."""
        v = self._values.get(name)
        if v is None:
            self._spec(name)  # a name the schema does not know is an error, not False
            return False
        return len(v) > 0 if type(v) is list else True

    HasField = has  # protobuf-style spelling

    def location(self, name=None):
        """``file:line:col`` of field ``name`` (or of the message itself)."""
        loc = self._locs.get(name) if name else self._locs.get(None)
        if loc is None:
            return str(self._where)
        if type(loc) is int:  # a token of the prototxt text (engine.prototxt.Source)
            loc = self._where.line_col(loc)
        return f"{self._where}:{loc[0]}:{loc[1]}"

    def fields(self):
        """Names of set fields, in schema order."""
        return sorted((n for n, v in self._values.items()
                       if v is not None and (type(v) is not list or v)),
                      key=_ORDER[self._type].__getitem__)

    # --- writing -------------------------------------------------------------------------------
    def __setattr__(self, name, value):
        spec = self._spec(name)
        if spec.repeated and not isinstance(value, list):
            raise TypeError(f"{self._type}.{name} is repeated; assign a list")
        self._values[name] = value
        self._unset.pop(name, None)
        self._attach()

    def _attach(self):
        """Make this (default) sub-message part of its parent once something is written to it."""
        if self._parent is not None:
            parent, name = self._parent
            object.__setattr__(self, "_parent", None)
            if name not in parent._values:
                parent._values[name] = self
                parent._unset.pop(name, None)
                parent._attach()

    def clear(self, name):
        self._spec(name)
        self._values.pop(name, None)

    def copy(self):
        """Deep copy."""
        m = _new(type(self))
        _set(m, "_type", self._type)
        _set(m, "_where", self._where)
        _set(m, "_parent", None)
        _set(m, "_unset", {})
        _set(m, "_locs", self._locs.copy())
        values = {}
        for k, v in self._values.items():
            if type(v) is list:
                if v and isinstance(v[0], Message):
                    v = [x.copy() for x in v]
                else:
                    v = v.copy()
            elif isinstance(v, Message):
                v = v.copy()
            values[k] = v
        _set(m, "__dict__", values)
        _set(m, "_values", values)
        return m

    def __eq__(self, other):
        return isinstance(other, Message) and self._type == other._type and \
            {k: v for k, v in self._values.items() if v != []} == \
            {k: v for k, v in other._values.items() if v != []}

    def __repr__(self):
        return f"<{self._type} {', '.join(self.fields())}>"


def _typed_class(type_name, fields):
    """The Message subclass of one message type: its scalar fields' defaults as class
    attributes (repeated and message fields are made per instance, in ``__getattr__``)."""
    defaults = {name: spec.default for name, spec in fields.items()
                if not spec.repeated and not spec.is_message}
    return type("Message", (Message,), {"__slots__": (), "__qualname__": "Message",
                                        "__doc__": f"A {type_name} message.", **defaults})


#: message type name -> its Message subclass
_TYPED = {t: _typed_class(t, fields) for t, fields in SCHEMA.items()}
