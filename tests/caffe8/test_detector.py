"""caffe8.Detector: window crops (with and without context) and scores computed by hand."""
import numpy
from PIL import Image

import caffe8 as caffe
from tests.caffe8.test_classifier import deploy_net


def test_detector_windows_and_context(tmp_path):
    model, weights, w, b = deploy_net(tmp_path, (2, 3, 4, 4), 2)
    rng = numpy.random.default_rng(1)
    pixels = rng.integers(0, 256, (20, 20, 3), dtype=numpy.uint8)
    Image.fromarray(pixels).save(tmp_path / "im.png")
    im = pixels.astype(numpy.float32) / 255
    det = caffe.Detector(model, weights)
    windows = [(0, 0, 4, 4), (2, 3, 10, 12), (5, 5, 9, 9)]
    out = det.detect_windows([(str(tmp_path / "im.png"), windows)])
    assert [d["window"] for d in out] == windows
    expect = w @ im[0:4, 0:4].transpose(2, 0, 1).ravel() + b
    numpy.testing.assert_allclose(out[0]["prediction"], expect, rtol=1e-4, atol=1e-5)
    # context_pad 1 on a 4-pixel input: the window doubles around its centre
    ctx = caffe.Detector(model, weights, context_pad=1)
    crop = ctx.crop(im, (8, 8, 11, 11))       # centre (10, 10), grown box [6, 6, 14, 14]
    numpy.testing.assert_allclose(crop, caffe.io.resize_image(im[6:14, 6:14], (4, 4)), atol=1e-6)
    corner = ctx.crop(im, (0, 0, 3, 3))       # box [-2, -2, 6, 6]: one row/column of context
    assert corner.shape == (4, 4, 3)
    assert numpy.all(corner[0] == 0) and numpy.all(corner[:, 0] == 0)   # the (zero) mean
    numpy.testing.assert_allclose(corner[1:, 1:], caffe.io.resize_image(im[0:6, 0:6], (3, 3)),
                                  atol=1e-6)
