"""HDF5Data: datasets named by the tops, batches spanning files, shuffle, errors."""
import h5py
import numpy
import pytest

from caffe8.engine import backend
from caffe8.engine.errors import CaffeError
from tests.data_layers.small_digits import batches, build, layer_text, small_digits, write_all_forms


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    imgs, labels = small_digits(9)
    root = tmp_path_factory.mktemp("h5")
    return imgs, labels, write_all_forms(root, imgs, labels, h5_files=3)


def test_batches_span_files_and_wrap(digits):
    imgs, labels, paths = digits
    layer, tops = build(layer_text("HDF5Data", paths, 4))
    assert tops[0].shape == (4, 1, 8, 8) and tops[1].shape == (4,)
    got = batches(layer, tops, 3)  # 12 rows from 3 files of 3: spans files, wraps once
    order = [i % 9 for i in range(12)]
    numpy.testing.assert_array_equal(numpy.concatenate([b[0] for b in got])[:, 0], imgs[order])
    numpy.testing.assert_array_equal(numpy.concatenate([b[1] for b in got]), labels[order])
    layer.close()


def test_shuffle_permutes_each_epoch_deterministically(digits):
    imgs, labels, paths = digits
    text = layer_text("HDF5Data", paths, 9, extra="shuffle: true")
    runs = []
    for _ in range(2):
        backend.seed(5)
        layer, tops = build(text)
        runs.append([tuple(b[1]) for b in batches(layer, tops, 4)])
        layer.close()
    assert runs[0] == runs[1]
    assert all(sorted(e) == sorted(labels) for e in runs[0])
    assert len(set(runs[0])) > 1


def test_shuffled_batches_keep_rows_whole_and_cast_as_each_row(tmp_path):
    """A batch is copied from the current file in runs of rows (one copy a run): float64 rows
    cast to float32 as one row at a time would be, data and label of a row kept together,
    every epoch each row once, a file's rows together (Caffe's shuffle of files, then rows)."""
    listing = tmp_path / "list.txt"
    first = 0
    for name, rows in (("a.h5", 5), ("b.h5", 4)):
        ids = numpy.arange(first, first + rows)
        with h5py.File(tmp_path / name, "w") as f:
            f["data"] = ids[:, None] + numpy.array([0.1, 1 / 3])     # float64, rounded on read
            f["label"] = ids.astype(numpy.float64)
        with open(listing, "a") as f:
            f.write(str(tmp_path / name) + "\n")
        first += rows
    backend.seed(3)
    layer, tops = build('name: "d" type: "HDF5Data" top: "data" top: "label" hdf5_data_param '
                        f'{{ source: "{listing}" batch_size: 4 shuffle: true }}')
    got = batches(layer, tops, 9)                     # 36 rows: four epochs of 9
    layer.close()
    data = numpy.concatenate([b[0] for b in got])
    labels = numpy.concatenate([b[1] for b in got]).astype(int)
    want = (labels[:, None] + numpy.array([0.1, 1 / 3])).astype(numpy.float32)
    assert data.dtype == numpy.float32 and data.tobytes() == want.tobytes()
    for epoch in labels.reshape(4, 9):
        assert sorted(epoch) == list(range(9))
        assert set(epoch[:5]) == {0, 1, 2, 3, 4} or set(epoch[:4]) == {5, 6, 7, 8}
    assert len({tuple(e) for e in labels.reshape(4, 9)}) > 1


def test_relative_paths_resolve_beside_the_list(tmp_path):
    imgs, labels = small_digits(2)
    with h5py.File(tmp_path / "x.h5", "w") as f:
        f["data"] = imgs.astype(numpy.float64)
        f["label"] = labels
    (tmp_path / "l.txt").write_text("x.h5\n")
    layer, tops = build(layer_text("HDF5Data", {"h5list": str(tmp_path / "l.txt")}, 2))
    assert tops[0].shape == (2, 8, 8)  # (batch, *dataset.shape[1:])
    (data, label), = batches(layer, tops, 1)
    numpy.testing.assert_array_equal(data, imgs)
    assert data.dtype == numpy.float32


def test_missing_dataset_names_file_and_dataset(tmp_path):
    with h5py.File(tmp_path / "x.h5", "w") as f:
        f["data"] = numpy.zeros((2, 3), numpy.float32)
    (tmp_path / "l.txt").write_text("x.h5\n")
    with pytest.raises(CaffeError, match=r"x.h5' has no dataset 'label'"):
        build(layer_text("HDF5Data", {"h5list": str(tmp_path / "l.txt")}, 1))


def test_missing_list_missing_file_and_corrupt_file(tmp_path):
    with pytest.raises(CaffeError, match="nolist.txt"):
        build(layer_text("HDF5Data", {"h5list": str(tmp_path / "nolist.txt")}, 1))
    (tmp_path / "l.txt").write_text("gone.h5\n")
    with pytest.raises(CaffeError, match=r"gone.h5.*l.txt:1"):
        build(layer_text("HDF5Data", {"h5list": str(tmp_path / "l.txt")}, 1))
    (tmp_path / "bad.h5").write_bytes(b"garbage" * 10)
    (tmp_path / "l.txt").write_text("bad.h5\n")
    with pytest.raises(CaffeError, match="bad.h5"):
        build(layer_text("HDF5Data", {"h5list": str(tmp_path / "l.txt")}, 1))


def test_row_count_mismatch_and_transform_rejected(tmp_path, digits):
    with h5py.File(tmp_path / "x.h5", "w") as f:
        f["data"] = numpy.zeros((3, 2), numpy.float32)
        f["label"] = numpy.zeros((2,), numpy.float32)
    (tmp_path / "l.txt").write_text("x.h5\n")
    with pytest.raises(CaffeError, match="different row counts"):
        build(layer_text("HDF5Data", {"h5list": str(tmp_path / "l.txt")}, 1))
    with pytest.raises(CaffeError, match="does not transform"):
        build(layer_text("HDF5Data", digits[2], 1, transform="scale: 0.5"))
