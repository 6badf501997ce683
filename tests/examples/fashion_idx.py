"""Small Fashion-MNIST-shaped IDX files for the tests (gzipped, as Debian ships them): 28×28
grey images whose class k is a bright 7×7 block at its own place of a 3×4 grid, over noise —
learnable in a few dozen steps, so a test can ask that training actually learns."""
import gzip
import os
import struct

import numpy


def images_of(labels, rng):
    x = rng.integers(0, 60, (labels.size, 28, 28)).astype(numpy.uint8)
    for i, k in enumerate(labels):
        r, c = divmod(int(k), 4)
        x[i, 1 + 9 * r:8 + 9 * r, 1 + 7 * c:8 + 7 * c] = 230
    return x


def write_idx_slices(folder, train=512, test=200, seed=0):
    """The four files of Fashion-MNIST (train-*, t10k-*) with ``train`` and ``test`` images."""
    os.makedirs(folder, exist_ok=True)
    rng = numpy.random.default_rng(seed)
    for prefix, n in (("train", train), ("t10k", test)):
        labels = rng.integers(0, 10, n).astype(numpy.uint8)
        images = images_of(labels, rng)
        with gzip.open(os.path.join(folder, f"{prefix}-images-idx3-ubyte.gz"), "wb") as f:
            f.write(struct.pack(">IIII", 2051, n, 28, 28) + images.tobytes())
        with gzip.open(os.path.join(folder, f"{prefix}-labels-idx1-ubyte.gz"), "wb") as f:
            f.write(struct.pack(">II", 2049, n) + labels.tobytes())
    return folder
