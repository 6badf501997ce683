"""Dataset preparation: the bundled handwritten digits in all three input forms, and LMDB writing.

``ensure_digits(root)`` writes scikit-learn's digits (1,797 real 8×8 greyscale images of 0..9,
pixel values 0..16) under ``root`` once, scaled to uint8 0..255 as ``floor(v·255/16 + 0.5)``:

    root/manifest.json            counts, split seed, the paths below (written last: "complete")
    root/train.txt, test.txt      ImageData lists "images/train/00000.png 7" (root_folder: root/)
    root/images/{train,test}/NNNNN.png
    root/train.h5, test.h5        datasets "data" (N,1,8,8) float32 0..255, "label" (N,) float32
    root/train_h5.txt, test_h5.txt   HDF5Data lists naming the .h5 file (relative to the list)
    root/train_lmdb/, test_lmdb/  Data (backend LMDB): raw Datum records 1×8×8 uint8, label

The split is stratified and fixed: 300 test images (per-class quotas by largest remainder of
300·n_c/1797, chosen by a seeded permutation of each class), 1,497 train images in a seeded
shuffled order (so the unshuffled LMDB still mixes classes); test images in original order.
Several processes (MPI ranks) may call ``ensure_digits`` at once: each builds in a private
temporary folder and renames it into place; the loser discards its copy.
"""
import json
import os
import shutil
import tempfile

import numpy

from caffe8.engine.datum import encode_datum
from caffe8.engine.db import DBWriter
from caffe8.engine.errors import DataError

DIGITS_TEST_SIZE = 300
DIGITS_SEED = 8
_MANIFEST = "manifest.json"
_FORMAT = 1  # bump when the layout changes, so old folders are rebuilt


def digits_uint8():
    """(images (1797, 8, 8) uint8 0..255, labels (1797,) int64) from scikit-learn."""
    from sklearn.datasets import load_digits
    d = load_digits()
    images = numpy.floor(d.images * 255.0 / 16.0 + 0.5).astype(numpy.uint8)
    return images, d.target.astype(numpy.int64)


def stratified_split(labels, test_size=DIGITS_TEST_SIZE, seed=DIGITS_SEED):
    """(train indices, test indices): per-class test quotas by largest remainder, members
    chosen by a seeded permutation; train in seeded shuffled order, test sorted."""
    classes, counts = numpy.unique(labels, return_counts=True)
    exact = test_size * counts / counts.sum()
    quota = numpy.floor(exact).astype(int)
    by_remainder = sorted(range(len(classes)), key=lambda i: (-(exact[i] - quota[i]), i))
    for i in by_remainder[:test_size - quota.sum()]:
        quota[i] += 1
    rng = numpy.random.default_rng(seed)
    test = []
    for c, q in zip(classes, quota):
        members = numpy.flatnonzero(labels == c)
        test.extend(rng.permutation(members)[:q])
    test = numpy.sort(numpy.asarray(test, dtype=numpy.int64))
    train = numpy.setdiff1d(numpy.arange(len(labels)), test)
    return rng.permutation(train), test


def write_datum_db(path, records, backend="lmdb", map_size=1 << 40):
    """Write ``records`` — an iterable of (key bytes, serialised Datum) — into a new database
    ``path`` (LMDB: Caffe's data.mdb + lock.mdb; or LevelDB), committing every 1000 records;
    written beside ``path`` and renamed into place when complete (``engine.db.DBWriter``).
    Returns the number of records."""
    with DBWriter(path, backend, map_size=map_size) as db:
        for key, value in records:
            db.put(key, value)
    return db.count


def write_datum_lmdb(path, records, map_size=1 << 40):
    """``write_datum_db`` into an LMDB."""
    return write_datum_db(path, records, "lmdb", map_size)


def _write_split(folder, name, images, labels):
    """Write one split (train or test) in the three forms; returns its manifest entry."""
    from PIL import Image
    import h5py
    os.makedirs(os.path.join(folder, "images", name))
    lines = []
    for i, (img, lab) in enumerate(zip(images, labels)):
        rel = f"images/{name}/{i:05d}.png"
        Image.fromarray(img).save(os.path.join(folder, rel))
        lines.append(f"{rel} {int(lab)}\n")
    with open(os.path.join(folder, f"{name}.txt"), "w") as f:
        f.writelines(lines)
    with h5py.File(os.path.join(folder, f"{name}.h5"), "w") as f:
        f["data"] = images[:, None].astype(numpy.float32)
        f["label"] = labels.astype(numpy.float32)
    with open(os.path.join(folder, f"{name}_h5.txt"), "w") as f:
        f.write(f"{name}.h5\n")
    write_datum_lmdb(os.path.join(folder, f"{name}_lmdb"), (
        (f"{i:08d}".encode(), encode_datum(1, 8, 8, img.tobytes(), int(lab), encoded=False))
        for i, (img, lab) in enumerate(zip(images, labels))))
    return {"count": int(len(labels)), "list": f"{name}.txt", "hdf5_list": f"{name}_h5.txt",
            "hdf5": f"{name}.h5", "lmdb": f"{name}_lmdb",
            "class_counts": numpy.bincount(labels, minlength=10).tolist()}


def _build_digits(folder):
    images, labels = digits_uint8()
    train, test = stratified_split(labels)
    manifest = {"format": _FORMAT, "source": "sklearn.datasets.load_digits",
                "scaling": "floor(v*255/16 + 0.5), uint8 0..255", "split_seed": DIGITS_SEED,
                "train": _write_split(folder, "train", images[train], labels[train]),
                "test": _write_split(folder, "test", images[test], labels[test]),
                "train_indices": train.tolist(), "test_indices": test.tolist()}
    with open(os.path.join(folder, _MANIFEST), "w") as f:
        json.dump(manifest, f, indent=1)


def _read_manifest(root):
    try:
        with open(os.path.join(root, _MANIFEST)) as f:
            m = json.load(f)
        return m if m.get("format") == _FORMAT else None
    except (OSError, ValueError):
        return None


def ensure_digits(root="data/digits", log=None):
    """Prepare the digits data under ``root`` unless already complete; returns the manifest
    (a dict: per split ``count``, ``list``, ``hdf5_list``, ``hdf5``, ``lmdb`` relative to root).
    ``log``: anything with ``info(str)`` (the glog logger), told when data is being written."""
    root = os.path.normpath(root)
    manifest = _read_manifest(root)
    if manifest is not None:
        return manifest
    if log is not None:
        log.info(f"Preparing the digits data (sklearn.datasets.load_digits) in {root}")
    if os.path.isdir(root) and os.listdir(root):
        raise DataError(f"'{root}' exists but holds no complete digits data ({_MANIFEST} "
                        "missing or outdated); remove it, and the next run of a digits net "
                        "prepares it again")
    parent = os.path.dirname(os.path.abspath(root))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".digits-", dir=parent)
    try:
        os.chmod(tmp, 0o755)  # mkdtemp makes it private; the data is for everyone
        _build_digits(tmp)
        if os.path.isdir(root):
            os.rmdir(root)  # an empty folder is replaced
        os.rename(tmp, root)
    except OSError:
        if _read_manifest(root) is None:  # not a lost race with another process: a real error
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return _read_manifest(root)
