"""caffe8.comm.perf_model against closed forms worked out by hand (not through the model's code)."""
import json
import math
import pytest
from caffe8.comm.codecs import CODECS, create_codec
from caffe8.comm.config import parse_comm
from caffe8.comm.perf_model import (CODEC_BYTES, CodecCost, LayerCost, Network, build_layers,
                                    exchange_time, fit_alpha_beta, flat_time, hierarchical_time,
                                    iteration_time, layer_times_from_caffe_time,
                                    layer_times_from_timing_log, weak_speedup)


NET = Network(alpha_intra=2e-6, beta_intra=4e9, alpha_inter=5e-6, beta_inter=1e9,
              processes_per_node=4, beta_host=8e9)


FP32 = CodecCost(4, reduce_rate=1e9)


FP8 = CodecCost(1, reduce_rate=2e9, convert_rate=1e10)


INF_BW = float("inf")


def test_one_layer_no_overlap_closed_form():
    n, p, fwd, bwd = 1_000_000, 2, 0.010, 0.020
    # P = 2 inside one node: ring of 2 → 2 steps, 1/2·2·B over the link, 1/2·n reduced.
    collective = 2 * 2e-6 + 2 * 0.5 * (4 * n) / 4e9 + 0.5 * n / 1e9
    host = 2 * (4 * n) / 8e9
    expect = fwd + bwd + collective + host
    got = iteration_time([LayerCost("ip", fwd, bwd, [n])], FP32, NET, p, "flat", overlap=False)
    assert got["iteration"] == pytest.approx(expect, rel=1e-12)
    assert got["comm"] == pytest.approx(collective + host, rel=1e-12)
    # One layer: nothing to hide its exchange under, so overlap changes nothing.
    again = iteration_time([LayerCost("ip", fwd, bwd, [n])], FP32, NET, p, "flat", overlap=True)
    assert again["iteration"] == pytest.approx(expect, rel=1e-12)


def test_fp8_adds_conversion():
    n = 2_000_000
    expect = n / 1e10 + 2 * n / 8e9 + (2 * 2e-6 + 2 * 0.5 * n / 4e9 + 0.5 * n / 2e9)
    assert exchange_time(n, FP8, NET, 2, "flat") == pytest.approx(expect, rel=1e-12)


def test_hierarchical_closed_form():
    # P = 8, P' = 4 → 2 nodes. Intra: 3 steps each way, 2·3/4·B/β_intra, 3/4·n reduced.
    # Inter: ring of 2 on n/4 elements, link β/4 per process →
    # 2α + 2·1/2·(B/4)/(β/4) + 1/2·n/4/r.
    n = 4_000_000
    b = 4 * n
    intra = 2 * 3 * 2e-6 + 2 * 0.75 * b / 4e9 + 0.75 * n / 1e9
    inter = 2 * 5e-6 + 2 * 0.5 * (b / 4) / (1e9 / 4) + 0.5 * (n / 4) / 1e9
    assert hierarchical_time(n, FP32, NET, 8) == pytest.approx(intra + inter, rel=1e-12)
    # Flat over 2 nodes is paced by the inter-node hop: 14 steps of α_inter, 2·7/8·B/β_inter.
    flat = 14 * 5e-6 + 2 * 7 / 8 * b / 1e9 + 7 / 8 * n / 1e9
    assert flat_time(n, FP32, NET, 8) == pytest.approx(flat, rel=1e-12)


def test_two_layers_overlap_max_form():
    fwd, b1, b2 = 0.005, 0.030, 0.010
    net = Network(0.0, INF_BW, 0.0, INF_BW, 1, INF_BW)
    # Codec with a pure per-element cost: c = n·(P−1)/P / reduce_rate, P = 2 → n/2e6 s.
    codec = CodecCost(4, reduce_rate=1e6)
    n1, n2 = 20_000, 60_000            # c1 = 0.01 s, c2 = 0.03 s
    c1, c2 = n1 / 2e6, n2 / 2e6
    layers = [LayerCost("a", fwd, b1, [n1]), LayerCost("b", 0.0, b2, [n2])]
    got = iteration_time(layers, codec, net, 2, "flat", overlap=True)["iteration"]
    # Backward runs b then a; b's exchange starts at b2, a's when both a's backward and b's
    # exchange are done.
    assert got == pytest.approx(fwd + max(b2 + b1, b2 + c2) + c1, rel=1e-12)
    no = iteration_time(layers, codec, net, 2, "flat", overlap=False)["iteration"]
    assert no == pytest.approx(fwd + b1 + b2 + c1 + c2, rel=1e-12)
    assert max(fwd + b1 + b2, fwd + c1 + c2) <= got <= no
    # Exchange longer than the remaining backward: exposed = c2 − b1 + c1.
    slow = [LayerCost("a", fwd, b1, [n1]), LayerCost("b", 0.0, b2, [200_000])]
    got = iteration_time(slow, codec, net, 2, "flat", overlap=True)
    assert got["exposed"] == pytest.approx(0.1 - b1 + c1, rel=1e-12)


