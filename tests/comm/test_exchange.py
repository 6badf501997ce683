"""comm/exchange.py on one process: the schedule of shared tensors, futures run on the
communication thread in backward order, errors with the layer's name, the per-layer timing
record, and on the GPU the same bits as on the CPU."""
import threading

import numpy
import pytest

from caffe8.comm.config import parse_comm
from caffe8.comm.exchange import Exchange
from caffe8.engine import backend
from caffe8.engine.errors import CaffeError
from caffe8.engine.timing import PHASES
from caffe8.engine.world import SingleProcessWorld
from tests.comm.mpi.fakenet import FakeNet, iterate, make_tensors


def _exchange(monkeypatch, asynchronous, codec="fp32"):
    """A one-process exchange, every layer a bucket of its own, recording (step, thread,
    layer) of each tensor's encode and decode (the codec's) and each bucket's sum (the
    transport's)."""
    net = FakeNet(*make_tensors(0))
    ex = Exchange(SingleProcessWorld(), parse_comm(f'codec: "{codec}" bucket_kb: 0 async: '
                                                   f'{str(asynchronous).lower()}'), net)
    layer_of = {(sl.start, sl.stop): i for i, sls in net.layer_param_slices.items()
                for _, sl in sls}
    first = {sl.start: i for i, sls in net.layer_param_slices.items() for _, sl in sls[:1]}
    calls = []

    def record(step, layer):
        calls.append((step, threading.current_thread().name, layer))

    for codec in (ex.codec, ex.fp32):
        encode, decode = codec.encode, codec.decode
        monkeypatch.setattr(codec, "encode", lambda grad, t, encode=encode: (
            record("encode", layer_of[t.key]), encode(grad, t))[1])
        monkeypatch.setattr(codec, "decode", lambda reduced, ctx, out, decode=decode: (
            record("decode", layer_of.get(_key(net, out))), decode(reduced, ctx, out))[1])
    for transport in ex.transports.values():
        monkeypatch.setattr(transport, "sum", lambda buf, wire, between=None, host=None,
                            real=transport.sum: (record("sum", None),
                                                 real(buf, wire, between, host))[1])
    return net, ex, calls


def _key(net, out):
    """(start, stop) of ``out``, a view of the net's flat diff."""
    start = (out.ctypes.data - net.flat_diff.ctypes.data) // out.itemsize
    return (start, start + out.size)


def _steps(calls, step):
    return [(thread, layer) for s, thread, layer in calls if s == step]


@pytest.mark.parametrize("asynchronous", [False, True])
def test_every_layer_once_per_iteration_in_backward_order(monkeypatch, asynchronous):
    net, ex, calls = _exchange(monkeypatch, asynchronous)
    grads = net.flat_diff.copy()
    for _ in range(2):
        iterate(ex, net)
    ex.close()
    # one sum per layer (its bucket) on the communication thread; on the CPU the encode and
    # the decode have stages of their own, so the link never waits for host work; each stage
    # sees the layers' tensors in backward order
    threads = {"encode": "caffe8-encode", "sum": "caffe8-comm", "decode": "caffe8-update"}
    order = [3, 2, 2, 0]                            # layer 2 has two tensors
    for step, thread in threads.items():
        layers = [3, 2, 0] if step == "sum" else order
        assert [t for t, _ in _steps(calls, step)] == \
            2 * len(layers) * [thread if asynchronous else "MainThread"]
        if step != "sum":
            assert [layer for _, layer in _steps(calls, step)] == 2 * layers
    assert len(_steps(calls, "sum")) == 2 * 3
    assert numpy.array_equal(net.flat_diff, grads)       # the mean over one process, exactly
    assert ex.iteration == 2 and ex.timings.asynchronous is asynchronous
    assert set(ex.timings.layers) == {0, 2, 3}
    assert all(set(t) == set(PHASES) and min(t.values()) >= 0 for t in ex.timings.layers.values())
    assert all(t["d2h"] == t["h2d"] == t["wait"] == 0.0 for t in ex.timings.layers.values())


@pytest.mark.parametrize("asynchronous", [False, True])
def test_a_layer_whose_hook_never_came_is_exchanged_before_the_update(monkeypatch, asynchronous):
    net, ex, calls = _exchange(monkeypatch, asynchronous)
    iterate(ex, net, layers=[3, 0])
    ex.close()
    assert [layer for _, layer in _steps(calls, "encode")] == [3, 0, 2, 2]
    assert [layer for _, layer in _steps(calls, "decode")] == [3, 0, 2, 2]


