"""SoftmaxWithLoss: loss against an explicit per-position log-sum-exp loop with each
normalisation mode's divisor counted by hand on a spatial (N, C, H, W) case, ignore_label,
FLT_MIN clamp, loss weight from top[0].diff, optional prob top, label errors, float64 gradients."""
import math

import numpy
import pytest

from caffe8.engine.errors import LayerError
from caffe8.engine.gradcheck import check_layer_gradient
from layer_util import assert_gpu_matches_cpu, blob, built_on, make, run, run_backward, tops

FLT_MIN = 1.1754943508222875e-38


def loss_text(extra="", axis=None):
    sm = f"softmax_param {{ axis: {axis} }}" if axis is not None else ""
    return (f'name: "loss" type: "SoftmaxWithLoss" bottom: "score" bottom: "label" top: "loss" '
            f'{sm} loss_param {{ {extra} }}')


def reference(x, labels, ignore=None, mode="VALID"):
    """(loss, dx for weight 1) from loops over n, h, w of an (N, C, H, W) score array."""
    n_, c_, h_, w_ = x.shape
    total, valid = 0.0, 0
    grad = numpy.zeros_like(x)
    for n in range(n_):
        for h in range(h_):
            for w in range(w_):
                lab = int(labels[n, h, w])
                if ignore is not None and lab == ignore:
                    continue
                v = [float(x[n, c, h, w]) for c in range(c_)]
                m = max(v)
                lse = m + math.log(sum(math.exp(t - m) for t in v))
                p_true = math.exp(v[lab] - lse)
                total -= math.log(max(p_true, FLT_MIN))
                valid += 1
                for c in range(c_):
                    grad[n, c, h, w] = math.exp(v[c] - lse) - (1.0 if c == lab else 0.0)
    divisor = {"VALID": valid, "FULL": n_ * h_ * w_, "BATCH_SIZE": n_, "NONE": 1}[mode]
    divisor = max(1, divisor)
    return total / divisor, grad / divisor


def spatial_case(seed=0):
    rng = numpy.random.default_rng(seed)
    x = rng.standard_normal((2, 4, 2, 3)) * 2
    labels = rng.integers(0, 4, (2, 2, 3)).astype(float)
    labels[0, 1, 2] = labels[1, 0, 0] = labels[1, 1, 1] = -1  # ignored where ignore_label: -1
    return x, labels


