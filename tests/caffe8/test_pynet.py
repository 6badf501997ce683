"""caffe8.Net as pycaffe's caffe.Net, each piece against a hand computation in NumPy."""
import os

import numpy
import pytest

import caffe8 as caffe
from caffe8.engine.errors import CaffeError, DataError

NET = """name: "tiny"
layer { name: "data" type: "Input" top: "data" top: "target"
  input_param { shape { dim: 3 dim: 4 } shape { dim: 3 dim: 2 } } }
layer { name: "ip1" type: "InnerProduct" bottom: "data" top: "ip1"
  inner_product_param { num_output: 5 weight_filler { type: "gaussian" std: 0.5 }
                        bias_filler { type: "gaussian" std: 0.5 } } }
layer { name: "relu1" type: "ReLU" bottom: "ip1" top: "ip1" }
layer { name: "ip2" type: "InnerProduct" bottom: "ip1" top: "ip2"
  inner_product_param { num_output: 2 weight_filler { type: "gaussian" std: 0.5 }
                        bias_filler { type: "gaussian" std: 0.5 } } }
layer { name: "loss" type: "EuclideanLoss" bottom: "ip2" bottom: "target" top: "loss" }
layer { name: "only_test" type: "Softmax" bottom: "ip2" top: "prob" include { phase: TEST } }
"""


@pytest.fixture
def net_file(tmp_path):
    path = tmp_path / "tiny.prototxt"
    path.write_text(NET)
    return str(path)


def reference(net, x):
    """The tiny net's forward in NumPy from its parameters."""
    w1, b1 = (b.data.astype(numpy.float64) for b in net.params["ip1"])
    w2, b2 = (b.data.astype(numpy.float64) for b in net.params["ip2"])
    h = numpy.maximum(x @ w1.T + b1, 0)
    return h, h @ w2.T + b2


def test_phases_are_pycaffe_integers(net_file):
    assert (caffe.TRAIN, caffe.TEST) == (0, 1)
    test = caffe.Net(net_file, caffe.TEST)
    assert "only_test" in test._layer_names and "prob" in test.outputs
    train = caffe.Net(net_file, caffe.TRAIN)
    assert "only_test" not in train._layer_names
    assert "only_test" in caffe.Net(net_file, phase=1)._layer_names
    with pytest.raises(CaffeError, match="phase must be TRAIN or TEST"):
        caffe.Net(net_file, 2)
    with pytest.raises(CaffeError, match="give the phase"):
        caffe.Net(net_file)


def test_graph_views(net_file):
    net = caffe.Net(net_file, caffe.TEST)
    assert list(net.blobs) == ["data", "target", "ip1", "ip2", "ip2_ip2_0_split_0",
                               "ip2_ip2_0_split_1", "loss", "prob"]
    assert net.inputs == ["data", "target"] and net.outputs == ["loss", "prob"]
    assert list(net.params) == ["ip1", "ip2"]
    assert [b.shape for b in net.params["ip1"]] == [(5, 4), (5,)]
    assert net._layer_names[:4] == ["data", "ip1", "relu1", "ip2"]
    assert [l.type for l in net.layers][:4] == ["Input", "InnerProduct", "ReLU", "InnerProduct"]
    assert net.layer_dict["ip2"].blobs[0].shape == (2, 5)
    assert net.top_names["relu1"] == ["ip1"] and net.bottom_names["loss"][1] == "target"
    assert net.blob_loss_weights["loss"] == 1.0 and net.blob_loss_weights["ip1"] == 0.0
    d = net.blobs["data"]
    assert (d.num, d.channels, d.height, d.width, d.count) == (3, 4, 1, 1, 12)
    # the Blob's arrays are the net's: writing params changes the forward
    net.params["ip2"][1].data[...] = 7
    assert numpy.allclose(net.forward(data=numpy.zeros((3, 4)), target=numpy.zeros((3, 2)))
                          ["prob"].sum(axis=1), 1)


