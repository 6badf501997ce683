"""Binary model/solver-state/mean files: files built with caffe_pb2 directly (independent of
engine.model_io's writer) load with the right blobs, and what caffe8 writes reads back with plain
caffe_pb2 as Caffe would read it."""
import os

import h5py
import numpy
import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, text_format

from caffe8.engine import model_io, snapshot
from caffe8.engine.datum import read_mean_file, write_mean_file
from caffe8.engine.errors import CaffeError, DataError
from caffe8.engine.net import Net
from caffe8.engine.proto import caffe_pb2
from caffe8.engine.prototxt import parse_text
from tests.engine import net_test_layers  # noqa: F401  (registers NT* layers)

NET = """name: "tiny"
layer { name: "in" type: "NTData" top: "x" top: "t"
  dummy_data_param { shape { dim: 3 dim: 4 } shape { dim: 3 } } }
layer { name: "ip" type: "NTLinear" bottom: "x" top: "y"
  inner_product_param { num_output: 2 weight_filler { type: "gaussian" } bias_filler { type: "gaussian" } } }
layer { name: "loss" type: "NTHalfSq" bottom: "y" top: "loss" }
"""


def build(dtype=numpy.float32, text=NET):
    return Net(parse_text(text, "net.prototxt"), dtype=dtype)


def pb_model(layers):
    """A NetParameter written with caffe_pb2 only: ``layers`` = [(name, [(shape, values)])]."""
    net = caffe_pb2.NetParameter(name="zoo")
    for name, blobs in layers:
        lp = net.layer.add(name=name, type="Whatever")
        for shape, values in blobs:
            b = lp.blobs.add()
            b.shape.dim.extend(shape)
            b.data.extend(float(v) for v in numpy.ravel(values))
    return net


def test_binary_model_written_by_protobuf_loads_by_name(tmp_path):
    w = numpy.arange(8, dtype=numpy.float32).reshape(2, 4) / 7
    b = numpy.array([0.5, -1.25], numpy.float32)
    path = tmp_path / "zoo.caffemodel"
    path.write_bytes(pb_model([("unknown_layer", [((5,), numpy.ones(5))]),
                               ("ip", [((2, 4), w), ((2,), b)])]).SerializeToString())
    net = build()
    net.copy_trained_layers_from(str(path))
    numpy.testing.assert_array_equal(net.params["ip"][0].data, w)
    numpy.testing.assert_array_equal(net.params["ip"][1].data, b)


def test_legacy_4d_blob_shapes_and_double_data(tmp_path):
    w = numpy.linspace(-1, 1, 8).reshape(2, 4)
    net_pb = caffe_pb2.NetParameter()
    lp = net_pb.layer.add(name="ip")
    legacy = lp.blobs.add(num=1, channels=1, height=2, width=4)      # (2, 4) padded to 4-D
    legacy.data.extend(w.ravel().tolist())
    bias = lp.blobs.add(num=1, channels=1, height=1, width=2)
    bias.double_data.extend([3.0, 4.0])
    path = tmp_path / "legacy.caffemodel"
    path.write_bytes(net_pb.SerializeToString())
    net = build(numpy.float64)
    net.copy_trained_layers_from(str(path))
    numpy.testing.assert_allclose(net.params["ip"][0].data, w.astype(numpy.float32))
    numpy.testing.assert_array_equal(net.params["ip"][1].data, [3.0, 4.0])


def test_v1_binary_model_loads(tmp_path):
    """A pre-2015 model: layers in NetParameter.layers (V1LayerParameter, enum type)."""
    w = numpy.full((2, 4), 0.25, numpy.float32)
    net_pb = caffe_pb2.NetParameter(name="old")
    v1 = net_pb.layers.add(name="ip", type=caffe_pb2.V1LayerParameter.INNER_PRODUCT)
    v1.bottom.append("x")
    v1.blobs_lr.extend([1, 2])
    for shape, values in (((1, 1, 2, 4), w), ((1, 1, 1, 2), [7.0, 8.0])):
        blob = v1.blobs.add(num=shape[0], channels=shape[1], height=shape[2], width=shape[3])
        blob.data.extend(numpy.ravel(values).tolist())
    path = tmp_path / "v1.caffemodel"
    path.write_bytes(net_pb.SerializeToString())
    net = build()
    net.copy_trained_layers_from(str(path))
    numpy.testing.assert_array_equal(net.params["ip"][0].data, w)
    numpy.testing.assert_array_equal(net.params["ip"][1].data, [7.0, 8.0])


