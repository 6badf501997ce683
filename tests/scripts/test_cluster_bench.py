"""scripts/cluster_bench.py's own logic without a cluster: layouts and variants, the medians
over rounds, weak scaling, the link counter's interpolation, and the DDP model built from the
same prototxt as caffe8's (the emulated CaffeNet's 16 tensors in 8 sleeping groups)."""
import os

import pytest

from scripts import cluster_bench as cb

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_layouts_and_variants_parse_or_fail_with_one_line():
    assert cb.parse_layout("2x1") == (2, 1) and cb.parse_layout("4X2") == (4, 2)
    assert cb.parse_variant("c8-fp8-async") == ("caffe8", "fp8", True)
    assert cb.parse_variant("c8-fp32-sync") == ("caffe8", "fp32", False)
    assert cb.parse_variant("ddp-fp16") == ("ddp", "fp16", None)
    assert cb.parse_variant("ddp-powersgd4") == ("ddp", "powersgd4", None)
    assert cb.parse_variant("ddp-fp8h") == ("ddp", "fp8h", None)
    assert cb.parse_variant("mpi-fp32") == ("mpi", "fp32", None)
    for bad in ("2by1", "0x1"):
        with pytest.raises(SystemExit, match="--layouts"):
            cb.parse_layout(bad)
    with pytest.raises(SystemExit, match="unknown variant 'ddp-fp4'.*ddp-bf16, ddp-powersgd1"):
        cb.parse_variant("ddp-fp4")


def _row(variant, rnd, it, nodes=2, base=500.0):
    return {"net": "caffenet", "layout": f"{nodes}x1", "nodes": nodes, "ppn": 1,
            "rate": "10gbit", "variant": variant, "round": rnd, "iterations": 4,
            "iter_ms": it, "exposed_ms": it - base, "baseline_ms": base, "comm_ms": 1.0,
            "transfer_ms": 2.0, "link_mb": 61.0, "link_use": 0.5, "load_1min": 1.0}


def test_medians_over_rounds_and_weak_scaling():
    rows = [_row("c8-fp8-async", r, it) for r, it in enumerate((600.0, 540.0, 560.0))]
    rows += [_row("c8-fp8-async", r, it, nodes=4) for r, it in enumerate((800.0, 700.0))]
    summary = {(r["layout"], r["round"]): r for r in cb.summarise(rows)}
    assert summary[("2x1", "all")]["iter_ms"] == 560.0
    assert summary[("4x1", "all")]["iter_ms"] == 750.0
    assert summary[("2x1", "all")]["iterations"] == 12
    rows += [dict(_row("c8-fp8-async", 0, 720.0, nodes=2), layout="2x2", ppn=2)]
    weak = {p["layout"]: p for p in cb.scaling(rows)}
    assert weak["1x1"]["speedup"] == 1.0
    assert weak["2x1"]["speedup"] == pytest.approx(2 * 500 / 560)
    assert weak["4x1"]["speedup"] == pytest.approx(4 * 500 / 750)
    assert weak["2x2"]["speedup"] == pytest.approx(4 * 500 / 720)     # 4 processes, 2 a node
    assert weak["4x1"]["samples_s"] == pytest.approx(256 * 4 / 0.75)   # CaffeNet's batch of 256
    assert weak["4x1"]["efficiency"] == pytest.approx(500 / 750)
    # the MPI reference has no one-process run: no scaling point, no division by zero
    assert not [p for p in cb.scaling([_row("mpi-fp32", "0", 300.0, base=0.0)])]


def test_strong_scaling_shares_the_global_batch():
    """--global-batch G: P processes share G, so the one-process run does all of G and the
    speedup is T1 / T_P; each process's emulated compute is its share of the net's batch."""
    import argparse
    rows = [dict(_row("c8-fp8-async", 0, 400.0, nodes=4, base=1000.0), global_batch=512)]
    strong = {p["layout"]: p for p in cb.scaling(rows)}
    assert strong["4x1"]["speedup"] == pytest.approx(1000 / 400)
    assert strong["4x1"]["efficiency"] == pytest.approx(1000 / 400 / 4)
    assert strong["4x1"]["samples_s"] == pytest.approx(512 / 0.4)
    solver = os.path.join(REPO, cb.NETS["caffenet"])
    args = argparse.Namespace(global_batch=512)
    assert [cb.batch_share(args, solver, p) for p in (1, 2, 4)] == [2.0, 1.0, 0.5]
    assert cb.batch_share(argparse.Namespace(global_batch=0), solver, 4) == 1.0


def test_link_bytes_between_two_times_interpolate_the_samples():
    sampler = cb.LinkSampler.__new__(cb.LinkSampler)
    sampler.samples = [(10.0, 1000), (11.0, 3000), (12.0, 3000), (13.0, 9000)]
    assert sampler.sent(10.5, 12.5) == pytest.approx((3000 - 2000) + (6000 - 3000))
    assert sampler.sent(9.0, 12.0) is None            # the samples do not cover the window


