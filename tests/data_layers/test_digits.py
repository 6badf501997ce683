"""The bundled digits: 1,797 real images in three forms, split 1,497 / 300, stratified."""
import json
import os

import h5py
import numpy
import pytest
from sklearn.datasets import load_digits

from tests.data_layers.small_digits import batches, build

P = {}


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    from caffe8.engine.datasets import ensure_digits  # what a digits net's first run calls
    r = str(tmp_path_factory.mktemp("d") / "digits")
    P["manifest"] = ensure_digits(r)
    return r


def reference():
    d = load_digits()
    return numpy.floor(d.images * 255 / 16 + 0.5).astype(numpy.uint8), d.target


def test_counts_split_and_labels(root):
    m = P["manifest"]
    assert (m["train"]["count"], m["test"]["count"]) == (1497, 300)
    train, test = m["train_indices"], m["test_indices"]
    assert len(set(train) | set(test)) == 1797 and not set(train) & set(test)
    _, target = reference()
    for split, idx in (("train", train), ("test", test)):
        lines = open(os.path.join(root, m[split]["list"])).read().split("\n")[:-1]
        labels = [int(x.rsplit(" ", 1)[1]) for x in lines]
        assert labels == target[idx].tolist()
        assert sorted(set(labels)) == list(range(10))
    # stratified: each class's test share is within one image of 300/1797 of it
    counts = numpy.bincount(target, minlength=10)
    assert numpy.all(numpy.abs(numpy.bincount(target[test]) - counts * 300 / 1797) < 1)


def test_pixels_agree_in_all_three_forms(root):
    m = P["manifest"]
    images, target = reference()
    idx = m["test_indices"]
    with h5py.File(os.path.join(root, m["test"]["hdf5"])) as f:
        assert f["data"].shape == (300, 1, 8, 8) and f["data"].dtype == numpy.float32
        numpy.testing.assert_array_equal(f["data"][:, 0], images[idx])
        numpy.testing.assert_array_equal(f["label"][...], target[idx])
    assert images.max() == 255 and images.min() == 0
    texts = {
        "ImageData": f'image_data_param {{ source: "{root}/test.txt" root_folder: "{root}/" '
                     'batch_size: 300 is_color: false }',
        "HDF5Data": f'hdf5_data_param {{ source: "{root}/test_h5.txt" batch_size: 300 }}',
        "Data": f'data_param {{ source: "{root}/test_lmdb" backend: LMDB batch_size: 300 }}'}
    for kind, body in texts.items():
        layer, tops = build(f'name: "d" type: "{kind}" top: "data" top: "label" {body}', "TEST")
        (data, label), = batches(layer, tops, 1)
        layer.close()
        numpy.testing.assert_array_equal(data[:, 0], images[idx], err_msg=kind)
        numpy.testing.assert_array_equal(label, target[idx], err_msg=kind)


def test_second_call_reuses_and_partial_folder_is_refused(root, tmp_path):
    from caffe8.engine.datasets import ensure_digits
    from caffe8.engine.errors import DataError
    stamp = os.path.getmtime(os.path.join(root, "manifest.json"))
    assert ensure_digits(root) == json.load(open(os.path.join(root, "manifest.json")))
    assert os.path.getmtime(os.path.join(root, "manifest.json")) == stamp
    (tmp_path / "half").mkdir()
    (tmp_path / "half" / "train.txt").write_text("")
    with pytest.raises(DataError, match="half"):
        ensure_digits(str(tmp_path / "half"))


def test_concurrent_preparation(tmp_path, monkeypatch):
    """MPI ranks may all call ensure_digits at once: both succeed, one complete copy remains.
    (The builder is replaced by a tiny one that waits until both callers are building, so the
    race on the final rename is certain to happen.)"""
    import threading
    from caffe8.engine import datasets
    barrier = threading.Barrier(2, timeout=30)

    def tiny_build(folder):
        barrier.wait()
        with open(os.path.join(folder, "manifest.json"), "w") as f:
            json.dump({"format": datasets._FORMAT, "builder": folder}, f)

    monkeypatch.setattr(datasets, "_build_digits", tiny_build)
    root = str(tmp_path / "digits")
    results, errors = [], []

    def call():
        try:
            results.append(datasets.ensure_digits(root))
        except Exception as e:  # noqa: BLE001  (reported by the assert below)
            errors.append(e)

    threads = [threading.Thread(target=call) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors and len(results) == 2
    assert results[0] == results[1]  # both see the winner's copy
    assert sorted(os.listdir(tmp_path)) == ["digits"]  # the loser's folder is gone
