"""studies/perf_model/validate.py: the figure-7 points that docs/BENCHMARKS.md quotes against
what it computes (and its committed CSV), one measured run against the model fed its own layer
times (``check``), the emulated cluster's predictions on a 2-tensor toy net worked out by hand
(``cluster``) and the link's CPU cost per byte from measured transfers."""
import csv
import json
import os
import re

import pytest

from caffe8.comm import perf_model as pm
from studies.perf_model import validate as spm

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))


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


def test_fig7_points(tmp_path):
    rows = spm.fig7_points(str(tmp_path))
    main = {(r["net"], r["codec"]): r for r in rows if r["variant"] == "model"}
    # the paper's figure 7 statements at 192 GPUs
    assert {k: r["paper"] for k, r in main.items()} == {
        ("caffenet", "fp32"): 114.0, ("caffenet", "fp8"): 168.0,
        ("googlenet", "fp32"): 173.0, ("googlenet", "fp8"): 170.0}
    for r in rows:
        assert r["err_pct"] == pytest.approx(100 * (r["model"] / r["paper"] - 1))
        assert 1 <= r["model"] <= 192
    # conversion on the compute path can only slow fp8 down, and leaves float32 alone
    for (net, codec), r in main.items():
        if codec == "fp8":
            assert r["model"] < r["model_plain"]
        else:
            assert r["model"] == pytest.approx(r["model_plain"])
    with open(tmp_path / "perf_model_fig7_points.csv") as f:
        assert len(list(csv.DictReader(f))) == len(rows)
    assert (tmp_path / "perf_model_fig7_points.png").read_bytes()[:4] == b"\x89PNG"


def test_check_run_against_synthetic_logs(tmp_path):
    """perf_model.py check: measured = median over iterations of the slowest rank's wall;
    predicted (sync) = layer times + Other + Σ over tensors of the fitted α + s·n."""
    from caffe8.engine.net import Net
    from caffe8.comm.perf_model import layer_params_from_net
    model = os.path.join(REPO, "tests", "scripts", "data", "tiny_net.prototxt")
    sizes = [n for v in layer_params_from_net(Net(model, phase="TRAIN")).values() for n in v]
    bench = tmp_path / "bench.csv"
    lines = ["codec,elements,processes,median_seconds,min_seconds"]
    for n in (1000, 100000, 1000000):
        t = 1e-4 + 1e-9 * n
        lines.append(f"fp32,{n},2,{2 * t},{t}")
    bench.write_text("\n".join(lines) + "\n")
    times = {"fc1": (0.002, 0.004), "fc2": (0.001, 0.003)}
    walls = {0: [0.05, 0.02, 0.03, 0.04, 0.01], 1: [0.06, 0.025, 0.01, 0.05, 0.02]}
    logs = []
    for rank in (0, 1):
        path = tmp_path / f"job.r{rank}.jsonl"
        recs = []
        for it in range(5):
            layers = [{"name": n, "type": "X", "forward": f, "backward": b, "encode": 0.0,
                       "d2h": 0.0, "comm": 0.0, "h2d": 0.0, "decode": 0.0, "quantile": 0.0}
                      for n, (f, b) in times.items()]
            recs.append({"iteration": it, "rank": rank, "wall": walls[rank][it],
                         "split": {"Other": 0.001}, "layers": layers})
        path.write_text("\n".join(json.dumps(r) for r in recs) + "\n")
        logs.append(str(path))
    r = spm.check_run(logs, model, str(bench), "fp32", False, 2, skip=1)
    # Iterations 1..4: slowest rank 0.025, 0.03, 0.05, 0.02 → median 0.0275.
    assert r["measured_s"] == pytest.approx(0.0275)
    expect = 0.010 + 0.001 + sum(1e-4 + 1e-9 * n for n in sizes)
    assert r["predicted_s"] == pytest.approx(expect, rel=1e-6)


TOY_EMULATED = """name: "Toy"
layer { name: "w1" type: "Parameter" top: "w1" parameter_param { shape { dim: 1000 dim: 1000 } } }
layer { name: "l1/emulate" type: "EmulatedCompute" bottom: "w1" top: "w1"
        emulate_param { forward_ms: 10 backward_ms: 20 } }
layer { name: "w2" type: "Parameter" top: "w2" parameter_param { shape { dim: 2000 dim: 1000 } } }
layer { name: "l2/emulate" type: "EmulatedCompute" bottom: "w2" top: "w2"
        emulate_param { forward_ms: 10 backward_ms: 5 } }
"""


