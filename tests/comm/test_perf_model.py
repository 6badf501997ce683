"""comm/perf_model.py against numbers worked out by hand for a tiny case, and the figure-7
points that docs/BENCHMARKS.md quotes against what scripts/perf_model.py computes."""
import csv
import os
import re
import sys

import pytest

from comm import perf_model as pm

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_split_by_macs_by_hand():
    # MACs 1 and 2: weights 1*2 (first layer: forward + one backward) and 2*3 → 8 shares of
    # 0.1 s in 0.8 s: a = 0.1 forward + 0.1 backward, b = 0.2 forward + 0.4 backward.
    layers = pm.split_by_macs({"a": 1, "b": 2}, {"b": [7, 3]}, 0.8)
    assert [x.name for x in layers] == ["a", "b"]
    assert [(x.forward, x.backward) for x in layers] == [
        pytest.approx((0.1, 0.1)), pytest.approx((0.2, 0.4))]
    assert layers[0].tensors == [] and layers[1].tensors == [7, 3]
    with pytest.raises(ValueError, match="multiply-adds"):
        pm.split_by_macs({"a": 0}, {}, 1.0)


def test_hierarchical_overlapped_iteration_by_hand():
    # 4 processes, 2 per node (2 nodes); one float tensor of 1e6 elements (4e6 bytes) per layer.
    network = pm.Network(alpha_intra=1e-6, beta_intra=1e9, alpha_inter=1e-5, beta_inter=2e9,
                         processes_per_node=2, beta_host=4e9)
    fp32 = pm.CodecCost(4, reduce_rate=1e9)
    # intra: 2 steps of 1 us + 2 * 1/2 * 4e6 B / 1e9 B/s + 1/2 * 1e6 / 1e9 adds  = 4.502 ms
    # inter: half the tensor per process, the link shared by 2 → 1e9 B/s each; ring of 2 nodes:
    #        2 steps of 10 us + 2 * 1/2 * 2e6 / 1e9 + 1/2 * 5e5 / 1e9             = 2.270 ms
    # host copies: 2 * 4e6 / 4e9                                                = 2.000 ms
    exchange = 0.008772
    assert pm.exchange_time(1_000_000, fp32, network, 4) == pytest.approx(exchange, rel=1e-12)
    layers = [pm.LayerCost("L1", 0.010, 0.020, [1_000_000]),
              pm.LayerCost("L2", 0.010, 0.005, [1_000_000])]
    # forward 20 ms; L2's backward ends at 25 ms, its exchange at 33.772 ms; L1's backward ends
    # at 45 ms, then its exchange (the thread is free): 53.772 ms.
    it = pm.iteration_time(layers, fp32, network, 4)
    assert it["iteration"] == pytest.approx(0.053772, rel=1e-12)
    assert it["comm"] == pytest.approx(2 * exchange, rel=1e-12)
    assert it["exposed"] == pytest.approx(0.053772 - 0.045, rel=1e-12)
    # without overlap both exchanges follow the backward
    sync = pm.iteration_time(layers, fp32, network, 4, overlap=False)
    assert sync["iteration"] == pytest.approx(0.045 + 2 * exchange, rel=1e-12)
    # weak speedup: 4 * T1 / T4, T1 = 45 ms without any exchange
    assert pm.weak_speedup(layers, fp32, network, 4) == pytest.approx(4 * 0.045 / 0.053772)


def _docs_fig7_table():
    """{(net, codec): (paper, model, error %)} from the BENCHMARKS.md subsection's table."""
    with open(os.path.join(REPO, "docs", "BENCHMARKS.md"), encoding="utf-8") as f:
        text = f.read()
    start = text.index("### Performance model vs Oyama et al.'s figure 7, point by point")
    section = text[start:text.index("\n### ", start + 10)]
    rows = {}
    for m in re.finditer(r"^\| (CaffeNet|GoogLeNet) (float|fp8) \| (\d+)x \| (\d+)x \| "
                         r"([+-]\d+\.\d) % \|", section, re.M):
        key = (m.group(1).lower(), "fp32" if m.group(2) == "float" else "fp8")
        rows[key] = (float(m.group(3)), float(m.group(4)), float(m.group(5)))
    return section, rows


def test_fig7_points_quoted_in_docs_are_what_the_code_computes():
    sys.path.insert(0, os.path.join(REPO, "scripts"))
    import perf_model as spm
    rows = spm.fig7_points()
    model = {(r["net"], r["codec"]): r for r in rows if r["variant"] == "model"}
    section, quoted = _docs_fig7_table()
    assert set(quoted) == set(model) == set(spm.FIG7)
    for key, (paper, speedup, err) in quoted.items():
        assert paper == spm.FIG7[key]
        assert speedup == round(model[key]["model"])
        assert err == round(model[key]["err_pct"], 1)
        assert abs(model[key]["err_pct"]) <= 15.0
    # the committed CSV holds the same numbers
    with open(os.path.join(REPO, "docs", "figures", "perf_model_fig7_points.csv"),
              encoding="utf-8") as f:
        committed = {(r["net"], r["codec"]): float(r["model"])
                     for r in csv.DictReader(f) if r["variant"] == "model"}
    assert committed == {k: pytest.approx(r["model"], rel=1e-5) for k, r in model.items()}
    # the efficiency band and the published-timing efficiency the text quotes
    band = spm.fig7_efficiency_band()
    assert f"{band[0]:.2f} to {band[1]:.2f}" in section
    assert f"{spm.published_efficiency():.2f}" in section
    assert band[0] <= spm.FIG7_GPU_EFFICIENCY <= band[1]