@pytest.mark.parametrize("mode", ["VALID", "FULL", "BATCH_SIZE", "NONE"])
def test_each_normalization_mode_on_spatial_case(mode):
    x, labels = spatial_case()
    layer = make(loss_text(f"ignore_label: -1 normalization: {mode}"))
    bottom, top = run(layer, [x, labels])
    assert top[0].data.shape == ()
    ref_loss, ref_grad = reference(x, labels, ignore=-1, mode=mode)
    numpy.testing.assert_allclose(float(top[0].data), ref_loss, rtol=1e-12)
    g = run_backward(layer, bottom, top, [numpy.array(0.7)], propagate=[True, False])[0]
    numpy.testing.assert_allclose(g, ref_grad * 0.7, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("normalize,mode", [("false", "BATCH_SIZE"), ("true", "VALID")])
def test_legacy_normalize_field(normalize, mode):
    x, labels = spatial_case(1)
    _, top = run(make(loss_text(f"ignore_label: -1 normalize: {normalize}")), [x, labels])
    numpy.testing.assert_allclose(float(top[0].data), reference(x, labels, -1, mode)[0], rtol=1e-12)


def test_normalization_wins_over_legacy_normalize():
    x, labels = spatial_case(2)
    _, top = run(make(loss_text("ignore_label: -1 normalize: false normalization: FULL")),
                 [x, labels])
    numpy.testing.assert_allclose(float(top[0].data), reference(x, labels, -1, "FULL")[0], rtol=1e-12)


def test_default_without_ignore_divides_by_n_h_w():
    x, labels = spatial_case(3)
    labels = numpy.abs(labels)  # no -1 and no ignore_label: every position counts
    _, top = run(make(loss_text()), [x, labels])
    ref_total = reference(x, labels, None, "NONE")[0]
    numpy.testing.assert_allclose(float(top[0].data), ref_total / (2 * 2 * 3), rtol=1e-12)


def test_all_ignored_gives_zero_loss_and_gradient():
    x = numpy.random.default_rng(4).standard_normal((2, 3))
    layer = make(loss_text("ignore_label: 5"))
    bottom, top = run(layer, [x, numpy.array([5.0, 5.0])])
    assert float(top[0].data) == 0.0
    g = run_backward(layer, bottom, top, [numpy.array(1.0)], propagate=[True, False])[0]
    numpy.testing.assert_array_equal(g, numpy.zeros_like(x))


def test_flt_min_clamp():
    x = numpy.array([[0.0, 1000.0]])  # p(class 0) = exp(-1000) underflows to 0
    _, top = run(make(loss_text()), [x, numpy.array([0.0])])
    numpy.testing.assert_allclose(float(top[0].data), -math.log(FLT_MIN), rtol=1e-12)


def test_class_axis_not_one_and_prob_top():
    x = numpy.random.default_rng(5).standard_normal((2, 3, 4))  # classes on axis 2
    labels = numpy.random.default_rng(6).integers(0, 4, (2, 3)).astype(float)
    layer = make(loss_text(axis=2) + ' top: "prob"')
    bottom, top = run(layer, [x, labels], n_top=2)
    moved = numpy.moveaxis(x, 2, 1)[..., None]  # as (N, C, H, W=1)
    numpy.testing.assert_allclose(float(top[0].data), reference(moved, labels[..., None])[0], rtol=1e-12)
    e = numpy.exp(x - x.max(axis=2, keepdims=True))
    numpy.testing.assert_allclose(top[1].data, e / e.sum(axis=2, keepdims=True), rtol=1e-13)


def test_gradcheck_scores_with_ignore_and_loss_weight():
    x, labels = spatial_case(7)
    layer = make(loss_text("ignore_label: -1"))
    check_layer_gradient(layer, [blob(x), blob(labels)], tops(1), check_bottom=[0])


@pytest.mark.parametrize("mode", ["FULL", "BATCH_SIZE", "NONE"])
def test_gradcheck_other_modes(mode):
    x, labels = spatial_case(8)
    layer = make(loss_text(f"ignore_label: -1 normalization: {mode}"))
    check_layer_gradient(layer, [blob(x), blob(labels)], tops(1), check_bottom=[0])


def test_labels_never_take_gradient():
    x, labels = spatial_case(9)
    layer = make(loss_text("ignore_label: -1"))
    assert layer.default_loss_weight == 1.0
    assert layer.allow_force_backward(0) and not layer.allow_force_backward(1)
    bottom, top = run(layer, [x, labels])
    with pytest.raises(LayerError, match="layer 'loss'.*label"):
        run_backward(layer, bottom, top, [numpy.array(1.0)], propagate=[True, True])


def test_label_count_mismatch_names_layer():
    with pytest.raises(LayerError, match="layer 'loss'.*labels"):
        run(make(loss_text()), [numpy.zeros((2, 3, 2)), numpy.zeros((2, 3))])


def test_label_out_of_range_names_layer():
    with pytest.raises(LayerError, match="layer 'loss'.*label 3 out of range"):
        run(make(loss_text()), [numpy.zeros((2, 3)), numpy.array([0.0, 3.0])])


@pytest.mark.gpu
def test_gpu_matches_cpu():
    x, labels = spatial_case(10)
    assert_gpu_matches_cpu(loss_text("ignore_label: -1") + ' top: "prob"', [x, labels], n_top=2)


def test_float32_matches_float64_reference():
    x, labels = spatial_case(11)
    layer = make(loss_text("ignore_label: -1"), dtype=numpy.float32)
    bottom, top = run(layer, [x, labels], dtype=numpy.float32)
    assert top[0].data.dtype == numpy.float32
    ref_loss, ref_grad = reference(x.astype(numpy.float32).astype(float), labels, -1)
    numpy.testing.assert_allclose(float(top[0].data), ref_loss, rtol=1e-6)
    g = run_backward(layer, bottom, top, [numpy.array(1.0)], propagate=[True, False])[0]
    assert g.dtype == numpy.float32
    numpy.testing.assert_allclose(g, ref_grad, rtol=1e-5, atol=1e-7)


@pytest.mark.gpu
def test_gpu_label_out_of_range_names_layer():
    """On CuPy the label check reads the device only when asked (Layer.defer_check); a layer
    outside a Net is asked at once, with the same message as on the host."""
    from caffe8.engine import backend
    cp = backend.cupy
    with built_on(cp):
        layer = make(loss_text())
        bottom = [blob(numpy.zeros((2, 3)), xp=cp), blob(numpy.array([0.0, 3.0]), xp=cp)]
        top = tops(1, xp=cp)
        layer.setup(bottom, top)
        with pytest.raises(LayerError, match="layer 'loss'.*label 3 out of range"):
            layer.forward(bottom, top)


@pytest.mark.parametrize("mode", ["VALID", "FULL", "BATCH_SIZE", "NONE"])
def test_without_ignore_label_equals_the_masked_path_bit_for_bit(mode):
    """Without an ignore_label the layer skips its mask (the in-place backward, no where/valid
    products); an ignore_label no position carries runs the masked path on the same batches:
    the same bits, forward and backward, over batches that change, float32 as in training."""
    rng = numpy.random.default_rng(12)
    plain = make(loss_text(f"normalization: {mode}"), dtype=numpy.float32)
    masked = make(loss_text(f"normalization: {mode} ignore_label: 7"), dtype=numpy.float32)
    runs = {}
    for name, layer in (("plain", plain), ("masked", masked)):
        bottom, top = [blob(numpy.zeros((3, 4, 2, 5)), numpy.float32),
                       blob(numpy.zeros((3, 2, 5)), numpy.float32)], tops(1, numpy.float32)
        layer.setup(bottom, top)
        runs[name] = (layer, bottom, top)
    for step in range(4):
        x = (rng.standard_normal((3, 4, 2, 5)) * (1 + step)).astype(numpy.float32)
        labels = rng.integers(0, 4, (3, 2, 5)).astype(numpy.float32)
        got = []
        for layer, bottom, top in runs.values():
            bottom[0].data[...], bottom[1].data[...] = x, labels
            layer.reshape(bottom, top)
            layer.forward(bottom, top)
            diff = run_backward(layer, bottom, top, [numpy.array(0.5 + step)], [True, False])[0]
            got.append((top[0].data.tobytes(), diff.tobytes()))
        assert runs["plain"][0].valid is None and runs["masked"][0].valid is not None
        assert got[0] == got[1]
