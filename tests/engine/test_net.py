"""Net semantics (Caffe's net.cpp) checked against closed forms, with the tiny layers of
net_test_layers (so a bug in a real layer cannot hide a bug in the Net)."""
import numpy
import pytest

from caffe8.engine import model_io
from caffe8.engine.errors import CaffeError, LayerError
from caffe8.engine.net import PARAM_ALIGN, Net
from caffe8.engine.net_graph import filter_net
from caffe8.engine.prototxt import parse_text
from tests.engine import net_test_layers  # noqa: F401  (registers NT* layers)

DATA = """layer { name: "in" type: "NTData" top: "x" top: "t"
  dummy_data_param { shape { dim: 3 dim: 4 } shape { dim: 3 } } }
"""


def linear(name, bottom, top, n=2, extra=""):
    return (f'layer {{ name: "{name}" type: "NTLinear" bottom: "{bottom}" top: "{top}" {extra}\n'
            f'  inner_product_param {{ num_output: {n} weight_filler {{ type: "gaussian" }}\n'
            f'  bias_filler {{ type: "gaussian" }} }} }}\n')


def halfsq(name, bottom, extra=""):
    return f'layer {{ name: "{name}" type: "NTHalfSq" bottom: "{bottom}" top: "{name}" {extra} }}\n'


def build(text, **kw):
    return Net(parse_text(text, "net.prototxt"), **kw)


def x_data():
    return 0.1 * (numpy.arange(12) + 1).reshape(3, 4)


# --- split insertion and in-place ----------------------------------------------------------------
def test_split_names_and_rewiring():
    net = build(DATA + linear("a", "x", "ya") + linear("b", "x", "yb") +
                halfsq("la", "ya") + halfsq("lb", "yb"))
    assert net.layer_names == ["in", "x_in_0_split", "a", "b", "la", "lb"]
    assert net.top_names[1] == ["x_in_0_split_0", "x_in_0_split_1"]
    assert net.bottom_names[2] == ["x_in_0_split_0"] and net.bottom_names[3] == ["x_in_0_split_1"]
    assert net.layers[1].type == "Split"
    assert net.output_blob_names == ["la", "lb", "t"]


def test_loss_weight_counts_as_a_use_and_moves_to_split_top0():
    net = build(DATA + linear("a", "x", "y", extra="loss_weight: 0.5") + halfsq("l", "y"))
    assert "y_a_0_split" in net.layer_names
    i = net.layer_names.index("y_a_0_split")
    assert net.top_names[i] == ["y_a_0_split_0", "y_a_0_split_1"]
    assert net.layer_loss_weights[i] == [0.5, 0.0]
    assert net.bottom_names[net.layer_names.index("l")] == ["y_a_0_split_1"]
    assert net.blob_loss_weights == {"y_a_0_split_0": 0.5, "l": 1.0}


def test_in_place_layer_reuses_the_blob():
    net = build(DATA + 'layer { name: "d" type: "NTDouble" bottom: "x" top: "x" }\n' +
                halfsq("l", "x"))
    i = net.layer_names.index("d")
    assert net.top_vecs[i][0] is net.bottom_vecs[i][0] is net.blobs["x"]
    out = net.forward()
    assert out["l"] == pytest.approx(0.5 * numpy.sum((2 * x_data()) ** 2), rel=1e-6)


# --- loss weights and gradients ------------------------------------------------------------------
def test_loss_weight_on_a_non_loss_top_closed_form():
    """loss = 0.5*sum(y) + 0.5*sum(y^2) with y = x W^T + b: dL/dy = 0.5 + y."""
    net = build(DATA + linear("a", "x", "y", extra="loss_weight: 0.5") + halfsq("l", "y"),
                dtype=numpy.float64)
    w, b = net.params["a"][0].data.copy(), net.params["a"][1].data.copy()
    x = x_data()
    y = x @ w.T + b
    loss = net.forward_backward()
    assert loss == pytest.approx(0.5 * y.sum() + 0.5 * (y ** 2).sum(), rel=1e-12)
    g = 0.5 + y
    numpy.testing.assert_allclose(net.params["a"][0].diff, g.T @ x, rtol=1e-12)
    numpy.testing.assert_allclose(net.params["a"][1].diff, g.sum(0), rtol=1e-12)


