"""caffe8.comm.perf_model against numbers worked out by hand for tiny cases: the MAC split, the
overlapped hierarchical iteration, the emulated cluster's schedules (caffe8 sync and async, DDP,
MPI_Allreduce), processor sharing, and ``serial_convert`` (Oyama et al.'s conversion kernels on
the GPU's compute path)."""
import pytest

from caffe8.comm import perf_model as pm


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


# --- the emulated cluster (cluster_time) on a 2-tensor toy net -----------------------------------
# L1: forward 10 ms, backward 20 ms, one tensor of 1e6 elements; L2: 10 ms / 5 ms, 2e6 elements.
# 2 nodes x 1 process; link 1e9 B/s, 1 ms per collective; float32 (4 bytes), sum 1e9/s, encode
# 1e9/s, decode 2e9/s; update 1e9/s; no other host cost; cores enough for every thread.
TOY = [pm.LayerCost("L1", 0.010, 0.020, [1_000_000]), pm.LayerCost("L2", 0.010, 0.005, [2_000_000])]


TOY_NET = pm.Network(alpha_intra=0.0, beta_intra=pm.INF, alpha_inter=1e-3, beta_inter=1e9,
                     processes_per_node=1)


TOY_FP32 = pm.CodecCost(4, reduce_rate=1e9, encode_rate=1e9, decode_rate=2e9)


TOY_HOST = pm.HostCost(cores=8, update_rate=1e9)


TOY_T1 = 0.045 + 0.003          # compute + the update of 3e6 elements: no other host work


def _c8_sum_by_hand(n):
    # 2 nodes: Alltoallv (1 ms + half the bytes), the sum of the half, Allgather (1 ms + half)
    half = 0.5 * 4 * n / 1e9
    return 1e-3 + half + 0.5 * n / 1e9 + 1e-3 + half


def test_cluster_sync_by_hand():
    # everything after backward, in ready order (L2's tensor, then L1's): encode, sum, decode,
    # then the verdict's allreduce (1 step of 1 ms for P = 2)
    ex = {n: n / 1e9 + _c8_sum_by_hand(n) + n / 2e9 for n in (2_000_000, 1_000_000)}
    assert ex[2_000_000] == pytest.approx(0.014) and ex[1_000_000] == pytest.approx(0.008)
    got = pm.cluster_time(TOY, TOY_FP32, TOY_NET, TOY_HOST, 2, 1, TOY_T1, "sync")
    assert got == pytest.approx(TOY_T1 + 0.022 + 0.001, rel=1e-9)
    # one process: the measured baseline itself
    assert pm.cluster_time(TOY, TOY_FP32, TOY_NET, TOY_HOST, 1, 1, TOY_T1, "sync") == TOY_T1


def test_cluster_async_pipeline_by_hand():
    # forward 20 ms, the verdict's allreduce 1 ms; L2 ready at 26: encode 26-28, sum 28-39,
    # decode + update 39-42; L1 ready at 46: encode 46-47, sum 47-53.5, decode 0.5 + update 1.
    got = pm.cluster_time(TOY, TOY_FP32, TOY_NET, TOY_HOST, 2, 1, TOY_T1, "async")
    assert got == pytest.approx(0.055, rel=1e-9)
    _, events = pm.simulate_threads(pm.c8_cluster_programs(
        TOY, TOY_FP32, TOY_NET, TOY_HOST, 2, 1, TOY_T1, True), 4)
    assert events[("ready", 1)] == pytest.approx(0.026) and events[("ready", 0)] == \
        pytest.approx(0.046)
    assert events[("encoded", 0)] == pytest.approx(0.028)
    assert events[("summed", 0)] == pytest.approx(0.039)
    assert events[("summed", 1)] == pytest.approx(0.0535)
    # A slow encoder (1e8/s) is the bottleneck stage: L2 encoded at 26 + 20 = 46, summed at 57,
    # updated at 60; L1 encoded at 46 + 10 = 56, summed after L2's at 57 + 6.5, updated + 1.5.
    slow = pm.CodecCost(4, reduce_rate=1e9, encode_rate=1e8, decode_rate=2e9)
    assert pm.cluster_time(TOY, slow, TOY_NET, TOY_HOST, 2, 1, TOY_T1, "async") == \
        pytest.approx(0.057 + 0.0065 + 0.0015, rel=1e-9)
    # One bucket for both tensors (limit above their 12e6 bytes): the sum waits for L1's
    # encode (47), then 2 collectives + 12e6/2 bytes each way + 1.5e6 adds: 62.5; L2's decode and
    # update 3 ms: 65.5, L1's 1.5 ms: 67 ms.
    assert pm.cluster_time(TOY, TOY_FP32, TOY_NET, TOY_HOST, 2, 1, TOY_T1, "async",
                           bucket_bytes=2e7) == pytest.approx(0.067, rel=1e-9)
    # synchronous, one bucket: one sum instead of two, 2 collectives fewer than 71 ms
    assert pm.cluster_time(TOY, TOY_FP32, TOY_NET, TOY_HOST, 2, 1, TOY_T1, "sync",
                           bucket_bytes=2e7) == pytest.approx(0.069, rel=1e-9)
    # caffe8's rule by wire bytes: fp8 (1 byte) puts L2's 2e6 bytes and L1's 1e6 in one
    # 4 MB bucket, float32 (4 bytes) closes it after L2
    assert pm.gradient_buckets(TOY, 4e6, 4e6, 1) == [(1, 3_000_000)]
    assert pm.gradient_buckets(TOY, 4e6, 4e6, 4) == [(0, 2_000_000), (1, 1_000_000)]
    assert pm.gradient_buckets(TOY, 0, 0, 4) == [(0, 2_000_000), (1, 1_000_000)]


