"""A stand-in for engine.net.Net with only what the exchange reads (ARCHITECTURE.md):
``flat_data``, ``flat_diff``, ``layer_param_slices`` (layer -> [(param index, slice)]) and
``layers`` (names for messages), plus the trainer's side of the callback protocol."""
from types import SimpleNamespace

import numpy

SIZES = (1000, 37, 5000, 3)          # odd sizes: every tensor needs padding


class FakeNet:
    def __init__(self, grads, weights):
        self.flat_diff = numpy.concatenate(grads).astype(numpy.float32)
        self.flat_data = numpy.concatenate(weights).astype(numpy.float32)
        bounds = numpy.cumsum((0,) + tuple(g.size for g in grads))
        slices = [slice(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]
        # layer 0 has one tensor, layer 2 has weights and bias, layer 1 none, layer 3 one
        self.layer_param_slices = {0: [(0, slices[0])], 1: [],
                                   2: [(1, slices[1]), (2, slices[2])], 3: [(3, slices[3])]}
        self.layers = [SimpleNamespace(name=f"layer{i}") for i in range(4)]


def make_tensors(rank, scale=1.0, step=0):
    """Per-rank gradients (uniform in +-scale) and weights shared by all ranks (|W| in 0.5..2)."""
    g_rng = numpy.random.default_rng([11, rank, step])
    w_rng = numpy.random.default_rng(5)
    grads = [(g_rng.uniform(-1, 1, n) * scale).astype(numpy.float32) for n in SIZES]
    weights = [(w_rng.uniform(0.5, 2.0, n) * w_rng.choice([-1, 1], n)).astype(numpy.float32)
               for n in SIZES]
    return grads, weights


def iterate(exchange, net, layers=None):
    """One iteration as the trainer drives it: on_start, on_backward for each layer in backward
    order (``layers``: the layers whose hook comes, default all), on_gradients_ready."""
    exchange.on_start()
    for i in (sorted(net.layer_param_slices, reverse=True) if layers is None else layers):
        exchange.on_backward(i)
    exchange.on_gradients_ready()