def test_shape_mismatch_and_blob_count_are_fatal(tmp_path):
    bad = tmp_path / "bad.caffemodel"
    bad.write_bytes(pb_model([("ip", [((4, 2), numpy.zeros(8)), ((2,), numpy.zeros(2))])])
                    .SerializeToString())
    with pytest.raises(DataError, match=r"param 0 .*layer 'ip'.*shape mismatch.*\(4, 2\).*\(2, 4\)"):
        build().copy_trained_layers_from(str(bad))
    extra = tmp_path / "extra.caffemodel"
    extra.write_bytes(pb_model([("ip", [((2, 4), numpy.zeros(8))] * 3)]).SerializeToString())
    with pytest.raises(DataError, match="incompatible number of blobs"):
        build().copy_trained_layers_from(str(extra))
    junk = tmp_path / "junk.caffemodel"
    junk.write_bytes(b"\xff\xff\xff")
    with pytest.raises(DataError, match="junk.caffemodel.*not a binary Caffe model"):
        build().copy_trained_layers_from(str(junk))
    with pytest.raises(DataError, match="does not exist"):
        build().copy_trained_layers_from(str(tmp_path / "missing.caffemodel"))


def test_binary_round_trip_read_back_with_protobuf(tmp_path):
    src = build()
    src.forward_backward()
    path = str(tmp_path / "m.caffemodel")
    model_io.save_model(src, path, write_diff=True)
    parsed = caffe_pb2.NetParameter.FromString(open(path, "rb").read())
    assert parsed.name == "tiny"
    assert [l.name for l in parsed.layer] == src.layer_names
    ip = parsed.layer[src.layer_names.index("ip")]
    assert ip.type == "NTLinear" and ip.inner_product_param.num_output == 2
    assert list(ip.blobs[0].shape.dim) == [2, 4]
    numpy.testing.assert_array_equal(numpy.array(ip.blobs[0].data, numpy.float32).reshape(2, 4),
                                     src.params["ip"][0].data)
    numpy.testing.assert_array_equal(numpy.array(ip.blobs[1].diff, numpy.float32),
                                     src.params["ip"][1].diff)
    dst = build()
    assert not numpy.array_equal(dst.params["ip"][0].data, src.params["ip"][0].data)
    dst.copy_trained_layers_from(path)
    for mine, theirs in zip(dst.params["ip"], src.params["ip"]):
        numpy.testing.assert_array_equal(mine.data, theirs.data)


def test_real_net_written_as_caffe_would_and_read_back(tmp_path):
    """BVLC's LeNet deploy net with the real layers: the binary model holds each layer's
    parameters (compared with protobuf's own text parser on the prototxt) and its blobs."""
    proto = os.path.join(os.path.dirname(__file__), "..", "data", "bvlc", "examples", "mnist",
                         "lenet.prototxt")
    src = Net(proto, phase="TEST")
    path = str(tmp_path / "lenet.caffemodel")
    model_io.save_model(src, path)
    written = caffe_pb2.NetParameter.FromString(open(path, "rb").read())
    declared = text_format.Parse(open(proto).read(), caffe_pb2.NetParameter())
    by_name = {l.name: l for l in written.layer}
    for layer in declared.layer:
        got = by_name[layer.name]
        assert (got.type, list(got.bottom), list(got.top)) == (layer.type, list(layer.bottom),
                                                               list(layer.top))
        for field in ("convolution_param", "pooling_param", "inner_product_param"):
            if layer.HasField(field):
                assert getattr(got, field) == getattr(layer, field), (layer.name, field)
        assert [p.lr_mult for p in got.param] == [p.lr_mult for p in layer.param]
    assert [list(b.shape.dim) for b in by_name["conv1"].blobs] == [[20, 1, 5, 5], [20]]
    assert [list(b.shape.dim) for b in by_name["ip1"].blobs] == [[500, 800], [500]]
    fresh = Net(proto, phase="TEST")
    assert not numpy.array_equal(fresh.params["conv1"][0].data, src.params["conv1"][0].data)
    dst = Net(proto, phase="TEST", weights=path)
    for name in ("conv1", "conv2", "ip1", "ip2"):
        for mine, theirs in zip(dst.params[name], src.params[name]):
            numpy.testing.assert_array_equal(mine.data, theirs.data)