CLUSTER_FIELDS = ("net,layout,nodes,ppn,rate,variant,round,iterations,iter_ms,exposed_ms,"
                  "baseline_ms,comm_ms,link_mb,load_1min")


def test_cluster_cli_by_hand(tmp_path, capsys):
    """perf_model.py cluster on a 2-tensor toy net (w1: 1e6 elements, 10/20 ms; w2: 2e6, 10/5
    ms) at 8 Gbit/s (1e9 B/s of frames), host rates set by --rate, cores plenty: every
    predicted_ms worked out by hand; rows of single rounds are left out."""
    from caffe8.comm.perf_model import TCP_PAYLOAD_EFFICIENCY as eta
    proto = tmp_path / "toy.prototxt"
    proto.write_text(TOY_EMULATED)
    assert [(x.name, x.forward, x.backward, x.tensors) for x in spm.emulated_layers(str(proto))] \
        == [("l1/emulate", 0.010, 0.020, [1_000_000]), ("l2/emulate", 0.010, 0.005, [2_000_000])]
    rows = ["toy,2x1,2,1,8gbit,c8-fp32-sync,0,5,99,0,48,0,0,0",
            "toy,2x1,2,1,8gbit,c8-fp32-sync,all,5,100,0,48,0,0,0",
            "toy,2x1,2,1,8gbit,c8-fp32-async,all,5,50,0,48,0,0,0",
            "toy,2x1,2,1,8gbit,ddp-fp32,all,5,60,0,48,0,0,0",
            "toy,1x1,1,1,8gbit,c8-fp8-async,all,5,40,0,48,0,0,0"]
    data = tmp_path / "cb.csv"
    data.write_text(CLUSTER_FIELDS + "\n" + "\n".join(rows) + "\n")
    rates = ["fp32_encode=1e9", "fp32_decode=2e9", "fp32_sum=1e9", "update=1e9", "finite=inf",
             "tcp=inf", "copy_bytes=inf", "ddp_copy=1e9", "ddp_step=1e9", "gloo_fp32_sum=1e9"]
    argv = ["cluster", "--csv", str(data), "--out", str(tmp_path / "out"), "--cores", "1e6",
            "--net", f"toy={proto}"]
    for r in rates:
        argv += ["--rate", r]
    assert spm.main(argv) == 0
    with open(tmp_path / "out" / "cluster_model.csv", encoding="utf-8") as f:
        got = list(csv.DictReader(f))
    assert [r["variant"] for r in got] == ["c8-fp32-sync", "c8-fp32-async", "ddp-fp32",
                                           "c8-fp8-async"]
    assert set(CLUSTER_FIELDS.split(",")) < set(got[0]) and {"predicted_ms", "error_pct"} < \
        set(got[0])
    a = spm.ALPHA_COLLECTIVE * 1e3          # ms per collective
    link = 1 / eta                          # ms per 1e6 bytes at 1e9 bytes of frames per s
    # sync: T1 + per tensor (ready order) encode n/1e9 + 2 collectives + 4n bytes over the
    # link (half out in each) + the sum of n/2 + decode n/2e9, and the verdict's allreduce:
    # 48 + 6 + 12·link + 4a + a
    sync = 48 + 6 + 12 * link + 5 * a
    # async: forward 20 and the verdict's allreduce, w2 ready at 25 + a, its exchange done long
    # before w1 is ready at 45 + a; w1: encode 1, sum 2a + 4·link + 0.5, decode 0.5 + update 1
    asyn = 45 + a + 1 + 2 * a + 4 * link + 0.5 + 1.5
    # DDP: buckets [w2] (8e6 B >= 1 MiB) and [w1] (the rest); w1's: ready 45, its copy 1 ms,
    # 2 ring steps + 2·(1/2)·4e6 B over the link (its sum hidden under it), then the copy back
    # (3 ms) and the step (3 ms)
    ddp = 48 + 2 * a + 4 * link + 6
    for r, want in zip(got, (sync, asyn, ddp, 48.0)):
        assert float(r["predicted_ms"]) == pytest.approx(want, abs=2e-3)
        assert float(r["error_pct"]) == pytest.approx(
            100 * (float(r["predicted_ms"]) / float(r["iter_ms"]) - 1), abs=0.01)
    # the DDP hooks the model has no cost for are left out and named
    data.write_text(CLUSTER_FIELDS + "\n" + rows[1] + "\ntoy,2x1,2,1,8gbit,ddp-fp8h,all,5,1,0,1,0,0,0\n")
    assert spm.main(argv) == 0
    assert "not modelled: ddp-fp8h (1 points)" in capsys.readouterr().out
    # caffe8.ddp.fp8_hook (flat): DDP's program with caffe8's fp8 in the hook: a quarter of the
    # bytes on the link (w1's bucket: 1 link instead of 4), w2's encode (2 ms) on the main thread
    # before l1's backward, w1's encode and decode (1 ms each) after its ready: +4 - 3 link
    data.write_text(CLUSTER_FIELDS + "\n" + rows[3] + "\n" + rows[3].replace("ddp-fp32", "ddp-fp8")
                    + "\n")
    assert spm.main(argv + ["--rate", "fp8_encode=1e9", "--rate", "fp8_decode=1e9",
                            "--rate", "fp8_sum=inf"]) == 0
    with open(tmp_path / "out" / "cluster_model.csv", encoding="utf-8") as f:
        fp32, fp8 = (float(r["predicted_ms"]) for r in csv.DictReader(f))
    assert fp32 == pytest.approx(ddp, abs=2e-3)
    assert fp8 == pytest.approx(ddp + 4 - 3 * link, abs=2e-3)
    data.write_text(CLUSTER_FIELDS + "\ntoy,2x1,2,1,8gbit,c8-fp4-async,all,5,1,0,1,0,0,0\n")
    with pytest.raises(ValueError, match="unknown variant"):
        spm.main(argv)
    data.write_text(CLUSTER_FIELDS + "\nalexnet,2x1,2,1,8gbit,ddp-fp32,all,5,1,0,1,0,0,0\n")
    with pytest.raises(ValueError, match="no emulated prototxt"):
        spm.main(argv)


