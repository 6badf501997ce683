"""pycaffe's ``caffe.Classifier``: a TEST-phase net that scores images (H×W×K, [0, 1])."""
import numpy

from caffe8 import io
from caffe8.pynet import Net, require_weights


class Classifier(Net):
    """``Classifier(model_file, pretrained_file, image_dims=None, mean=None, input_scale=None,
    raw_scale=None, channel_swap=None)``; ``predict(images, oversample=True)`` returns one row
    of class scores per image (the mean over the ten crops when ``oversample``)."""

    def __init__(self, model_file, pretrained_file, image_dims=None, mean=None,
                 input_scale=None, raw_scale=None, channel_swap=None):
        require_weights("Classifier", pretrained_file)
        super().__init__(model_file, pretrained_file, "TEST")
        in_ = self.inputs[0]
        self.transformer = io.image_transformer(in_, self.blobs[in_].shape, mean, input_scale,
                                                raw_scale, channel_swap)
        self.crop_dims = numpy.array(self.blobs[in_].shape[2:])
        self.image_dims = numpy.array(image_dims if image_dims is not None else self.crop_dims)

    def predict(self, inputs, oversample=True):
        """Class scores (N × classes): images resized to ``image_dims``, then ten crops
        averaged (``oversample``) or the centre crop only."""
        inputs = list(inputs)
        h, w = (int(d) for d in self.image_dims)
        resized = numpy.stack([io.resize_image(im, (h, w)) for im in inputs])
        if oversample:
            crops = io.oversample(resized, self.crop_dims)
        else:
            ch, cw = (int(d) for d in self.crop_dims)
            y, x = int(h / 2.0 - ch / 2.0), int(w / 2.0 - cw / 2.0)
            crops = resized[:, y:y + ch, x:x + cw, :]
        in_ = self.inputs[0]
        caffe_in = numpy.stack([self.transformer.preprocess(in_, c) for c in crops])
        scores = self.forward_all(**{in_: caffe_in})[self.outputs[0]]
        if oversample:
            scores = scores.reshape(len(inputs), 10, -1).mean(axis=1)
        return scores.reshape(len(inputs), -1)