def test_double_net_writes_double_data(tmp_path):
    src = build(numpy.float64)
    path = str(tmp_path / "d.caffemodel")
    model_io.save_model(src, path)
    ip = [l for l in caffe_pb2.NetParameter.FromString(open(path, "rb").read()).layer
          if l.name == "ip"][0]
    assert len(ip.blobs[0].data) == 0
    numpy.testing.assert_array_equal(numpy.array(ip.blobs[0].double_data).reshape(2, 4),
                                     src.params["ip"][0].data)


def test_convert_binary_hdf5_both_ways(tmp_path):
    src = build()
    binary = str(tmp_path / "m.caffemodel")
    model_io.save_model(src, binary)
    h5 = model_io.convert(binary, str(tmp_path / "m.caffemodel.h5"))
    with h5py.File(h5) as f:
        numpy.testing.assert_array_equal(f["data/ip/0"][...], src.params["ip"][0].data)
        numpy.testing.assert_array_equal(f["data/ip/1"][...], src.params["ip"][1].data)
    back = model_io.convert(h5, str(tmp_path / "back.caffemodel"))
    parsed = caffe_pb2.NetParameter.FromString(open(back, "rb").read())
    ip = [l for l in parsed.layer if l.name == "ip"][0]
    numpy.testing.assert_array_equal(numpy.array(ip.blobs[1].data, numpy.float32),
                                     src.params["ip"][1].data)
    dst = build()
    dst.copy_trained_layers_from(back)
    numpy.testing.assert_array_equal(dst.params["ip"][0].data, src.params["ip"][0].data)
    with pytest.raises(DataError, match="one file must be HDF5"):
        model_io.convert(binary, str(tmp_path / "x.caffemodel"))


def test_snapshot_names_follow_caffe():
    assert snapshot.snapshot_names("s/lenet", 100, "BINARYPROTO") == (
        "s/lenet_iter_100.caffemodel", "s/lenet_iter_100.solverstate")
    assert snapshot.snapshot_names("s/lenet", 100, "HDF5") == (
        "s/lenet_iter_100.caffemodel.h5", "s/lenet_iter_100.solverstate.h5")


@pytest.mark.parametrize("fmt", ["BINARYPROTO", "HDF5"])
def test_write_snapshot_honours_format_and_restores_by_name(tmp_path, fmt):
    src = build()
    lines = []
    hist = [numpy.full((2, 4), 0.5, numpy.float32), numpy.zeros(2, numpy.float32)]
    model, state = model_io.write_snapshot(src, {"iter": 5, "current_step": 0, "history": hist},
                                           str(tmp_path / "p"), 5, fmt, extra={"k": 1},
                                           log=lines.append)
    kind = "HDF5" if fmt == "HDF5" else "binary proto"
    assert lines == [f"Snapshotting to {kind} file {model}",
                     f"Snapshotting solver state to {kind} file {state}"]
    assert model.endswith(".caffemodel.h5" if fmt == "HDF5" else "_iter_5.caffemodel")
    assert h5py.is_hdf5(model) == (fmt == "HDF5") and h5py.is_hdf5(state) == (fmt == "HDF5")
    got, extra = snapshot.load_solverstate(state)
    import hashlib, os  # noqa: E401  (the state names its model: file and checksum)
    record = {"file": os.path.basename(model),
              "sha256": hashlib.sha256(open(model, "rb").read()).hexdigest()}
    assert got["learned_net"] == model and extra == {"k": 1, "model": record}
    numpy.testing.assert_array_equal(got["history"][0], hist[0])
    dst = build()
    dst.copy_trained_layers_from(got["learned_net"])
    numpy.testing.assert_array_equal(dst.params["ip"][0].data, src.params["ip"][0].data)


def _caffe_solverstate_class():
    """SolverState as BVLC Caffe declares it (fields 1-4 only), in a pool of its own."""
    fdp = descriptor_pb2.FileDescriptorProto(name="bvlc_state.proto", package="bvlc")
    fdp.message_type.add().CopyFrom(descriptor_pb2.DescriptorProto(name="BlobShape", field=[
        descriptor_pb2.FieldDescriptorProto(name="dim", number=1, type=3, label=3)]))
    blob = fdp.message_type.add(name="BlobProto")
    blob.field.add(name="shape", number=7, type=11, label=1, type_name=".bvlc.BlobShape")
    blob.field.add(name="data", number=5, type=2, label=3)
    state = fdp.message_type.add(name="SolverState")
    state.field.add(name="iter", number=1, type=5, label=1)
    state.field.add(name="learned_net", number=2, type=9, label=1)
    state.field.add(name="history", number=3, type=11, label=3, type_name=".bvlc.BlobProto")
    state.field.add(name="current_step", number=4, type=5, label=1)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("bvlc.SolverState"))