def test_cluster_host_work_is_shared_by_threads():
    # One core per process (2 cores, 2 processes); the slow encoder's 20 ms for L2 runs alone
    # (25-45); L1's encode (10 ms CPU) starts at 45 while L2's decode + update (1 + 2 ms) runs:
    # both at half a core until 51, then the encode alone: 55 -> 49 + ... worked below.
    slow = pm.CodecCost(4, reduce_rate=pm.INF, encode_rate=1e8, decode_rate=2e9)
    net = pm.Network(0.0, pm.INF, 0.0, pm.INF, 1)
    host = pm.HostCost(cores=2, update_rate=1e9)
    # L2: encoded 45, summed 45 (free sum), decode + update 3 ms CPU from 45; L1's encode 10 ms
    # CPU from 45. Shared at 0.5 each until the update finishes: 45 + 6 = 51 (encode has 3 ms
    # done); the encode alone: 7 ms more, 58; L1's sum is free, its decode + update 1.5 ms: 59.5.
    got = pm.cluster_time(TOY, slow, net, host, 2, 1, TOY_T1, "async")
    assert got == pytest.approx(0.0595, rel=1e-9)
    # with a core per thread the two overlap fully: L1 encoded at 55, updated at 56.5
    fast = pm.HostCost(cores=8, update_rate=1e9)
    assert pm.cluster_time(TOY, slow, net, fast, 2, 1, TOY_T1, "async") == \
        pytest.approx(0.0565, rel=1e-9)


def test_simulate_threads_processor_sharing_by_hand():
    # a: 1 s of CPU; b: sleeps 0.5 s, then 1 s of CPU; one core. a alone to 0.5 (half done),
    # both at half speed: a ends at 1.5, b has 0.5 left, alone: 2.0.
    finish, _ = pm.simulate_threads({"a": [("cpu", 1.0)], "b": [("idle", 0.5), ("cpu", 1.0)]}, 1)
    assert finish == {"a": pytest.approx(1.5), "b": pytest.approx(2.0)}
    # a transfer of 1 s on the link needing 0.5 CPU-s beside a CPU thread: the transfer wants
    # half a core and gets it (full speed, ends at 1); the CPU thread has 0.5 left: 1.5.
    finish, events = pm.simulate_threads({"x": [("xfer", 1.0, 0.5), ("signal", "e")],
                                          "c": [("cpu", 1.0)],
                                          "w": [("await", "e"), ("idle", 0.25)]}, 1)
    assert finish == {"x": pytest.approx(1.0), "c": pytest.approx(1.5), "w": pytest.approx(1.25)}
    assert events == {"e": pytest.approx(1.0)}
    # a CPU-bound transfer (2 CPU-s for 1 s of wire) on one core takes 2 s
    assert pm.simulate_threads({"x": [("xfer", 1.0, 2.0)]}, 1)[0]["x"] == pytest.approx(2.0)
    with pytest.raises(ValueError, match="never signalled"):
        pm.simulate_threads({"w": [("await", "nothing")]}, 1)


