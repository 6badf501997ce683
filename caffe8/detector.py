"""pycaffe's ``caffe.Detector``: score windows of images with a TEST-phase net (R-CNN style).

Windows are (ymin, xmin, ymax, xmax) in pixels. With ``context_pad`` p, a window is grown so
that, once warped to the net's input, p pixels of surrounding context border it (as R-CNN's
"warp with context"); context beyond the image is filled with the mean.
"""
import numpy

from caffe8 import io
from caffe8.pynet import Net, require_weights
from caffe8.engine.errors import CaffeError


class Detector(Net):
    """``Detector(model_file, pretrained_file, mean=None, input_scale=None, raw_scale=None,
    channel_swap=None, context_pad=None)``; ``detect_windows([(image file, windows), ...])``."""

    def __init__(self, model_file, pretrained_file, mean=None, input_scale=None,
                 raw_scale=None, channel_swap=None, context_pad=None):
        require_weights("Detector", pretrained_file)
        super().__init__(model_file, pretrained_file, "TEST")
        in_ = self.inputs[0]
        self.transformer = io.image_transformer(in_, self.blobs[in_].shape, mean, input_scale,
                                                raw_scale, channel_swap)
        self.configure_crop(context_pad)

    def detect_windows(self, images_windows):
        """[{'window', 'prediction', 'filename'}] for every window of every image."""
        crops, owners = [], []
        for filename, windows in images_windows:
            image = io.load_image(filename)
            for window in windows:
                crops.append(self.crop(image, window))
                owners.append((filename, window))
        if not crops:
            return []
        in_ = self.inputs[0]
        caffe_in = numpy.stack([self.transformer.preprocess(in_, c) for c in crops])
        scores = self.forward_all(**{in_: caffe_in})[self.outputs[0]]
        return [{"window": window, "prediction": scores[k], "filename": filename}
                for k, (filename, window) in enumerate(owners)]

    def detect_selective_search(self, image_fnames):
        raise CaffeError("detect_selective_search needs the selective_search_ijcv_with_python "
                         "package, which caffe8 does not ship; compute the windows and call "
                         "detect_windows")

    def crop(self, im, window):
        """The window's pixels (H×W×K), with ``context_pad`` context when configured."""
        y0, x0, y1, x1 = (int(v) for v in window)
        if not self.context_pad:
            return im[y0:y1, x0:x1]
        size = self.blobs[self.inputs[0]].width  # a square input
        grow = size / (size - 2.0 * self.context_pad)
        half_h, half_w = (y1 - y0 + 1) / 2.0, (x1 - x0 + 1) / 2.0
        cy, cx = y0 + half_h, x0 + half_w
        box = numpy.round([cy - grow * half_h, cx - grow * half_w,
                           cy + grow * half_h, cx + grow * half_w])
        scale_h = size / (box[2] - box[0] + 1)
        scale_w = size / (box[3] - box[1] + 1)
        # context beyond the image: the part of the warped crop it would cover stays mean
        pad_y = int(round(max(0.0, -box[0]) * scale_h))
        pad_x = int(round(max(0.0, -box[1]) * scale_w))
        im_h, im_w = im.shape[:2]
        box = numpy.clip(box, 0, [im_h, im_w, im_h, im_w]).astype(int)
        crop_h = min(int(round((box[2] - box[0] + 1) * scale_h)), size - pad_y)
        crop_w = min(int(round((box[3] - box[1] + 1) * scale_w)), size - pad_x)
        if crop_h <= 0 or crop_w <= 0:
            raise CaffeError(f"window {tuple(window)} lies outside the {im_h}×{im_w} image")
        inner = io.resize_image(im[box[0]:box[2], box[1]:box[3]], (crop_h, crop_w))
        out = numpy.ones(self.crop_dims, dtype=numpy.float32) * self.crop_mean
        out[pad_y:pad_y + crop_h, pad_x:pad_x + crop_w] = inner
        return out

    def configure_crop(self, context_pad):
        """Crop size (in the image's H×W×K layout) and the mean used to pad context."""
        in_ = self.inputs[0]
        order = numpy.argsort(self.transformer.transpose[in_])
        self.crop_dims = numpy.array(self.blobs[in_].shape[1:])[order]
        self.context_pad = context_pad
        if not context_pad:
            return
        mean = self.transformer.mean.get(in_)
        if mean is None:
            self.crop_mean = numpy.zeros(self.crop_dims, dtype=numpy.float32)
            return
        crop_mean = numpy.array(mean, dtype=numpy.float32).transpose(order)
        swap = self.transformer.channel_swap.get(in_)
        if swap is not None:
            crop_mean = crop_mean[:, :, numpy.argsort(swap)]
        raw_scale = self.transformer.raw_scale.get(in_)
        if raw_scale is not None:
            crop_mean = crop_mean / raw_scale
        self.crop_mean = crop_mean
