"""``caffe8 test`` (score a model) and ``caffe8 time`` (per-layer timing), as Caffe's tool."""
import contextlib
import time

import numpy

from caffe8.engine import backend, blas
from caffe8.engine.errors import CaffeError
from caffe8.engine.glog import fmt
from caffe8.engine.net import Net


def _sync():
    if backend.on_gpu():
        backend.cupy.cuda.Device().synchronize()


def output_values(net):
    """[(blob name, flat float64 host values, loss weight)] of the net's outputs, sorted by name."""
    return [(name, backend.to_numpy(net.blobs[name].data).astype(numpy.float64).reshape(-1),
             net.blob_loss_weights.get(name, 0.0)) for name in net.output_blob_names]


def average_outputs(net, iterations, world, on_batch=None, busy=None):
    """Forward ``iterations`` batches in all, spread over the ranks (each runs
    ``passes_per_rank(iterations, world.size)`` on its own share of the data), and average every
    output element and the loss over the passes and then over all ranks.

    As Caffe's test, whose root solver alone runs ``test_iter`` batches: the job scores
    ``test_iter`` x batch images once, the ranks in parallel (BVLC's 100 x 100 on 4 ranks: 25
    batches each, its 2,500 of the 10,000 test images, instead of 100 batches that read each
    rank's share four times over).

    Returns (outputs of the last pass as from :func:`output_values`, element means, mean loss).
    ``on_batch(i, outputs)`` sees each pass's outputs (``caffe8 test`` logs them). ``busy``: a
    context around the passes (they make no collective; the trainer tells its stall watchdog).
    """
    iterations = passes_per_rank(iterations, world.size)
    with busy or contextlib.nullcontext():
        sums, loss, outputs = _forward_passes(net, iterations, on_batch)
    means = numpy.append(sums if sums is not None else numpy.zeros(0), loss) / max(iterations, 1)
    if world.size > 1:
        world.allreduce_sum_array(means)
        means /= world.size
    return outputs, means[:-1], float(means[-1])


