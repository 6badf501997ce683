"""caffe8 upgrade_net_proto_text / _binary, upgrade_solver_proto_text: outputs parsed with
protobuf's caffe_pb2 and compared with the upgraded messages Caffe's rules give, written here."""
from google.protobuf import text_format

from caffe8.engine.proto import caffe_pb2
from tests.caffe8.tools.tool_helpers import cli, one_error_line

V1 = """name: "v1"
layers { name: "data" type: DATA top: "data" top: "label"
         data_param { source: "db" batch_size: 2 backend: LMDB } transform_param { scale: 0.5 } }
layers { name: "ip" type: INNER_PRODUCT bottom: "data" top: "ip" blobs_lr: 1 blobs_lr: 2
         weight_decay: 1 weight_decay: 0 inner_product_param { num_output: 3 } }
layers { name: "loss" type: SOFTMAX_LOSS bottom: "ip" bottom: "label" top: "loss" }
"""
CURRENT = """name: "v1"
layer { name: "data" type: "Data" top: "data" top: "label"
        transform_param { scale: 0.5 } data_param { source: "db" batch_size: 2 backend: LMDB } }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
        param { lr_mult: 1 decay_mult: 1 } param { lr_mult: 2 decay_mult: 0 }
        inner_product_param { num_output: 3 } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
"""


def pb(text, kind="NetParameter"):
    return text_format.Parse(text, getattr(caffe_pb2, kind)())


def test_net_text(tmp_path, capsys):
    (tmp_path / "old.prototxt").write_text(V1)
    assert cli("upgrade_net_proto_text", tmp_path / "old.prototxt", tmp_path / "new") == 0
    assert pb((tmp_path / "new").read_text()) == pb(CURRENT)
    assert "Wrote upgraded NetParameter text proto" in capsys.readouterr().err
    assert cli("upgrade_net_proto_text", tmp_path / "new", tmp_path / "again") == 0
    assert "File already in latest proto format" in capsys.readouterr().err
    assert pb((tmp_path / "again").read_text()) == pb(CURRENT)


def test_net_binary_keeps_the_weights(tmp_path):
    old = pb(V1)
    old.layers[1].blobs.add().data.extend([1.5, -2.0, 3.25])
    (tmp_path / "old.caffemodel").write_bytes(old.SerializeToString())
    assert cli("upgrade_net_proto_binary", tmp_path / "old.caffemodel", tmp_path / "new") == 0
    new = caffe_pb2.NetParameter.FromString((tmp_path / "new").read_bytes())
    want = pb(CURRENT)
    want.layer[1].blobs.add().data.extend([1.5, -2.0, 3.25])
    assert new == want


def test_solver_text(tmp_path):
    (tmp_path / "s").write_text('net: "n.prototxt" base_lr: 0.01 solver_type: NESTEROV\n')
    assert cli("upgrade_solver_proto_text", tmp_path / "s", tmp_path / "out") == 0
    assert pb((tmp_path / "out").read_text(), "SolverParameter") == pb(
        'net: "n.prototxt" base_lr: 0.01 type: "Nesterov"', "SolverParameter")


def test_bad_input_is_one_line(tmp_path, capsys):
    (tmp_path / "bad").write_text("layers { name: 3 4 }")
    assert cli("upgrade_net_proto_text", tmp_path / "bad", tmp_path / "out") == 1
    assert "bad: failed to parse input text file as NetParameter" in one_error_line(capsys)
    assert cli("upgrade_net_proto_binary", tmp_path / "none", tmp_path / "out") == 1
    assert "input file" in one_error_line(capsys) and not (tmp_path / "out").exists()


V0_INPUT = """name: "v0"
input: "data"
input_dim: 1 input_dim: 3 input_dim: 4 input_dim: 4
layers { layer { name: "conv1" type: "conv" num_output: 2 kernelsize: 3
                 weight_filler { type: "gaussian" std: 0.01 } blobs_lr: 1 blobs_lr: 2
                 weight_decay: 1 weight_decay: 0 } bottom: "data" top: "conv1" }
"""
# what BVLC's upgrade_net_proto_text writes for it (UpgradeNetInput's Input layer first;
# C++ TextFormat prints floats with SimpleFtoa: 1, 0.01, 1.23456776)
V0_UPGRADED = """name: "v0"
layer {
  name: "input"
  type: "Input"
  top: "data"
  input_param {
    shape {
      dim: 1
      dim: 3
      dim: 4
      dim: 4
    }
  }
}
layer {
  name: "conv1"
  type: "Convolution"
  bottom: "data"
  top: "conv1"
  param {
    lr_mult: 1
    decay_mult: 1
  }
  param {
    lr_mult: 2
    decay_mult: 0
  }
  convolution_param {
    num_output: 2
    kernel_size: 3
    weight_filler {
      type: "gaussian"
      std: 1.23456776
    }
  }
}
"""


def test_v0_inputs_become_an_input_layer_and_floats_print_as_caffes(tmp_path):
    (tmp_path / "old.prototxt").write_text(V0_INPUT.replace("std: 0.01", "std: 1.2345678"))
    assert cli("upgrade_net_proto_text", tmp_path / "old.prototxt", tmp_path / "new") == 0
    assert (tmp_path / "new").read_text() == V0_UPGRADED


def test_cpp_float_is_protobufs_simple_ftoa():
    from caffe8.tools._upgrade import cpp_float
    # (value, as float, as double): 6 digits when they read back, else 9 (17 for doubles)
    for value, as_float, as_double in [(1.0, "1", "1"), (0.01, "0.01", "0.01"),
                                       (1e-05, "1e-05", "1e-05"), (100000.0, "100000", "100000"),
                                       (1.2345678, "1.23456776", "1.2345678"),
                                       (16777217.0, "16777216", "16777217"),
                                       (0.1 + 0.2, "0.3", "0.30000000000000004"),
                                       (float("-inf"), "-inf", "-inf")]:
        assert (cpp_float(value), cpp_float(value, double=True)) == (as_float, as_double)