def test_hierarchical_cpu_steps_by_hand():
    # 2 nodes x 2 processes, fp8: shared-memory reduce-scatter (barrier, 1/2 · n adds), the
    # rescale of the n/2 piece, Alltoallv and Allgather of the piece (each process moves 1/2
    # of the bytes at 1/2 of the link: (N-1)/N · (n/2) / (β/2)), the sum of 1/2 of the piece,
    # then the intra-node allgather (barrier, copy of 1/2 · n bytes).
    n = 8_000_000
    fp8 = pm.CodecCost(1, reduce_rate=4e9, encode_rate=1e9, decode_rate=1e9, between_rate=2e9)
    net = pm.Network(1e-5, pm.INF, 1e-3, 1e9, 2)
    host = pm.HostCost(cores=4, tcp_rate=2e9, copy_rate=8e9)
    steps = pm.c8_collective_steps(n, fp8, net, host, 2, 2)
    wire = 0.5 * (n / 2) / (1e9 / 2)
    tcp = pytest.approx(0.5 * n / 2 / 2e9)
    assert steps == [("idle", 1e-5), ("cpu", pytest.approx(0.5 * n / 4e9)),
                     ("cpu", pytest.approx(n / 2 / 2e9)),
                     ("idle", 1e-3), ("xfer", pytest.approx(wire), tcp),
                     ("cpu", pytest.approx(0.5 * n / 2 / 4e9)),
                     ("idle", 1e-3), ("xfer", pytest.approx(wire), tcp),
                     ("idle", 1e-5), ("cpu", pytest.approx(0.5 * n / 8e9))]
    # one process per node: no shared-memory stages, and the rescale is in the encode's scale
    wire = 0.5 * n / 1e9
    assert pm.c8_collective_steps(n, fp8, net, host, 2, 1) == [
        ("cpu", 0.0), ("idle", 1e-3), ("xfer", pytest.approx(wire), pytest.approx(0.5 * n / 2e9)),
        ("cpu", pytest.approx(0.5 * n / 4e9)),
        ("idle", 1e-3), ("xfer", pytest.approx(wire), pytest.approx(0.5 * n / 2e9))]


def test_ddp_buckets_and_iteration_by_hand():
    # Ready order L2 (8e6 bytes), L1 (4e6 bytes). First bucket limit 4e6 bytes: L2 closes it;
    # L1 (4e6 < 1e7) is the last bucket.
    ddp = pm.DdpCost(copy_rate=1e9, first=4e6, cap=1e7)
    assert pm.gradient_buckets(TOY, ddp.first, ddp.cap) == [(0, 2_000_000), (1, 1_000_000)]
    assert pm.gradient_buckets(TOY, 1e9, 1e9) == [(1, 3_000_000)]
    # autograd: forward 20; L2's backward to 25, its copy into the bucket (2 ms): bucket 0 at 27;
    # L1's backward to 47, copy 1 ms: bucket 1 at 48. gloo: 2(P-1) = 2 steps of 1 ms, then the
    # ring's 2(P-1)/P · bytes at 1e9 B/s (the sum, 1e6 adds in 1 ms, under the 8 ms of wire):
    # bucket 0 27 + 2 + 8 = 37; bucket 1 48 + 2 + 4 = 54. Then the copy back (3 ms) and the
    # step (3e6 at 1e9/s): 60 ms. T1 = compute + step, no other host work.
    fp32 = pm.CodecCost(4, reduce_rate=1e9)
    got = pm.cluster_time(TOY, fp32, TOY_NET, TOY_HOST, 2, 1, 0.048, "ddp", ddp, 1e9)
    assert got == pytest.approx(0.060, rel=1e-9)
    # fp16 hook: cast + divide of each bucket on the autograd thread (2e9/s), half the bytes,
    # its sum at 1e8/s (1e6 adds: 10 ms, longer than the 4 ms of wire: CPU-bound at one
    # core), the copy back into the float bucket at 1e9/s on the gloo thread.
    # 2 nodes x 2 processes (P = 4): 2(P-1) = 6 ring steps of 1 ms; each process sends
    # 2 · 3/4 · its bucket's bytes, half of them over the node's loopback (2e9 B/CPU-s), half
    # over the link (5e8 B/CPU-s): bucket 1, 4e6 bytes: 6e6 · (0.5/2e9 + 0.5/5e8) = 7.5 ms of
    # CPU and its 0.75e6 adds (0.75 ms) against the 6 ms of its 6e6 bytes on the link.
    host = pm.HostCost(cores=16, update_rate=1e9, tcp_rate=5e8, loopback_rate=2e9)
    net22 = pm.Network(0.0, pm.INF, 1e-3, 1e9, 2)
    programs = pm.ddp_cluster_programs(TOY, fp32, net22, host, ddp, 2, 2, 0.048, 1e9)
    assert programs["gloo"][4:7] == [("await", ("bucket", 1)), ("idle", 6e-3),
                                     ("xfer", pytest.approx(6e-3), pytest.approx(8.25e-3))]
    fp16 = pm.CodecCost(2, reduce_rate=1e8, encode_rate=2e9, decode_rate=1e9)
    # bucket 0: closes 27 + 1 = 28; 2 ms; ring: max(wire 4, sum 10) = 10: 40; decode 2: 42.
    # The cast held up backward: L1's ends at 48, its copy 49, cast 49.5; 2 ms; max(2, 5) = 5:
    # 56.5; decode 1: 57.5. Then the copy back and the step, 3 + 3 ms: 63.5.
    got = pm.cluster_time(TOY, fp16, TOY_NET, TOY_HOST, 2, 1, 0.048, "ddp", ddp, 1e9)
    assert got == pytest.approx(0.0635, rel=1e-9)