def test_loss_stays_an_array_until_read_and_net_loss_is_a_float():
    """Two weighted tops: forward_loss(as_float=False) hands back the un-read float64 array (on a
    GPU, a device scalar), and the float view of the same sum is what Net.loss and the default
    return give."""
    net = build(DATA + linear("a", "x", "y", extra="loss_weight: 0.5") + halfsq("l", "y"),
                dtype=numpy.float64)
    w, b = net.params["a"][0].data.copy(), net.params["a"][1].data.copy()
    y = x_data() @ w.T + b
    want = 0.5 * y.sum() + 0.5 * (y ** 2).sum()
    lazy = net.forward_loss(as_float=False)
    assert isinstance(lazy, numpy.ndarray) or isinstance(lazy, numpy.generic)
    assert numpy.asarray(lazy).dtype == numpy.float64
    assert type(net.loss) is float and net.loss == pytest.approx(want, rel=1e-12)
    assert float(lazy) == net.loss
    eager = net.forward_loss()
    assert type(eager) is float and eager == net.loss
    assert type(net.forward_backward(as_float=False)) is not float


@pytest.mark.gpu
def test_loss_stays_on_the_device_until_read():
    from caffe8.engine import backend
    text = DATA + linear("a", "x", "y", extra="loss_weight: 0.5") + halfsq("l", "y")
    host = build(text, dtype=numpy.float64)
    want = host.forward_loss()
    backend.use_gpu()
    try:
        net = build(text, dtype=numpy.float64)
        net.flat_data[...] = backend.to_device(host.flat_data, like=net.flat_data)
        lazy = net.forward_loss(as_float=False)
        assert isinstance(lazy, backend.cupy.ndarray) and lazy.shape == ()
        assert type(net.loss) is float and net.loss == pytest.approx(want, rel=1e-12)
    finally:
        backend.use_cpu()


def test_deferred_layer_checks_run_when_the_loss_is_read_or_before_the_next_pass():
    """Layer.defer_check (how the loss layers check labels on a GPU without stalling the
    device queue mid-forward): in a Net the check waits for the loss to be read, or for the
    next forward pass at the latest; a failing check raises there; outside a Net it runs now."""
    net = build(DATA + linear("a", "x", "y") + halfsq("l", "y"), dtype=numpy.float64)
    layer, ran = net.layers[-1], []
    forward = layer.forward

    def checking_forward(bottom, top):
        forward(bottom, top)
        layer.defer_check(lambda: ran.append(len(ran)))
    layer.forward = checking_forward
    net.forward_loss(as_float=False)
    assert ran == []
    net.loss
    assert ran == [0]
    net.forward_loss(as_float=False)
    net.forward_loss(as_float=False)            # the previous pass's check runs first
    assert ran == [0, 1]
    net.run_pending_checks()
    assert ran == [0, 1, 2]

    def failing():
        raise layer.error("bad labels")
    layer.forward = lambda bottom, top: (forward(bottom, top), layer.defer_check(failing))
    net.forward_loss(as_float=False)
    with pytest.raises(LayerError, match="bad labels"):
        net.loss
    alone = net.layers[-1].__class__(net.layers[-1].layer_param)
    with pytest.raises(LayerError, match="bad labels"):
        alone.defer_check(failing)                  # no Net: at once


def test_param_diffs_accumulate_over_backward_calls():
    net = build(DATA + linear("a", "x", "y") + halfsq("l", "y"), dtype=numpy.float64)
    net.forward_backward()
    once = net.params["a"][0].diff.copy()
    net.forward_backward()
    numpy.testing.assert_allclose(net.params["a"][0].diff, 2 * once)
    net.clear_param_diffs()
    assert not net.flat_diff.any()


# --- parameter sharing ---------------------------------------------------------------------------
SHARED = (DATA +
          linear("a", "x", "ya", extra='param { name: "w" } param { name: "bias" }') +
          'layer { name: "d" type: "NTDouble" bottom: "x" top: "x2" }\n' +
          linear("b", "x2", "yb", extra='param { name: "w" } param { name: "bias" }') +
          halfsq("la", "ya") + halfsq("lb", "yb"))


