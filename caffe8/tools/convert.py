"""``caffe8 convert SRC DST``: a model between Caffe's binary proto (``.caffemodel``) and HDF5
(``.caffemodel.h5``) layouts, chosen by the file names (``engine.model_io.convert``)."""
NAME = "convert"
HELP = "convert a model between binary .caffemodel and HDF5 (.caffemodel.h5), by the names"
GROUP = "models"
FILES = {"src": "in", "dst": "out"}


def add_arguments(p):
    p.add_argument("src", help="model to read (.caffemodel or .h5)")
    p.add_argument("dst", help="model to write (.caffemodel or .h5)")


def run(args):
    from caffe8.engine.model_io import convert
    convert(args.src, args.dst)
    print(f"wrote {args.dst}")
    return 0
