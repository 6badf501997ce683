"""Caffe prototxt (protobuf text format) parser with Caffe's schema and defaults.

``parse_text(text, filename, type_name)`` returns a ``Message``: attribute access gives the value
if set, else the field's default (``[]`` for repeated fields, an empty default ``Message`` for
message fields); ``msg.has(name)`` tells whether a field was set; ``msg.location(name)`` gives
``file:line:col`` for error messages. Enum values are their names as strings ("MAX", "TRAIN").
Unknown fields are errors that list the valid names.

Why a parser of our own when protobuf ships ``google.protobuf.text_format``: it keeps
``file:line:col`` of every field (``Message.location``), so that a bad value found long after
parsing (by a layer's setup, the solver, ``engine.validate``) is reported where it was written;
text_format's messages forget where their fields came from. Both parsers read the same schema
(``engine/proto/caffe.proto``) and tests/engine/test_proto_schema.py checks that they agree on
every prototxt in the repository.
"""
import math
import os
import re

from caffe8.engine import upgrade
from caffe8.engine.errors import PrototxtError, did_you_mean, relative_to_cwd
from caffe8.engine.message import Message, paused_gc  # noqa: F401  (Message re-exported)
from caffe8.engine.schema import SCHEMA, ENUMS, FieldSpec  # noqa: F401  (FieldSpec re-exported)
from caffe8.engine.validate import validate

_INT_TYPES = {"int32", "int64", "uint32", "uint64", "sint32", "sint64", "fixed32", "fixed64"}
_FLOAT_TYPES = {"float", "double"}


# --- tokenizer ---------------------------------------------------------------------------------
# One token a match (group 1), the blanks and comments before it included (possessive: a comment
# is never given back to match as a token); a number takes the name characters that follow it
# ("5abc" is one token, refused as a number, where protobuf would refuse it too); a character
# that starts no token is a token of its own ("bad"); the end of the text is the empty token.
_NUMBER_RE = r"[-+]?(?:0[xX][0-9a-fA-F]+|(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?[fF]?)"
_TOKEN = re.compile(r"""
    (?:[ \t\r\n\f\v]+|\#[^\n]*)*+
    (   "(?:[^"\\\n]|\\.)*" | '(?:[^'\\\n]|\\.)*'
      | """ + _NUMBER_RE + r"""[A-Za-z0-9_.]*
      | [-+]?[A-Za-z_][A-Za-z0-9_.]*
      | [{}<>\[\]:,;]
      | .
      | \Z )
""", re.VERBOSE)
_NUMBER = re.compile(_NUMBER_RE)
_IDENT_START = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_")
_NUMBER_START = frozenset("0123456789.")
_SYMS = frozenset("{}<>[]:,;")
_STRING, _BOOL, _INT, _FLOAT, _ENUM = range(5)
_KIND = {"string": _STRING, "bytes": _STRING, "bool": _BOOL, "float": _FLOAT, "double": _FLOAT,
         **{t: _INT for t in _INT_TYPES}}

_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", "'": "'", '"': '"', "a": "\a",
            "b": "\b", "f": "\f", "v": "\v", "?": "?"}


def _kind(tok):
    """"string", "number", "ident", "sym", "eof" or "bad" for a token of ``_TOKEN``."""
    if not tok:
        return "eof"
    c = tok[0]
    if c in "\"'":
        return "string" if len(tok) > 1 else "bad"
    if c in _IDENT_START:
        return "ident"
    if c in _SYMS:
        return "sym"
    if c in "+-" and len(tok) > 1:
        c = tok[1]
        if c in _IDENT_START:
            return "ident"
    if c in _NUMBER_START:
        return "number" if _NUMBER.fullmatch(tok) else "bad"
    return "bad"


