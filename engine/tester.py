"""``caffe8 test`` (score a model) and ``caffe8 time`` (per-layer timing), as Caffe's tool."""
import time

import numpy

from engine import backend
from engine.errors import CaffeError
from engine.glog import fmt
from engine.net import Net


def _sync():
    if backend.on_gpu():
        backend.cupy.cuda.Device().synchronize()


def run_test(model, weights, iterations, world, log):
    """Forward ``iterations`` batches of this rank's share; log per-batch and mean outputs.

    Means are averaged over all ranks (each rank scores its own share of the data).
    Returns {output name: mean} and the mean loss.
    """
    if iterations < 1:
        raise CaffeError(f"--iterations must be >= 1, got {iterations}")
    net = Net(model, phase="TEST", weights=weights, rank=world.rank, world=world.size)
    names, blob_of, sums, loss_sum = [], [], None, 0.0
    for i in range(iterations):
        outputs = net.forward()
        loss_sum += net.loss
        flat, names, blob_of = [], [], []
        for name, data in outputs.items():
            vals = backend.to_numpy(data).astype(numpy.float64).reshape(-1)
            for k, v in enumerate(vals):
                names.append(name if vals.size == 1 else f"{name}[{k}]")
                blob_of.append(name)
                log(f"Batch {i}, {names[-1]} = {fmt(v)}")
            flat.append(vals)
        flat = numpy.concatenate(flat) if flat else numpy.zeros(0)
        sums = flat if sums is None else sums + flat
    means = numpy.append(sums if sums is not None else numpy.zeros(0), loss_sum) / max(iterations, 1)
    if world.size > 1:
        from mpi4py import MPI
        world.comm.Allreduce(MPI.IN_PLACE, means, op=MPI.SUM)
        means /= world.size
    log(f"Loss: {fmt(means[-1])}")
    for name, blob, v in zip(names, blob_of, means[:-1]):
        w = net.blob_loss_weights.get(blob, 0.0)
        suffix = f" (* {fmt(w)} = {fmt(w * v)} loss)" if w else ""
        log(f"{name} = {fmt(v)}{suffix}")
    return dict(zip(names, means[:-1].tolist())), float(means[-1])


def run_time(model, iterations, log, phase="TRAIN"):
    """Average per-layer forward and backward milliseconds over ``iterations`` (Caffe's ``time``)."""
    if iterations < 1:
        raise CaffeError(f"--iterations must be >= 1, got {iterations}")
    net = Net(model, phase=phase)
    n = len(net.layers)
    fwd, bwd = numpy.zeros(n), numpy.zeros(n)
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
        t_start = t_iter = time.perf_counter()
        for i, layer in enumerate(net.layers):
            t = time.perf_counter()
            layer.reshape(net.bottom_vecs[i], net.top_vecs[i])
            layer.forward(net.bottom_vecs[i], net.top_vecs[i])
            _sync()
            fwd[i] += time.perf_counter() - t
        total_f += time.perf_counter() - t_iter
        t_iter = time.perf_counter()
        for i in reversed(range(n)):
            t = time.perf_counter()
            if net.layer_need_backward[i]:
                net.layers[i].backward(net.top_vecs[i], net.bottom_need_backward[i], net.bottom_vecs[i])
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
    log(f"Average Forward-Backward: {fmt((total_f + total_b) * 1000 / iterations)} ms.")
    log(f"Total Time: {fmt((time.perf_counter() - t_all) * 1000)} ms.")
    log("*** Benchmark ends ***")
    return fwd * 1000 / iterations, bwd * 1000 / iterations
