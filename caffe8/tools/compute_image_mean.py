"""``caffe8 compute_image_mean``: Caffe's tools/compute_image_mean.cpp.

``compute_image_mean [FLAGS] INPUT_DB [OUTPUT_FILE]``: the mean image of a database of Datum
records (raw, float or encoded), summed and divided in float32 in record order as Caffe does, so
the file is bit-identical to Caffe's: a BlobProto 1×C×H×W (num/channels/height/width, packed
data). The mean of each channel is logged ("mean_value channel [c]: ...").
"""
import numpy

from caffe8.engine.errors import DataError
from caffe8.tools._common import add_backend, logger, progress

NAME = "compute_image_mean"
HELP = "compute the mean image of an lmdb/leveldb of Datum records (→ .binaryproto)"
GROUP = "data"


def add_arguments(p):
    p.add_argument("input_db", metavar="INPUT_DB", help="lmdb/leveldb of Datum records")
    p.add_argument("output_file", metavar="OUTPUT_FILE", nargs="?",
                   help="mean image to write (.binaryproto); without it the mean is only logged")
    add_backend(p, "the backend containing the images")


def datum_pixels(value, where):
    """C×H×W float32 pixels of one serialised Datum (encoded images decoded as stored)."""
    from caffe8.engine.datum import datum_to_array, decode_datum
    from caffe8.engine.transformer import decode_image
    d = decode_datum(value, where)
    if d.encoded:
        return decode_image(d.data, color=None, where=where).transpose(2, 0, 1).astype(
            numpy.float32)
    return datum_to_array(d, where).astype(numpy.float32)


def mean_image(db, log):
    """Caffe's float32 running sum over the records, divided by their count."""
    cur = db.cursor()
    total = None
    count = 0
    try:
        ok = cur.first()
        if not ok:
            raise DataError(f"{db.label} '{db.path}' is empty")
        log("Starting iteration")
        for _ in progress(range(db.count), db.count, NAME):
            where = f"{db.label} '{db.path}' record {cur.key().decode(errors='replace')!r}"
            pixels = datum_pixels(cur.value(), where)
            if total is None:
                total = numpy.zeros(pixels.shape, numpy.float32)
            elif pixels.size != total.size:
                raise DataError(f"{where}: incorrect data field size {pixels.size}, the first "
                                f"record has {total.size}")
            total += pixels.reshape(total.shape)
            count += 1
            if count % 10000 == 0:
                log(f"Processed {count} files.")
            if not cur.next():
                break
    finally:
        cur.close()
    if count % 10000:
        log(f"Processed {count} files.")
    return total / numpy.float32(count)


def run(args):
    from caffe8.engine.datum import write_mean_file
    from caffe8.engine.db import open_db
    from caffe8.engine.glog import fmt
    log = logger()
    db = open_db(args.input_db, args.backend)
    try:
        mean = mean_image(db, log)
    finally:
        db.release()
    if args.output_file:
        log(f"Write to {args.output_file}")
        write_mean_file(args.output_file, mean)
    log(f"Number of channels: {mean.shape[0]}")
    for c, plane in enumerate(mean.reshape(mean.shape[0], -1)):
        channel_sum = numpy.cumsum(plane, dtype=numpy.float32)[-1]  # Caffe's sequential sum
        log(f"mean_value channel [{c}]: {fmt(channel_sum / numpy.float32(plane.size))}")
    return 0
