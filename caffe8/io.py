"""pycaffe's ``caffe.io``: image loading and resizing, the input ``Transformer``, oversampling,
and conversions between arrays and Caffe's BlobProto / Datum messages.

Images are H×W×K float32 arrays in [0, 1] (``load_image``), as in pycaffe; the Transformer
turns them into the net's K×H×W layout. Resizing computes what pycaffe's scikit-image call
computes, with scipy alone (scikit-image is not needed).
"""
import numpy

from caffe8.proto import caffe_pb2
from caffe8.engine.errors import CaffeError, DataError
from caffe8.engine.proto.blobs import array_to_blob, blob_shape

class ImageReadError(DataError, OSError):
    """An image file that cannot be read: a DataError (caffe8's one error line) that is also
    the OSError (``IOError``) pycaffe's scikit-image raises, so ``except IOError`` catches it.
    ``errno`` is the underlying error's (ENOENT for a missing file), ``None`` for a file that
    is there but is no image."""


# scikit-image's rgb2gray weights (ITU-R BT.709), which pycaffe's load_image(color=False) uses
_GREY = numpy.array([0.2125, 0.7154, 0.0721], dtype=numpy.float32)


# --- arrays and messages (caffe_pb2 objects) ----------------------------------------------------
def blobproto_to_array(blob, return_diff=False):
    """The array of a BlobProto (its data, or its diff), shaped as pycaffe shapes it: by
    ``shape``, else the legacy num/channels/height/width, else as a scalar. Values that do not
    fill that shape raise ValueError, as pycaffe's reshape does (a blob with no shape and more
    than one value among them)."""
    doubles, floats = (blob.double_diff, blob.diff) if return_diff else (blob.double_data,
                                                                         blob.data)
    values = numpy.array(doubles if len(doubles) else floats,
                         dtype=numpy.float64 if len(doubles) else numpy.float32)
    shaped = blob.HasField("shape") or any(blob.HasField(f) for f in ("num", "channels",
                                                                       "height", "width"))
    shape = blob_shape(blob) if shaped else ()
    if values.size != int(numpy.prod(shape, dtype=numpy.int64)):
        has = f"shape {shape}" if shaped else "no shape (neither shape.dim nor num/channels/" \
            "height/width: a scalar)"
        raise ValueError(f"blobproto_to_array: the BlobProto has {has} but {values.size} "
                         f"{'diff' if return_diff else 'data'} values")
    return values.reshape(shape)


def array_to_blobproto(arr, diff=None):
    """A BlobProto holding ``arr`` as float32 (and ``diff`` of the same shape, if given)."""
    arr = numpy.asarray(arr, dtype=numpy.float32)
    if diff is not None:
        diff = numpy.asarray(diff, dtype=numpy.float32)
        if diff.shape != arr.shape:
            raise CaffeError(f"array_to_blobproto: diff shape {diff.shape} differs from the "
                             f"data shape {arr.shape}")
    return array_to_blob(arr, caffe_pb2.BlobProto(), diff)


def arraylist_to_blobprotovector_str(arraylist):
    """A serialised BlobProtoVector of the arrays."""
    vec = caffe_pb2.BlobProtoVector()
    vec.blobs.extend(array_to_blobproto(a) for a in arraylist)
    return vec.SerializeToString()


def blobprotovector_str_to_arraylist(text):
    """The arrays of a serialised BlobProtoVector."""
    vec = caffe_pb2.BlobProtoVector()
    vec.ParseFromString(text)
    return [blobproto_to_array(b) for b in vec.blobs]


def array_to_datum(arr, label=None):
    """A Datum of a C×H×W array: uint8 pixels in ``data``, other types in ``float_data``."""
    arr = numpy.asarray(arr)
    if arr.ndim != 3:
        raise CaffeError(f"array_to_datum: expected a C×H×W array, got shape {arr.shape}")
    datum = caffe_pb2.Datum()
    datum.channels, datum.height, datum.width = (int(d) for d in arr.shape)
    if arr.dtype == numpy.uint8:
        datum.data = arr.tobytes()
    else:
        datum.float_data.extend(arr.astype(float).ravel())
    if label is not None:
        datum.label = int(label)
    return datum


def datum_to_array(datum):
    """The C×H×W array of a (not encoded) Datum: uint8 from ``data``, else ``float_data``
    (as floats, as pycaffe)."""
    shape = (datum.channels, datum.height, datum.width)
    if len(datum.data):
        values = numpy.frombuffer(bytes(datum.data), dtype=numpy.uint8)
    else:
        values = numpy.array(datum.float_data, dtype=float)
    if values.size != int(numpy.prod(shape)):
        raise DataError(f"datum_to_array: the Datum holds {values.size} values for "
                        f"channels×height×width = {shape}")
    return values.reshape(shape)