def test_monotonic_in_p_and_speedup_below_p():
    layers = [LayerCost("conv", 0.02, 0.04, [300_000, 64]), LayerCost("fc", 0.005, 0.01,
                                                                      [4_000_000, 1000])]
    net = Network(5e-6, 5e9, 2e-5, 5e9, 4, 1e10)
    for schedule in ("flat", "hierarchical"):
        times = [iteration_time(layers, FP32, net, p, schedule)["iteration"]
                 for p in (1, 4, 8, 16, 32, 64, 128)]
        assert all(a <= b for a, b in zip(times, times[1:])), (schedule, times)
        for p in (4, 16, 128):
            s = weak_speedup(layers, FP32, net, p, schedule)
            assert 0 < s <= p
            assert weak_speedup(layers, FP8, net, p, schedule) >= s * 0.999


def test_codec_bytes_are_the_wire_sizes_of_the_codecs_the_transport_sums():
    """The paper's 4 / 2 / 1 bytes, read from the registry: each sum codec's own wire buffer;
    gather codecs (payloads that depend on the data) are not modelled."""
    assert CODEC_BYTES == {"fp32": 4, "fp16": 2, "fp8": 1}
    for name, codec in CODECS.items():
        if codec.reduction == "sum":
            assert create_codec(name, parse_comm()).wire.dtype.itemsize == CODEC_BYTES[name]
        else:
            assert name not in CODEC_BYTES


def test_codec_bytes_ratio():
    # Only bandwidth terms (α = 0, free reduction and conversion): time ∝ bytes per element.
    net = Network(0.0, 3e9, 0.0, 1e9, 2, 6e9)
    n = 10_000_000
    t = {b: exchange_time(n, CodecCost(b), net, 8) for b in (4, 2, 1)}
    assert t[4] / t[1] == pytest.approx(4.0, rel=1e-12)
    assert t[2] / t[1] == pytest.approx(2.0, rel=1e-12)


def test_single_process_has_no_exchange():
    layers = [LayerCost("x", 0.1, 0.2, [10 ** 6])]
    assert iteration_time(layers, FP32, NET, 1)["iteration"] == pytest.approx(0.3)
    assert weak_speedup(layers, FP32, NET, 1) == pytest.approx(1.0)


def test_bad_processes_per_node():
    with pytest.raises(ValueError, match="does not divide"):
        hierarchical_time(100, FP32, NET, 6)


def test_readers(tmp_path):
    lines = ["I1122 03:00:00.000000 1 tester.py:83]      conv1\tforward: 1.5 ms.",
             "I1122 03:00:00.000000 1 tester.py:84]      conv1\tbackward: 3 ms.",
             "I1122 03:00:00.000000 1 tester.py:83]        ip1\tforward: 0.25 ms.",
             "I1122 03:00:00.000000 1 tester.py:84]        ip1\tbackward: 0.5 ms.",
             "I1122 03:00:00.000000 1 tester.py:85] Average Forward pass: 1.75 ms."]
    assert layer_times_from_caffe_time(lines) == [("conv1", 1.5e-3, 3e-3), ("ip1", 2.5e-4, 5e-4)]
    path = tmp_path / "t.jsonl"
    recs = []
    for it, f in enumerate((9.0, 1.0, 2.0, 4.0)):
        layer = {"name": "ip1", "type": "InnerProduct", "forward": f, "backward": 2 * f}
        layer.update({k: 0.0 for k in ("encode", "d2h", "comm", "h2d", "decode", "quantile")})
        recs.append({"iteration": it, "rank": 0, "wall": 1.0, "split": {}, "layers": [layer]})
    path.write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    # Iteration 0 skipped; median of 1, 2, 4 = 2.
    assert layer_times_from_timing_log(str(path), skip=1) == [("ip1", 2.0, 4.0)]
    layers = build_layers([("ip1", 2.0, 4.0)], {"ip1": [10, 2], "ip2": [5]})
    assert [(x.name, x.tensors) for x in layers] == [("ip1", [10, 2]), ("ip2", [5])]


def test_fit_alpha_beta():
    a, s = fit_alpha_beta([(n, 3e-5 + 2e-9 * n) for n in (1e3, 1e5, 1e7)])
    assert math.isclose(a, 3e-5, rel_tol=1e-6) and math.isclose(s, 2e-9, rel_tol=1e-9)


def test_fit_alpha_beta_relative_weights_match_polyfit():
    import numpy
    pts = [(1.6e4, 2.3e-5), (6.4e4, 7.5e-5), (2.56e5, 3.0e-4), (1e6, 1.1e-3), (4e6, 4.1e-2)]
    x = numpy.array([p[0] for p in pts])
    y = numpy.array([p[1] for p in pts])
    slope, icept = numpy.polyfit(x, y, 1, w=1.0 / y)   # residuals weighted by 1/t
    a, s = fit_alpha_beta(pts)
    assert a == pytest.approx(icept, rel=1e-6) and s == pytest.approx(slope, rel=1e-6)
    with pytest.raises(ValueError):
        fit_alpha_beta([(10, 1.0), (10, 2.0)])
