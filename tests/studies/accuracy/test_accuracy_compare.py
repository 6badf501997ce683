"""studies/accuracy/accuracy_compare.py: variant parsing and log parsing in-process; a real 2-process
run of two variants on the digits demo (20 iterations) under mpiexec."""
import csv
import os

import pytest

from studies.accuracy import accuracy_compare as ac
from caffe8.engine.prototxt import parse_file

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))
SOLVER = os.path.join(REPO, "prototxt", "digits", "solver.prototxt")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

LOG = """\
I1122 23:59:58.500000 11 cli.py:79] Starting Optimization
I1122 23:59:59.000000 11 trainer.py:138] Solving DigitsNet
I1122 23:59:59.250000 11 trainer.py:262] Iteration 0, Testing net (#0)
I1122 23:59:59.300000 11 trainer.py:252]     Test net output #0: accuracy = 0.1
I1122 23:59:59.300000 11 trainer.py:252]     Test net output #1: loss = 2.3 (* 1 = 2.3 loss)
I1123 00:00:01.000000 11 trainer.py:262] Iteration 10, Testing net (#0)
I1123 00:00:01.000000 11 trainer.py:270] Test loss: 1.5
I1123 00:00:01.100000 11 trainer.py:252]     Test net output #0: accuracy = 0.75
I1123 00:00:01.100000 11 trainer.py:252]     Test net output #1: loss = 1.25 (* 1 = 1.25 loss)
I1123 00:00:01.200000 11 trainer.py:262] Iteration 10, Testing net (#1)
I1123 00:00:01.300000 11 trainer.py:252]     Test net output #0: accuracy = 0.5
"""


def test_parse_test_log():
    rows = ac.parse_test_log(LOG.splitlines())
    # Net #1 is ignored; seconds from "Solving" (across midnight); "Test loss" wins over the blob.
    assert rows == [
        {"iteration": 0, "seconds": pytest.approx(0.25), "test_accuracy": 0.1, "test_loss": 2.3},
        {"iteration": 10, "seconds": pytest.approx(2.0), "test_accuracy": 0.75,
         "test_loss": 1.5}]


def test_parse_variants_and_solver_copy(tmp_path):
    variants = ac.parse_variants("fp32,fp8_direct,q99:codec=fp8,quantile=0.99,async=false")
    assert variants[0] == ("fp32", {"codec": "fp32"})
    assert variants[1][1]["relative"] is False and variants[1][1]["warmup_fp32_iters"] == 0
    assert variants[2] == ("q99", {"codec": "fp8", "quantile": 0.99, "async": False})
    with pytest.raises(ValueError, match="unknown variant"):
        ac.parse_variants("fp7")
    with pytest.raises(ValueError, match="no field 'quantil'"):
        ac.parse_variants("x:quantil=0.9")
    path = ac.write_variant_solver(SOLVER, str(tmp_path / "v"), variants[2][1], 20, 10, 2)
    s = parse_file(path, "SolverParameter")
    assert os.path.isabs(s.net) and os.path.exists(s.net)
    assert (s.max_iter, s.test_interval, s.snapshot) == (20, 10, 0)
    assert (s.comm.codec, s.comm.quantile, getattr(s.comm, "async"),
            s.comm.processes_per_node) == ("fp8", pytest.approx(0.99), False, 2)
    assert s.random_seed == parse_file(SOLVER, "SolverParameter").random_seed
    s = parse_file(ac.write_variant_solver(SOLVER, str(tmp_path / "w"), {}, 0, 0, 0, 5),
                   "SolverParameter")
    assert s.random_seed == 5 and s.max_iter == parse_file(SOLVER, "SolverParameter").max_iter


@pytest.mark.mpi
@pytest.mark.timeout(120)
def test_two_variants_two_processes(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)    # data/digits is relative to the CWD
    out = tmp_path / "acc"
    assert ac.main(["--solver", SOLVER, "--out", str(out), "--procs", "2", "--variants",
                    "fp32,fp8", "--max-iter", "20", "--test-interval", "10",
                    "--timeout", "100"]) == 0
    rows = list(csv.DictReader(open(out / "accuracy.csv")))
    assert [(r["variant"], r["iteration"]) for r in rows] == [
        (v, i) for v in ("fp32", "fp8") for i in ("0", "10", "20")]
    for r in rows:
        assert 0.0 <= float(r["test_accuracy"]) <= 1.0 and float(r["test_loss"]) > 0
    # Same seed, same initial weights: the iteration-0 tests agree exactly.
    assert rows[0]["test_accuracy"] == rows[3]["test_accuracy"]
    assert rows[0]["test_loss"] == rows[3]["test_loss"]
    assert float(rows[2]["seconds"]) > float(rows[1]["seconds"]) > float(rows[0]["seconds"])
    assert (out / "accuracy.png").read_bytes()[:8] == PNG_MAGIC
    assert "codec: \"fp8\"" in (out / "fp8" / "solver.prototxt").read_text()
    # --replot redraws from the CSV alone, with the same rows read back.
    (out / "accuracy.png").unlink()
    assert ac.main(["--out", str(out), "--replot"]) == 0
    assert (out / "accuracy.png").read_bytes()[:8] == PNG_MAGIC
    back = ac.read_csv(str(out / "accuracy.csv"))
    assert [(r["variant"], r["iteration"]) for r in back] == [
        (r["variant"], int(r["iteration"])) for r in rows]


def _row(variant, seed, iteration, acc):
    return {"variant": variant, "seed": seed, "iteration": iteration, "seconds": 1.0,
            "test_accuracy": acc, "test_loss": 0.5}


def test_summarise_seeds_takes_each_seeds_final_test_and_the_gap_to_the_first_variant():
    rows = [_row("fp32", 1, 0, 0.1), _row("fp32", 1, 100, 0.90), _row("fp32", 2, 100, 0.92),
            _row("fp32", 3, 100, 0.94), _row("fp8", 1, 100, 0.89), _row("fp8", 2, 100, 0.93),
            _row("fp8", 3, 50, 0.99), _row("fp8", 3, 100, 0.91)]
    fp32, fp8 = ac.summarise_seeds(rows)
    assert (fp32["variant"], fp32["seeds"], fp32["final_iteration"]) == ("fp32", 3, 100)
    assert fp32["mean_accuracy"] == pytest.approx(92.0)
    assert fp32["std_accuracy"] == pytest.approx(2.0)               # sample sd of 90, 92, 94
    assert (fp8["min_accuracy"], fp8["max_accuracy"]) == (89.0, 93.0)  # iteration 50 is not final
    assert fp8["mean_accuracy"] == pytest.approx(91.0)
    assert fp8["gap_to_first_points"] == pytest.approx(-1.0)


def test_resume_keeps_a_complete_run_and_reruns_a_cut_one(tmp_path):
    done, cut = tmp_path / "done.log", tmp_path / "cut.log"
    done.write_text("I1125 04:00:00.000000 1 x.py:1] Iteration 10\n"
                    "I1125 04:00:01.000000 1 x.py:1] Optimization Done.\n")
    cut.write_text("I1125 04:00:00.000000 1 x.py:1] Iteration 10\n")
    assert ac.finished(str(done)) and not ac.finished(str(cut))
    assert not ac.finished(str(tmp_path / "missing.log"))
