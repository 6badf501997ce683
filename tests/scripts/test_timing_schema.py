"""docs/timing_schema.json against real `caffe8 train --timing-log` output, plus the record's
semantics (split arithmetic, per-layer sums, the emulated layer's known delay)."""
import copy
import json
import os
import subprocess
import sys

import jsonschema
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
SCHEMA_PATH = os.path.join(REPO, "docs", "timing_schema.json")
TINY_LAYERS = [("data", "DummyData"), ("fc1", "InnerProduct"), ("fc1/emulate", "EmulatedCompute"),
               ("fc2", "InnerProduct"), ("loss", "EuclideanLoss")]
EMULATED_MS = (4.0, 8.0)   # tiny_net.prototxt's emulate_param
MAX_ITER = 6               # tiny_solver.prototxt
MPIEXEC = os.path.join(os.path.dirname(sys.executable), "mpiexec")


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def _train(cmd, cwd):
    res = subprocess.run(cmd, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]


def _records(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


@pytest.fixture(scope="module")
def validator():
    with open(SCHEMA_PATH, encoding="utf-8") as f:
        schema = json.load(f)
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


@pytest.fixture(scope="module")
def single_log(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("timing1")
    log = str(tmp / "t.jsonl")
    _train([sys.executable, "-m", "caffe8.cli", "train", "--solver",
            os.path.join(DATA, "tiny_solver.prototxt"), "--timing-log", log], str(tmp))
    return _records(log)


def _check_semantics(rec):
    split, layers = rec["split"], rec["layers"]
    assert [(l["name"], l["type"]) for l in layers] == TINY_LAYERS
    fb = sum(l["forward"] + l["backward"] for l in layers)
    assert split["ForwardBackward"] == pytest.approx(fb, rel=1e-9, abs=1e-12)
    comm = sum(l["comm"] + l["encode"] + l["decode"] for l in layers)
    assert split["Communication"] == pytest.approx(comm, rel=1e-9, abs=1e-12)
    assert split["D2H"] == pytest.approx(sum(l["d2h"] for l in layers), abs=1e-12)
    assert split["H2D"] == pytest.approx(sum(l["h2d"] for l in layers), abs=1e-12)
    # Other is the rest of the wall time, with the quantile pass counted at what it took in this
    # iteration (the split's Quantile is its share amortised over N iterations).
    this_quantile = sum(l["quantile"] for l in layers)
    measured = sum(v for k, v in split.items() if k not in ("Other", "Quantile")) + this_quantile
    assert measured <= rec["wall"] + 1e-6
    assert split["Other"] == pytest.approx(rec["wall"] - measured, abs=1e-9)
    emu = layers[2]
    # the sleeping layer's own times hold its sleeps (and not, say, the next layer's time: a
    # second is far beyond any scheduling delay; a share of ForwardBackward is not, on a
    # loaded machine the other layers' times grow)
    assert EMULATED_MS[0] / 1e3 <= emu["forward"] < EMULATED_MS[0] / 1e3 + 1.0
    assert EMULATED_MS[1] / 1e3 <= emu["backward"] < EMULATED_MS[1] / 1e3 + 1.0


def test_single_process_records_validate(validator, single_log):
    assert [r["iteration"] for r in single_log] == list(range(MAX_ITER))
    for rec in single_log:
        validator.validate(rec)
        assert rec["rank"] == 0
        _check_semantics(rec)
        assert all(l[ph] == 0.0 for l in rec["layers"] for ph in ("comm", "d2h", "h2d"))


@pytest.mark.parametrize("breaks", [
    lambda r: r.pop("wall"),
    lambda r: r.update(extra=1),
    lambda r: r["split"].update(Comm=0.0),
    lambda r: r["split"].pop("Quantile"),
    lambda r: r["layers"][1].update(forward=-1e-3),
    lambda r: r["layers"][0].pop("h2d"),
    lambda r: r["layers"][0].update(name=""),
    lambda r: r.update(iteration=1.5),
    lambda r: r.update(rank=-1),
    lambda r: r["split"].update(Other="0.1"),
], ids=["no-wall", "extra-top", "extra-split", "no-quantile", "negative", "no-h2d", "empty-name",
        "float-iter", "negative-rank", "string-time"])
def test_schema_rejects_malformed_records(validator, single_log, breaks):
    rec = copy.deepcopy(single_log[0])
    breaks(rec)
    with pytest.raises(jsonschema.ValidationError):
        validator.validate(rec)


@pytest.mark.mpi
def test_two_rank_records_validate(validator, tmp_path):
    """Two ranks (one log each, mpiexec's MPMD form), fp8 exchange: per-layer comm is recorded
    for exactly the layers that own parameters."""
    solver = tmp_path / "solver.prototxt"
    with open(os.path.join(DATA, "tiny_solver.prototxt"), encoding="utf-8") as f:
        text = f.read().replace('net: "tiny_net.prototxt"',
                                f'net: "{os.path.join(DATA, "tiny_net.prototxt")}"')
    solver.write_text(text + 'comm { codec: "fp8" async: false }\n')
    logs = [str(tmp_path / f"r{r}.jsonl") for r in range(2)]
    cmd = [MPIEXEC]
    for r in range(2):
        cmd += ([":"] if r else []) + ["-n", "1", sys.executable, "-m", "caffe8.cli", "train",
                                       "--solver", str(solver), "--timing-log", logs[r]]
    _train(cmd, str(tmp_path))
    for rank, log in enumerate(logs):
        recs = _records(log)
        assert [r["iteration"] for r in recs] == list(range(MAX_ITER))
        for rec in recs:
            validator.validate(rec)
            assert rec["rank"] == rank
            _check_semantics(rec)
            has_params = [l["name"] in ("fc1", "fc2") for l in rec["layers"]]
            assert [l["comm"] > 0 for l in rec["layers"]] == has_params
