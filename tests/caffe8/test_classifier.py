"""caffe8.Classifier against crops and scores computed by hand."""
import numpy

import caffe8 as caffe


def deploy_net(tmp_path, shape, outputs):
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
    model, weights, w, b = deploy_net(tmp_path, (4, 1, 4, 4), 3)
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