def test_forward_with_inputs_and_ranges(net_file):
    net = caffe.Net(net_file, caffe.TEST)
    rng = numpy.random.default_rng(0)
    x, t = rng.normal(size=(3, 4)), rng.normal(size=(3, 2))
    out = net.forward(data=x, target=t, blobs=["ip1"])
    h, y = reference(net, x)
    assert set(out) == {"loss", "prob", "ip1"}
    numpy.testing.assert_allclose(out["ip1"], h, rtol=1e-5, atol=1e-6)
    numpy.testing.assert_allclose(out["loss"], ((y - t) ** 2).sum() / 2 / 3, rtol=1e-5)
    e = numpy.exp(y - y.max(axis=1, keepdims=True))
    numpy.testing.assert_allclose(out["prob"], e / e.sum(axis=1, keepdims=True), rtol=1e-5)
    full = {k: v.copy() for k, v in out.items()}
    # a range run: the first part, then (after spoiling ip2's top) the rest
    part = net.forward(end="relu1")
    assert set(part) == {"ip1"}
    net.blobs["ip2"].data[...] = 0
    net.blobs["prob"].data[...] = 0
    rest = net.forward(start="ip2")
    numpy.testing.assert_allclose(rest["prob"], full["prob"], rtol=1e-6)
    numpy.testing.assert_allclose(rest["loss"], full["loss"], rtol=1e-6)
    with pytest.raises(CaffeError, match="no such layer"):
        net.forward(start="nope")
    with pytest.raises(CaffeError, match="do not match"):
        net.forward(data=x)
    with pytest.raises(CaffeError, match="batch"):
        net.forward(data=x[:2], target=t[:2])


def test_backward_ranges_and_top_diffs(net_file):
    text = "force_backward: true\n" + NET
    net = caffe.Net(_write(net_file, text), caffe.TRAIN)
    rng = numpy.random.default_rng(1)
    x, t = rng.normal(size=(3, 4)), rng.normal(size=(3, 2))
    net.forward(data=x, target=t)
    grads = net.backward()
    h, y = reference(net, x)
    w1 = net.params["ip1"][0].data.astype(numpy.float64)
    w2 = net.params["ip2"][0].data.astype(numpy.float64)
    dy = (y - t) / 3                   # Euclidean loss: sum((y-t)^2)/2/N
    dh = (dy @ w2) * (h > 0)
    numpy.testing.assert_allclose(grads["data"], dh @ w1, rtol=1e-4, atol=1e-6)
    numpy.testing.assert_allclose(grads["target"], -dy, rtol=1e-4, atol=1e-6)
    full_w1 = net.params["ip1"][0].diff.copy()
    # the same in two ranges: loss..ip2 then relu1..data (param diffs accumulate, so reset)
    for layer in net.layers:
        for b in layer.blobs:
            b.diff[...] = 0
    upper = net.backward(end="ip2")
    assert set(upper) == {"ip1"}
    numpy.testing.assert_allclose(upper["ip1"], dy @ w2, rtol=1e-4, atol=1e-6)
    lower = net.backward(start="relu1")
    numpy.testing.assert_allclose(lower["data"], dh @ w1, rtol=1e-4, atol=1e-6)
    numpy.testing.assert_allclose(net.params["ip1"][0].diff, full_w1, rtol=1e-5)


def test_backward_from_given_top_diffs(tmp_path):
    net = caffe.Net(_write(str(tmp_path / "n.prototxt"), "force_backward: true\n" + """
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 2 dim: 3 } } }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
  inner_product_param { num_output: 4 weight_filler { type: "gaussian" } } }"""), caffe.TRAIN)
    dtop = numpy.arange(8.0).reshape(2, 4)
    net.forward(data=numpy.ones((2, 3)))
    grads = net.backward(ip=dtop)
    numpy.testing.assert_allclose(grads["data"], dtop @ net.params["ip"][0].data, rtol=1e-5)


def _write(path, text):
    with open(path, "w") as f:
        f.write(text)
    return path


