"""``caffe8 convert_imageset``: Caffe's tools/convert_imageset.cpp.

``convert_imageset [FLAGS] ROOTFOLDER/ LISTFILE DB_NAME``: LISTFILE has one ``path label`` line
per image (the label after the last space); each image ``ROOTFOLDER + path`` becomes a Datum
record with key ``%08d_path`` (the line's index), committed every 1000 records. As Caffe:

* images are read as BGR (or grey with ``-gray``) and, when both ``-resize_height`` and
  ``-resize_width`` are set, resized with OpenCV's INTER_LINEAR arithmetic (in floating point:
  OpenCV's 11-bit fixed-point coefficients may round a pixel 1 apart); images are decoded with
  Pillow, whose greyscale conversion can differ from OpenCV's by 1 as well;
* ``-encoded`` (or ``-encode_type``) stores the image file itself when it is not resized and its
  extension matches the encoding, else the image re-encoded (jpg, png, ...) with Pillow;
* ``-shuffle`` shuffles the lines; Caffe draws its random seed from /dev/urandom, caffe8 uses a
  fixed random seed (0) so a conversion can be repeated.

Unlike Caffe, which logs an unreadable image and skips it, a missing or undecodable image is an
error naming the list file's line (and no database is left behind).
"""
import io
import os

import numpy

from caffe8.engine.errors import DataError
from caffe8.tools._common import add_backend, logger, require_file, write_records

NAME = "convert_imageset"
HELP = "convert a list of images with labels to an lmdb/leveldb of Caffe Datum records"
GROUP = "data"
SHUFFLE_SEED = 0
_PIL_FORMATS = {"jpg": "JPEG", "jpeg": "JPEG", "png": "PNG", "bmp": "BMP", "tif": "TIFF",
                "tiff": "TIFF", "ppm": "PPM", "pgm": "PPM", "webp": "WEBP"}


def add_arguments(p):
    p.add_argument("root_folder", metavar="ROOTFOLDER/", help="prefix of every image path "
                   "(joined as text, as Caffe does: end it with '/')")
    p.add_argument("list_file", metavar="LISTFILE", help="lines 'path label'")
    p.add_argument("db_name", metavar="DB_NAME", help="database to create (must not exist)")
    p.add_argument("--gray", action="store_true", help="treat images as grayscale ones")
    p.add_argument("--shuffle", action="store_true",
                   help="randomly shuffle the order of images and their labels")
    add_backend(p, "the backend for storing the result")
    p.add_argument("--resize_width", "--resize-width", type=int, default=0,
                   help="width images are resized to (with -resize_height)")
    p.add_argument("--resize_height", "--resize-height", type=int, default=0,
                   help="height images are resized to (with -resize_width)")
    p.add_argument("--check_size", "--check-size", action="store_true",
                   help="check that all the datum have the same size")
    p.add_argument("--encoded", action="store_true",
                   help="store the encoded image in the datum")
    p.add_argument("--encode_type", "--encode-type", default="",
                   help="what type to encode the image as ('png', 'jpg', ...)")


def read_list(path):
    """[(path, label)] of a list file; errors name file:line."""
    require_file(path, "list file")
    lines = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.rstrip("\r\n")
            if not line.strip():
                continue
            name, sep, label = line.rpartition(" ")
            try:
                lines.append((name, int(label)))
            except ValueError:
                sep = ""
            if not sep or not name:
                raise DataError(f"{path}:{n}: expected 'path label', got {line!r}")
    return lines


def image_datum(filename, label, args, where):
    """Caffe's ReadImageToDatum: the serialised Datum of one image."""
    from caffe8.engine.datum import encode_datum
    from caffe8.engine.transformer import decode_image
    from caffe8.layers.window_data import resize_linear
    enc = args.encode_type
    if args.encoded and not enc:
        enc = os.path.splitext(filename)[1][1:].lower()  # guessed from the file name
    img = decode_image(filename, color=not args.gray, where=where)
    h, w = args.resize_height, args.resize_width
    if h > 0 and w > 0:
        img = resize_linear(img, h, w)
    if enc:
        ext = os.path.splitext(filename)[1][1:].lower()
        if not h and not w and (ext == enc.lower() or (enc.lower() == "jpg" and ext == "jpeg")):
            with open(filename, "rb") as f:
                data = f.read()  # Caffe's ReadFileToDatum: the file itself
        else:
            data = _encode(img, enc, where)
        return encode_datum(None, None, None, data=data, label=label, encoded=True)
    chw = img.transpose(2, 0, 1)
    return encode_datum(*chw.shape, data=chw.tobytes(), label=label, encoded=False)


def _encode(img, enc, where):
    """H×W×C (BGR or grey) uint8 → file bytes of format ``enc``, as cv::imencode."""
    from PIL import Image
    fmt = _PIL_FORMATS.get(enc.lower())
    if fmt is None:
        raise DataError(f"{where}: cannot encode as '{enc}'; use one of "
                        f"{', '.join(sorted(_PIL_FORMATS))}")
    pil = Image.fromarray(img[:, :, ::-1] if img.shape[2] == 3 else img[:, :, 0])
    buf = io.BytesIO()
    pil.save(buf, format=fmt, **({"quality": 95} if fmt == "JPEG" else {}))  # OpenCV's default
    return buf.getvalue()


def records(lines, args):
    size = None
    for line_id, (name, label) in enumerate(lines):
        where = f"{args.list_file}: line for '{name}'"
        value = image_datum(args.root_folder + name, label, args, where)
        if args.check_size and not (args.encoded or args.encode_type):
            from caffe8.engine.datum import decode_datum
            d = decode_datum(value, where)
            if size is None:
                size = d.channels * d.height * d.width
            elif len(d.data) != size:
                raise DataError(f"{where}: incorrect data field size {len(d.data)} "
                                f"(the first image has {size}; -check_size)")
        yield (b"%08d_" % line_id) + name.encode(), value


def run(args):
    log = logger()
    lines = read_list(args.list_file)
    if args.shuffle:
        log("Shuffling data")
        order = numpy.random.default_rng(SHUFFLE_SEED).permutation(len(lines))
        lines = [lines[i] for i in order]
    log(f"A total of {len(lines)} images.")
    if args.encode_type and not args.encoded:
        log("encode_type specified, assuming encoded=true.")
    args.resize_height, args.resize_width = max(0, args.resize_height), max(0, args.resize_width)
    count = write_records(args.db_name, args.backend, records(lines, args), len(lines), NAME,
                          log=log, every=True)
    if count % 1000:
        log(f"Processed {count} files.")
    return 0
