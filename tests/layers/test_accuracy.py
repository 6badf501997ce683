"""Accuracy: against a per-position loop where ties count as misses; top_k, ignore_label, class
axis, spatial inputs, per-class second top, errors."""
import numpy
import pytest

from caffe8.engine.errors import LayerError
from layer_util import assert_gpu_matches_cpu, make, run, run_backward


def acc_text(extra="", two_tops=False):
    t2 = ' top: "per_class"' if two_tops else ""
    return (f'name: "acc" type: "Accuracy" bottom: "score" bottom: "label" top: "acc"{t2} '
            f'accuracy_param {{ {extra} }}')


def reference(x, labels, top_k=1, ignore=None):
    """(accuracy, per-class) from loops over (N, C, H, W) scores: correct iff fewer than top_k
    other classes score >= the true class."""
    n_, c_, h_, w_ = x.shape
    hits, seen = numpy.zeros(c_), numpy.zeros(c_)
    for n in range(n_):
        for h in range(h_):
            for w in range(w_):
                lab = int(labels[n, h, w])
                if ignore is not None and lab == ignore:
                    continue
                rivals = sum(1 for c in range(c_) if c != lab and x[n, c, h, w] >= x[n, lab, h, w])
                seen[lab] += 1
                hits[lab] += rivals < top_k
    acc = hits.sum() / seen.sum() if seen.sum() else 0.0
    return acc, numpy.where(seen > 0, hits / numpy.maximum(seen, 1), 0.0)


def test_ties_count_as_misses():
    x = numpy.array([[1.0, 1.0, 0.0], [2.0, 1.0, 2.0], [0.0, 3.0, 1.0]])
    _, top = run(make(acc_text()), [x, numpy.array([0.0, 2.0, 1.0])])
    assert top[0].data.shape == ()
    assert float(top[0].data) == pytest.approx(1.0 / 3.0)  # rows 0, 1 tie: misses


def test_top2_with_ties():
    x = numpy.array([[3.0, 2.0, 2.0, 0.0], [3.0, 2.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
    _, top = run(make(acc_text("top_k: 2")), [x, numpy.array([1.0, 1.0, 0.0])])
    # row 0: classes >= 2.0 are 0, 1, 2 → 3 > 2 miss; row 1: 2 ≤ 2 hit; row 2: 4 > 2 miss
    assert float(top[0].data) == pytest.approx(1.0 / 3.0)


@pytest.mark.parametrize("top_k", [1, 2, 3])
@pytest.mark.parametrize("ignore", [None, 2])
def test_spatial_against_loop_with_per_class(top_k, ignore):
    rng = numpy.random.default_rng(top_k)
    x = rng.integers(0, 3, (3, 4, 2, 3)).astype(float)  # small integers: many ties
    labels = rng.integers(0, 4, (3, 2, 3)).astype(float)
    extra = f"top_k: {top_k}" + (f" ignore_label: {ignore}" if ignore is not None else "")
    _, top = run(make(acc_text(extra, two_tops=True)), [x, labels], n_top=2)
    acc, per_class = reference(x, labels, top_k, ignore)
    numpy.testing.assert_allclose(float(top[0].data), acc, rtol=1e-15)
    assert top[1].data.shape == (4,)
    numpy.testing.assert_allclose(top[1].data, per_class, rtol=1e-15)


def test_class_axis_last():
    rng = numpy.random.default_rng(5)
    x = rng.standard_normal((2, 3, 5))
    labels = rng.integers(0, 5, (2, 3)).astype(float)
    _, top = run(make(acc_text("axis: -1 top_k: 2")), [x, labels])
    acc, _ = reference(numpy.moveaxis(x, 2, 1)[..., None], labels[..., None], 2)
    numpy.testing.assert_allclose(float(top[0].data), acc, rtol=1e-15)


def test_all_ignored_is_zero():
    _, top = run(make(acc_text("ignore_label: 0")), [numpy.ones((2, 3)), numpy.zeros(2)])
    assert float(top[0].data) == 0.0


def test_float32():
    x = numpy.array([[0.1, 0.7, 0.2], [0.5, 0.4, 0.1]], dtype=numpy.float32)
    _, top = run(make(acc_text(), dtype=numpy.float32), [x, numpy.array([1.0, 1.0])],
                 dtype=numpy.float32)
    assert top[0].data.dtype == numpy.float32 and float(top[0].data) == 0.5


def test_top_k_larger_than_classes_names_layer():
    with pytest.raises(LayerError, match="layer 'acc'.*top_k"):
        run(make(acc_text("top_k: 4")), [numpy.ones((2, 3)), numpy.zeros(2)])


def test_label_count_mismatch_names_layer():
    with pytest.raises(LayerError, match="layer 'acc'.*labels"):
        run(make(acc_text()), [numpy.ones((2, 3, 2)), numpy.zeros(2)])


def test_no_backward():
    layer = make(acc_text())
    assert not layer.allow_force_backward(0) and not layer.allow_force_backward(1)
    bottom, top = run(layer, [numpy.ones((2, 3)), numpy.zeros(2)])
    run_backward(layer, bottom, top, [numpy.array(1.0)], propagate=[False, False])
    with pytest.raises(LayerError, match="layer 'acc'.*no backward"):
        run_backward(layer, bottom, top, [numpy.array(1.0)], propagate=[True, False])


@pytest.mark.gpu
def test_gpu_matches_cpu():
    rng = numpy.random.default_rng(9)
    x = rng.integers(0, 3, (3, 4, 2, 3)).astype(float)
    labels = rng.integers(0, 4, (3, 2, 3)).astype(float)
    assert_gpu_matches_cpu(acc_text("top_k: 2 ignore_label: 1", two_tops=True), [x, labels],
                           n_top=2, backward=False)


@pytest.mark.parametrize("top_k", [1, 2])
def test_without_ignore_label_equals_the_masked_path_bit_for_bit(top_k):
    """Without an ignore_label the layer counts every position without a mask; an
    ignore_label no position carries takes the masked path: the same accuracy and per-class
    accuracy over batches that change (ties included)."""
    rng = numpy.random.default_rng(4)
    def text(extra):
        return ('name: "acc" type: "Accuracy" bottom: "x" bottom: "label" top: "acc" '
                f'top: "per" accuracy_param {{ top_k: {top_k} {extra} }}')
    plain = make(text(""), dtype=numpy.float32)
    masked = make(text("ignore_label: 9"), dtype=numpy.float32)
    for step in range(4):
        x = rng.integers(0, 3, (6, 5, 3)).astype(numpy.float32)   # small integers: ties
        labels = rng.integers(0, 5, (6, 3)).astype(numpy.float32)
        got = [tuple(t.data.tobytes() for t in run(layer, [x, labels], 2, numpy.float32)[1])
               for layer in (plain, masked)]
        assert got[0] == got[1]