def test_forward_all_pads_the_last_batch(net_file):
    net = caffe.Net(net_file, caffe.TEST)
    x = numpy.random.default_rng(2).normal(size=(7, 4))
    out = net.forward_all(data=x, target=numpy.zeros((7, 2)))
    _, y = reference(net, x)
    e = numpy.exp(y - y.max(axis=1, keepdims=True))
    assert out["prob"].shape == (7, 2)
    numpy.testing.assert_allclose(out["prob"], e / e.sum(axis=1, keepdims=True), rtol=1e-5)


def test_reshape_and_blob_reshape(net_file):
    net = caffe.Net(net_file, caffe.TEST)
    net.blobs["data"].reshape(6, 4)
    net.blobs["target"].reshape((6, 2))
    net.reshape()
    assert net.blobs["ip2"].shape == (6, 2) and net.blobs["prob"].num == 6
    x = numpy.random.default_rng(3).normal(size=(6, 4))
    out = net.forward(data=x, target=numpy.zeros((6, 2)))
    _, y = reference(net, x)
    numpy.testing.assert_allclose(out["prob"].argmax(1), y.argmax(1))


def test_weights_files_and_sharing(net_file, tmp_path):
    a = caffe.Net(net_file, caffe.TRAIN)
    path = str(tmp_path / "w.caffemodel.h5")
    a.save(path)
    b = caffe.Net(net_file, path, caffe.TEST)        # the older Net(file, weights, phase)
    c = caffe.Net(net_file, caffe.TEST, weights=path)
    for net in (b, c):
        for name in ("ip1", "ip2"):
            for pa, pb in zip(a.params[name], net.params[name]):
                numpy.testing.assert_array_equal(pa.data, pb.data)
    d = caffe.Net(net_file, caffe.TEST)
    d.share_with(a)
    a.params["ip1"][0].data[0, 0] = 42
    assert d.params["ip1"][0].data[0, 0] == 42
    with pytest.raises(DataError, match="not found"):
        a.copy_from(str(tmp_path / "missing.caffemodel.h5"))
    binary = str(tmp_path / "w.caffemodel")  # Caffe's binary proto, read back by name
    a.save(binary)
    e = caffe.Net(net_file, caffe.TEST, weights=binary)
    numpy.testing.assert_array_equal(e.params["ip2"][0].data, a.params["ip2"][0].data)


def test_hdf5_weights_are_told_by_content_not_name(net_file, tmp_path):
    """pycaffe's save_hdf5 / load_hdf5 on a temporary file of any name (BVLC's test_save_hdf5
    uses tempfile's), and copy_from on an HDF5 file named like a binary model."""
    a = caffe.Net(net_file, caffe.TRAIN)
    path = str(tmp_path / "tmpweights")
    a.save_hdf5(path)
    with open(path, "rb") as f:
        assert f.read(8) == b"\x89HDF\r\n\x1a\n"  # HDF5's signature
    b, c = caffe.Net(net_file, caffe.TEST), caffe.Net(net_file, caffe.TEST)
    b.load_hdf5(path)
    odd = str(tmp_path / "w.caffemodel")
    os.rename(path, odd)
    c.copy_from(odd)
    for net in (b, c):
        for name in ("ip1", "ip2"):
            for pa, pb in zip(a.params[name], net.params[name]):
                numpy.testing.assert_array_equal(pa.data, pb.data)
    with open(path, "wb") as f:
        f.write(b"neither format")
    with pytest.raises(DataError, match=f"{path}.*HDF5"):
        b.load_hdf5(path)


def test_set_input_arrays_needs_a_memory_data_layer(net_file):
    with pytest.raises(CaffeError, match="MemoryData"):
        caffe.Net(net_file, caffe.TEST).set_input_arrays(numpy.zeros((3, 1, 1, 4), "f"),
                                                         numpy.zeros(3, "f"))


def test_set_input_arrays_feeds_memory_data(tmp_path):
    from caffe8.engine.layer import LAYERS
    if "MemoryData" not in LAYERS:
        pytest.skip("no MemoryData layer in this build")
    path = _write(str(tmp_path / "m.prototxt"), """
layer { name: "data" type: "MemoryData" top: "data" top: "label"
  memory_data_param { batch_size: 2 channels: 1 height: 1 width: 3 } }""")
    net = caffe.Net(path, caffe.TEST)
    data = numpy.arange(12, dtype="f").reshape(4, 1, 1, 3)
    net.set_input_arrays(data, numpy.array([5, 6, 7, 8], "f"))
    out = net.forward(blobs=["data"])
    numpy.testing.assert_array_equal(out["data"], data[:2])
    numpy.testing.assert_array_equal(out["label"].ravel(), [5, 6])


