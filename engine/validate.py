"""Checks a parsed message against the allowed values declared in caffe.proto, in one place.

The schema carries them as field options (``engine.schema.FieldSpec``): ``range`` is an interval
such as ``"(0,1]"`` or ``"[1,)"`` (an empty bound is unbounded), ``choices`` the allowed strings,
``registry`` a registry above the engine whose names are allowed too (``schema.provide_choices``),
``check`` a named rule (``"odd"``, ``"positive_or_minus_one"``). ``validate(msg)`` walks every set
field of ``msg`` and its sub-messages (repeated fields element by element) and raises one
``PrototxtError`` naming ``file:line:col`` (or, for a message built in Python, the field's path
such as ``NetParameter.layer['drop'].dropout_param.dropout_ratio``), the field and what is
allowed: the same text for the same bad value wherever the message came from. Unset fields take their
defaults, which satisfy their own rules (tests/engine/test_validate.py checks that), so only set
fields are checked, plus proto2 ``required`` fields of set sub-messages, which must be present.
"""
import math

from caffe8.engine.errors import PrototxtError
from caffe8.engine.schema import SCHEMA, allowed_values

_CHECKS = {
    "odd": (lambda v: int(v) % 2 == 1, "must be odd"),
    "positive_or_minus_one": (lambda v: v > 0 or v == -1, "must be > 0, or -1 for e"),
}


def parse_range(text):
    """``"(0,1]"`` -> ``(0.0, False, 1.0, True)``: low, low inclusive, high, high inclusive;
    ``None`` for an open end."""
    text = text.strip()
    if len(text) < 3 or text[0] not in "[(" or text[-1] not in "])" or "," not in text:
        raise ValueError(f"bad c8_range {text!r}")
    low, high = (p.strip() for p in text[1:-1].split(",", 1))
    return (float(low) if low else None, text[0] == "[",
            float(high) if high else None, text[-1] == "]")


def in_range(value, text):
    """True when number ``value`` lies in interval ``text`` (NaN never does)."""
    low, low_in, high, high_in = parse_range(text)
    if isinstance(value, float) and math.isnan(value):
        return False
    if low is not None and (value < low or (value == low and not low_in)):
        return False
    if high is not None and (value > high or (value == high and not high_in)):
        return False
    return True


def describe_range(text):
    """``"(0,1]"`` -> ``"(0,1], i.e. > 0 and <= 1"``."""
    low, low_in, high, high_in = parse_range(text)
    parts = []
    if low is not None:
        parts.append(f"{'>=' if low_in else '>'} {low:g}")
    if high is not None:
        parts.append(f"{'<=' if high_in else '<'} {high:g}")
    return f"{text}, i.e. " + " and ".join(parts)


def _fmt(value):
    return repr(value) if isinstance(value, str) else f"{value:g}" if isinstance(value, float) \
        else str(value)


#: the values each integer type of the schema can hold (Caffe's fields are C++ integers: a
#: larger value would wrap or be refused by protobuf there, so it is refused here, by name)
_INT_BOUNDS = {"int32": (-2**31, 2**31 - 1), "uint32": (0, 2**32 - 1),
               "int64": (-2**63, 2**63 - 1), "uint64": (0, 2**64 - 1)}


def check_value(spec, value):
    """None when ``value`` is allowed for field ``spec``, else the reason."""
    bounds = _INT_BOUNDS.get(spec.type)
    if bounds and not bounds[0] <= value <= bounds[1]:
        return f"{spec.type} holds {bounds[0]} to {bounds[1]}"
    choices = allowed_values(spec)
    if choices is not None and value not in choices:
        return "allowed values: " + ", ".join(repr(c) for c in choices)
    if spec.range and not in_range(value, spec.range):
        return "allowed range: " + describe_range(spec.range)
    if spec.check:
        ok, what = _CHECKS[spec.check]
        if not ok(value):
            return what
    return None


def place(msg, name=None, path=None):
    """Where field ``name`` of ``msg`` (the message itself for None) was written: its
    ``file:line:col`` when it came from a prototxt (a field left unset: where its message
    was), else its ``path`` from the message the caller validated (default ``Type.name``, e.g.
    ``CommParameter.quantile``), as for messages built in Python."""
    if name in msg._locs:
        return msg.location(name)
    if None in msg._locs:  # unset, in a message read from a file: the message's own place
        return msg.location()
    return path or (f"{msg.type_name}.{name}" if name else msg.type_name)


def _item_path(path, name, index, item):
    """``path.name[index]``; named items (layers) by their name: ``NetParameter.layer['fc1']``."""
    if SCHEMA[item.type_name].get("name") is not None and item.has("name"):
        return f"{path}.{name}[{item.name!r}]"
    return f"{path}.{name}[{index}]"


def _constrained(spec):
    return spec.choices is not None or spec.registry or spec.range or spec.check or \
        spec.type in _INT_BOUNDS


#: per message type: its required fields, and the fields that need a look (sub-messages, to
#: walk them, and constrained scalars): most fields of a big net need none
_REQUIRED = {t: [n for n, s in fields.items() if s.required] for t, fields in SCHEMA.items()}
_LOOK = {t: {n: s for n, s in fields.items() if s.is_message or _constrained(s)}
         for t, fields in SCHEMA.items()}


def validate(msg, path=None):
    """Raise ``PrototxtError`` at the first field of ``msg`` (recursively) that breaks its rule;
    return ``msg``. Every message is checked here, wherever it comes from: a file or text
    (``engine.prototxt``), NetSpec, or built in Python (checked by the Net, Trainer and comm block
    that take it). ``path``: how ``msg`` is reached (default: its type), for the error's place."""
    path = path or msg.type_name
    for name in _REQUIRED[msg.type_name]:
        if not msg.has(name):
            raise PrototxtError(f"{place(msg, None, path)}: {msg.type_name} needs field "
                                f"'{name}' (required)")
    look = _LOOK[msg.type_name]
    for name in msg.fields():
        spec = look.get(name)
        if spec is None:
            continue
        value = getattr(msg, name)
        values = value if spec.repeated else [value]
        if spec.is_message:
            for i, sub in enumerate(values):
                validate(sub, _item_path(path, name, i, sub) if spec.repeated else
                         f"{path}.{name}")
            continue
        for v in values:
            reason = check_value(spec, v)
            if reason:
                raise PrototxtError(f"{place(msg, name, f'{path}.{name}')}: {msg.type_name}."
                                    f"{name} = {_fmt(v)} is not allowed; {reason}")
    return msg