def test_the_ddp_side_has_caffe8s_tensors_and_sleeps():
    solver = os.path.join(REPO, cb.NETS["caffenet"])
    groups, (lr, momentum, decay) = cb.emulated_layers(solver)
    assert [g[0] for g in groups] == [f"{n}/emulate" for n in
                                      ("conv1", "conv2", "conv3", "conv4", "conv5", "fc6",
                                       "fc7", "fc8")]
    assert groups[5][1] == [(4096, 9216), (4096,)]
    total = 0
    for _, shapes, _, _ in groups:
        for s in shapes:
            n = 1
            for d in s:
                n *= d
            total += n
    assert total == 60965224                           # CaffeNet's parameter count
    assert (lr, momentum, decay) == (pytest.approx(0.01), pytest.approx(0.9), 0.0)
    assert groups[1][2] == pytest.approx(52.477) and groups[1][3] == pytest.approx(104.954)


def test_dilated_narrowed_runs_give_both_sides_the_same_tensors_and_sleeps():
    """Time dilation multiplies every emulated time by k and narrowing divides every tensor's
    first axis; caffe8's run net and the DDP side read the same groups from it, and the share
    of parameters left is what the link's rate is scaled by."""
    from studies import _runs
    from scripts.make_emulated_net import read_groups
    solver = os.path.join(REPO, cb.NETS["caffenet"])
    plain, _ = cb.emulated_layers(solver)
    groups, _ = cb.emulated_layers(solver, 4.0, 4)
    assert read_groups(cb._transform(solver, 4.0, 4)(_runs.load_train_net(solver)[1])) == groups
    for (name, shapes, fwd, bwd), (name0, shapes0, fwd0, bwd0) in zip(groups, plain):
        assert name == name0 and (fwd, bwd) == (pytest.approx(4 * fwd0), pytest.approx(4 * bwd0))
        assert [s[0] for s in shapes] == [max(1, round(s0[0] / 4)) for s0 in shapes0]
        assert [s[1:] for s in shapes] == [s0[1:] for s0 in shapes0]
    import numpy
    count = sum(int(numpy.prod(s)) for _, shapes, _, _ in groups for s in shapes)
    assert count == 60965224 // 4
    assert cb.narrowed_share(solver, 4) == pytest.approx(0.25)
    assert cb.narrowed_share(os.path.join(REPO, cb.NETS["lenet"]), 4) == 1.0


def test_dilation_auto_is_the_clusters_sound_factor_per_layout():
    import argparse
    args = argparse.Namespace(dilation="auto", min_dilation=1.0)
    from caffe8.cluster import dilation_needed
    assert [cb.layout_dilation(args, p) for p in (1, 4, 16)] == \
        [dilation_needed(p) for p in (1, 4, 16)]
    args.min_dilation = 2.0
    assert [cb.layout_dilation(args, p) for p in (1, 16)] == [2.0, dilation_needed(16)]
    args.dilation = "3"
    assert cb.layout_dilation(args, 16) == 3.0
    with pytest.raises(SystemExit):
        cb.main(["--dilation", "0.5"])


def test_lenet_is_real_compute_with_inputs_for_its_data_layers():
    solver = os.path.join(REPO, cb.NETS["lenet"])
    assert cb._real_compute(solver) and not cb._real_compute(
        os.path.join(REPO, cb.NETS["caffenet"]))
    from studies import _runs
    net = cb._transform(solver, 4.0, 4)(_runs.load_train_net(solver)[1])
    assert [layer.type for layer in net.layer][:2] == ["Input", "Input"]
    assert cb._net_batch(solver) == 64
    torch = pytest.importorskip("torch")
    model = cb._torch_lenet(torch)
    caffe_params = 20 * 25 + 20 + 50 * 20 * 25 + 50 + 500 * 800 + 500 + 10 * 500 + 10
    assert sum(p.numel() for p in model.parameters()) == caffe_params
    assert tuple(model(torch.zeros(cb.LENET_INPUTS["data"])).shape) == (64, 10)


def test_the_pytorch_emulated_net_sleeps_its_times_with_gradients_of_one():
    """The DDP side's net: one zero parameter per tensor of each group, the group's forward and
    backward times slept, every gradient 1 (caffe8's Reduction SUM losses)."""
    import time
    torch = pytest.importorskip("torch")
    groups = [("a/emulate", [(30, 4), (30,)], 20.0, 40.0), ("b/emulate", [(7,)], 10.0, 30.0)]
    net = cb.emulated_module(torch, groups)
    assert [tuple(p.shape) for p in net.parameters()] == [(30, 4), (30,), (7,)]
    assert all(not p.detach().any() for p in net.parameters())
    t0 = time.perf_counter()
    loss = net(torch.zeros(1))
    t1 = time.perf_counter()
    loss.backward()
    t2 = time.perf_counter()
    assert t1 - t0 >= 0.030 and t2 - t1 >= 0.070
    assert all(torch.equal(p.grad, torch.ones_like(p)) for p in net.parameters())


