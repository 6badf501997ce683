"""studies/accuracy/ddp_accuracy.py on small IDX files: two variants, two seeds, 2 processes
under torchrun, briefly — the curves, the per-seed table, the summary and the figure."""
import csv
import os

import pytest

from tests.examples.fashion_idx import write_idx_slices

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.mark.mpi
@pytest.mark.timeout(600)
def test_two_variants_two_seeds_summarised(tmp_path):
    pytest.importorskip("torch")
    from studies.accuracy import ddp_accuracy
    data = write_idx_slices(str(tmp_path / "fm"), train=256, test=100)
    out = tmp_path / "acc"
    assert ddp_accuracy.main(["--data", data, "--procs", "2", "--processes-per-node", "1",
                              "--seeds", "1,2", "--variants", "fp32,fp8", "--iterations", "20",
                              "--test-interval", "10", "--out", str(out)]) == 0
    for name in ("fp32_seed1.csv", "fp8_seed2.csv", "seeds.csv", "summary.csv"):
        assert (out / name).exists(), name
    seeds = list(csv.DictReader(open(out / "seeds.csv")))
    assert len(seeds) == 2 * 2 * 3                  # variants x seeds x (0, 10, 20)
    summary = {r["variant"]: r for r in csv.DictReader(open(out / "summary.csv"))}
    assert list(summary) == ["fp32", "fp8"]
    finals = {(r["variant"], r["seed"]): float(r["test_accuracy"]) for r in seeds
              if r["iteration"] == "20"}
    for v in ("fp32", "fp8"):
        mean = 100 * (finals[(v, "1")] + finals[(v, "2")]) / 2
        assert summary[v]["seeds"] == "2" and summary[v]["final_iteration"] == "20"
        assert float(summary[v]["mean_accuracy"]) == pytest.approx(mean, abs=1e-3)
        assert mean > 50                            # the blocks are learnt (chance: 10 %)
    assert (out / "curves.png").read_bytes()[:8] == PNG_MAGIC
    assert (out / "curves_time.png").read_bytes()[:8] == PNG_MAGIC
    with pytest.raises(SystemExit):
        ddp_accuracy.main(["--variants", "fp4", "--out", str(out)])