def test_mpi_allreduce_reference_by_hand():
    # all 3e6 float32 gradients (12e6 bytes) in one blocking MPI_Allreduce, no compute:
    # 2 nodes x 1: 2 steps of 1 ms + 2 · 1/2 · 12e6 bytes at 1e9 B/s (the 1.5e6 adds under it)
    assert pm.cluster_time(TOY, TOY_FP32, TOY_NET, TOY_HOST, 2, 1, 0.0, "mpi") == \
        pytest.approx(0.014, rel=1e-9)
    # 2 nodes x 2: 4 steps; the two processes of a node both send their 6e6 crossing bytes
    # through its link: 24 ms
    net = pm.Network(0.0, pm.INF, 1e-3, 1e9, 2)
    assert pm.cluster_time(TOY, TOY_FP32, net, TOY_HOST, 2, 2, 0.0, "mpi") == \
        pytest.approx(0.028, rel=1e-9)
    with pytest.raises(ValueError, match="variant"):
        pm.cluster_time(TOY, TOY_FP32, TOY_NET, TOY_HOST, 2, 1, 0.0, "nccl")


NET = pm.Network(alpha_intra=1e-6, beta_intra=1e9, alpha_inter=5e-6, beta_inter=1e9,
                 processes_per_node=2)


FP8 = pm.CodecCost(1, reduce_rate=1e9, convert_rate=1e8)


def test_serial_convert_exposes_the_conversion_of_a_hidden_exchange():
    # two layers, backward order L2 then L1; L1's backward (0.5 s) hides L2's exchange
    n1, n2, f, b1, b2 = 1000, 2_000_000, 0.01, 0.5, 0.02
    layers = [pm.LayerCost("L1", 0.0, b1, [n1]), pm.LayerCost("L2", f, b2, [n2])]
    e1, e2 = (pm.exchange_time(n, FP8, NET, 4) for n in (n1, n2))
    assert e2 < b1
    plain = pm.iteration_time(layers, FP8, NET, 4)
    serial = pm.iteration_time(layers, FP8, NET, 4, serial_convert=True)
    assert plain["iteration"] == pytest.approx(f + b2 + b1 + e1)
    # L2's conversion (n2 / rate) now delays L1's backward; L1's own conversion moves from the
    # communication thread to the compute path, so e1 stays in full at the end
    assert serial["iteration"] == pytest.approx(f + b2 + n2 / 1e8 + b1 + e1)
    assert serial["comm"] == pytest.approx(plain["comm"] - (n1 + n2) / 1e8)


def test_serial_convert_changes_nothing_for_one_process_or_float32():
    layers = [pm.LayerCost("L", 0.1, 0.2, [10_000])]
    fp32 = pm.CodecCost(4, reduce_rate=1e9)
    for codec, p in ((FP8, 1), (fp32, 4)):
        assert pm.iteration_time(layers, codec, NET, p, serial_convert=True) == \
            pm.iteration_time(layers, codec, NET, p)
