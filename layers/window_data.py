"""WindowData (Caffe's window_data_layer.cpp): object-detection windows cut out of images and
warped to a fixed size, as used to fine-tune R-CNN ("Rich feature hierarchies for accurate
object detection and semantic segmentation", Girshick et al.).

``window_data_param.source`` is Caffe's window file, repeated per image::

    # image_index
    image_path
    channels
    height
    width
    num_windows
    class_index overlap x1 y1 x2 y2        (num_windows lines; inclusive 0-based pixel corners)

(``image_path`` is prefixed with ``root_folder``.) A window with overlap ≥ ``fg_threshold`` is
foreground and keeps its label (which must be > 0); one with overlap < ``bg_threshold`` is
background with label 0; others are dropped. Each batch (``batch_size``) holds
⌊batch_size · fg_fraction⌋ foreground windows after the background ones, each drawn uniformly
with replacement by the layer's seeded generator; with ``mirror`` a coin flips each window.

``crop_mode: "warp"`` stretches the window to crop_size × crop_size (``transform_param.crop_size``,
required). With ``context_pad`` > 0, or ``crop_mode: "square"`` (the tightest square around the
window), the region is first grown about its centre by crop_size / (crop_size − 2·context_pad),
clipped to the image, and the clipped part warped and placed at its offset in a zero-filled
crop (Caffe's arithmetic, C rounding included). Resizing is bilinear with OpenCV's INTER_LINEAR
pixel-centre convention; images are read in BGR as OpenCV does. Values are
(pixel − mean) · scale with the mean from ``mean_file`` (indexed at the centred crop plus the
padding offset, as Caffe) or ``mean_value``; scale and the deprecated crop_size/mirror/mean_file of
window_data_param are honoured as transform_param fields (Caffe's UpgradeNetDataTransformation).
Tops: data (batch_size×C×crop×crop) and label (batch_size). Windows are sharded across ranks.
"""
import math
import os

import numpy

from caffe8.engine.errors import DataError, relative_to_cwd
from caffe8.engine.layer import register_layer
from caffe8.engine.transformer import DataTransformer, decode_image, transform_param_with_legacy
from caffe8.layers.base_data import BaseDataLayer, resolve_listed_path

IMAGE, LABEL, OVERLAP, X1, Y1, X2, Y2 = range(7)


def c_round(x):
    """C's round(): halves away from zero (Python's round() goes to even)."""
    return int(math.copysign(math.floor(abs(x) + 0.5), x))


def parse_window_file(path, root_folder, fg_threshold, bg_threshold):
    """(images, fg windows, bg windows) from a Caffe window file; errors name file:line."""
    if not os.path.isfile(path):
        raise DataError(f"window file (source) '{path}' does not exist"
                        f"{relative_to_cwd(path)}")
    with open(path, encoding="utf-8") as f:
        tokens = [(n, tok) for n, line in enumerate(f, 1) for tok in line.split()]
    if not tokens:
        raise DataError(f"window file '{path}' is empty")
    pos = 0

    def take(kind, what):
        nonlocal pos
        if pos >= len(tokens):
            raise DataError(f"{path}: unexpected end of file, expected {what}")
        n, tok = tokens[pos]
        pos += 1
        try:
            return kind(tok)
        except ValueError:
            raise DataError(f"{path}:{n}: expected {what}, got {tok!r}") from None

    images, fg, bg = [], [], []
    while pos < len(tokens):
        line = tokens[pos][0]
        if take(str, "'#'") != "#":
            raise DataError(f"{path}:{line}: expected '# image_index'")
        index = take(int, "an image index")
        image_path = take(str, "an image path")
        size = [take(int, "channels"), take(int, "height"), take(int, "width")]
        images.append((index, root_folder + image_path, size))
        for _ in range(take(int, "the number of windows")):
            label, overlap = take(int, "a class index"), take(float, "an overlap")
            box = [take(int, c) for c in ("x1", "y1", "x2", "y2")]
            window = [index, label, overlap] + box
            if overlap >= fg_threshold:
                if label <= 0:
                    raise DataError(f"{path}: foreground window of image {index} has label "
                                    f"{label}; foreground labels must be > 0")
                fg.append(window)
            elif overlap < bg_threshold:
                window[LABEL] = 0
                window[OVERLAP] = 0.0
                bg.append(window)
    for i, (index, image_path, _) in enumerate(images):
        if index != i:
            raise DataError(f"{path}: image '{image_path}' has index {index}, expected {i} "
                            "(windows refer to images by their position in the file)")
    return images, fg, bg


