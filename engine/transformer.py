"""Caffe's DataTransformer (src/caffe/data_transformer.cpp) and image decoding with Pillow.

``value = (pixel - mean) * scale`` — the mean is subtracted first, then the result is scaled, in
float32 as Caffe's ``Dtype`` arithmetic does. The mean is a full-size ``mean_file`` (indexed at the
crop offset, so it is cropped and mirrored with the image) or ``mean_value`` (one value for every
channel, or one per channel). Crop: TRAIN draws ``h_off = Rand(H - crop + 1)`` then ``w_off``;
TEST takes the centre ``(H - crop) // 2``. Mirror: with ``mirror: true`` every image is flipped
left-right with probability 1/2 *in any phase*; the coin is drawn before the crop offsets, as in
Caffe.

Images are read like OpenCV does for Caffe: colour images come out in **BGR** channel order (so
Caffe's BGR ``mean_value: 104 117 123`` and models trained by Caffe apply unchanged), greyscale as
one channel.
"""
import io
import os

import numpy
from PIL import Image, UnidentifiedImageError

from caffe8.engine.datum import read_mean_file
from caffe8.engine.errors import DataError, relative_to_cwd


class DataTransformer:
    """Crop / mirror / mean / scale of one image.

    ``transform_param`` is a parsed TransformationParameter, ``phase`` "TRAIN" or "TEST",
    ``rng`` a ``numpy.random.Generator`` owned by the calling layer (so prefetching stays
    deterministic), ``where`` names the layer in errors.
    """

    def __init__(self, transform_param, phase, rng, where="data layer"):
        p = transform_param
        self.where = where
        self.phase = phase
        self.rng = rng
        self.scale = numpy.float32(p.scale)
        self.mirror = bool(p.mirror)
        self.crop_size = int(p.crop_size)
        self.force_color = bool(p.force_color)
        self.force_gray = bool(p.force_gray)
        if self.force_color and self.force_gray:
            raise DataError(f"{where}: force_color and force_gray cannot both be set")
        self.mean = None
        self.mean_values = [float(v) for v in p.mean_value]
        if p.has("mean_file"):
            if self.mean_values:
                raise DataError(f"{where}: cannot specify mean_file and mean_value at the same "
                                "time (as in Caffe)")
            self.mean = read_mean_file(p.mean_file)
            self.mean_file = p.mean_file

    def output_shape(self, in_shape):
        """(C, H, W) of the result for an input of (C, H, W) ``in_shape``."""
        c, h, w = in_shape
        if self.crop_size:
            self._check_crop(h, w)
            return (c, self.crop_size, self.crop_size)
        return (c, h, w)

    def _check_crop(self, h, w):
        if self.crop_size > h or self.crop_size > w:
            raise DataError(f"{self.where}: crop_size {self.crop_size} is larger than the "
                            f"image ({h}×{w})")

    def _mean_for(self, c, h, w):
        """The mean broadcastable against a (C, H, W) float32 image, or None."""
        if self.mean is not None:
            if self.mean.shape != (c, h, w):
                raise DataError(f"{self.where}: mean_file '{self.mean_file}' has shape "
                                f"{self.mean.shape} but the images are {(c, h, w)}")
            return self.mean
        if not self.mean_values:
            return None
        if len(self.mean_values) == 1:
            vals = self.mean_values * c
        elif len(self.mean_values) == c:
            vals = self.mean_values
        else:
            raise DataError(f"{self.where}: mean_value has {len(self.mean_values)} values; "
                            f"give 1 or one per channel ({c})")
        return numpy.asarray(vals, dtype=numpy.float32).reshape(c, 1, 1)

    def draw(self, h, w):
        """Random choices for one image of height h, width w: (mirror?, h_off, w_off)."""
        do_mirror = bool(self.mirror and self.rng.integers(2))
        h_off = w_off = 0
        if self.crop_size:
            self._check_crop(h, w)
            if self.phase == "TRAIN":
                h_off = int(self.rng.integers(h - self.crop_size + 1))
                w_off = int(self.rng.integers(w - self.crop_size + 1))
            else:
                h_off = (h - self.crop_size) // 2
                w_off = (w - self.crop_size) // 2
        return do_mirror, h_off, w_off

    def transform(self, image, layout="CHW", out=None, choices=None):
        """Transform one uint8/float image (``layout`` "CHW" or "HWC"; 2-D means one channel)
        into a float32 (C, H', W') array, written into ``out`` when given. ``choices``: the
        (mirror, h_off, w_off) of an earlier ``draw`` (decoding threads draw in record order
        first, then transform in parallel); None draws now."""
        x = numpy.asarray(image)
        if x.ndim == 2:
            x = x[None] if layout == "CHW" else x[:, :, None]
        if layout == "HWC":
            x = x.transpose(2, 0, 1)
        elif layout != "CHW":
            raise ValueError(f"layout must be 'CHW' or 'HWC', got {layout!r}")
        c, h, w = x.shape
        mean = self._mean_for(c, h, w)
        do_mirror, h_off, w_off = self.draw(h, w) if choices is None else choices
        if self.crop_size:
            window = (slice(None), slice(h_off, h_off + self.crop_size),
                      slice(w_off, w_off + self.crop_size))
            x = x[window]
            if self.mean is not None:  # a full-size mean is cropped with the image
                mean = mean[window]
        y = x.astype(numpy.float32)
        if mean is not None:
            y -= mean
        y *= self.scale
        if do_mirror:
            y = y[:, :, ::-1]
        if out is None:
            return numpy.ascontiguousarray(y)
        out[...] = y
        return out