def test_an_error_surfaces_with_the_layer_name_and_stops_the_exchange(monkeypatch):
    net, ex, calls = _exchange(monkeypatch, True)

    sums = []

    def broken(buf, wire, between=None, host=None):
        sums.append(buf.size)
        raise RuntimeError("link down")
    for transport in ex.transports.values():
        monkeypatch.setattr(transport, "sum", broken)
    with pytest.raises(CaffeError, match="layer 'layer3'.*link down"):
        iterate(ex, net)
    with pytest.raises(CaffeError, match="earlier layer's exchange failed"):
        iterate(ex, net)
    ex.close()
    assert len(sums) == 1                                # no MPI traffic after the failure
    assert not _steps(calls, "decode")                   # nothing decoded from a failed sum


@pytest.mark.parametrize("asynchronous", [False, True])
def test_small_layers_share_a_bucket_and_keep_their_bits(monkeypatch, asynchronous):
    from caffe8.comm.buckets import build_buckets
    schedule = {i: [slice(0, n)] for i, n in enumerate((10, 300, 20, 30, 700, 5))}
    # backward order, closing once 1000 bytes (of 1-byte wire items) are in
    assert build_buckets(schedule, 1000, 1) == [[5, 4, 3, 2, 1], [0]]
    assert build_buckets(schedule, 0, 1) == [[5], [4], [3], [2], [1], [0]]
    results = {}
    for kb in (0, 1024):
        net = FakeNet(*make_tensors(0))
        comm = parse_comm(f'codec: "fp8" async: {str(asynchronous).lower()} bucket_kb: {kb}')
        ex = Exchange(SingleProcessWorld(), comm, net)
        sums = []
        for transport in ex.transports.values():
            real = transport.sum
            monkeypatch.setattr(transport, "sum", lambda buf, wire, between=None, host=None,
                                real=real: (sums.append(buf.size),
                                            real(buf, wire, between, host))[1])
        for _ in range(2):
            iterate(ex, net)
        ex.close()
        # every layer by itself (3 layers with tensors), or the whole small net in one bucket
        assert len(sums) == 2 * (3 if kb == 0 else 1)
        assert ex.buckets == ([[3], [2], [0]] if kb == 0 else [[3, 2, 0]])
        results[kb] = net.flat_diff.copy()
    assert results[0].tobytes() == results[1024].tobytes()


@pytest.mark.parametrize("asynchronous", [False, True])
def test_a_decode_error_surfaces_with_the_layer_name(monkeypatch, asynchronous):
    net, ex, calls = _exchange(monkeypatch, asynchronous)

    def broken(reduced, ctx, out):
        raise RuntimeError("bad bytes")
    monkeypatch.setattr(ex.fp32, "decode", broken)
    monkeypatch.setattr(ex.codec, "decode", broken)
    with pytest.raises(CaffeError, match="layer 'layer3'.*bad bytes"):
        iterate(ex, net)
    ex.close()


def test_quantile_pass_is_recorded_for_the_timing_log():
    net = FakeNet(*make_tensors(0))
    ex = Exchange(SingleProcessWorld(), parse_comm("quantile_interval: 3 async: false"), net)
    iterate(ex, net)
    first = ex.timings.quantile_pass
    assert first > 0 and ex.timings.quantile_interval == 3
    iterate(ex, net)                                      # no estimate: the last pass is kept
    assert ex.timings.quantile_pass == first
    assert all(t["quantile"] == 0.0 for t in ex.timings.layers.values())
    state = ex.state()
    assert state["iteration"] == 2 and len(state["quantiles"]) == 4
    ex.close()


@pytest.mark.device
@pytest.mark.parametrize("codec", ["fp32", "fp16", "fp8", "aps", "dettmers", "strom"])
@pytest.mark.parametrize("asynchronous", [False, True])
def test_gpu_path_gives_the_bits_of_the_host_path(device, codec, asynchronous):
    """Per-layer streams, pinned copies and device kernels (on a GPU or the stand-in device):
    the same means as the host path, 3 changing steps."""
    extra = " strom_tau: 0.05" if codec == "strom" else ""
    text = f'codec: "{codec}" async: {str(asynchronous).lower()}{extra}'
    results = []
    for gpu in (False, True):
        backend.use_gpu(0) if gpu else backend.use_cpu()
        net = FakeNet(*make_tensors(0))
        if gpu:
            net.flat_diff = device.asarray(net.flat_diff)
            net.flat_data = device.asarray(net.flat_data)
        ex = Exchange(SingleProcessWorld(), parse_comm(text), net, timed=True)
        for step in range(3):
            net.flat_diff[...] = backend.to_device(
                numpy.concatenate(make_tensors(0, step=step)[0]), like=net.flat_diff)
            iterate(ex, net)
        device.cuda.get_current_stream().synchronize() if gpu else None
        assert all(t["d2h"] > 0 for t in ex.timings.layers.values()) or not gpu
        ex.close()
        results.append(backend.to_numpy(net.flat_diff))
    assert numpy.array_equal(results[0], results[1])


