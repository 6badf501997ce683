"""Python layer: a user module written into tmp_path (a Euclidean loss, and a layer with its own
learnable blob) imported from the prototxt's folder, trained in a linreg-style net against the
built-in EuclideanLoss and a closed-form gradient; param_str and phase; import errors."""
import textwrap

import numpy
import pytest

from caffe8 import solvers
from caffe8.engine.errors import LayerError
from caffe8.engine.net import Net
from caffe8.engine.prototxt import parse_text

PYLOSS = '''
import numpy as np


class EuclideanLossLayer:
    """Loss = sum((a - b)^2) / (2 N), written independently of caffe8's EuclideanLoss."""

    def setup(self, bottom, top):
        if len(bottom) != 2:
            raise Exception("Need two inputs to compute distance.")
        self.seen_param_str = self.param_str
        self.seen_phase = self.phase

    def reshape(self, bottom, top):
        if bottom[0].count != bottom[1].count:
            raise Exception("Inputs must have the same dimension.")
        self.diff = np.zeros_like(bottom[0].data)
        top[0].reshape((1,))

    def forward(self, bottom, top):
        self.diff[...] = bottom[0].data - bottom[1].data
        top[0].data[...] = np.sum(self.diff ** 2) / bottom[0].data.shape[0] / 2.0

    def backward(self, top, propagate_down, bottom):
        for i in range(2):
            if not propagate_down[i]:
                continue
            sign = 1 if i == 0 else -1
            bottom[i].diff[...] = sign * self.diff / bottom[i].data.shape[0] * top[0].diff[0]
'''

SCALE = '''
import numpy as np


class LearnedScale:
    """y = w * x with one learnable scalar w, initialised from param_str."""

    def __init__(self, layer_param):
        self.name = layer_param.name

    def setup(self, bottom, top):
        self.blobs.add_blob(1)
        self.blobs[0].data[...] = float(self.param_str)

    def reshape(self, bottom, top):
        top[0].reshape(bottom[0].data.shape)

    def forward(self, bottom, top):
        top[0].data[...] = self.blobs[0].data[0] * bottom[0].data

    def backward(self, top, propagate_down, bottom):
        self.blobs[0].diff[0] += np.sum(top[0].diff * bottom[0].data)
        if propagate_down[0]:
            bottom[0].diff[...] = self.blobs[0].data[0] * top[0].diff
'''


def linreg(loss_layer):
    return textwrap.dedent(f"""
    name: 'LinearRegressionExample'
    layer {{ type: 'Input' name: 'input' top: 'x' top: 'y'
      input_param {{ shape {{ dim: 10 dim: 3 dim: 2 }} shape {{ dim: 10 dim: 3 dim: 2 }} }} }}
    layer {{ type: 'InnerProduct' name: 'ipx' top: 'ipx' bottom: 'x'
      inner_product_param {{ num_output: 10 weight_filler {{ type: 'xavier' }} }} }}
    layer {{ type: 'InnerProduct' name: 'ipy' top: 'ipy' bottom: 'y'
      inner_product_param {{ num_output: 10 weight_filler {{ type: 'xavier' }} }} }}
    {loss_layer}
    """)


PY_LOSS = """layer { type: 'Python' name: 'loss' top: 'loss' bottom: 'ipx' bottom: 'ipy'
  python_param { module: 'user_pyloss' layer: 'EuclideanLossLayer' param_str: 'hello' }
  loss_weight: 1 }"""
BUILTIN_LOSS = "layer { type: 'EuclideanLoss' name: 'loss' top: 'loss' bottom: 'ipx' bottom: 'ipy' }"


def write(tmp_path, name, source, text):
    (tmp_path / f"{name}.py").write_text(source)
    path = tmp_path / "net.prototxt"
    path.write_text(text)
    return str(path)