class Source(str):
    """The name of a prototxt file (it is that string) that also finds the ``line:col`` of its
    tokens. The parser records a field's place as its token's index (``Message._locs``); the
    line and column are worked out only when a message asks (``Message.location``), by a second
    pass over the text that goes only as far as the token asked for: a 50 MB net pays for line
    numbers only where an error or a log line names one."""

    def __new__(cls, name, text):
        self = super().__new__(cls, name)
        self._text, self._pos, self._scan = text, [], _TOKEN.finditer(text)
        self._line, self._line_start, self._at = 1, 0, 0
        return self

    def line_col(self, index):
        """(line, column) of token ``index``, both from 1."""
        pos, text = self._pos, self._text
        while len(pos) <= index:
            start = next(self._scan).start(1)
            newlines = text.count("\n", self._at, start)
            if newlines:
                self._line += newlines
                self._line_start = text.rfind("\n", self._at, start) + 1
            self._at = start
            pos.append((self._line, start - self._line_start + 1))
        return pos[index]


def _unescape(body, err):
    if "\\" not in body:
        return body
    out, i = [], 0
    while i < len(body):
        c = body[i]
        if c != "\\":
            out.append(c)
            i += 1
            continue
        i += 1
        if i >= len(body):
            raise err("dangling backslash in string")
        c = body[i]
        if c in _ESCAPES:
            out.append(_ESCAPES[c])
            i += 1
        elif c in "xX":
            m = re.match(r"[0-9a-fA-F]{1,2}", body[i + 1:])
            if not m:
                raise err("bad \\x escape in string")
            out.append(chr(int(m.group(), 16)))
            i += 1 + len(m.group())
        elif c in "01234567":
            m = re.match(r"[0-7]{1,3}", body[i:])
            out.append(chr(int(m.group(), 8)))
            i += len(m.group())
        else:
            raise err(f"unknown escape '\\{c}' in string")
    return "".join(out)