def test_steps_are_placed_at_construction_and_sync_mode_keeps_layers_apart_from_futures(
        monkeypatch):
    net, ex, calls = _exchange(monkeypatch, False)
    assert [s.thread for s in ex.stages] == ["caffe8-encode", "caffe8-comm", "caffe8-update"]
    assert ex.local_at_launch is False and ex.side.timed
    ex.on_start()
    for i in (3, 0):
        ex.on_backward(i)
    assert calls == []                                   # layers noted, nothing run
    ex.on_gradients_ready()
    # hooks in the order they came, then the missing layer; every step on this thread
    assert [layer for _, layer in _steps(calls, "encode")] == [3, 0, 2, 2]
    assert {thread for _, thread, _ in calls} == {"MainThread"}
    ex.close()


@pytest.mark.parametrize("codec", ["fp32", "fp16", "fp8"])
def test_sum_codecs_encode_into_the_span_of_the_bucket_buffer_they_are_handed(codec):
    net = FakeNet(*make_tensors(0))
    ex = Exchange(SingleProcessWorld(), parse_comm(f'codec: "{codec}" async: false '
                                                   'bucket_kb: 1000'), net)
    payloads = []
    encode = ex.codec.encode
    ex.codec.encode = lambda grad, t: payloads.append((t, encode(grad, t))) or payloads[-1][1]
    iterate(ex, net)
    host, _ = ex.reductions[ex.codec.name].buffers[0]           # one bucket: every tensor
    assert len(payloads) == 4
    for t, (payload, _) in payloads:
        assert payload is t.out and payload.dtype == ex.codec.wire.dtype
        assert numpy.shares_memory(payload, host) and payload.size == t.key[1] - t.key[0]
    ex.close()


def test_quantile_computes_the_ratio_at_the_sampled_positions_only():
    """On a refresh iteration D is computed at the tracker's positions (``samples`` of them), not
    over the whole tensor: the encode computes it there; the estimate is the full-D one's."""
    from caffe8.comm.codecs import Tensor, create_codec
    codec = create_codec("fp8", parse_comm("samples: 64 quantile_interval: 2"))
    rng = numpy.random.default_rng(2)
    g = rng.standard_normal(5000).astype(numpy.float32)
    w = rng.standard_normal(5000).astype(numpy.float32)
    sizes = []
    ratio = codec.ratio
    codec.ratio = lambda grad, weight: sizes.append(grad.size) or ratio(grad, weight)
    for iteration in (0, 2):
        t = Tensor((0, 5000), w, iteration, 1, (1, 1))
        stat = codec.host_stat(codec.device_stat(g, t))
        full = codec.tracker.estimate(t.key, ratio(g, w), iteration)
        assert stat == full > 0
    assert sizes == [64, 64]


@pytest.mark.device
@pytest.mark.parametrize("timed", [False, True])
def test_gpu_events_only_where_needed_unless_a_timing_log_asks(device, monkeypatch, timed):
    """Untimed: three CUDA events per layer (after its backward, after its copies, after its
    decode); timed: the phases too, and D2H/H2D read from them. Strom's encode (its size is a
    host read) runs on the communication thread, never on the compute thread."""
    from caffe8.engine.timing import Clock
    for codec in ("fp32", "strom"):
        net = FakeNet(*make_tensors(0))
        net.flat_diff = device.asarray(net.flat_diff)
        net.flat_data = device.asarray(net.flat_data)
        ex = Exchange(SingleProcessWorld(), parse_comm(f'codec: "{codec}" async: true '
                                                       'strom_tau: 0.05'), net, timed=timed)
        marks, threads = [], []
        mark = Clock.mark
        monkeypatch.setattr(Clock, "mark", lambda self, s=None: marks.append(1) or mark(self, s))
        encode = ex.codec.encode
        ex.codec.encode = lambda g, t: threads.append(threading.current_thread().name) or \
            encode(g, t)
        iterate(ex, net)
        ex.close()
        monkeypatch.setattr(Clock, "mark", mark)
        layers = len(ex.schedule)
        assert len(marks) == 3 * layers if not timed else len(marks) > 3 * layers
        assert all(t["d2h"] > 0 for t in ex.timings.layers.values()) == timed
        assert set(threads) == {"caffe8-comm" if codec == "strom" else "MainThread"}