def test_tcp_rate_from_measured_transfers(tmp_path):
    """HOST_RATES' tcp is what TCP_REFERENCE (a bucket's measured sum) implies; the inversions
    by hand: a CPU-bound caffe8 sum on 2x1 (one core per process): bytes sent / (its time − 2
    latency steps − the sum of half the elements); an mpi-fp32 row: the same with its
    recursive-halving steps. Fed back, the model gives the measured times."""
    ref = spm.TCP_REFERENCE
    assert spm.tcp_rate_from_sum(ref["elements"], ref["seconds"], ref["codec"], ref["nodes"],
                                 ref["ppn"]) == pytest.approx(spm.HOST_RATES["tcp"], rel=1e-3)
    # 2e6 float32 elements summed on 2 nodes in 20 ms: 8e6 bytes sent per process; the sum of
    # 1e6 elements at 1e9/s is 1 ms
    a = spm.ALPHA_COLLECTIVE
    want = 8e6 / (0.020 - 2 * a - 1e-3)
    got = spm.tcp_rate_from_sum(2_000_000, 0.020, "fp32", 2, 1, {"fp32_sum": 1e9})
    assert got == pytest.approx(want, rel=1e-9)
    c8, _, host, _, network = spm.cluster_costs(dict(spm.HOST_RATES, fp32_sum=1e9, tcp=got), 2,
                                                8e9, 1)
    steps = pm.c8_collective_steps(2_000_000, c8["fp32"], network, host, 2, 1)
    assert pm.simulate_threads({"comm": steps}, 1.0)[0]["comm"] == pytest.approx(0.020)
    with pytest.raises(ValueError, match="2 or more nodes"):
        spm.tcp_rate_from_sum(2_000_000, 0.0005, "fp32", 2, 1)     # under 2 latencies
    # mpi-fp32 on the toy net: 3e6 float32, 12e6 bytes cross per process; its sum of 1.5e6
    proto = tmp_path / "toy.prototxt"
    proto.write_text(TOY_EMULATED)
    toy = spm.emulated_layers(str(proto))
    row = {"nodes": "2", "ppn": "1", "rate": "8gbit", "variant": "mpi-fp32", "iter_ms": "40"}
    want = 12e6 / (0.040 - 2 * a - 1.5e-3)
    got = spm.tcp_rate_from_mpi_reference(row, toy, {"fp32_sum": 1e9})
    assert got == pytest.approx(want, rel=1e-9)
    assert 1e3 * spm.predict_cluster_row(row | {"baseline_ms": "0"}, toy, dict(
        spm.HOST_RATES, fp32_sum=1e9, tcp=got), spm.HOST_CORES) == pytest.approx(40.0, rel=1e-9)
    with pytest.raises(ValueError, match="CPU-bound"):    # 12e6 B at 1e9 B/s: 12.5 ms of link
        spm.tcp_rate_from_mpi_reference(row | {"iter_ms": "12"}, toy)
    with pytest.raises(ValueError, match="CPU-bound"):
        spm.tcp_rate_from_mpi_reference(row | {"variant": "ddp-fp32"}, toy)
