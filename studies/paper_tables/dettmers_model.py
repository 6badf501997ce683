#!/usr/bin/env python
"""Dettmers' predictive speedup model ("8-bit approximations for parallelism in deep learning",
appendix): its Tables 1 and 7 recomputed from its own inputs (Tables 3-6).

The model (AlexNet, batch 128 per GPU; convolutional layers data parallel, fully connected layers
fed with sub-batches of the convolutional activities):

* 4 GPUs, one node (appendix 5.1)::

      speedup = K * T / ((T - T_fc) + conv_penalty + K * T_fc_parallel + fc_penalty)

  T: one GPU's time for a batch (104.1 ms with NervanaGPU kernels, 177 ms with convnet2's),
  T_fc: the fully connected layers' share (Table 4: fprop + bprop + update of the three layers,
  6.5 ms), T_fc_parallel: the same with the output split over K = 4 GPUs (3.34 ms),
  conv_penalty: the one gradient sync that nothing hides (conv11's, 0.05 ms, Table 3), and
  fc_penalty = sum over the model parallel transfers of max(0, sync - compute that hides it)
  + 5 x the convolutional activities' sync (the first sub-batch forward and the last error
  batches have nothing to overlap with). The transfer/compute pairs are the ones the paper writes
  out: conv activities behind fc1's fprop, fc1 and fc2 activities behind the next layer's fprop,
  fc3's output behind fc2's bprop, two error transfers behind fc1's bprop and behind the sum of
  the parallel updates (0.43 + 0.13 + 0.08 = 0.64 ms). Sync times from Table 3.

* 96 GPUs on 32 nodes (appendix 5.2): no model parallelism; the convolutional activities of the
  global batch B = 96 x 128 = 12288 go to the fully connected layers in B / b sub-batches of b::

      speedup = G * T / ((T - T_fc) + (B / b) * T_fc + full_pass(b))
      full_pass(b) = sync(b)                         if sync(b) <= 1.3 ms (hidden but once)
                   = (nodes - 1) * (sync(b) - 1.3)   otherwise

  sync(b): Table 6's time to send one sub-batch's activities (32-bit or 8-bit), 1.3 ms: the fc
  matrix multiplication each transfer hides behind, nodes = 32.

Run (from the repository root)::

    python -m studies.paper_tables.dettmers_model --out docs/figures

Writes OUT/dettmers_model_speedups.csv and OUT/dettmers_model_speedups.png and prints the
markdown table of docs/dettmers_model.md (ours next to the paper's numbers).
"""
import argparse
import os
import sys

from studies._runs import label_axes, pyplot, save_figure, write_rows

# --- the paper's inputs --------------------------------------------------------------------------
T_NERVANA, T_CONVNET2 = 104.1, 177.0            # ms per batch of 128 on one GPU (Table 4, 5.1.3)
# Table 4, fully connected layers: (fprop, bprop, update) in ms, baseline and split over 4 GPUs
FC_BASELINE = {"fc 9216->3072": (1.3, 1.3, 1.5), "fc 3072->3072": (0.45, 0.45, 0.5),
               "fc 3072->1000": (0.4, 0.4, 0.2)}
FC_PARALLEL = {"fc 9216->3072": (0.9, 0.9, 0.43), "fc 3072->3072": (0.3, 0.3, 0.13),
               "fc 3072->1000": (0.15, 0.15, 0.08)}
# Table 3, sync times (ms): 32-bit, 8-bit
SYNC = {"conv11": (0.05, 0.05), "conv activation": (0.9, 0.4), "fc 9216->3072": (1.1, 0.5),
        "fc 3072->3072": (1.1, 0.5), "fc 3072->1000": (0.4, 0.25)}
FIRST_AND_LAST_BATCHES = 5       # conv-activation syncs with nothing to overlap (appendix 5.1.2)


def fc_time(table):
    return round(sum(sum(v) for v in table.values()), 10)