def test_shared_params_accumulate_diffs_from_both_users():
    net = build(SHARED, dtype=numpy.float64)
    assert len(net.learnable_params) == 2
    wa, wb = net.params["a"][0], net.params["b"][0]
    assert numpy.shares_memory(wa.data, wb.data) and numpy.shares_memory(wa.diff, wb.diff)
    w, b = wa.data.copy(), net.params["a"][1].data.copy()
    x1, x2 = x_data(), 2 * x_data()
    y1, y2 = x1 @ w.T + b, x2 @ w.T + b
    net.forward_backward()
    numpy.testing.assert_allclose(wa.diff, y1.T @ x1 + y2.T @ x2, rtol=1e-12)
    numpy.testing.assert_allclose(net.params["b"][1].diff, y1.sum(0) + y2.sum(0), rtol=1e-12)
    assert net.layer_param_slices[net.layer_names.index("b")] == []


def test_share_shape_mismatch_strict_and_permissive():
    text = (DATA + linear("a", "x", "ya", n=2, extra='param { name: "w" }') +
            'layer { name: "r" type: "NTDouble" bottom: "ya" top: "ya2" }\n' +
            linear("b", "ya2", "yb", n=4, extra='param { name: "w" %s }') + halfsq("l", "yb"))
    with pytest.raises(LayerError, match=r"layer 'b'.*shape mismatch"):
        build(text % "")
    net = build(text % "share_mode: PERMISSIVE")  # 2x4 and 4x2: same count
    assert net.params["b"][0].shape == (4, 2)
    assert numpy.shares_memory(net.params["b"][0].data, net.params["a"][0].data)


def test_shared_param_lr_mult_mismatch_is_an_error():
    text = (DATA + linear("a", "x", "ya", extra='param { name: "w" lr_mult: 1 }') +
            linear("b", "x", "yb", extra='param { name: "w" lr_mult: 2 }') +
            halfsq("la", "ya") + halfsq("lb", "yb"))
    with pytest.raises(LayerError, match="mismatched lr_mult"):
        build(text)


# --- backward pruning, propagate_down, force_backward -------------------------------------------
def test_branch_without_loss_gets_no_backward_and_lr0_gets_no_diff():
    text = (DATA + linear("frozen", "x", "h", n=3, extra="param { lr_mult: 0 } param { lr_mult: 0 }")
            + linear("a", "h", "y") + halfsq("l", "y") + linear("side", "h", "s"))
    net = build(text)
    need = dict(zip(net.layer_names, net.layer_need_backward))
    assert need == {"in": False, "frozen": False, "h_frozen_0_split": False, "a": True,
                    "l": True, "side": False}
    net.forward_backward()
    assert not net.params["frozen"][0].diff.any() and not net.params["frozen"][1].diff.any()
    assert not net.params["side"][0].diff.any()
    assert net.params["a"][0].diff.any()
    assert net.params_lr[:2] == [0.0, 0.0] and net.params_lr[2:4] == [1.0, 1.0]


def test_propagate_down_false_leaves_bottom_diff_untouched():
    text = (DATA + linear("first", "x", "h", n=3) +
            linear("second", "h", "y", extra="propagate_down: false") + halfsq("l", "y"))
    net = build(text)
    net.forward()
    net.blobs["h"].diff[...] = 7.0
    net.backward()
    assert (net.blobs["h"].diff == 7.0).all()
    assert not net.params["first"][0].diff.any()   # nothing reaches it
    assert net.params["second"][0].diff.any()


def test_force_backward_runs_every_layer():
    text = "force_backward: true\n" + DATA + linear("a", "x", "y") + linear("side", "x", "s")
    net = build(text)
    assert all(net.layer_need_backward)
    assert net.bottom_need_backward[net.layer_names.index("a")] == [True]


def test_backward_hook_runs_for_every_layer_in_reverse():
    net = build(DATA + linear("a", "x", "y") + halfsq("l", "y"))
    seen = []
    net.add_backward_hook(lambda i, layer: seen.append((i, layer.name)))
    net.add_forward_hook(lambda i, layer: seen.append(("f", layer.name)))
    net.forward_backward()
    assert seen == [("f", "in"), ("f", "a"), ("f", "l"), (2, "l"), (1, "a"), (0, "in")]


