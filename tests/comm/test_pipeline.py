"""comm/pipeline.py on one process: the step between the levels tensor by tensor, each with its
own context (host and device arithmetic), and the agreement in one collective per call. Both
front doors driving the same steps: tests/caffe8/ddp_ranks.py (its 'contexts' case puts a
context-dependent step through caffe8's Exchange and the DDP hook)."""
from types import SimpleNamespace

import numpy
import pytest

from caffe8.comm.arithmetic import HOST, Device
from caffe8.comm.codecs import create_codec
from caffe8.comm.config import parse_comm
from caffe8.comm.pipeline import BetweenStages, Pipeline, Trip


def test_the_step_between_stages_runs_per_tensor_on_its_part_of_the_piece():
    """A bucket of two tensors (spans 0-5 and 5-12 of a 16-item buffer) whose contexts differ:
    each gets its own part of the transport's piece, with its own context; the padding is left
    alone."""
    buffer = numpy.zeros(16, numpy.uint8)
    calls = []
    codec = SimpleNamespace(between_stages=lambda part, ctx: (calls.append(
        ((part.ctypes.data - buffer.ctypes.data), part.size, ctx)), part.__iadd__(ctx)))
    trips = [Trip(numpy.zeros(5), None, at=0, ctx=1), Trip(numpy.zeros(7), None, at=5, ctx=2)]
    between = BetweenStages(codec, buffer, trips)
    for piece in buffer.reshape(4, 4):                # every block a transport may hand over
        between(piece)
    assert calls == [(0, 4, 1), (4, 1, 1), (5, 3, 2), (8, 4, 2)]
    assert buffer.tolist() == [1] * 5 + [2] * 7 + [0] * 4


@pytest.mark.device
def test_the_step_on_a_device_piece_gives_the_host_bits(device):
    """fp8's x1/nodes with a different node count per tensor, on a device piece (one copy to
    the host and back, caffe8.ddp's CUDA side) and on the same bytes on the host."""
    codec = create_codec("fp8", parse_comm())
    codes = numpy.random.default_rng(3).integers(0, 256, 64).astype(numpy.uint8)
    ctxs = [SimpleNamespace(nodes=n) for n in (2, 3, 1)]
    trips = [Trip(numpy.zeros(n), None, at=at, ctx=c) for n, at, c in zip((20, 25, 19),
                                                                             (0, 20, 45), ctxs)]
    on_host, on_device = codes.copy(), device.asarray(codes)
    for arith, buf in ((HOST, on_host), (Device(), on_device)):
        step = Pipeline(codec, None, arith).between(buf, trips)
        for piece in buf.reshape(2, 32):
            step(piece)
    assert numpy.array_equal(device.asnumpy(on_device), on_host)
    assert not numpy.array_equal(on_host[20:45], codes[20:45])          # x1/3 applied
    assert numpy.array_equal(on_host[45:], codes[45:])                  # x1/1: untouched


def test_the_agreement_is_one_collective_for_every_tensor_due_for_a_scale():
    """The fp8 codec refreshes q every other iteration: the due tensors' values go to the
    transport's ``maxima`` in one call, its answers to the codec; no call when none is due."""
    calls = []
    transport = SimpleNamespace(size=2, stages=(2, 1), maxima=lambda values: (
        calls.append(list(values)), [2 * v for v in values])[1])
    pipeline = Pipeline(create_codec("fp8", parse_comm("quantile_interval: 2")), transport)
    rng = numpy.random.default_rng(1)
    grads = [rng.standard_normal(n).astype(numpy.float32) for n in (300, 7, 2000)]
    keys = [(0, 300), (300, 307), (307, 2307)]
    for iteration in (0, 1):
        trips = [Trip(g, pipeline.tensor(k, numpy.ones_like(g), iteration)) for g, k in
                 zip(grads, keys)]
        assert (pipeline.stat(trips) > 0) == (iteration == 0)
        pipeline.agree(trips)
    assert len(calls) == 1 and len(calls[0]) == 3 and min(calls[0]) > 0
    # the codec got the agreed values (the stand-in transport's: twice the local ones)
    assert [pipeline.codec.tracker.get(k) for k in keys] == [2 * v for v in calls[0]]
    assert pipeline.tensor((0, 300), None, 5).stages == (2, 1)     # the transport's