def _overlaps():
    """(transfer, compute that hides it in ms) of the 4-GPU model parallel pass (appendix 5.1.2)."""
    par = FC_PARALLEL
    updates = sum(v[2] for v in par.values())                         # 0.64
    return [("conv activation", par["fc 9216->3072"][0]),           # behind fc1 fprop
            ("fc 9216->3072", par["fc 3072->3072"][0]),             # fc1 out behind fc2 fprop
            ("fc 3072->3072", par["fc 3072->1000"][0]),             # fc2 out behind fc3 fprop
            ("fc 3072->1000", par["fc 3072->3072"][1]),             # fc3 out behind fc2 bprop
            ("fc 9216->3072", par["fc 9216->3072"][1]),             # errors behind fc1 bprop
            ("fc 3072->3072", updates)]                             # errors behind the updates


def fc_penalty(bits):
    """Model parallel penalty (ms) of the 4-GPU model for 32- or 8-bit transfers."""
    col = 0 if bits == 32 else 1
    terms = sum(max(0.0, SYNC[name][col] - hide) for name, hide in _overlaps())
    return terms + FIRST_AND_LAST_BATCHES * SYNC["conv activation"][col]


def speedup_4gpu(bits, total=T_NERVANA, k=4):
    denominator = ((total - fc_time(FC_BASELINE)) + SYNC["conv11"][0]
                   + k * fc_time(FC_PARALLEL) + fc_penalty(bits))
    return k * total / denominator


# Table 6: sub-batch size -> sync time (ms) of one sub-batch's conv activities, 32-bit, 8-bit
TABLE6_SYNC = {128: (2.1, 0.35), 256: (4.2, 0.55), 512: (7.15, 1.13), 1024: (17.4, 2.25),
               2048: (25.5, 3.26), 12288: (250.0, 31.0)}
# Table 6 as printed: total time of the full pass with overlap (ms), 32-bit, 8-bit
TABLE6_FULL = {128: (24.8, 0.35), 256: (89.9, 0.55), 512: (181.0, 1.13), 1024: (499.0, 29.5),
               2048: (750.0, 60.8), 12288: (7750.0, 921.0)}
# Table 5: sub-batch -> (size kB 32-bit, 8-bit, latency ms/msg 32-bit, 8-bit)
TABLE5 = {128: (144, 18, 0.035, 0.007), 256: (288, 36, 0.07, 0.01), 512: (576, 72, 0.1, 0.02),
          1024: (1152, 144, 0.3, 0.04), 2048: (2312, 289, 0.7, 0.07),
          12288: (13872, 1734, 5.0, 0.06)}
GPUS, NODES, BATCH = 96, 32, 96 * 128
HIDE_MS = 1.3                    # the fc matrix multiplication each transfer hides behind
INFINIBAND_BYTES_PER_MS = 6e6    # 6 GB/s


def full_pass(sync):
    return sync if sync <= HIDE_MS else (NODES - 1) * (sync - HIDE_MS)


def speedup_cluster(b, bits, total=T_NERVANA):
    sync = TABLE6_SYNC[b][0 if bits == 32 else 1]
    passes = BATCH / b
    t_fc = fc_time(FC_BASELINE)
    return GPUS * total / ((total - t_fc) + passes * t_fc + full_pass(sync))


def sync_from_table5(b, bits):
    """35 messages of (size / 6 GB/s + latency): fits Table 6 for b <= 1024 (see the docs)."""
    kb32, kb8, lat32, lat8 = TABLE5[b]
    kb, lat = (kb32, lat32) if bits == 32 else (kb8, lat8)
    return 35 * (kb * 1e3 / INFINIBAND_BYTES_PER_MS + lat)


# --- the paper's outputs, for comparison ---------------------------------------------------------
PAPER_TABLE1_4GPU = {32: 3.53, 8: 3.67}
PAPER_CONVNET2_4GPU = {32: 3.71, 8: 3.8}
PAPER_FC_PENALTY = {32: 6.81, 8: 2.55}
# Table 7 (Table 1's 96-GPU rows are its NervanaGPU columns; both print 2056 for 2048)
PAPER_TABLE7 = {128: (13.4, 13.8, 20.7, 21.4), 256: (20.0, 24.4, 29.7, 35.2),
                512: (23.0, 39.3, 33.5, 51.9), 1024: (14.8, 48.6, 22.7, 61.0),
                2048: (11.3, 50.6, 17.7, 62.8), 12288: (1.3, 9.7, 2.15, 15.5)}