TINY_NET = """name: "TinyEmulated"
layer { name: "data" type: "DummyData" top: "data"
        dummy_data_param { shape { dim: 8 dim: 1 } } }
layer { name: "silence_data" type: "Silence" bottom: "data" }
layer { name: "fc_w" type: "Parameter" top: "fc_w"
        parameter_param { shape { dim: 512 dim: 1024 } } }
layer { name: "fc_b" type: "Parameter" top: "fc_b" parameter_param { shape { dim: 512 } } }
layer { name: "fc/emulate" type: "EmulatedCompute" bottom: "fc_w" top: "fc_w"
        emulate_param { forward_ms: 2 backward_ms: 4 } }
layer { name: "fc_w_sum" type: "Reduction" bottom: "fc_w" top: "fc_w_sum"
        reduction_param { operation: SUM } loss_weight: 1 }
layer { name: "fc_b_sum" type: "Reduction" bottom: "fc_b" top: "fc_b_sum"
        reduction_param { operation: SUM } loss_weight: 1 }
"""
TINY_SOLVER = """net: "train.prototxt"
base_lr: 0.01 lr_policy: "fixed" momentum: 0.9 max_iter: 10 snapshot: 0
snapshot_prefix: "runs/tiny/tiny" solver_mode: CPU random_seed: 1
comm { codec: "fp8" }
"""


def _tiny_solver(tmp_path):
    folder = tmp_path / "tiny_emulated"
    folder.mkdir()
    (folder / "train.prototxt").write_text(TINY_NET)
    (folder / "solver.prototxt").write_text(TINY_SOLVER)
    return str(folder / "solver.prototxt")


@pytest.mark.mpi
@pytest.mark.timeout(300)
def test_every_hook_runs_in_the_ddp_worker(tmp_path):
    """Each ddp-<hook> variant trains the emulated net under mpiexec (no cluster needed);
    PowerSGD with two buckets included, which deadlocked on gloo before its buckets were made
    to go one at a time."""
    pytest.importorskip("torch")
    import json
    import subprocess
    import sys
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if not os.path.exists(mpiexec):
        pytest.skip("no mpiexec next to the Python interpreter")
    solver = _tiny_solver(tmp_path)
    for variant in ("ddp-powersgd4", "ddp-bf16", "ddp-fp8h"):
        r = subprocess.run([mpiexec, "-n", "2", sys.executable, "-m", "scripts.cluster_bench",
                            "--ddp-worker", "--variant", variant, "--solver", solver,
                            "--iters", "4", "--master", "127.0.0.1", "--ppn", "1"], cwd=REPO,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           timeout=120, env=dict(os.environ, PYTHONPATH=REPO))
        assert r.returncode == 0, (variant, r.stdout[-3000:])
        line = [ln for ln in r.stdout.splitlines() if ln.startswith("DDP-RESULT ")][-1]
        walls = json.loads(line.split(" ", 1)[1])["walls"]
        assert len(walls) == 4 and min(walls) >= 0.006, (variant, walls)   # 2 + 4 ms slept


@pytest.mark.mpi
@pytest.mark.timeout(300)
def test_the_fp8_hook_sends_a_quarter_of_ddps_bytes_over_the_shaped_link(tmp_path):
    """A tiny configuration of the whole benchmark on a real emulated cluster (2 nodes of one
    process, 1 Gbit/s): the link's byte counter per iteration, fp8 hook against DDP's float32."""
    pytest.importorskip("torch")
    from caffe8 import cluster as ec
    ok, why = ec.available()
    if not ok:
        pytest.skip(f"no emulated cluster here: {why}")
    out = tmp_path / "cb.csv"
    rc = cb.main(["--nets", _tiny_solver(tmp_path), "--layouts", "2x1", "--rates", "1gbit",
                  "--variants", "ddp-fp32,ddp-fp8", "--iters", "5", "--skip", "2",
                  "--rounds", "1", "--out", str(tmp_path / "runs"), "--csv", str(out),
                  "--prefix", "c8cb", "--timeout", "150", "--dilation", "2"])
    assert rc == 0
    import csv
    rows = {r["variant"]: r for r in csv.DictReader(open(out)) if r["round"] == "all"}
    assert set(rows) == {"ddp-fp32", "ddp-fp8"}
    # time dilated 2x (links at half the rate, sleeps doubled): the same bytes per iteration
    assert all(float(r["dilation"]) == 2.0 for r in rows.values())
    fp32, fp8 = float(rows["ddp-fp32"]["link_mb"]), float(rows["ddp-fp8"]["link_mb"])
    # 512 x 1024 gradients: float32's ring moves 2 MB a rank and iteration, fp8 a quarter (the
    # counters are read between iterations: one in flight at a read moves ~10 % either way)
    assert 1.5 < fp32 < 2.6 and fp8 < 0.35 * fp32, rows