def resize_linear(img, out_h, out_w):
    """OpenCV's INTER_LINEAR resize of an H×W×C uint8 image (pixel centres aligned, edge
    samples clamped), rounded back to uint8."""
    in_h, in_w = img.shape[:2]

    def axis(out_n, in_n):
        scale = in_n / out_n
        f = (numpy.arange(out_n) + 0.5) * scale - 0.5
        lo = numpy.floor(f).astype(int)
        frac = f - lo
        frac[lo < 0] = 0.0
        lo = numpy.clip(lo, 0, in_n - 1)
        hi = numpy.minimum(lo + 1, in_n - 1)
        return lo, hi, frac

    y0, y1, fy = axis(out_h, in_h)
    x0, x1, fx = axis(out_w, in_w)
    src = img.astype(numpy.float64)
    top = src[y0][:, x0] * (1 - fx)[None, :, None] + src[y0][:, x1] * fx[None, :, None]
    bottom = src[y1][:, x0] * (1 - fx)[None, :, None] + src[y1][:, x1] * fx[None, :, None]
    out = top * (1 - fy)[:, None, None] + bottom * fy[:, None, None]
    return numpy.clip(numpy.floor(out + 0.5), 0, 255).astype(numpy.uint8)


def window_geometry(box, img_h, img_w, crop, context_pad, square, mirror, dtype):
    """Caffe's crop arithmetic: (x1, y1, x2, y2) to cut, the warped (height, width) and the
    (pad_h, pad_w) offset of the warped region inside the crop."""
    x1, y1, x2, y2 = box
    warp_h = warp_w = crop
    pad_h = pad_w = 0
    if context_pad > 0 or square:
        D = dtype.type
        context_scale = D(crop) / D(crop - 2 * context_pad)
        half_h = D(y2 - y1 + 1) / D(2.0)
        half_w = D(x2 - x1 + 1) / D(2.0)
        cx, cy = D(x1) + half_w, D(y1) + half_h
        if square:
            half_h = half_w = max(half_h, half_w)
        x1 = c_round(float(cx - half_w * context_scale))
        x2 = c_round(float(cx + half_w * context_scale))
        y1 = c_round(float(cy - half_h * context_scale))
        y2 = c_round(float(cy + half_h * context_scale))
        unclipped_h, unclipped_w = y2 - y1 + 1, x2 - x1 + 1
        pad_x1, pad_y1 = max(0, -x1), max(0, -y1)
        pad_x2, pad_y2 = max(0, x2 - img_w + 1), max(0, y2 - img_h + 1)
        x1, x2, y1, y2 = x1 + pad_x1, x2 - pad_x2, y1 + pad_y1, y2 - pad_y2
        scale_x = D(crop) / D(unclipped_w)
        scale_y = D(crop) / D(unclipped_h)
        warp_w = c_round(float(D(x2 - x1 + 1) * scale_x))
        warp_h = c_round(float(D(y2 - y1 + 1) * scale_y))
        pad_x1 = c_round(float(D(pad_x1) * scale_x))
        pad_x2 = c_round(float(D(pad_x2) * scale_x))
        pad_y1 = c_round(float(D(pad_y1) * scale_y))
        pad_h = pad_y1
        pad_w = pad_x2 if mirror else pad_x1  # a mirrored window mirrors its padding
        warp_h = min(warp_h, crop - pad_h)  # rounding may overflow the crop by a pixel
        warp_w = min(warp_w, crop - pad_w)
    return (x1, y1, x2, y2), (warp_h, warp_w), (pad_h, pad_w)


