"""Prototxt parser: the whole text format, Caffe's defaults, and errors with file:line:col."""
import math

import pytest

from caffe8.engine.errors import PrototxtError
from caffe8.engine.prototxt import parse_file, parse_layer, parse_text, to_text


def test_defaults_follow_caffe():
    l = parse_layer('name: "p" type: "Pooling"')
    pp = l.pooling_param
    assert (pp.pool, pp.round_mode, pp.stride, pp.pad, pp.global_pooling) == ("MAX", "CEIL", 1, 0, False)
    assert l.lrn_param.local_size == 5 and l.lrn_param.alpha == 1.0 and l.lrn_param.beta == 0.75
    assert l.convolution_param.bias_term is True and l.convolution_param.kernel_size == []
    assert l.loss_param.normalization == "VALID" and not l.loss_param.has("ignore_label")
    assert l.inner_product_param.weight_filler.type == "constant"
    s = parse_text("", "s", "SolverParameter")
    assert (s.type, s.iter_size, s.average_loss, s.clip_gradients, s.delta) == ("SGD", 1, 1, -1.0, 1e-8)
    assert s.snapshot_format == "BINARYPROTO" and s.test_initialization is True  # Caffe's default
    assert s.comm.codec == "fp8" and s.comm.quantile == pytest.approx(0.95) and s.comm.samples == 1024


def test_syntax_forms():
    text = r'''
    # comment line
    name: "a\"b\n\x41\101" 'c'   # adjacent strings concatenate
    force_backward: true;
    input_dim: [1, 3, 0x10, 16]
    layer < name: "l" type: "Convolution"  param: { lr_mult: 1e0 } param { lr_mult: 2.f decay_mult: .5 }
      convolution_param { kernel_size: 3 kernel_size: 5, pad: [1, 2] weight_filler { value: -1.5E-3 } }
      loss_weight: inf loss_weight: -Infinity propagate_down: false propagate_down: 1 >
    layer { include { phase: TEST } exclude: { stage: "x" } name: "m" }
    '''
    m = parse_text(text, "t.prototxt")
    assert m.name == 'a"b\nAAc'
    assert m.force_backward is True and m.input_dim == [1, 3, 16, 16]
    l = m.layer[0]
    assert [p.lr_mult for p in l.param] == [1.0, 2.0] and l.param[1].decay_mult == 0.5
    assert l.convolution_param.kernel_size == [3, 5] and l.convolution_param.pad == [1, 2]
    assert l.convolution_param.weight_filler.value == pytest.approx(-1.5e-3)
    assert l.loss_weight[0] == math.inf and l.loss_weight[1] == -math.inf
    assert l.propagate_down == [False, True]
    assert m.layer[1].include[0].phase == "TEST" and m.layer[1].exclude[0].stage == ["x"]
    assert parse_text(to_text(m)) == m  # round trip


def test_enum_by_number_and_has():
    l = parse_layer("pooling_param { pool: 1 }")
    assert l.pooling_param.pool == "AVE"
    assert l.has("pooling_param") and not l.has("lrn_param")
    assert l.pooling_param.has("pool") and not l.pooling_param.has("stride")


@pytest.mark.parametrize("text, line, col, words", [
    ('layer {\n  nme: "x"\n}', 2, 3, ["unknown field 'nme'", "LayerParameter", "name", "type",
                                     "(did you mean 'name'?)"]),
    ('layer {\n  name: "x"\n', 3, 1, ["missing '}'"]),
    ('layer { pooling_param { pool: FOO } }', 1, 31, ["MAX", "AVE", "FOO"]),
    ('layer { name: x }', 1, 15, ["quoted string"]),
    ('layer { convolution_param { num_output: -3 } }', 1, 41, ["negative"]),
    ('layer { name: "a" name: "b" }', 1, 19, ["set twice"]),
    ('layer { name "a" }', 1, 14, ["expected ':'"]),
    ('layer { name: "a" } }', 1, 21, ["expected a field name"]),
    ('name: "x" @', 1, 11, ["unexpected character"]),
])
def test_errors_name_file_line_col(text, line, col, words):
    with pytest.raises(PrototxtError) as e:
        parse_text(text, "net.prototxt")
    msg = str(e.value)
    assert msg.startswith(f"net.prototxt:{line}:{col}:"), msg
    for w in words:
        assert w in msg


def test_a_misspelt_solver_field_names_the_closest():
    with pytest.raises(PrototxtError, match=r"^s\.prototxt:2:1: unknown field 'max_iters' in "
                                            r"SolverParameter \(did you mean 'max_iter'\?\)"):
        parse_text('base_lr: 0.1\nmax_iters: 10\n', "s.prototxt", "SolverParameter")
    with pytest.raises(PrototxtError) as e:
        parse_text('qqqqq: 1\n', "s.prototxt", "SolverParameter")
    assert "did you mean" not in str(e.value)


def test_missing_file(tmp_path):
    with pytest.raises(PrototxtError, match="nope.prototxt"):
        parse_file(tmp_path / "nope.prototxt")