FIELDS = ("setting", "sub_batch", "kernels", "bits", "ours", "paper", "rel_diff_pct",
          "sync_ms", "full_pass_ms", "full_pass_paper_ms", "sync_from_table5_ms")


def rows():
    out = []
    for kernels, total, paper in (("NervanaGPU", T_NERVANA, PAPER_TABLE1_4GPU),
                                  ("convnet2", T_CONVNET2, PAPER_CONVNET2_4GPU)):
        for bits in (32, 8):
            ours = speedup_4gpu(bits, total)
            out.append(dict(setting="4 GPUs (Table 1 / appendix 5.1.3)", sub_batch=128,
                            kernels=kernels, bits=bits, ours=ours, paper=paper[bits],
                            rel_diff_pct=100 * (ours / paper[bits] - 1), sync_ms="",
                            full_pass_ms="", full_pass_paper_ms="", sync_from_table5_ms=""))
    for b in TABLE6_SYNC:
        for col, (kernels, total) in enumerate((("NervanaGPU", T_NERVANA),
                                                ("convnet2", T_CONVNET2))):
            for j, bits in enumerate((32, 8)):
                ours = speedup_cluster(b, bits, total)
                paper = PAPER_TABLE7[b][2 * col + j]
                sync = TABLE6_SYNC[b][j]
                out.append(dict(setting="96 GPUs (Table 7)", sub_batch=b, kernels=kernels,
                                bits=bits, ours=ours, paper=paper,
                                rel_diff_pct=100 * (ours / paper - 1), sync_ms=sync,
                                full_pass_ms=full_pass(sync),
                                full_pass_paper_ms=TABLE6_FULL[b][j],
                                sync_from_table5_ms=sync_from_table5(b, bits)))
    return out


def markdown(table):
    lines = ["| setting | sub-batch | kernels | bits | ours | paper | diff % | full pass ours / "
             "paper (ms) |", "|---|---|---|---|---|---|---|---|"]
    for r in table:
        full = (f"{r['full_pass_ms']:.4g} / {r['full_pass_paper_ms']:g}"
                if r["full_pass_ms"] != "" else "")
        lines.append(f"| {r['setting']} | {r['sub_batch']} | {r['kernels']} | {r['bits']} | "
                     f"{r['ours']:.2f}x | {r['paper']:g}x | {r['rel_diff_pct']:+.2f} | {full} |")
    return "\n".join(lines)


def plot(table, path):
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    cluster = [r for r in table if r["setting"].startswith("96")]
    for kernels in ("NervanaGPU", "convnet2"):
        for bits, color in ((32, "tab:blue"), (8, "tab:red")):
            pts = [r for r in cluster if r["kernels"] == kernels and r["bits"] == bits]
            style = "-" if kernels == "NervanaGPU" else ":"
            ax.plot([r["sub_batch"] for r in pts], [r["ours"] for r in pts], style, color=color,
                    label=f"model, {kernels}, {bits}-bit")
            ax.plot([r["sub_batch"] for r in pts], [r["paper"] for r in pts], "o", color=color,
                    mfc="none")
    ax.set_xscale("log", base=2)
    label_axes(ax, xlabel="sub-batch size (global batch 12288)",
               ylabel="speedup over one GPU (96 GPUs)",
               title="Dettmers' cluster model (lines) vs the paper's Table 7 (circles)",
               legend_size=8)
    save_figure(fig, path)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join("docs", "figures"))
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    table = rows()
    csv_path = os.path.join(args.out, "dettmers_model_speedups.csv")
    write_rows(table, FIELDS, csv_path, digits=4)
    plot(table, csv_path[:-4] + ".png")
    print(f"fc penalty (4 GPUs): 32-bit {fc_penalty(32):.2f} ms (paper prints "
          f"{PAPER_FC_PENALTY[32]}), 8-bit {fc_penalty(8):.2f} ms (paper {PAPER_FC_PENALTY[8]})")
    print(markdown(table))
    print(f"wrote {csv_path} and its .png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