@register_layer("WindowData")
class WindowDataLayer(BaseDataLayer):
    exact_num_top = 2

    def data_setup(self, top):
        p = self.layer_param.window_data_param
        self.batch_size = self.batch_size_of(p)
        tp = transform_param_with_legacy(self.layer_param, p)
        self.transformer = DataTransformer(tp, self.phase, self.rng, where=f"layer '{self.name}'")
        self.crop = int(tp.crop_size)
        if self.crop <= 0:
            raise self.error("transform_param.crop_size must be positive for WindowData "
                             "(the size windows are warped to)")
        self.context_pad = int(p.context_pad)
        if 2 * self.context_pad >= self.crop:
            raise self.error(f"context_pad {self.context_pad} leaves nothing of a "
                             f"{self.crop}-pixel crop")
        if p.crop_mode not in ("warp", "square"):
            raise self.error(f"crop_mode must be \"warp\" or \"square\", got {p.crop_mode!r} "
                             f"({p.location('crop_mode')})")
        self.square = p.crop_mode == "square"
        self.fg_fraction = float(p.fg_fraction)
        self.source = p.source
        images, fg, bg = parse_window_file(p.source, p.root_folder, p.fg_threshold,
                                           p.bg_threshold)
        self.images = [(resolve_listed_path(path, p.source) if not p.root_folder else path, size)
                       for _, path, size in images]
        self.num_fg = int(numpy.float32(self.batch_size) * numpy.float32(self.fg_fraction))
        self.fg = self.shard_or_fail(fg, p.source + " (foreground windows)") if self.num_fg else fg
        self.bg = (self.shard_or_fail(bg, p.source + " (background windows)")
                   if self.batch_size > self.num_fg else bg)
        self.channels = images[-1][2][0]
        self.mean_values = None
        if self.transformer.mean is not None:
            m = self.transformer.mean
            if m.shape[0] != self.channels or min(m.shape[1:]) < self.crop:
                raise self.error(f"mean_file has shape {m.shape}; it needs {self.channels} "
                                 f"channels and at least {self.crop}×{self.crop} pixels")
        elif self.transformer.mean_values:
            vals = self.transformer.mean_values
            if len(vals) == 1:
                vals = vals * self.channels
            if len(vals) != self.channels:
                raise self.error(f"mean_value has {len(vals)} values; give 1 or one per "
                                 f"channel ({self.channels})")
            self.mean_values = numpy.asarray(vals, dtype=numpy.float32)
        self.cache = {} if p.cache_images else None
        return [(self.batch_size, self.channels, self.crop, self.crop), (self.batch_size,)]

    def _image(self, index):
        path, size = self.images[index]
        if self.cache is not None and index in self.cache:
            return self.cache[index]
        img = decode_image(path, color=size[0] != 1, where=f"image '{path}' (listed in "
                           f"window file {self.source})")
        if self.cache is not None:
            self.cache[index] = img
        return img

    def load_batch(self):
        data = numpy.zeros(self.top_shapes[0], dtype=self.dtype)
        label = numpy.empty(self.top_shapes[1], dtype=self.dtype)
        item = 0
        for windows, count in ((self.bg, self.batch_size - self.num_fg), (self.fg, self.num_fg)):
            for _ in range(count):
                window = windows[int(self.rng.integers(len(windows)))]
                mirror = bool(self.transformer.mirror and self.rng.integers(2))
                self._fill(data[item], window, mirror)
                label[item] = window[LABEL]
                item += 1
        return data, label

    def _fill(self, out, window, mirror):
        img = self._image(int(window[IMAGE]))
        img_h, img_w = img.shape[:2]
        (x1, y1, x2, y2), (warp_h, warp_w), (pad_h, pad_w) = window_geometry(
            window[X1:], img_h, img_w, self.crop, self.context_pad, self.square, mirror,
            self.dtype)
        if not (0 <= x1 <= x2 < img_w and 0 <= y1 <= y2 < img_h):
            raise DataError(f"layer '{self.name}': window ({window[X1]}, {window[Y1]}, "
                            f"{window[X2]}, {window[Y2]}) of image '{self.images[window[IMAGE]][0]}' "
                            f"lies outside its {img_w}×{img_h} pixels")
        if warp_h <= 0 or warp_w <= 0:
            return
        patch = resize_linear(img[y1:y2 + 1, x1:x2 + 1], warp_h, warp_w)
        if mirror:
            patch = patch[:, ::-1]
        values = patch.transpose(2, 0, 1).astype(numpy.float32)
        rows = slice(pad_h, pad_h + warp_h)
        cols = slice(pad_w, pad_w + warp_w)
        if self.transformer.mean is not None:
            off = (self.transformer.mean.shape[2] - self.crop) // 2
            values -= self.transformer.mean[:, off + pad_h:off + pad_h + warp_h,
                                            off + pad_w:off + pad_w + warp_w]
        elif self.mean_values is not None:
            values -= self.mean_values[:, None, None]
        out[:, rows, cols] = values * self.transformer.scale

    def cursor_state(self):
        return {}

    def restore_cursor(self, state):
        """Nothing to restore: windows are drawn by the generator the base class saves."""
