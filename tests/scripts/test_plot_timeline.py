"""scripts/plot_timeline.py: the bars and ticks it draws from a timing record, the image file,
and one clear error for a record it cannot draw."""
import json

import pytest

from scripts import plot_timeline


def _record(iteration, rank=0, buckets=True):
    layers = [{"name": "fc1", "backward_end": 0.020}, {"name": "relu", "backward_end": 0.015},
              {"name": "fc2", "backward_end": 0.010}, {"name": "data", "backward_end": None}]
    timeline = [{"bucket": 0, "layers": ["fc2"], "encode": [0.011, 0.012],
                 "reduce": [0.012, 0.018], "decode": [0.0185, 0.019]},
                {"bucket": 1, "layers": ["fc1"], "encode": [0.021, 0.022],
                 "d2h": [0.022, 0.023], "reduce": [0.023, 0.03], "h2d": [0.03, 0.031],
                 "decode": [0.031, 0.032]}]
    return {"iteration": iteration, "rank": rank, "wall": 0.035, "layers": layers,
            "buckets": timeline if buckets else []}


def test_bars_per_bucket_phase_and_ticks_at_the_exchanged_layers_backward_ends():
    ticks, bars = plot_timeline.timeline(_record(3))
    assert ticks == [("fc2", 0.010), ("fc1", 0.020)]       # relu has no bucket, data no backward
    assert bars == [(0, "encode", 0.011, 0.012), (0, "reduce", 0.012, 0.018),
                    (0, "decode", 0.0185, 0.019),
                    (1, "encode", 0.021, 0.022), (1, "d2h", 0.022, 0.023),
                    (1, "reduce", 0.023, 0.03), (1, "h2d", 0.03, 0.031),
                    (1, "decode", 0.031, 0.032)]


def test_it_draws_the_chosen_iteration_of_the_chosen_rank(tmp_path):
    log = tmp_path / "t.jsonl"
    log.write_text("".join(json.dumps(_record(i, r)) + "\n" for i in range(3) for r in (0, 1)))
    assert plot_timeline.pick(plot_timeline.read_log(str(log)), rank=1)["iteration"] == 2
    out = tmp_path / "t.png"
    assert plot_timeline.main([str(log), "--iteration", "1", "--out", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("args, message", [
    (["--iteration", "7"], "no timing record of rank 0 at iteration 7"),
    (["--rank", "3"], "no timing record of rank 3"),
    (["--iteration", "0"], "has no exchange timeline"),
])
def test_a_record_it_cannot_draw_is_one_line_naming_it(tmp_path, capsys, args, message):
    log = tmp_path / "t.jsonl"
    log.write_text(json.dumps(_record(0, buckets=False)) + "\n")
    assert plot_timeline.main([str(log)] + args + ["--out", str(tmp_path / "t.png")]) == 1
    assert message in capsys.readouterr().err