class _Parser:
    """Recursive descent over the token list; a field's place is kept as its token's index."""

    def __init__(self, text, where):
        self.where = Source(where, text)
        self.toks = _TOKEN.findall(text)
        self.i = 0

    def err(self, msg, index=None):
        index = self.i if index is None else index
        tok = self.toks[index]
        if _kind(tok) == "bad":
            msg = f"unexpected character {tok[0]!r}"
        line, col = self.where.line_col(index)
        return PrototxtError(f"{self.where}:{line}:{col}: {msg}")

    def parse_message(self, msg, close=None):
        toks = self.toks
        fields = SCHEMA[msg._type]
        i = self.i
        while True:
            name = toks[i]
            if name == close:
                self.i = i + 1
                return
            if not name:
                self.i = i
                if close:
                    raise self.err(f"unexpected end of file: missing '{close}'")
                return
            if name[0] not in _IDENT_START:
                raise self.err(f"expected a field name, got {name!r}", i)
            spec = fields.get(name)
            if spec is None:
                raise self.err(f"unknown field '{name}' in {msg._type}"
                               f"{did_you_mean(name, fields)}; valid fields: "
                               + ", ".join(sorted(fields)), i)
            at = i
            i += 1
            if spec.is_message:
                if toks[i] == ":":
                    i += 1
                if toks[i] == "[" and spec.repeated:
                    i += 1
                    while toks[i] != "]":
                        self.i = i
                        self._store(msg, name, spec, self.parse_submessage(spec), at)
                        i = self.i
                        if toks[i] == ",":
                            i += 1
                    i += 1
                else:
                    self.i = i
                    self._store(msg, name, spec, self.parse_submessage(spec), at)
                    i = self.i
            else:
                if toks[i] != ":":
                    raise self.err(f"expected ':' after field '{name}'", i)
                i += 1
                if spec.repeated:
                    if toks[i] == "[":
                        i += 1
                        while toks[i] != "]":
                            value, i = self.parse_scalar(spec, name, i)
                            self._store(msg, name, spec, value, at)
                            if toks[i] == ",":
                                i += 1
                            elif toks[i] != "]":
                                raise self.err("expected ',' or ']' in list", i)
                        i += 1
                    else:
                        value, i = self.parse_scalar(spec, name, i)
                        self._store(msg, name, spec, value, at)
                else:
                    value, i = self.parse_scalar(spec, name, i)
                    self._store(msg, name, spec, value, at)
            sep = toks[i]
            if sep == "," or sep == ";":
                i += 1

    def parse_submessage(self, spec):
        at = self.i
        tok = self.toks[at]
        if tok == "{":
            close = "}"
        elif tok == "<":
            close = ">"
        else:
            raise self.err(f"expected '{{' to open a {spec.type}")
        self.i = at + 1
        sub = Message(spec.type, self.where)
        sub._locs[None] = at
        self.parse_message(sub, close)
        return sub

    def parse_scalar(self, spec, name, i):
        """(value, index of the next token) for the scalar field ``spec`` at token ``i``."""
        toks = self.toks
        tok = toks[i]
        kind = _KIND.get(spec.type, _ENUM)
        if kind == _STRING:
            if tok[:1] not in ("'", '"') or len(tok) < 2:
                raise self.err(f"field '{name}' expects a quoted string, got {tok!r}", i)
            parts = [_unescape(tok[1:-1], lambda m, at=i: self.err(m, at))]
            i += 1
            while toks[i][:1] in ("'", '"') and len(toks[i]) > 1:  # adjacent literals concatenate
                parts.append(_unescape(toks[i][1:-1], lambda m, at=i: self.err(m, at)))
                i += 1
            return (parts[0] if len(parts) == 1 else "".join(parts)), i
        if kind == _BOOL:
            if tok in ("true", "True", "t", "1"):
                return True, i + 1
            if tok in ("false", "False", "f", "0"):
                return False, i + 1
            raise self.err(f"field '{name}' expects true or false, got {tok!r}", i)
        if kind == _INT:
            if _kind(tok) != "number":
                raise self.err(f"field '{name}' expects an integer, got {tok!r}", i)
            try:
                v = int(tok, 0) if not tok.lstrip("+-").lower().startswith("0x") else int(tok, 16)
            except ValueError:
                raise self.err(f"field '{name}' expects an integer, got {tok!r}", i) from None
            if spec.type.startswith("uint") and v < 0:
                raise self.err(f"field '{name}' must not be negative, got {tok}", i)
            return v, i + 1
        if kind == _FLOAT:
            k = _kind(tok)
            if k == "number":
                s = tok[:-1] if tok[-1] in "fF" and "x" not in tok.lower() else tok
                return (float(int(s, 16)) if "x" in s.lower() else float(s)), i + 1
            low = tok.lower().lstrip("+") if k == "ident" else ""
            if low in ("inf", "infinity", "-inf", "-infinity", "nan", "-nan"):
                return float(low.replace("infinity", "inf")), i + 1
            raise self.err(f"field '{name}' expects a number, got {tok!r}", i)
        values = ENUMS[spec.type]
        k = _kind(tok)
        if k == "number":
            try:
                code = int(tok, 0)
            except ValueError:
                code = None
            names = [n for n, v in values.items() if v == code]
            if names:
                return names[0], i + 1
        elif k == "ident" and tok in values:
            return tok, i + 1
        raise self.err(f"field '{name}' expects one of {', '.join(values)}; got {tok!r}", i)

    def _store(self, msg, name, spec, value, at):
        if spec.repeated:
            msg._values.setdefault(name, []).append(value)
            msg._locs.setdefault(name, at)
        else:
            if name in msg._values:
                first = msg._locs[name]
                line = self.where.line_col(first)[0] if isinstance(first, int) else first[0]
                raise self.err(f"field '{name}' of {msg._type} is set twice "
                               f"(first at line {line})", at)
            msg._values[name] = value
            msg._locs[name] = at


@paused_gc()
def parse_text(text, filename="<string>", type_name="NetParameter"):
    """Parse prototxt ``text`` as message ``type_name``; errors name ``filename:line:col``.

    Old nets (V0/V1 ``layers``, also inline in a solver) come back upgraded, as Caffe's readers
    return them (``engine.upgrade``); every field is then checked against its allowed values
    (``engine.validate``), so a bad value fails here, naming its ``filename:line:col``."""
    p = _Parser(text, filename)
    msg = Message(type_name, p.where)
    msg._locs[None] = (1, 1)
    p.parse_message(msg)
    if type_name == "NetParameter":
        msg = upgrade.upgrade_net(msg)
    elif type_name == "SolverParameter":
        for field in ("net_param", "train_net_param"):
            if msg.has(field):
                setattr(msg, field, upgrade.upgrade_net(getattr(msg, field)))
        if msg.has("test_net_param"):
            msg.test_net_param = [upgrade.upgrade_net(n) for n in msg.test_net_param]
        if msg.has("comm"):
            upgrade.upgrade_comm(msg.comm)
    elif type_name == "CommParameter":
        upgrade.upgrade_comm(msg)
    return validate(msg)