def passes_per_rank(iterations, ranks):
    """Each rank's share of ``iterations`` test passes: all of them rounded up, so that every
    rank runs the same number (their means then weigh alike) and none is left out."""
    return -(-int(iterations) // max(1, int(ranks))) if iterations > 0 else 0


def _forward_passes(net, iterations, on_batch):
    """(element sums of the outputs, summed loss, outputs of the last pass) of ``iterations``
    forward passes."""
    sums, loss, outputs = None, 0.0, []
    for i in range(iterations):
        blas.adapt_threads()
        net.forward()
        loss += net.loss
        outputs = output_values(net)
        if on_batch is not None:
            on_batch(i, outputs)
        flat = numpy.concatenate([v for _, v, _ in outputs]) if outputs else numpy.zeros(0)
        sums = flat if sums is None else sums + flat
    return sums, loss, outputs


def _element_names(outputs):
    """(blob name, loss weight) per output element: Caffe's tool prints each element of an
    output under the blob's own name (``Batch 0, ip = 2`` once per element)."""
    return [(name, w) for name, vals, w in outputs for _ in range(vals.size)]


def run_test(model, weights, iterations, world, log):
    """Forward ``iterations`` batches in all, spread over the ranks (``average_outputs``); log
    rank 0's per-batch outputs and the means.

    Means are averaged over all ranks (each rank scores its own share of the data).
    Returns {output name: its elements' means (a float for a single element)} and the mean loss.
    """
    if iterations < 1:
        raise CaffeError(f"--iterations must be >= 1, got {iterations}")
    net = Net(model, phase="TEST", weights=weights, rank=world.rank, world=world.size, log=log)
    log(f"Running for {iterations} iterations.")

    def log_batch(i, outputs):
        values = numpy.concatenate([v for _, v, _ in outputs]) if outputs else []
        for (name, _), v in zip(_element_names(outputs), values):
            log(f"Batch {i}, {name} = {fmt(v)}")

    try:
        outputs, means, loss = average_outputs(net, iterations, world, log_batch)
    finally:
        net.close()  # join the data layers' prefetch threads before the process exits
    log(f"Loss: {fmt(loss)}")
    for (name, w), v in zip(_element_names(outputs), means):
        suffix = f" (* {fmt(w)} = {fmt(w * v)} loss)" if w else ""
        log(f"{name} = {fmt(v)}{suffix}")
    scores, start = {}, 0
    for name, vals, _ in outputs:
        element_means = [float(v) for v in means[start:start + vals.size]]
        scores[name] = element_means[0] if vals.size == 1 else element_means
        start += vals.size
    return scores, loss


def run_time(model, iterations, log, phase="TRAIN"):
    """Average per-layer forward and backward milliseconds over ``iterations`` (Caffe's ``time``).

    As BVLC's tools/caffe.cpp time(), every layer's Backward runs, whether or not the net needs
    its gradient (a deploy net with no loss included), with the net's propagate_down flags: so
    the parameter gradients of a deploy net's layers are timed too.

    Beside Caffe's lines, the framework's own cost: as many forward + backward passes through
    the Net itself, then as many again timed layer by layer with the Net's hooks, split into
    the layers' calls and the rest, the Net's dispatch (its loops, reshape checks, loss sums)
    with the hooks' own cost; on a GPU,
    each layer's host time too (from the call until it returns, before the device has
    finished: what bounds a GPU iteration of small layers)."""
    if iterations < 1:
        raise CaffeError(f"--iterations must be >= 1, got {iterations}")
    net = Net(model, phase=phase, log=log)  # the net's setup log, as Caffe's tool writes it
    n = len(net.layers)
    fwd, bwd = numpy.zeros(n), numpy.zeros(n)
    host = numpy.zeros((2, n))
    log("Performing Forward")
    net.forward()
    log(f"Initial loss: {fmt(net.loss)}")
    log("Performing Backward")
    net.backward()
    log("*** Benchmark begins ***")
    log(f"Testing for {iterations} iterations.")
    total_f = total_b = 0.0
    t_all = time.perf_counter()
    for j in range(iterations):
        blas.adapt_threads()
        t_start = t_iter = time.perf_counter()
        for i, layer in enumerate(net.layers):
            t = time.perf_counter()
            layer.reshape(net.bottom_vecs[i], net.top_vecs[i])
            layer.forward(net.bottom_vecs[i], net.top_vecs[i])
            host[0, i] += time.perf_counter() - t
            _sync()
            fwd[i] += time.perf_counter() - t
        total_f += time.perf_counter() - t_iter
        t_iter = time.perf_counter()
        for i in reversed(range(n)):
            t = time.perf_counter()
            net.layers[i].backward(net.top_vecs[i], net.bottom_need_backward[i], net.bottom_vecs[i])
            host[1, i] += time.perf_counter() - t
            _sync()
            bwd[i] += time.perf_counter() - t
        total_b += time.perf_counter() - t_iter
        log(f"Iteration: {j + 1} forward-backward time: {fmt((time.perf_counter() - t_start) * 1000)} ms.")
    log("Average time per layer: ")
    for i, layer in enumerate(net.layers):
        log(f"{layer.name:>10s}\tforward: {fmt(fwd[i] * 1000 / iterations)} ms.")
        log(f"{layer.name:>10s}\tbackward: {fmt(bwd[i] * 1000 / iterations)} ms.")
    log(f"Average Forward pass: {fmt(total_f * 1000 / iterations)} ms.")
    log(f"Average Backward pass: {fmt(total_b * 1000 / iterations)} ms.")
    layers_ms = (total_f + total_b) * 1000 / iterations
    log(f"Average Forward-Backward: {fmt(layers_ms)} ms.")
    total_ms = (time.perf_counter() - t_all) * 1000
    _log_framework_cost(net, iterations, host * 1000 / iterations, log)
    log(f"Total Time: {fmt(total_ms)} ms.")
    log("*** Benchmark ends ***")
    return fwd * 1000 / iterations, bwd * 1000 / iterations


def net_pass_ms(net, iterations):
    """Average milliseconds of a forward + backward pass through the Net's own methods."""
    start = time.perf_counter()
    for _ in range(iterations):
        blas.adapt_threads()
        net.forward_loss(as_float=False)
        net.backward()
        _sync()
    return (time.perf_counter() - start) * 1000 / iterations


def layer_calls_in_net_ms(net, iterations):
    """(average milliseconds of a pass through the Net with hooks timing each layer's calls,
    of which inside its layers' calls: reshape when due + forward, backward). The rest of the
    hooked pass, the Net's dispatch, includes the hooks' own cost: an upper bound. Adds the
    hooks: for a net made to be timed."""
    inside, opened = [0.0], [0.0]

    def before(i, layer):
        _sync()
        opened[0] = time.perf_counter()

    def after(i, layer):
        _sync()
        inside[0] += time.perf_counter() - opened[0]
    net.add_before_hooks(forward=before, backward=before)
    net.add_forward_hook(after)
    net.add_backward_hook(after)
    hooked = net_pass_ms(net, iterations)
    return hooked, inside[0] * 1000 / iterations


def _log_framework_cost(net, iterations, host_ms, log):
    """The lines of :func:`run_time` on the framework's own cost (see there)."""
    pass_ms = net_pass_ms(net, iterations)
    hooked_ms, layers_ms = layer_calls_in_net_ms(net, iterations)
    log(f"Average Forward-Backward through the Net: {fmt(pass_ms)} ms; timed layer by layer "
        f"with its hooks, {fmt(hooked_ms)} ms: the layers' calls {fmt(layers_ms)} ms, the Net's "
        f"dispatch and the hooks {fmt(hooked_ms - layers_ms)} ms.")
    if not backend.on_gpu():
        return
    log("Host time per layer (each call until it returns, before its device work ends):")
    for i, layer in enumerate(net.layers):
        log(f"{layer.name:>10s}\thost forward: {fmt(host_ms[0, i])} ms, "
            f"host backward: {fmt(host_ms[1, i])} ms.")
    log(f"Average host time of the layers: {fmt(host_ms.sum())} ms.")
