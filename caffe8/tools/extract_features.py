"""``caffe8 extract_features``: Caffe's tools/extract_features.cpp.

``extract_features pretrained_net_param feature_extraction_proto_file
extract_feature_blob_name1[,name2,...] save_feature_dataset_name1[,name2,...] num_mini_batches
db_type [CPU/GPU] [DEVICE_ID=0]``: runs the TEST net ``num_mini_batches`` times and stores every
item of each named blob as a Datum (``float_data``, channels/height/width of the blob's legacy
4-D shape) under the key ``%010d`` (the item's index), one database per blob.
"""
from contextlib import ExitStack

import numpy

from caffe8.engine.errors import CaffeError
from caffe8.tools._common import logger, progress, require_file

NAME = "extract_features"
HELP = "store blobs of a trained net over N mini-batches as Datum records (lmdb/leveldb)"
GROUP = "data"


def add_arguments(p):
    p.add_argument("pretrained_net_param", help="trained weights (.caffemodel or .h5)")
    p.add_argument("feature_extraction_proto_file", help="net prototxt (its TEST phase is run)")
    p.add_argument("blob_names", metavar="extract_feature_blob_name1[,name2,...]")
    p.add_argument("dataset_names", metavar="save_feature_dataset_name1[,name2,...]",
                   help="one database per blob, created (must not exist)")
    p.add_argument("num_mini_batches", type=int)
    p.add_argument("db_type", help="lmdb or leveldb")
    p.add_argument("mode", nargs="?", default="CPU", choices=("CPU", "GPU"), metavar="CPU/GPU")
    p.add_argument("device_id", nargs="?", type=int, default=0, metavar="DEVICE_ID")


def legacy_shape(shape):
    """Caffe's Blob::channels/height/width: axes 1-3, 1 where the blob has fewer."""
    if len(shape) > 4:
        raise CaffeError(f"blob of shape {tuple(shape)}: a Datum holds at most 4 axes")
    full = tuple(shape) + (1,) * (4 - len(shape))
    return full[1:]


def feature_records(data):
    """(key, Datum) of every item of an N×... blob, keys counted from ``start``."""
    from caffe8.engine.datum import encode_datum
    c, h, w = legacy_shape(data.shape)
    rows = numpy.asarray(data, dtype=numpy.float32).reshape(data.shape[0], -1)
    return [encode_datum(c, h, w, float_data=row) for row in rows]


def run(args):
    import caffe8
    log = logger()
    blobs, dbs = args.blob_names.split(","), args.dataset_names.split(",")
    if len(blobs) != len(dbs):
        raise CaffeError(f"{len(blobs)} blob name(s) but {len(dbs)} dataset name(s): the number "
                         "of blob names and dataset names must be equal")
    if args.mode == "GPU":
        caffe8.set_device(args.device_id)
        caffe8.set_mode_gpu()
    else:
        caffe8.set_mode_cpu()
    require_file(args.feature_extraction_proto_file, "feature extraction prototxt")
    require_file(args.pretrained_net_param, "pretrained net")
    net = caffe8.Net(args.feature_extraction_proto_file, caffe8.TEST,
                     weights=args.pretrained_net_param)
    for name in blobs:
        if name not in net.blobs:
            raise CaffeError(f"unknown feature blob name {name} in the network "
                             f"{args.feature_extraction_proto_file}")
    from caffe8.engine.db import DBWriter
    with ExitStack() as stack:
        writers = []
        for name in dbs:
            log(f"Opening dataset {name}")
            writers.append(stack.enter_context(DBWriter(name, args.db_type)))
        log("Extracting Features")
        for _ in progress(range(args.num_mini_batches), args.num_mini_batches, NAME):
            net.forward()
            for name, db in zip(blobs, writers):
                for value in feature_records(net.blobs[name].data):
                    db.put(b"%010d" % db.count, value)
    for name, db in zip(blobs, writers):
        log(f"Extracted features of {db.count} query images for feature blob {name}")
    log("Successfully extracted the features!")
    return 0
