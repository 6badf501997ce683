"""Finite-difference gradient checking for layers (Caffe's GradientChecker, in float64).

``check_layer_gradient(layer, bottom, top)`` sets the layer up, uses the objective
``sum(top[k].data * W_k)`` with fixed random weights W_k, and compares the analytic gradients of
every bottom (where checked) and every parameter with central differences.
"""
import numpy


def _objective(layer, bottom, top, weights):
    layer.reshape(bottom, top)
    layer.forward(bottom, top)
    return sum(float(numpy.sum(numpy.asarray(t.data, dtype=numpy.float64) * w))
               for t, w in zip(top, weights))


def check_layer_gradient(layer, bottom, top, check_bottom=None, eps=1e-6, rtol=1e-5, atol=1e-7,
                         seed=0, setup=True, forward_reset=None):
    """Raise AssertionError when analytic and numerical gradients disagree.

    ``check_bottom``: indices of bottoms to check (default: all). ``forward_reset``: callable run
    before each forward (e.g. to re-seed a Dropout mask). Arrays must be NumPy float64.
    """
    rng = numpy.random.default_rng(seed)
    if setup:
        layer.setup(bottom, top)
    check_bottom = list(range(len(bottom))) if check_bottom is None else list(check_bottom)
    reset = forward_reset or (lambda: None)
    reset()
    layer.reshape(bottom, top)
    layer.forward(bottom, top)
    weights = [rng.standard_normal(t.data.shape) for t in top]
    for t, w in zip(top, weights):
        t.diff[...] = w
    for b in layer.blobs:
        b.diff[...] = 0
    for b in bottom:
        b.diff[...] = 0
    propagate = [i in check_bottom for i in range(len(bottom))]
    layer.backward(top, propagate, bottom)
    analytic = [(f"bottom[{i}]", bottom[i], bottom[i].diff.copy()) for i in check_bottom]
    analytic += [(f"param[{j}]", p, p.diff.copy()) for j, p in enumerate(layer.blobs)]
    for label, blob, grad in analytic:
        flat = blob.data.reshape(-1)
        num = numpy.empty(flat.size)
        for k in range(flat.size):
            orig = flat[k]
            flat[k] = orig + eps
            reset()
            fp = _objective(layer, bottom, top, weights)
            flat[k] = orig - eps
            reset()
            fm = _objective(layer, bottom, top, weights)
            flat[k] = orig
            num[k] = (fp - fm) / (2 * eps)
        numpy.testing.assert_allclose(grad.reshape(-1), num, rtol=rtol, atol=atol,
                                      err_msg=f"{layer.type} '{layer.name}' gradient of {label}")