def test_binary_solverstate_round_trip_and_caffe_reads_it(tmp_path):
    hist = [numpy.arange(6, dtype=numpy.float32).reshape(2, 3), numpy.array([1.5], numpy.float32)]
    path = str(tmp_path / "s_iter_7.solverstate")
    extra = {"world": 1, "ranks": [{"rng": [1, 2, 3]}]}
    snapshot.save_solverstate(path, {"iter": 7, "current_step": 2, "history": hist},
                              "s_iter_7.caffemodel", extra=extra)
    raw = open(path, "rb").read()
    assert raw[:1] != b"\x89"     # not an HDF5 file
    caffe_state = _caffe_solverstate_class().FromString(raw)
    assert (caffe_state.iter, caffe_state.learned_net, caffe_state.current_step) == (
        7, "s_iter_7.caffemodel", 2)
    assert [list(h.shape.dim) for h in caffe_state.history] == [[2, 3], [1]]
    assert list(caffe_state.history[0].data) == list(range(6))
    state, got_extra = snapshot.load_solverstate(path)
    assert (state["iter"], state["current_step"], state["learned_net"]) == (
        7, 2, "s_iter_7.caffemodel")
    for a, b in zip(state["history"], hist):
        numpy.testing.assert_array_equal(a, b)
    assert got_extra == extra


def test_binary_solverstate_written_by_protobuf_and_junk(tmp_path):
    msg = caffe_pb2.SolverState(iter=3, learned_net="m.caffemodel")
    h = msg.history.add(num=1, channels=1, height=1, width=2)
    h.data.extend([0.5, 0.25])
    path = tmp_path / "x.solverstate"
    path.write_bytes(msg.SerializeToString())
    state, extra = snapshot.load_solverstate(str(path))
    assert state["iter"] == 3 and state["current_step"] == 0 and extra == {}
    numpy.testing.assert_array_equal(state["history"][0].reshape(-1), [0.5, 0.25])
    path.write_bytes(b"\x0a\xff")
    with pytest.raises(CaffeError, match="x.solverstate"):
        snapshot.load_solverstate(str(path))


def test_hdf5_solverstate_still_chosen_by_name(tmp_path):
    path = str(tmp_path / "s.solverstate.h5")
    snapshot.save_solverstate(path, {"iter": 4, "current_step": 0,
                                     "history": [numpy.ones(3, numpy.float32)]}, "m.h5")
    with h5py.File(path) as f:
        assert int(f["iter"][0]) == 4
    assert snapshot.load_solverstate(path)[0]["iter"] == 4


def test_binaryproto_mean_file_both_directions(tmp_path):
    mean = numpy.arange(12, dtype=numpy.float32).reshape(3, 2, 2) - 5
    ours = tmp_path / "ours.binaryproto"
    write_mean_file(str(ours), mean)
    blob = caffe_pb2.BlobProto.FromString(ours.read_bytes())
    assert (blob.num, blob.channels, blob.height, blob.width) == (1, 3, 2, 2)
    assert list(blob.data) == mean.ravel().tolist()
    theirs = caffe_pb2.BlobProto()
    theirs.shape.dim.extend([1, 3, 2, 2])
    theirs.data.extend(mean.ravel().tolist())
    path = tmp_path / "theirs.binaryproto"
    path.write_bytes(theirs.SerializeToString())
    numpy.testing.assert_array_equal(read_mean_file(str(path)), mean)


def test_a_weights_error_of_a_layer_name_used_twice_says_so(tmp_path):
    from caffe8.engine.net import Net
    from caffe8.engine.prototxt import parse_text
    text = ('layer { name: "x" type: "Input" top: "x" input_param { shape { dim: 2 dim: 3 } } }\n'
            'layer { name: "ip" type: "InnerProduct" bottom: "x" top: "a" '
            'inner_product_param { num_output: 4 } }\n'
            'layer { name: "ip" type: "InnerProduct" bottom: "a" top: "b" '
            'inner_product_param { num_output: 2 bias_term: false } }\n')
    net = Net(parse_text(text, "twice.prototxt"))
    path = str(tmp_path / "w.caffemodel")  # (HDF5 refuses to write two layers of one name)
    model_io.save_model(net, path)
    with pytest.raises(DataError, match=r"layer 'ip'.*; the layer name 'ip' is used 2 times "
                                        r"\(twice\.prototxt:2:\d+, twice\.prototxt:3:\d+\)"):
        Net(parse_text(text, "twice.prototxt"), weights=path)