def test_writing_into_an_unset_submessage_attaches_it():
    s = parse_text("", "s", "SolverParameter")
    assert not s.has("comm") and s.comm.codec == "fp8" and not s.has("comm")
    s.comm.codec = "fp16"
    assert s.has("comm") and s.comm.codec == "fp16"
    l = parse_layer('name: "x"')
    l.convolution_param.weight_filler.std = 0.5
    assert l.has("convolution_param") and l.convolution_param.weight_filler.std == 0.5


def test_locations_worked_out_on_demand_match_the_text():
    """Field places are kept as token indices and turned into line:col only when asked, in any
    order; each must point at the field's name in the text."""
    lines = ['name: "n"  # a comment with "quotes" and { braces']
    for i in range(30):
        lines += [f"layer {{  # layer {i}", f'  name: "l{i}"', '  type: "ReLU"',
                  "", f'  bottom: "x{i}" top: "x{i + 1}"', "}"]
    text = "\n".join(lines) + "\n"
    m = parse_text(text, "deep.prototxt")
    for i in (29, 3, 17, 0):  # later tokens first: the scan must not depend on the order
        layer = m.layer[i]
        for field in ("name", "bottom", "top"):
            _, line, col = layer.location(field).rsplit(":", 2)
            assert text.splitlines()[int(line) - 1][int(col) - 1:].startswith(field)
        _, line, col = layer.location().rsplit(":", 2)
        assert text.splitlines()[int(line) - 1][int(col) - 1] == "{"
    assert m.location("name") == "deep.prototxt:1:1"


# --- a net of more layers than caffe8 builds ------------------------------------------------------
def test_too_many_layers_are_refused_before_parsing(tmp_path, monkeypatch):
    """The layer blocks are counted in the raw text (new and V1 spellings, one line or many,
    not in comments); over CAFFE8_MAX_LAYERS the file is refused with one line, at or under
    it the net parses."""
    from caffe8.engine.prototxt import MAX_LAYERS, max_layers
    assert max_layers() == MAX_LAYERS == 200_000
    monkeypatch.setenv("CAFFE8_MAX_LAYERS", "3")
    body = ('name: "n"\n# a layer { in a comment is no layer\n'
            'layer { name: "a" type: "Input" top: "x" input_param { shape { dim: 1 } } }\n'
            'layer{name:"b" type:"ReLU" bottom:"x" top:"x"}\n'
            'layer {\n  name: "c"\n  type: "ReLU"\n  bottom: "x"\n  top: "x"\n}\n')
    path = tmp_path / "net.prototxt"
    path.write_text(body)
    assert len(parse_file(str(path)).layer) == 3            # the limit itself is allowed
    path.write_text(body + 'layer { name: "d" type: "ReLU" bottom: "x" top: "x" }\n')
    with pytest.raises(PrototxtError) as e:
        parse_file(str(path))
    assert str(e.value).startswith(f"{path}: a net of 4 layers, more than caffe8 builds (3; ")
    assert str(e.value).endswith("CAFFE8_MAX_LAYERS sets the limit (CAFFE8_MAX_LAYERS=4) for a "
                                 "run that may wait that long")
    v1 = tmp_path / "v1.prototxt"
    v1.write_text('name: "old"\n' + 'layers { name: "r" type: RELU bottom: "x" top: "x" }\n' * 4)
    with pytest.raises(PrototxtError, match="a net of 4 layers"):
        parse_file(str(v1))
    monkeypatch.setenv("CAFFE8_MAX_LAYERS", "many")
    with pytest.raises(PrototxtError, match="CAFFE8_MAX_LAYERS='many': not a whole number"):
        parse_file(str(path))


def test_set_fields_are_plain_attributes_and_no_field_hides_a_method():
    """A Message keeps its set fields in its ``__dict__`` and its type's scalar defaults on its
    class (a read is a plain attribute lookup, not ``__getattr__``): no field of the schema may
    be named like a method or attribute of the class, which a field would hide; a cleared field
    reads its default again; copies keep the two one dict."""
    from caffe8.engine.message import Message
    from caffe8.engine.schema import SCHEMA
    fields = {name for spec in SCHEMA.values() for name in spec}
    assert not fields & set(dir(Message))
    m = parse_text('base_lr: 0.5 comm { codec: "fp8" }', "s.prototxt", "SolverParameter")
    c = m.copy()
    for msg in (m, c):
        assert msg.__dict__ is msg._values and msg.__dict__["base_lr"] == 0.5
        assert msg.momentum == 0.0 and not msg.has("momentum") and msg.comm.codec == "fp8"
    c.base_lr = 0.25
    assert (m.base_lr, c.base_lr) == (0.5, 0.25)
    c.momentum = 0.9
    assert (m.momentum, c.momentum, c.has("momentum")) == (0.0, 0.9, True)
    c.clear("momentum")
    assert (c.momentum, c.has("momentum")) == (0.0, False)
    assert "momentum" not in type(m).__dict__["__slots__"] and type(m).momentum == 0.0