def test_python_layer_subclassing_caffe_layer(tmp_path):
    (tmp_path / "pyscale.py").write_text('''import caffe8 as caffe


class Scale(caffe.Layer):
    def setup(self, bottom, top):
        self.k = float(self.param_str)
        self.seen_phase = self.phase

    def reshape(self, bottom, top):
        top[0].reshape(*bottom[0].data.shape)

    def forward(self, bottom, top):
        top[0].data[...] = self.k * bottom[0].data

    def backward(self, top, propagate_down, bottom):
        bottom[0].diff[...] = self.k * top[0].diff
''')
    from caffe8.engine.layer import LAYERS
    if "Python" not in LAYERS:
        pytest.skip("no Python layer in this build")
    net = caffe.Net(_write(str(tmp_path / "p.prototxt"), """force_backward: true
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 2 dim: 3 } } }
layer { name: "scale" type: "Python" bottom: "data" top: "out"
  python_param { module: "pyscale" layer: "Scale" param_str: "3" } }"""), caffe.TEST)
    x = numpy.arange(6.0).reshape(2, 3)
    numpy.testing.assert_allclose(net.forward(data=x)["out"], 3 * x)
    numpy.testing.assert_allclose(net.backward(out=numpy.ones((2, 3)))["data"], 3.0)
    assert net.layers[1].type == "Python" and net.layers[1].phase == caffe.TEST
    assert net._net.layers[1].user.seen_phase == caffe.TEST  # set before setup, as pycaffe


def test_backward_before_any_forward_says_so_when_it_fails_and_none_weights_are_errors(
        net_file, tmp_path):
    """As pycaffe, backward may run before forward (BVLC's tests set top diffs and do); when a
    layer then fails for want of forward's state, the error keeps its type and says why."""
    net = caffe.Net(net_file, caffe.TRAIN)  # its EuclideanLoss keeps the batch from forward
    with pytest.raises(Exception, match=r"ran before any forward pass: .*net.forward\(\) first"):
        net.backward()
    (tmp_path / "needs_forward.py").write_text(
        "class Remembers:\n"
        "    def setup(self, bottom, top): pass\n"
        "    def reshape(self, bottom, top): top[0].reshape(*bottom[0].data.shape)\n"
        "    def forward(self, bottom, top):\n"
        "        self.prob = bottom[0].data\n"
        "        top[0].data[...] = self.prob\n"
        "    def backward(self, top, propagate_down, bottom):\n"
        "        bottom[0].diff[...] = top[0].diff * self.prob\n")
    path = _write(str(tmp_path / "py.prototxt"), """force_backward: true
layer { name: "x" type: "Input" top: "x" input_param { shape { dim: 2 } } }
layer { name: "p" type: "Python" bottom: "x" top: "y"
  python_param { module: "needs_forward" layer: "Remembers" } }""")
    py = caffe.Net(path, caffe.TEST)
    with pytest.raises(AttributeError, match=r"'prob'.*\(Net.backward\(\) ran before any "
                                             r"forward pass: .*call net.forward\(\) first\)"):
        py.backward()
    py.forward(x=numpy.array([2.0, 3.0]))
    py.blobs["y"].diff[...] = 1
    numpy.testing.assert_allclose(py.backward(y=numpy.ones(2))["x"], [2.0, 3.0])
    with pytest.raises(CaffeError, match="pretrained_file is None; give the weights file, or "
                                         r"leave it out: Net\(network_file, phase\)"):
        caffe.Net(net_file, None, caffe.TEST)
    for cls in (caffe.Classifier, caffe.Detector):
        with pytest.raises(CaffeError, match=rf"^{cls.__name__}\(model_file, pretrained_file\): "
                                             "pretrained_file is None"):
            cls(net_file, None)
