"""caffe8.Classifier and caffe8.Detector against crops and scores computed by hand."""
import numpy
from PIL import Image

import caffe8 as caffe


def _deploy(tmp_path, shape, outputs):
    dims = " ".join(f"dim: {d}" for d in shape)
    path = tmp_path / "deploy.prototxt"
    path.write_text(f'layer {{ name: "data" type: "Input" top: "data" input_param {{ shape {{ '
                    f'{dims} }} }} }}\nlayer {{ name: "score" type: "InnerProduct" bottom: "data" '
                    f'top: "score" inner_product_param {{ num_output: {outputs} weight_filler {{ '
                    f'type: "gaussian" }} bias_filler {{ type: "gaussian" }} }} }}\n')
    net = caffe.Net(str(path), caffe.TEST)
    weights = str(tmp_path / "w.caffemodel.h5")
    net.save(weights)
    w, b = (p.data.astype(numpy.float64) for p in net.params["score"])
    return str(path), weights, w, b


def test_classifier_center_and_ten_crops(tmp_path):
    model, weights, w, b = _deploy(tmp_path, (4, 1, 4, 4), 3)
    clf = caffe.Classifier(model, weights, image_dims=(6, 6), raw_scale=2.0, mean=numpy.array([0.5]))
    rng = numpy.random.default_rng(0)
    images = [rng.random((6, 6, 1)).astype(numpy.float32) for _ in range(3)]

    def score(crop):
        return w @ (crop[:, :, 0] * 2.0 - 0.5).ravel() + b

    center = clf.predict(images, oversample=False)
    numpy.testing.assert_allclose(center, [score(im[1:5, 1:5]) for im in images], rtol=1e-4,
                                  atol=1e-5)
    ten = clf.predict(images)
    for k, im in enumerate(images):
        crops = [im[0:4, 0:4], im[0:4, 2:6], im[2:6, 0:4], im[2:6, 2:6], im[1:5, 1:5]]
        crops += [c[:, ::-1] for c in crops]
        numpy.testing.assert_allclose(ten[k], numpy.mean([score(c) for c in crops], axis=0),
                                      rtol=1e-4, atol=1e-5)


def test_detector_windows_and_context(tmp_path):
    model, weights, w, b = _deploy(tmp_path, (2, 3, 4, 4), 2)
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
