"""studies/scaling/plot_breakdown.py on generated two-rank logs: the CSV holds the means computed here
with plain loops (warm-up skipped, rank 0 or the mean over ranks), and a PNG is written."""
import contextlib
import csv
import io
import json
import os
import random
import subprocess
import sys

import pytest

from studies.scaling import plot_breakdown

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))
SPLIT = ("ForwardBackward", "D2H", "Communication", "H2D", "Quantile", "Other")
PHASES = ("forward", "backward", "encode", "d2h", "comm", "h2d", "decode", "quantile")
LAYERS = (("data", "Input"), ("ip", "InnerProduct"), ("loss", "SoftmaxWithLoss"))
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _record(rng, iteration, rank):
    layers = [dict({"name": n, "type": t}, **{ph: rng.uniform(0, 0.01) for ph in PHASES})
              for n, t in LAYERS]
    split = {k: rng.uniform(0, 0.05) for k in SPLIT}
    return {"iteration": iteration, "rank": rank, "wall": sum(split.values()), "split": split,
            "layers": layers}


def _write_logs(folder, seed, iterations=(7, 5)):
    """Rank r gets iterations[r] records (unequal on purpose: means must be per rank first)."""
    rng = random.Random(seed)
    os.makedirs(folder, exist_ok=True)
    recs = {}
    for rank, n in enumerate(iterations):
        recs[rank] = [_record(rng, it, rank) for it in range(n)]
        with open(os.path.join(folder, f"timing.r{rank}.jsonl"), "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in recs[rank])
    return recs


def _expected(recs, skip, ranks, value):
    """Mean of value(record) over iterations >= skip; 'mean': averaged over the ranks' means."""
    per_rank = []
    for rank, rs in recs.items():
        if ranks == "0" and rank != 0:
            continue
        kept = [value(r) for r in rs if r["iteration"] >= skip]
        per_rank.append(sum(kept) / len(kept))
    return sum(per_rank) / len(per_rank)




def _run(args):
    """main() in this process (matplotlib loads once); (exit code, stderr text)."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = plot_breakdown.main(args)
    return code, err.getvalue()


def _read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.parametrize("ranks", ["0", "mean"])
def test_split_csv_and_png(tmp_path, ranks):
    runs = {"fp32": _write_logs(tmp_path / "a", 1), "fp8": _write_logs(tmp_path / "b", 2)}
    png, out_csv = tmp_path / "bd.png", tmp_path / "bd.csv"
    args = [f"fp32={tmp_path / 'a'}", f"fp8={tmp_path / 'b'}", "--skip", "2", "--ranks", ranks,
            "--out", str(png), "--csv", str(out_csv)]
    if ranks == "mean":   # once as `python -m studies.scaling.plot_breakdown`, in-process elsewhere
        res = subprocess.run([sys.executable, "-m", "studies.scaling.plot_breakdown"] + args,
                             capture_output=True, text=True, timeout=120, cwd=REPO)
        assert res.returncode == 0, res.stderr
    else:
        code, err = _run(args)
        assert code == 0, err
    assert png.read_bytes()[:8] == PNG_MAGIC
    rows = _read_csv(out_csv)
    assert [r["label"] for r in rows] == ["fp32", "fp8"]
    for row in rows:
        recs = runs[row["label"]]
        kept = sum(1 for rank, rs in recs.items() for r in rs
                   if r["iteration"] >= 2 and (ranks == "mean" or rank == 0))
        assert int(row["records"]) == kept
        assert float(row["wall"]) == pytest.approx(_expected(recs, 2, ranks, lambda r: r["wall"]),
                                                   rel=1e-8)
        for key in SPLIT:
            want = _expected(recs, 2, ranks, lambda r, k=key: r["split"][k])
            assert float(row[key]) == pytest.approx(want, rel=1e-8)


def test_single_file_and_comma_list(tmp_path):
    recs = _write_logs(tmp_path / "a", 3)
    r0, r1 = (str(tmp_path / "a" / f"timing.r{r}.jsonl") for r in range(2))
    code, err = _run([f"one={r0}", f"both={r0},{r1}", "--skip", "0", "--ranks", "mean",
                      "--out", str(tmp_path / "x.png")])
    assert code == 0, err
    rows = _read_csv(tmp_path / "x.csv")     # default CSV: next to the PNG
    only0 = {0: recs[0]}
    assert float(rows[0]["Other"]) == pytest.approx(
        _expected(only0, 0, "mean", lambda r: r["split"]["Other"]), rel=1e-8)
    assert float(rows[1]["Other"]) == pytest.approx(
        _expected(recs, 0, "mean", lambda r: r["split"]["Other"]), rel=1e-8)


def test_per_layer(tmp_path):
    recs = _write_logs(tmp_path / "a", 4)
    png, out_csv = tmp_path / "layers.png", tmp_path / "layers.csv"
    code, err = _run([f"run={tmp_path / 'a'}", "--per-layer", "run", "--skip", "1", "--ranks",
                      "mean", "--out", str(png), "--csv", str(out_csv)])
    assert code == 0, err
    assert png.read_bytes()[:8] == PNG_MAGIC
    rows = _read_csv(out_csv)
    assert [(r["layer"], r["type"]) for r in rows] == list(LAYERS)
    for i, row in enumerate(rows):
        for ph in PHASES:
            want = _expected(recs, 1, "mean", lambda r, i=i, ph=ph: r["layers"][i][ph])
            assert float(row[ph]) == pytest.approx(want, rel=1e-8)


@pytest.mark.parametrize("args, message", [
    (["nolabel"], "expected LABEL=PATH"),
    (["a={missing}"], "no timing log"),
    (["a={logs}", "--skip", "99"], "after skipping 99"),
    (["a={logs}", "--per-layer", "b"], "no run with that label"),
])
def test_errors_name_the_problem(tmp_path, args, message):
    _write_logs(tmp_path / "logs", 5)
    args = [a.format(missing=tmp_path / "nope.jsonl", logs=tmp_path / "logs") for a in args]
    code, err = _run(args + ["--out", str(tmp_path / "e.png")])
    assert code == 1
    assert message in err and not (tmp_path / "e.png").exists()


def test_folder_of_repeats_pools_iterations(tmp_path):
    """A sweep point run with --repeats: rep0/ and rep1/ logs are pooled per rank."""
    a = _write_logs(tmp_path / "pt" / "rep0", 6)
    b = _write_logs(tmp_path / "pt" / "rep1", 7)
    code, err = _run([f"pt={tmp_path / 'pt'}", "--skip", "1", "--ranks", "mean",
                      "--out", str(tmp_path / "r.png")])
    assert code == 0, err
    pooled = {rank: a[rank] + b[rank] for rank in a}
    row = _read_csv(tmp_path / "r.csv")[0]
    assert int(row["records"]) == 2 * (6 + 4)
    assert float(row["Communication"]) == pytest.approx(
        _expected(pooled, 1, "mean", lambda r: r["split"]["Communication"]), rel=1e-8)