def test_python_loss_matches_builtin_and_closed_form(tmp_path):
    path = write(tmp_path, "user_pyloss", PYLOSS, linreg(PY_LOSS))
    net = Net(path, dtype=numpy.float64)
    (tmp_path / "ref").mkdir()
    ref_path = tmp_path / "ref" / "net.prototxt"
    ref_path.write_text(linreg(BUILTIN_LOSS))
    ref = Net(str(ref_path), dtype=numpy.float64)
    user = net.layers[net.layer_names.index("loss")].user
    assert user.seen_param_str == "hello" and user.seen_phase == 0
    rng = numpy.random.default_rng(0)
    x, y = rng.standard_normal((2, 10, 3, 2))
    for n in (net, ref):
        n.blobs["x"].data[...] = x
        n.blobs["y"].data[...] = y
    for name in ("ipx", "ipy"):
        for mine, theirs in zip(net.params[name], ref.params[name]):
            theirs.data[...] = mine.data
    net.clear_param_diffs()
    ref.clear_param_diffs()
    loss, ref_loss = net.forward_backward(), ref.forward_backward()
    wx, bx = (p.data for p in net.params["ipx"])
    wy, by = (p.data for p in net.params["ipy"])
    d = (x.reshape(10, -1) @ wx.T + bx) - (y.reshape(10, -1) @ wy.T + by)
    numpy.testing.assert_allclose(float(loss), (d ** 2).sum() / 20, rtol=1e-12)
    numpy.testing.assert_allclose(float(loss), float(ref_loss), rtol=1e-12)
    numpy.testing.assert_allclose(net.params["ipx"][0].diff, d.T @ x.reshape(10, -1) / 10,
                                  rtol=1e-10)
    for name in ("ipx", "ipy"):
        for mine, theirs in zip(net.params[name], ref.params[name]):
            numpy.testing.assert_allclose(mine.diff, theirs.diff, rtol=1e-10, atol=1e-14)


def test_python_loss_trains_with_sgd(tmp_path):
    path = write(tmp_path, "user_pyloss_train", PYLOSS,
                 linreg(PY_LOSS.replace("user_pyloss", "user_pyloss_train")))
    net = Net(path, dtype=numpy.float64)
    solver = solvers.create_solver(parse_text("base_lr: 0.05 lr_policy: 'fixed' momentum: 0.9",
                                              "solver.prototxt", "SolverParameter"), net)
    rng = numpy.random.default_rng(1)
    net.blobs["x"].data[...] = rng.standard_normal((10, 3, 2))
    net.blobs["y"].data[...] = rng.standard_normal((10, 3, 2))
    losses = []
    for _ in range(30):
        net.clear_param_diffs()
        losses.append(float(net.forward_backward()))
        solver.apply_update()
    assert losses[-1] < 0.1 * losses[0]


def test_user_blobs_are_learnable_params(tmp_path):
    layer = """layer { type: 'Python' name: 'scale' bottom: 'ipx' top: 'sx'
      python_param { module: 'user_scale' layer: 'LearnedScale' param_str: '2.5' } }
    layer { type: 'EuclideanLoss' name: 'loss' bottom: 'sx' bottom: 'ipy' top: 'loss' }"""
    path = write(tmp_path, "user_scale", SCALE, linreg(layer))
    net = Net(path, dtype=numpy.float64)
    assert net.layers[net.layer_names.index("scale")].user.name == "scale"
    (w,) = net.params["scale"]
    assert w.shape == (1,) and float(w.data[0]) == 2.5
    assert any(p is w for p in net.learnable_params)
    rng = numpy.random.default_rng(2)
    net.blobs["x"].data[...] = rng.standard_normal((10, 3, 2))
    net.blobs["y"].data[...] = rng.standard_normal((10, 3, 2))
    net.clear_param_diffs()
    net.forward_backward()
    ipx, ipy = net.blobs["ipx"].data, net.blobs["ipy"].data
    expected = numpy.sum((2.5 * ipx - ipy) * ipx) / 10
    numpy.testing.assert_allclose(float(w.diff[0]), expected, rtol=1e-10)


def test_test_phase_is_one(tmp_path):
    path = write(tmp_path, "user_pyloss_phase", PYLOSS,
                 linreg(PY_LOSS.replace("user_pyloss", "user_pyloss_phase")))
    net = Net(path, phase="TEST", dtype=numpy.float64)
    assert net.layers[net.layer_names.index("loss")].user.seen_phase == 1


