"""studies/host/big_net.py: the net it writes (layer count, chain, size per layer), the log phases it
reads, and one real run on a small net."""
import os

import pytest

from caffe8.engine.prototxt import parse_file
from studies.host import big_net


def test_written_net_is_a_chain_of_the_four_kinds(tmp_path):
    path = tmp_path / "n.prototxt"
    size = big_net.write_net(path, 10)
    net = parse_file(path)
    assert [l.type for l in net.layer] == ["Input"] + ["Convolution", "ReLU", "BatchNorm",
                                                       "Scale"] * 2 + ["Convolution", "ReLU"]
    assert [l.bottom for l in net.layer[1:]] == [[f"x{i}"] for i in range(10)]
    assert net.layer[-1].top == ["x10"]
    # about 490 bytes a layer: 100,000 layers make the issue's ~50 MB file
    assert 450 < (size - big_net.write_net(tmp_path / "m.prototxt", 0)) / 10 < 530


def test_phases_read_from_glog_lines():
    log = ("I1127 23:59:58.500000 1 trainer.py:57] Initializing solver from parameters: \n"
           "I1127 23:59:59.250000 1 net.py:73] Initializing net from parameters: \n"
           "I1128 00:00:02.000000 1 net.py:205] Network initialization done.\n"
           "I1128 00:00:03.000000 1 net.py:205] Network initialization done.\n")
    parsed, built = big_net.phases(log, 23 * 3600 + 59 * 60 + 58.0)
    assert parsed == pytest.approx(1.25) and built == pytest.approx(4.0)  # across midnight
    with pytest.raises(RuntimeError, match="Network initialization done"):
        big_net.phases("I1127 00:00:00.0 1 x.py:1] nothing\n", 0)


def test_small_run_writes_rows(tmp_path, capsys):
    out = tmp_path / "big.csv"
    assert big_net.main(["--layers", "40", "--rounds", "1", "--out", str(out)]) == 0
    header, row = out.read_text().splitlines()
    assert header.split(",") == list(big_net.FIELDS)
    values = dict(zip(big_net.FIELDS, row.split(",")))
    assert values["layers"] == "40"
    assert 0 < float(values["parsed_s"]) <= float(values["built_s"]) <= float(values["exit_s"])