# --- the flat parameter buffer -------------------------------------------------------------------
def test_params_are_views_of_one_flat_buffer():
    net = build(SHARED + linear("c", "x", "yc", n=5) + halfsq("lc", "yc"))
    total = net.flat_data.size
    assert net.flat_data.shape == (total,) and net.flat_diff.shape == (total,)
    for blobs in net.params.values():
        for b in blobs:
            assert numpy.shares_memory(b.data, net.flat_data)
            assert numpy.shares_memory(b.diff, net.flat_diff)
    # each parameter starts on a 256-byte boundary, in learnable order, the gaps left at zero
    step = PARAM_ALIGN // net.flat_data.itemsize
    starts = [sl.start for sl in net.param_slices]
    assert starts == sorted(starts) and all(s % step == 0 for s in starts)
    assert all(b.data.ctypes.data % PARAM_ALIGN == net.flat_data.ctypes.data % PARAM_ALIGN
               for b in net.learnable_params)
    assert [sl.stop - sl.start for sl in net.param_slices] == \
        [b.count for b in net.learnable_params]
    net.flat_data[...] = numpy.arange(total)
    assert net.params["c"][1].data.tolist() == list(range(total - 5, total))
    net.params["c"][0].diff[...] = 3.0
    i = net.layer_names.index("c")
    (k0, s0), (k1, s1) = net.layer_param_slices[i]
    assert (k0, k1) == (0, 1) and (net.flat_diff[s0] == 3.0).all()
    assert s1.start == -(-s0.stop // step) * step and s1.stop == total
    assert not net.flat_diff[s0.stop:s1.start].any()


# --- phase / level / stage ------------------------------------------------------------------------
RULES = """
layer { name: "all" type: "X" }
layer { name: "train" type: "X" include { phase: TRAIN } }
layer { name: "test" type: "X" include { phase: TEST } }
layer { name: "not_test" type: "X" exclude { phase: TEST } }
layer { name: "lvl" type: "X" include { min_level: 1 max_level: 2 } }
layer { name: "stage_a" type: "X" include { stage: "a" } }
layer { name: "a_not_b" type: "X" include { stage: "a" not_stage: "b" } }
layer { name: "either" type: "X" include { phase: TEST } include { stage: "b" } }
"""


@pytest.mark.parametrize("phase, level, stages, kept", [
    ("TRAIN", 0, (), ["all", "train", "not_test"]),
    ("TEST", 0, (), ["all", "test", "either"]),
    ("TRAIN", 1, ("a",), ["all", "train", "not_test", "lvl", "stage_a", "a_not_b"]),
    ("TRAIN", 3, ("a", "b"), ["all", "train", "not_test", "stage_a", "either"]),
])
def test_phase_level_stage_filtering(phase, level, stages, kept):
    net_param = filter_net(parse_text(RULES, "rules.prototxt"), phase, level, stages)
    assert [l.name for l in net_param.layer] == kept


def test_include_and_exclude_together_is_an_error():
    text = 'layer { name: "both" type: "X" include { phase: TEST } exclude { phase: TRAIN } }'
    with pytest.raises(LayerError, match="'both'.*include rules or exclude rules"):
        filter_net(parse_text(text, "r.prototxt"), "TRAIN")


def test_net_phase_filters_layers():
    text = DATA + linear("a", "x", "y") + halfsq("l", "y", 'include { phase: TEST }')
    assert Net(parse_text(text), phase="TRAIN").layer_names == ["in", "a"]
    assert Net(parse_text(text), phase="TEST").layer_names == ["in", "a", "l"]


def test_file_state_level_and_stages_apply_and_args_add_to_them():
    text = ('state { level: 2 stage: "s1" }\n' + DATA + linear("a", "x", "y") +
            halfsq("lvl", "y", "include { min_level: 2 }") +
            linear("both", "x", "z", extra='include { stage: "s1" stage: "s2" }'))
    assert Net(parse_text(text)).layer_names == ["in", "a", "lvl"]
    assert Net(parse_text(text), level=0).layer_names == ["in", "a"]
    assert Net(parse_text(text), stages=["s2"]).layer_names[-1] == "both"


# --- bad input ----------------------------------------------------------------------------------
def test_missing_bottom_names_layer_and_place():
    text = DATA + linear("a", "x", "y") + '\nlayer { name: "loss" type: "NTHalfSq"\n  bottom: "nope" top: "l" }'
    with pytest.raises(LayerError) as e:
        build(text)
    assert str(e.value) == "layer 'loss': unknown bottom blob 'nope' (at net.prototxt:8:3)"


def test_duplicate_top_names_the_layer():
    text = DATA + linear("a", "x", "y") + linear("b", "x", "y")
    with pytest.raises(LayerError, match=r"layer 'b'.*top blob 'y' produced by multiple sources"):
        build(text)


def test_in_place_layer_on_a_split_blob_is_an_error_as_in_caffe():
    """Caffe renames the consumer's bottom to a split top but keeps its in-place top name, so
    the name then has two producers ("produced by multiple sources") -- the same here."""
    text = (DATA + linear("a", "x", "y", extra="loss_weight: 1") +
            'layer { name: "d" type: "NTDouble" bottom: "y" top: "y" }\n')
    with pytest.raises(LayerError, match="layer 'd'.*'y' produced by multiple sources"):
        build(text)


def test_loss_weight_count_must_match_tops():
    text = DATA.replace('top: "t"', 'top: "t" loss_weight: 1 loss_weight: 1 loss_weight: 1')
    with pytest.raises(CaffeError, match="loss_weight must be unspecified or given once per top"):
        build(text)


# --- HDF5 model files ---------------------------------------------------------------------------
def test_hdf5_roundtrip_with_slashes_and_shared_params(tmp_path):
    text = SHARED.replace('name: "a"', 'name: "inc/a"') + linear("c/x/1", "x", "yc") + halfsq("lc", "yc")
    src = build(text, dtype=numpy.float64)
    path = str(tmp_path / "m.caffemodel.h5")
    src.to_hdf5(path)
    import h5py
    with h5py.File(path) as f:
        assert set(f["data/inc/a"].keys()) == {"0", "1"}
        assert set(f["data/b"].keys()) == set()   # shared: not written, group still there
        assert "x_in_0_split" in f["data"] and f["data/c/x/1/0"].shape == (2, 4)
    dst = build(text, dtype=numpy.float64, weights=path)
    for name in ("inc/a", "c/x/1"):
        for mine, theirs in zip(dst.params[name], src.params[name]):
            numpy.testing.assert_array_equal(mine.data, theirs.data)
    numpy.testing.assert_array_equal(dst.params["b"][0].data, src.params["inc/a"][0].data)
    assert numpy.shares_memory(dst.params["inc/a"][0].data, dst.flat_data)


def test_hdf5_diff_tree_and_missing_param(tmp_path):
    import h5py
    net = build(SHARED, dtype=numpy.float64)
    net.forward_backward()
    path = str(tmp_path / "d.h5")
    net.to_hdf5(path, write_diff=True)
    with h5py.File(path) as f:
        assert set(f["diff/b"].keys()) == {"0", "1"}   # shared params do appear under /diff
        numpy.testing.assert_array_equal(f["diff/a/0"][...], net.params["a"][0].diff)
    with h5py.File(path, "a") as f:
        del f["data/a/1"]
    with pytest.raises(CaffeError, match="layer 'a': param 1 missing"):
        build(SHARED, weights=path)


def test_log_receives_caffe_setup_section():
    lines = []
    build(DATA + linear("a", "x", "y", n=5) + halfsq("l", "y"), log=lines.append)
    assert lines[0].startswith("Initializing net from parameters: \n")
    # Caffe's net.cpp lines in its order (a layer's lines may come in one call, one per line,
    # as glog writes them); memory = running count of top values x 4 bytes
    assert [line for call in lines[1:] for line in call.split("\n")] == [
        "Creating layer in", "Creating Layer in", "in -> x", "in -> t", "Setting up in",
        "Top shape: 3 4 (12)", "Top shape: 3 (3)", "Memory required for data: 60",
        "Creating layer a", "Creating Layer a", "a <- x", "a -> y", "Setting up a",
        "Top shape: 3 5 (15)", "Memory required for data: 120",
        "Creating layer l", "Creating Layer l", "l <- y", "l -> l", "Setting up l",
        "Top shape: (1)", "Memory required for data: 124",
        "l needs backward computation.", "a needs backward computation.",
        "in does not need backward computation.",
        "This network produces output l", "This network produces output t",
        "Network initialization done."]


def test_hdf5_shape_mismatch_names_the_layer(tmp_path):
    path = str(tmp_path / "m.h5")
    build(DATA + linear("a", "x", "y", n=2)).to_hdf5(path)
    with pytest.raises(CaffeError, match="layer 'a' param 0: shape mismatch"):
        build(DATA + linear("a", "x", "y", n=3), weights=path)


def test_share_trained_layers_with_shares_data_not_diff():
    train = build(DATA + linear("a", "x", "y") + halfsq("l", "y"))
    test = build(DATA + linear("a", "x", "y"), phase="TEST")
    test.share_trained_layers_with(train)
    assert numpy.shares_memory(test.params["a"][0].data, train.flat_data)
    assert not numpy.shares_memory(test.params["a"][0].diff, train.flat_diff)


# --- duplicate layer names (Caffe allows them) ---------------------------------------------------
def test_duplicate_layer_names_build_and_both_losses_count():
    """Two loss layers may share a name (BVLC's autoencoder has two named "loss"); Caffe sums
    both, and layer_names keeps both entries in order."""
    net = build(DATA + linear("a", "x", "ya", n=3) + linear("b", "x", "yb", n=2) +
                halfsq("loss", "ya").replace('top: "loss"', 'top: "l1"') +
                halfsq("loss", "yb").replace('top: "loss"', 'top: "l2"'))
    assert net.layer_names[-2:] == ["loss", "loss"]
    x = x_data()
    wa, ba = (p.data for p in net.params["a"])
    wb, bb = (p.data for p in net.params["b"])
    ya, yb = x @ wa.T + ba, x @ wb.T + bb
    want = 0.5 * (ya ** 2).sum() + 0.5 * (yb ** 2).sum()
    assert net.forward_loss() == pytest.approx(want, rel=1e-5)
    assert set(net.output_blob_names) == {"t", "l1", "l2"}


def test_duplicate_names_share_and_copy_to_the_first_layer_of_the_name(tmp_path):
    """Caffe's ShareTrainedLayersWith / CopyTrainedLayersFrom search the target net for the
    first layer of a source layer's name; a later same-named layer keeps its own params."""
    text = DATA + linear("ip", "x", "y1") + linear("ip", "x", "y2")
    src = build(DATA + linear("ip", "x", "y1"))
    path = str(tmp_path / "one.caffemodel")
    model_io.write_binary_model(src, path)
    net = build(text)
    first, second = [layer for layer in net.layers if layer.name == "ip"]
    second_before = second.blobs[0].data.copy()
    assert not numpy.array_equal(first.blobs[0].data, src.params["ip"][0].data)
    net.copy_trained_layers_from(path)
    numpy.testing.assert_array_equal(first.blobs[0].data, src.params["ip"][0].data)
    numpy.testing.assert_array_equal(second.blobs[0].data, second_before)
    test = build(text, phase="TEST")
    test.share_trained_layers_with(src)
    first, second = [layer for layer in test.layers if layer.name == "ip"]
    assert numpy.shares_memory(first.blobs[0].data, src.flat_data)
    assert not numpy.shares_memory(second.blobs[0].data, src.flat_data)


def test_hdf5_model_refuses_two_same_named_layers_with_params(tmp_path):
    net = build(DATA + linear("ip", "x", "y1") + linear("ip", "x", "y2"))
    with pytest.raises(CaffeError, match="two layers named 'ip' hold params"):
        net.to_hdf5(str(tmp_path / "m.h5"))
    # param-less duplicates (the autoencoder's two "loss" layers) write fine
    ok = build(DATA + linear("a", "x", "y") + halfsq("loss", "y").replace('top: "loss"', 'top: "l1"')
               + halfsq("loss", "y").replace('top: "loss"', 'top: "l2"'))
    ok.to_hdf5(str(tmp_path / "ok.h5"))
    build(DATA + linear("a", "x", "y"), weights=str(tmp_path / "ok.h5"))


def test_loss_layer_without_a_top_gets_an_anonymous_one():
    """Caffe's AutoTopBlobs: a loss layer may omit its top (old nets do); the Net adds one,
    weighted 1, that is neither a net output nor usable as a bottom."""
    net = build(DATA + linear("a", "x", "y") +
                'layer { name: "l" type: "NTHalfSq" bottom: "y" }\n')
    assert net.top_names[-1] == ["(automatic)"] and net.layer_loss_weights[-1] == [1.0]
    assert net.output_blob_names == ["t"]
    w, b = (p.data.astype(float) for p in net.params["a"])
    y = x_data() @ w.T + b
    assert net.forward_loss() == pytest.approx(0.5 * (y ** 2).sum(), rel=1e-5)
    net.clear_param_diffs()
    net.backward()
    want = y.T @ x_data()
    numpy.testing.assert_allclose(net.params["a"][0].diff, want, rtol=1e-5,
                                  atol=1e-5 * numpy.abs(want).max())
    with pytest.raises(LayerError, match="unknown bottom blob"):
        build(DATA + linear("a", "x", "y") + 'layer { name: "l" type: "NTHalfSq" bottom: "y" }\n'
              + 'layer { name: "m" type: "NTDouble" bottom: "(automatic)" top: "z" }\n')


def test_a_layer_that_is_not_a_loss_still_needs_its_tops():
    with pytest.raises(LayerError, match=r"layer 'd'.*produces exactly 1 top blob\(s\), got 0"):
        build(DATA + 'layer { name: "d" type: "NTDouble" bottom: "x" }\n')


def test_an_unknown_layer_type_is_named_with_the_closest_before_any_log():
    """A misspelt type fails before the net logs its ~200 setup lines, naming the place and the
    registered type it resembles (a case slip too)."""
    lines = []
    text = ('layer { name: "in" type: "Input" top: "x" input_param { shape { dim: 1 } } }\n'
            'layer { name: "act" type: "relu" bottom: "x" top: "x" }\n'
            'layer { name: "s" type: "Sofmax" bottom: "x" top: "y" }\n')
    with pytest.raises(LayerError, match=r"layer 'act': unknown layer type 'relu' at "
                                         r"n\.prototxt:2:\d+ \(did you mean 'ReLU'\?\)"):
        Net(parse_text(text, "n.prototxt"), log=lines.append)
    assert lines == []
    with pytest.raises(LayerError, match=r"'Sofmax'.*did you mean 'Softmax'"):
        Net(parse_text(text.replace('"relu"', '"ReLU"'), "n.prototxt"))
    with pytest.raises(LayerError) as err:
        Net(parse_text(text.replace('"relu"', '"Zzyzx"'), "n.prototxt"))
    assert "did you mean" not in str(err.value)


def test_a_net_of_many_layers_logs_the_first_ones_and_a_summary():
    """Past LOG_LAYERS layers the setup log says what it leaves out instead of six lines per
    layer (a 700,000-layer tower logged 21.6 million lines); the net is built in full."""
    from caffe8.engine import net as net_module
    count = net_module.LOG_LAYERS + 200
    text = ['layer { name: "in" type: "Input" top: "x" input_param { shape { dim: 2 } } }']
    text += [f'layer {{ name: "r{k}" type: "ReLU" bottom: "x" top: "x" }}' for k in range(count)]
    lines = []
    net = Net(parse_text("\n".join(text), "tower.prototxt"), log=lambda m: lines.extend(
        m.split("\n")))
    assert len(net.layers) == count + 1
    shown = net_module.LOG_LAYERS
    assert sum(line.startswith("Setting up ") for line in lines) == shown
    assert sum(line.startswith("Top shape: ") for line in lines) == shown
    assert f"... the setup of layers {shown + 1} to {count + 1} is not logged layer by layer " \
        f"(the log shows the first {shown})" in lines
    assert f"... and {count + 1 - shown} more layers" in lines
    assert sum(line.startswith("layer {") for line in lines) == shown  # the parameters' text
    assert sum("backward computation." in line for line in lines) == shown
    assert f"... of layers {shown + 1} to {count + 1}, 0 need backward computation" in lines
    assert lines[-1] == "Network initialization done."
    assert net.param.layer[-1].name == f"r{count - 1}"  # the text's cut left the net whole


# --- reshapes skipped while the shapes hold (engine.layer.from_shapes) ----------------------------
INPUT = """layer { name: "in" type: "Input" top: "x" input_param { shape { dim: 3 dim: 4 } } }
"""


def test_a_from_shapes_reshape_runs_only_when_a_shape_moved():
    """The Net skips a marked reshape while every bottom and top keeps the shape it left; a new
    batch size, a top reshaped from outside, or the layer reshaped directly with other blobs
    (what it keeps changes) each make the next pass reshape it."""
    net = build(INPUT + 'layer { name: "r" type: "NTRows" bottom: "x" top: "y" }\n')
    layer = net.layers[1]
    x = net.blobs["x"]
    x.data[...] = 1.0
    counts = []
    for rows in (3, 3, 5, 5, 3):
        if x.shape[0] != rows:
            x.reshape(rows, 4)
            x.data[...] = 1.0
        net.forward()
        counts.append(layer.reshapes)
        assert (net.blobs["y"].data == rows).all() and net.blobs["y"].shape == (rows, 4)
    assert counts == [1, 1, 2, 2, 3]          # setup's reshape, then only when the rows moved
    net.blobs["y"].reshape(1, 1)              # moved from outside: reshaped back
    net.forward()
    assert layer.reshapes == 4 and net.blobs["y"].shape == (3, 4)
    from caffe8.engine.blob import Blob
    layer.reshape([Blob((7, 4))], [Blob(())])  # kept rows = 7, recorded for those blobs
    net.forward()
    assert layer.reshapes == 6 and (net.blobs["y"].data == 3).all()


def test_an_unmarked_override_is_reshaped_every_pass():
    """A subclass that overrides a marked reshape (and calls it) is not skipped: the mark is
    the function's, not the class's."""
    from tests.engine.net_test_layers import NTRows

    class Counted(NTRows):
        def reshape(self, bottom, top):
            super().reshape(bottom, top)
    net = build(INPUT + 'layer { name: "r" type: "NTRows" bottom: "x" top: "y" }\n')
    layer = net.layers[1]
    layer.__class__ = Counted
    before = layer.reshapes
    for _ in range(3):
        net.forward()
    assert layer.reshapes == before + 3


REAL_NET = """layer { name: "in" type: "Input" top: "data" top: "label"
  input_param { shape { dim: 6 dim: 3 dim: 8 dim: 8 } shape { dim: 6 } } }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
  convolution_param { num_output: 4 kernel_size: 3 pad: 1 weight_filler { type: "xavier" }
  bias_filler { type: "uniform" min: -0.1 max: 0.1 } } }
layer { name: "relu" type: "ReLU" bottom: "conv" top: "conv" }
layer { name: "pool" type: "Pooling" bottom: "conv" top: "pool"
  pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layer { name: "drop" type: "Dropout" bottom: "pool" top: "pool" dropout_param { dropout_ratio: 0.3 } }
layer { name: "ip" type: "InnerProduct" bottom: "pool" top: "ip"
  inner_product_param { num_output: 5 weight_filler { type: "xavier" } } }
layer { name: "sig" type: "Sigmoid" bottom: "ip" top: "sig" }
layer { name: "ip2" type: "InnerProduct" bottom: "sig" top: "ip2"
  inner_product_param { num_output: 3 weight_filler { type: "xavier" } } }
layer { name: "prob" type: "Softmax" bottom: "ip2" top: "prob" }
layer { name: "acc" type: "Accuracy" bottom: "ip2" bottom: "label" top: "acc" }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip2" bottom: "label" top: "loss" }
"""


def test_skipped_reshapes_give_the_bits_of_reshaping_every_pass():
    """The real layers whose reshape is marked, trained by forward + backward over passes
    whose data and batch size change (6, 6, 4, 4, 6 images): the same outputs and gradients as
    a Net that reshapes every layer every pass, bit for bit."""
    from caffe8.engine import backend
    results = []
    for every_pass in (False, True):
        backend.seed(4)
        net = build(REAL_NET)
        rng = numpy.random.default_rng(9)
        out = []
        for batch in (6, 6, 4, 4, 6):
            for name, shape in (("data", (batch, 3, 8, 8)), ("label", (batch,))):
                net.blobs[name].reshape(shape)
            net.blobs["data"].data[...] = rng.standard_normal((batch, 3, 8, 8))
            net.blobs["label"].data[...] = rng.integers(0, 3, batch)
            if every_pass:
                for layer in net.layers:
                    layer.shapes_seen = None
            net.clear_param_diffs()
            net.forward_backward()
            out += [net.blobs[n].data.tobytes() for n in ("prob", "acc", "loss")]
            out += [net.flat_diff.tobytes(), net.blobs["data"].diff.tobytes()]
        results.append(out)
    assert results[0] == results[1]