#: the most layers a net file may hold; ``CAFFE8_MAX_LAYERS`` sets another. Every process that
#: builds a net parses and sets up each layer (a 100,000-layer net is initialised in ~25 s on a
#: quiet 2-core machine, docs/BENCHMARKS.md L; beside other work and with two processes on two
#: cores, several times that): a net of 700,000 layers ran past a 300 s limit before its first
#: iteration. The largest published nets have a few thousand layers.
MAX_LAYERS = 200_000
#: a comment, or the start of a layer block (new or V1 spelling): counted without a copy of the
#: text (a net over the limit can be hundreds of megabytes)
_LAYER_OR_COMMENT = re.compile(rb"#[^\n]*|\blayers?\s*:?\s*\{")


def max_layers():
    """:data:`MAX_LAYERS`, or ``CAFFE8_MAX_LAYERS`` where set."""
    value = os.environ.get("CAFFE8_MAX_LAYERS")
    try:
        return int(value) if value else MAX_LAYERS
    except ValueError:
        raise PrototxtError(f"CAFFE8_MAX_LAYERS={value!r}: not a whole number") from None


def refuse_too_many_layers(raw, path):
    """One error line for a net file of more than :func:`max_layers` layer blocks, counted in
    the raw text (comments left out) before the seconds-per-thousand-layers parse begins."""
    limit = max_layers()
    if raw.count(b"layer") <= limit:       # the common case, at the speed of bytes.count
        return
    count = sum(1 for m in _LAYER_OR_COMMENT.finditer(raw) if raw[m.start()] != ord("#"))
    if count > limit:
        raise PrototxtError(f"{path}: a net of {count:,} layers, more than caffe8 builds "
                            f"({limit:,}; each process would parse and build it for many "
                            "minutes before the first iteration); CAFFE8_MAX_LAYERS sets the "
                            f"limit (CAFFE8_MAX_LAYERS={count}) for a run that may wait that long")


def parse_file(path, type_name="NetParameter"):
    """Parse the prototxt file at ``path`` (upgraded as ``parse_text`` does, and a solver's old
    ``solver_type`` enum moved into ``type``) and checked as ``parse_text`` checks it, so a bad
    value fails here, naming its file:line:col. A net of more than :func:`max_layers` layers
    is refused before it is parsed (:func:`refuse_too_many_layers`)."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise PrototxtError(f"{path}: cannot read prototxt: {e.strerror}"
                            f"{relative_to_cwd(path)}") from None
    if type_name == "NetParameter":
        refuse_too_many_layers(raw, path)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        col = e.start - (raw.rfind(b"\n", 0, e.start) + 1) + 1
        raise PrototxtError(f"{path}:{line}:{col}: byte 0x{raw[e.start]:02x} at offset {e.start} "
                            f"is not valid UTF-8; prototxt files must be UTF-8 text") from None
    msg = parse_text(text, str(path), type_name)
    if type_name == "SolverParameter":
        upgrade.upgrade_solver(msg)
    return msg


def parse_layer(text, filename="<string>"):
    """Parse the body of one ``layer { ... }`` (convenience for tests and scripts)."""
    return parse_text(text, filename, "LayerParameter")


def _fmt_scalar(spec, v):
    if spec.type in ("string", "bytes"):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    if spec.type == "bool":
        return "true" if v else "false"
    if spec.type in _FLOAT_TYPES:
        if math.isinf(v) or math.isnan(v):
            return repr(v)
        return repr(float(v))
    return str(v)


def to_text(msg, indent=0):
    """Serialise a Message back to prototxt text (round-trips through ``parse_text``)."""
    pad = "  " * indent
    out = []
    for name in msg.fields():
        spec = SCHEMA[msg._type][name]
        vals = msg._values[name] if spec.repeated else [msg._values[name]]
        for v in vals:
            if spec.is_message:
                out.append(f"{pad}{name} {{\n{to_text(v, indent + 1)}{pad}}}\n")
            else:
                out.append(f"{pad}{name}: {_fmt_scalar(spec, v)}\n")
    return "".join(out)
