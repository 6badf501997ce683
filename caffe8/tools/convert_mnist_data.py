"""``caffe8 convert_mnist_data``: Caffe's examples/mnist/convert_mnist_data.cpp.

IDX image and label files (MNIST, Fashion-MNIST; gzipped or not) → an LMDB or LevelDB of Datum
records: key ``%08d`` (the item's index), channels 1, height rows, width cols, the raw pixels and
the label (a C ``char``, as Caffe stores it), committed every 1000 records.
"""
import gzip
import struct

import numpy

from caffe8.engine.errors import DataError
from caffe8.tools._common import add_backend, logger, require_file, write_records

NAME = "convert_mnist_data"
HELP = ("convert MNIST-format IDX images and labels (gzipped or not) to an lmdb/leveldb of "
        "Caffe Datum records")
GROUP = "data"
IMAGES_MAGIC, LABELS_MAGIC = 2051, 2049


def add_arguments(p):
    p.add_argument("input_image_file", help="IDX images (magic 2051), e.g. train-images-idx3-ubyte"
                   "[.gz]")
    p.add_argument("input_label_file", help="IDX labels (magic 2049), e.g. train-labels-idx1-ubyte"
                   "[.gz]")
    p.add_argument("output_db_file", help="database to create (must not exist)")
    add_backend(p, "the backend for storing the result")


def read_idx(path, magic, what):
    """(header dims, uint8 payload) of an IDX file; ``magic`` 2051 (images) or 2049 (labels)."""
    require_file(path, what)
    with open(path, "rb") as f:
        raw = f.read()
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as e:
            raise DataError(f"{what} '{path}': not a readable gzip file ({e})") from None
    ndims = 3 if magic == IMAGES_MAGIC else 1
    header = 4 * (1 + ndims)
    found = struct.unpack(">I", raw[:4])[0] if len(raw) >= 4 else None
    if found != magic:
        raise DataError(f"{what} '{path}': incorrect magic {found}, expected {magic} "
                        f"(an IDX {'image' if magic == IMAGES_MAGIC else 'label'} file)")
    if len(raw) < header:
        raise DataError(f"{what} '{path}': {len(raw)} bytes, shorter than an IDX header")
    dims = struct.unpack(f">{ndims}I", raw[4:header])
    payload = numpy.frombuffer(raw, dtype=numpy.uint8, offset=header)
    need = int(numpy.prod(dims))
    if payload.size < need:
        raise DataError(f"{what} '{path}': truncated: {payload.size} bytes of data, the header "
                        f"{'×'.join(map(str, dims))} needs {need}")
    return dims, payload[:need]


def mnist_records(images, labels, rows, cols):
    """Caffe's (key, Datum) pairs of convert_mnist_data."""
    from caffe8.engine.datum import encode_datum
    size = rows * cols
    signed = labels.view(numpy.int8)  # Caffe reads the label into a C char
    for i in range(len(labels)):
        yield b"%08d" % i, encode_datum(1, rows, cols, images[i * size:(i + 1) * size].tobytes(),
                                        int(signed[i]))


def run(args):
    log = logger()
    (num_items, rows, cols), images = read_idx(args.input_image_file, IMAGES_MAGIC, "image file")
    (num_labels,), labels = read_idx(args.input_label_file, LABELS_MAGIC, "label file")
    if num_items != num_labels:
        raise DataError(f"'{args.input_image_file}' holds {num_items} images but "
                        f"'{args.input_label_file}' {num_labels} labels")
    log(f"A total of {num_items} items.")
    log(f"Rows: {rows} Cols: {cols}")
    count = write_records(args.output_db_file, args.backend,
                          mnist_records(images, labels, rows, cols), num_items, NAME)
    log(f"Processed {count} files.")
    return 0