def _open(source, where):
    try:
        img = Image.open(source)
        img.load()  # decode now so that a truncated file fails here, naming it
        return img
    except FileNotFoundError:
        cwd = relative_to_cwd(source) if isinstance(source, (str, os.PathLike)) else ""
        raise DataError(f"{where}: image file not found{cwd}") from None
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as e:
        raise DataError(f"{where}: cannot decode image ({type(e).__name__}: {e})") from None


def decode_image(source, color=None, size=None, where="image"):
    """Read an image file path or encoded bytes into an H×W×C uint8 array.

    ``color``: True → 3 channels BGR, False → 1 channel grey, None → as stored (grey stays grey,
    anything else becomes BGR; OpenCV's IMREAD_ANYCOLOR). ``size``: (height, width) to resize to
    with bilinear interpolation, or None.
    """
    if isinstance(source, (bytes, bytearray, memoryview)):
        source = io.BytesIO(bytes(source))
    img = _open(source, where)
    if color is None:
        color = img.mode not in ("L", "1", "I", "I;16", "F")
    img = img.convert("RGB" if color else "L")
    if size is not None:
        img = img.resize((int(size[1]), int(size[0])), Image.BILINEAR)
    a = numpy.asarray(img, dtype=numpy.uint8)
    if color:
        return numpy.ascontiguousarray(a[:, :, ::-1])  # RGB → BGR, as OpenCV loads for Caffe
    return a[:, :, None]


def transform_param_with_legacy(layer_param, legacy):
    """The layer's TransformationParameter with deprecated fields of ``legacy`` (an
    ImageDataParameter or DataParameter: scale, mean_file, crop_size, mirror) moved in, as
    Caffe's UpgradeNetDataTransformation does. Setting a field in both places is an error."""
    tp = layer_param.transform_param.copy()
    for name in ("scale", "mean_file", "crop_size", "mirror"):
        if legacy.has(name):
            if tp.has(name):
                raise DataError(f"layer '{layer_param.name}': {name} is set both in "
                                f"transform_param and (deprecated) in {legacy.type_name} "
                                f"at {legacy.location(name)}")
            setattr(tp, name, getattr(legacy, name))
    return tp