# --- images ----------------------------------------------------------------------------------
def load_image(filename, color=True):
    """An image file as H×W×3 (``color``) or H×W×1 float32 in [0, 1]."""
    from PIL import Image
    try:
        with Image.open(filename) as im:
            im.load()
            mode = im.mode
            if mode in ("I;16", "I;16B", "I"):
                img = numpy.asarray(im, dtype=numpy.float32) / 65535.0
            else:
                img = numpy.asarray(im.convert("RGBA" if "A" in mode else
                                               "RGB" if mode not in ("L", "1") else "L"),
                                    dtype=numpy.float32) / 255.0
    except OSError as e:
        error = ImageReadError(f"{filename}: cannot read image: {e}")
        error.errno = e.errno    # set after: OSError(errno, text) would reword the message
        raise error from None
    if img.ndim == 2:
        img = img[:, :, None]
    if img.shape[2] == 4:
        img = img[:, :, :3]
    if color and img.shape[2] == 1:
        img = numpy.tile(img, (1, 1, 3))
    elif not color and img.shape[2] == 3:
        img = (img @ _GREY)[:, :, None]
    return img.astype(numpy.float32)


def _skimage_resize(image, output_shape, order):
    """scikit-image's ``transform.resize(image, output_shape, order=order, mode='constant')``
    (scikit-image 0.19 and later) of an H×W×K image, with scipy alone: where the image shrinks,
    a Gaussian anti-aliasing prefilter of sigma (factor - 1)/2 per axis; then scipy's ``zoom``
    with pixel-area alignment (``grid_mode``) and zeros beyond the edges; clipped to the
    input's range."""
    from scipy import ndimage
    if image.dtype not in (numpy.float32, numpy.float64):
        image = image.astype(numpy.float32 if image.dtype == numpy.float16 else numpy.float64)
    output_shape = tuple(output_shape) + (image.shape[-1],)
    factors = numpy.divide(image.shape, output_shape)
    filtered = image
    if any(o < i for o, i in zip(output_shape, image.shape)):
        filtered = ndimage.gaussian_filter(image, numpy.maximum(0, (factors - 1) / 2), cval=0,
                                           mode="grid-constant")
    out = ndimage.zoom(filtered, [1 / f for f in factors], order=order, mode="grid-constant",
                       cval=0, grid_mode=True)
    return numpy.clip(out, image.min(), image.max(), out=out)


def resize_image(im, new_dims, interp_order=1):
    """pycaffe's ``caffe.io.resize_image``: an H×W×K image to ``new_dims`` (H', W'), bilinear
    by default (``interp_order`` 0: nearest). As pycaffe does: a 1- or 3-channel image is
    scaled to [0, 1], resized as scikit-image's ``resize(..., mode='constant')`` does (see
    :func:`_skimage_resize`; edge pixels blend with the zeros beyond them) and scaled back; a
    constant one stays exactly constant; other channel counts go through scipy's ``zoom``."""
    from scipy import ndimage
    im = numpy.asarray(im)
    if im.shape[-1] == 1 or im.shape[-1] == 3:
        im_min, im_max = im.min(), im.max()
        if not im_max > im_min:
            return numpy.full((new_dims[0], new_dims[1], im.shape[-1]), im_min,
                              dtype=numpy.float32)
        im_std = (im - im_min) / (im_max - im_min)
        resized_im = _skimage_resize(im_std, new_dims, interp_order) * (im_max - im_min) + im_min
    else:
        scale = tuple(numpy.array(new_dims, dtype=float) / numpy.array(im.shape[:2]))
        resized_im = ndimage.zoom(im, scale + (1,), order=interp_order)
    return resized_im.astype(numpy.float32)


def oversample(images, crop_dims):
    """Ten crops per image: the four corners and the centre, then the same five mirrored."""
    images = list(images)
    im_h, im_w, k = images[0].shape
    ch, cw = int(crop_dims[0]), int(crop_dims[1])
    if ch > im_h or cw > im_w:
        raise CaffeError(f"oversample: crop {ch}×{cw} is larger than the image {im_h}×{im_w}")
    origins = [(0, 0), (0, im_w - cw), (im_h - ch, 0), (im_h - ch, im_w - cw),
               (int(im_h / 2.0 - ch / 2.0), int(im_w / 2.0 - cw / 2.0))]
    crops = numpy.empty((10 * len(images), ch, cw, k), dtype=numpy.float32)
    for n, im in enumerate(images):
        for j, (y, x) in enumerate(origins):
            crop = im[y:y + ch, x:x + cw, :]
            crops[10 * n + j] = crop
            crops[10 * n + 5 + j] = crop[:, ::-1, :]
    return crops


