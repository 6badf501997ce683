"""NetSpec / layers (L) / params (P): the prototxt a pycaffe user expects, parsed back by caffe8."""
import pytest

import caffe8 as caffe
from caffe8 import layers as L, params as P
from caffe8.engine.errors import CaffeError
from caffe8.engine.proto.convert import from_pb
from caffe8.engine.prototxt import parse_text

EXPECTED = '''layer {
  name: "data"
  type: "Input"
  top: "data"
  input_param {
    shape {
      dim: 2
      dim: 3
      dim: 8
      dim: 8
    }
  }
}
layer {
  name: "conv"
  type: "Convolution"
  bottom: "data"
  top: "conv"
  param {
    lr_mult: 1
  }
  param {
    lr_mult: 2
  }
  convolution_param {
    num_output: 4
    pad: 1
    kernel_size: 3
    weight_filler {
      type: "xavier"
    }
  }
}
layer {
  name: "relu"
  type: "ReLU"
  bottom: "conv"
  top: "conv"
}
layer {
  name: "Pooling1"
  type: "Pooling"
  bottom: "conv"
  top: "Pooling1"
  pooling_param {
    pool: AVE
    kernel_size: 2
    stride: 2
  }
}
layer {
  name: "out"
  type: "InnerProduct"
  bottom: "Pooling1"
  top: "out"
  loss_weight: 0.5
  include {
    phase: TEST
  }
  inner_product_param {
    num_output: 3
  }
}
'''


def spec():
    n = caffe.NetSpec()
    n.data = L.Input(shape=dict(dim=[2, 3, 8, 8]))
    n.conv = L.Convolution(n.data, num_output=4, kernel_size=3, pad=1,
                           weight_filler=dict(type="xavier"),
                           param=[dict(lr_mult=1), dict(lr_mult=2)])
    n.relu = L.ReLU(n.conv, in_place=True)
    pooled = L.Pooling(n.relu, kernel_size=2, stride=2, pool=P.Pooling.AVE)  # unnamed top
    n.out = L.InnerProduct(pooled, num_output=3, loss_weight=0.5,
                           include=dict(phase=caffe.TEST))
    return n


def test_to_proto_text_is_the_expected_prototxt():
    proto = spec().to_proto()
    assert type(proto) is caffe.proto.caffe_pb2.NetParameter   # as pycaffe's
    assert str(proto) == EXPECTED
    assert parse_text(str(proto), "spec.prototxt") == from_pb(proto)


def test_a_net_builds_from_the_spec(tmp_path):
    path = tmp_path / "n.prototxt"
    path.write_text(str(spec().to_proto()))
    net = caffe.Net(str(path), caffe.TEST)
    assert net.blobs["out"].shape == (2, 3) and net.blobs["Pooling1"].shape == (2, 4, 4, 4)
    assert net.blob_loss_weights["out"] == 0.5
    assert caffe.Net(spec(), caffe.TEST).blobs["out"].shape == (2, 3)   # a NetSpec directly
    assert "out" not in caffe.Net(str(path), caffe.TRAIN).blobs


def test_multiple_tops_names_and_enum_values():
    n = caffe.NetSpec()
    n.data, n.label = L.Data(source="db", backend=P.Data.LMDB, batch_size=4, ntop=2,
                             transform_param=dict(scale=0.5))
    n.loss = L.SoftmaxWithLoss(n.data, n.label, name="the_loss")
    proto = n.to_proto()
    data, loss = proto.layer
    pb = caffe.proto.caffe_pb2
    assert (data.name, list(data.top)) == ("data", ["data", "label"])
    assert data.data_param.backend == pb.DataParameter.LMDB == P.Data.LMDB
    assert data.transform_param.scale == 0.5
    assert (loss.name, list(loss.bottom), list(loss.top)) == ("the_loss", ["data", "label"],
                                                              ["loss"])
    assert P.Pooling.MAX == pb.PoolingParameter.MAX == 0 and pb.TEST == caffe.TEST == 1


def test_bad_fields_name_the_layer_and_field():
    n = caffe.NetSpec()
    n.data = L.Input(shape=dict(dim=[1]))
    n.ip = L.InnerProduct(n.data, num_outputs=3)
    with pytest.raises(CaffeError, match=r"InnerProduct\(num_outputs=...\).*no field"):
        n.to_proto()
    n2 = caffe.NetSpec()
    n2.data = L.Input(shape=dict(dim=[1]), include=dict(phase=7))
    with pytest.raises(CaffeError, match="not a value of Phase"):
        n2.to_proto()


def test_a_bottom_that_is_not_a_top_is_a_type_error_in_pycaffes_words():
    data = L.DummyData(ntop=2)  # a tuple of two tops
    with pytest.raises(TypeError, match=r"^Silence input 0 is not a Top \(type is <class "
                                        r"'tuple'>\)$") as err:
        L.Silence(data, ntop=0)
    assert isinstance(err.value, CaffeError)  # the tools print it as one line
    n = caffe.NetSpec()
    with pytest.raises(TypeError, match="NetSpec.x: assign a layer's top"):
        n.x = 3
    n.silence = L.Silence(*data, ntop=0)
    assert [layer.type for layer in n.to_proto().layer] == ["DummyData", "Silence"]