def test_every_wire_buffer_is_made_before_the_first_trip(monkeypatch):
    """The constructor makes each bucket's wire buffers, zeroed and padded, for the configured
    codec and the float32 warm-up; no trip makes one (on a GPU a buffer made at first use, on
    the compute stream, raced the layer stream's encode), and every encode writes into its
    bucket's buffer."""
    from caffe8.comm.ops import padded_length
    net = FakeNet(*make_tensors(0))
    ex = Exchange(SingleProcessWorld(), parse_comm('codec: "fp8" warmup_fp32_iters: 1 '
                                                   'bucket_kb: 0 async: true'), net)
    assert len(ex.buckets) == 3
    made = {(name, b): buffers for name, r in ex.reductions.items()
            for b, buffers in enumerate(r.buffers)}
    assert set(made) == {(name, b) for name in ("fp8", "fp32") for b in range(3)}
    for (name, b), (host, device) in made.items():
        codec = ex.codec if name == "fp8" else ex.fp32
        size = sum(sl.stop - sl.start for layer in ex.buckets[b] for sl in ex.schedule[layer])
        assert host.dtype == codec.wire.dtype and device is host and not host.any()
        assert host.size == padded_length(size, codec.wire.unit, 1)
    for transport in ex.transports.values():
        monkeypatch.setattr(transport, "host_buffer", lambda *a, **k: pytest.fail("made late"))
    outs = []
    for codec in (ex.codec, ex.fp32):
        encode = codec.encode
        monkeypatch.setattr(codec, "encode", lambda grad, t, encode=encode, name=codec.name: (
            outs.append((name, t)), encode(grad, t))[1])
    for _ in range(2):                          # the float32 warm-up, then fp8
        iterate(ex, net)
    ex.close()
    assert [name for name, _ in outs] == ["fp32"] * 4 + ["fp8"] * 4
    for name, t in outs:
        layer = next(i for i, sls in ex.schedule.items() for sl in sls
                     if (sl.start, sl.stop) == t.key)
        host, _ = made[(name, ex.buckets.index([layer]))]
        assert numpy.shares_memory(t.out, host)


@pytest.mark.device
@pytest.mark.parametrize("codec", ["fp32", "fp8"])
def test_gpu_first_iterations_of_fresh_exchanges_give_the_host_bits(device, codec):
    """The race of issue 30: a bucket's device buffer was zero-filled on the compute stream at
    its first use, unordered with the encode on the layer's stream, so iteration 0 (and the
    first after the float32 warm-up) could send partly zero gradients. On a GPU large buckets
    (a long zero-fill) behind busy compute streams, five fresh exchanges: every one gives the
    bits of the host path in its first two iterations. On the stand-in device, which fails on
    the unordered access itself, small ones."""
    standin = getattr(device, "__standin__", False)
    sizes = (1 << 12, 37, 1 << 13, 3) if standin else (1 << 24, 37, 1 << 25, 3)
    busy = 64 if standin else 4096
    rng = numpy.random.default_rng(7)
    grads = [rng.standard_normal(n).astype(numpy.float32) for n in sizes]
    weights = [rng.uniform(0.5, 2.0, n).astype(numpy.float32) for n in sizes]
    text = f'codec: "{codec}" warmup_fp32_iters: 1 async: true'

    def run(gpu):
        net = FakeNet(grads, weights)
        if gpu:
            net.flat_diff = backend.cupy.asarray(net.flat_diff)
            net.flat_data = backend.cupy.asarray(net.flat_data)
        ex = Exchange(SingleProcessWorld(), parse_comm(text), net)
        out = []
        for step in range(2):
            net.flat_diff[...] = backend.to_device(numpy.concatenate(grads), like=net.flat_diff)
            if gpu:                             # keep the compute stream busy past the hooks
                a = device.ones((busy, busy), device.float32)
                for _ in range(4):
                    a = a @ a / busy
            iterate(ex, net)
            out.append(backend.to_numpy(net.flat_diff).copy())
        ex.close()
        return out

    backend.use_cpu()
    host = run(False)
    backend.use_gpu(0)
    for _ in range(5):
        assert all(numpy.array_equal(h, d) for h, d in zip(host, run(True)))