def test_import_errors_name_the_layer(tmp_path):
    path = write(tmp_path, "user_broken", "import no_such_module_xyz\n",
                 linreg(PY_LOSS.replace("user_pyloss", "user_broken")))
    with pytest.raises(LayerError, match=r"layer 'loss'.*user_broken.*No module named "
                                         r"'no_such_module_xyz'"):
        Net(path)
    path = write(tmp_path, "user_missing_cls", PYLOSS,
                 linreg(PY_LOSS.replace("user_pyloss", "user_missing_cls")
                        .replace("EuclideanLossLayer", "Nope")))
    with pytest.raises(LayerError, match="layer 'loss'.*no class 'Nope'"):
        Net(path)
    path = write(tmp_path, "unused", "",
                 linreg(PY_LOSS.replace("user_pyloss", "user_absent_module")))
    with pytest.raises(LayerError, match="layer 'loss'.*ModuleNotFoundError"):
        Net(path)


def test_errors_in_user_code_become_layer_errors(tmp_path):
    bad = PYLOSS.replace("if len(bottom) != 2", "if len(bottom) != 3")
    path = write(tmp_path, "user_bad_setup", bad,
                 linreg(PY_LOSS.replace("user_pyloss", "user_bad_setup")))
    with pytest.raises(LayerError, match="setup.*Need two inputs"):
        Net(path)


RAISES = '''
class Odd(Exception):
    def __init__(self, code, detail):  # a constructor LayerError's cannot call
        super().__init__(code, detail)


class Raising:
    def setup(self, bottom, top):
        if self.param_str == "runtime":
            raise RuntimeError("setup refused")
        if self.param_str == "key":
            raise KeyError("k")
        if self.param_str == "odd":
            raise Odd(7, "odd")

    def reshape(self, bottom, top):
        top[0].reshape((1,))

    def forward(self, bottom, top):
        raise ValueError("no forward")
'''


@pytest.mark.parametrize("kind", ["runtime", "key"])
def test_user_exceptions_keep_their_type_and_gain_the_layer_name(tmp_path, kind):
    """pycaffe lets a Python layer's exception through: ``except RuntimeError`` catches it; it
    is also a LayerError whose text names the layer and its line in the file."""
    layer = PY_LOSS.replace("user_pyloss", f"user_raise_{kind}").replace(
        "EuclideanLossLayer", "Raising").replace("hello", kind)
    path = write(tmp_path, f"user_raise_{kind}", RAISES, linreg(layer))
    original = {"runtime": RuntimeError, "key": KeyError}[kind]
    with pytest.raises(original) as err:
        Net(path)
    assert isinstance(err.value, LayerError)
    line = next(k for k, text in enumerate(open(path), 1) if "type: 'Python'" in text)
    assert str(err.value).startswith(f"layer 'loss' (type Python) at {path}:{line}:")
    assert f"Raising.setup() raised {original.__name__}" in str(err.value)
    assert isinstance(err.value.__cause__, original) and not isinstance(err.value.__cause__,
                                                                          LayerError)


def test_user_exceptions_in_forward_and_odd_constructors(tmp_path):
    layer = PY_LOSS.replace("user_pyloss", "user_raise_fw").replace(
        "EuclideanLossLayer", "Raising").replace("hello", "")
    net = Net(write(tmp_path, "user_raise_fw", RAISES, linreg(layer)))
    with pytest.raises(ValueError, match="layer 'loss'.*Raising.forward.*no forward"):
        net.forward()
    # an exception class whose constructor needs its own arguments: a plain LayerError
    (tmp_path / "odd").mkdir()
    layer = layer.replace("user_raise_fw", "user_raise_odd").replace("param_str: ''",
                                                                     "param_str: 'odd'")
    path = write(tmp_path / "odd", "user_raise_odd", RAISES, linreg(layer))
    with pytest.raises(LayerError, match=r"Raising.setup\(\) raised Odd") as err:
        Net(path)
    assert type(err.value) is LayerError