# --- the Transformer ---------------------------------------------------------------------------
class Transformer:
    """Turns images into net inputs and back, per input blob.

    ``inputs``: {input name: blob shape (N, C, H, W)}. ``preprocess`` applies, in order: resize
    to H×W, transpose, channel swap, ×raw_scale, −mean, ×input_scale; ``deprocess`` inverts it.
    """

    def __init__(self, inputs):
        self.inputs = {name: tuple(int(d) for d in shape) for name, shape in inputs.items()}
        self.transpose, self.channel_swap = {}, {}
        self.raw_scale, self.mean, self.input_scale = {}, {}, {}

    def _check_input(self, name):
        if name not in self.inputs:
            raise CaffeError(f"{name!r} is not one of the net inputs: {sorted(self.inputs)}")

    def preprocess(self, in_, data):
        """An H×W×K image (any size) → the K×H×W float32 array the net's input ``in_`` takes."""
        self._check_input(in_)
        x = numpy.asarray(data).astype(numpy.float32, copy=True)
        in_dims = self.inputs[in_][2:]
        if x.shape[:2] != in_dims:
            x = resize_image(x, in_dims)
        if in_ in self.transpose:
            x = x.transpose(self.transpose[in_])
        if in_ in self.channel_swap:
            x = x[list(self.channel_swap[in_]), :, :]
        if in_ in self.raw_scale:
            x *= self.raw_scale[in_]
        if in_ in self.mean:
            x -= self.mean[in_]
        if in_ in self.input_scale:
            x *= self.input_scale[in_]
        return x

    def deprocess(self, in_, data):
        """Invert :meth:`preprocess` (all but the resize)."""
        self._check_input(in_)
        x = numpy.asarray(data).copy().squeeze().astype(numpy.float32)
        if in_ in self.input_scale:
            x /= self.input_scale[in_]
        if in_ in self.mean:
            x += self.mean[in_]
        if in_ in self.raw_scale:
            x /= self.raw_scale[in_]
        if in_ in self.channel_swap:
            x = x[numpy.argsort(self.channel_swap[in_]), :, :]
        if in_ in self.transpose:
            x = x.transpose(numpy.argsort(self.transpose[in_]))
        return x

    def set_transpose(self, in_, order):
        """Axis order from the image's layout to the net's, e.g. (2, 0, 1) for H×W×K → K×H×W."""
        self._check_input(in_)
        if len(order) != len(self.inputs[in_]) - 1:
            raise CaffeError(f"set_transpose({in_!r}): order {tuple(order)} needs "
                             f"{len(self.inputs[in_]) - 1} axes, as the input's image")
        self.transpose[in_] = tuple(order)

    def set_channel_swap(self, in_, order):
        """Channel order, e.g. (2, 1, 0) for RGB → BGR (applied after the transpose)."""
        self._check_input(in_)
        if len(order) != self.inputs[in_][1]:
            raise CaffeError(f"set_channel_swap({in_!r}): order {tuple(order)} needs one entry "
                             f"per input channel ({self.inputs[in_][1]})")
        self.channel_swap[in_] = tuple(order)

    def set_raw_scale(self, in_, scale):
        """Multiply the image by ``scale`` before the mean is subtracted ([0,1] → [0,255]: 255)."""
        self._check_input(in_)
        self.raw_scale[in_] = scale

    def set_mean(self, in_, mean):
        """Subtract ``mean``: one value per channel (K,), or an image (K×H×W, resized to the
        input when its size differs)."""
        self._check_input(in_)
        mean = numpy.asarray(mean, dtype=numpy.float32)
        channels, size = self.inputs[in_][1], self.inputs[in_][2:]
        if mean.ndim == 1:
            if mean.shape[0] != channels:
                raise CaffeError(f"set_mean({in_!r}): {mean.shape[0]} mean values for "
                                 f"{channels} input channels")
            mean = mean[:, None, None]
        else:
            if mean.ndim == 2:
                mean = mean[None]
            if mean.ndim != 3 or mean.shape[0] != channels:
                raise CaffeError(f"set_mean({in_!r}): mean of shape {mean.shape} for an input "
                                 f"of {channels}×{size[0]}×{size[1]}")
            if mean.shape[1:] != size:
                mean = resize_image(mean.transpose(1, 2, 0), size).transpose(2, 0, 1)
        self.mean[in_] = mean

    def set_input_scale(self, in_, scale):
        """Multiply by ``scale`` after the mean is subtracted."""
        self._check_input(in_)
        self.input_scale[in_] = scale


def image_transformer(name, shape, mean=None, input_scale=None, raw_scale=None, channel_swap=None):
    """The Transformer pycaffe's Classifier and Detector build for input ``name`` of ``shape``:
    H×W×K images to K×H×W, then the optional mean, scales and channel order."""
    t = Transformer({name: shape})
    t.set_transpose(name, (2, 0, 1))
    if mean is not None:
        t.set_mean(name, mean)
    if input_scale is not None:
        t.set_input_scale(name, input_scale)
    if raw_scale is not None:
        t.set_raw_scale(name, raw_scale)
    if channel_swap is not None:
        t.set_channel_swap(name, channel_swap)
    return t
