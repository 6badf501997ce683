"""Fault corpus cases whose error named too little: each is now one line naming the file and
the line (a strom codec without its threshold; a layer name used twice)."""
import re

from caffe8.cli import main

NET = """layer { name: "x" type: "DummyData" top: "x" dummy_data_param { shape { dim: 2 dim: 3 } } }
layer { name: "ip" type: "InnerProduct" bottom: "x" top: "a" inner_product_param { num_output: 4 } }
layer { name: "ip" type: "InnerProduct" bottom: "a" top: "b"
  inner_product_param { num_output: 2 bias_term: false } }
layer { name: "l" type: "Reduction" bottom: "b" top: "l" loss_weight: 1 }
"""
SOLVER = 'net: "net.prototxt"\nbase_lr: 0.01\nlr_policy: "fixed"\nmax_iter: 2\n'


def _errors(capsys):
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return [line for line in err.splitlines() if line.startswith("caffe8: error:")]


def test_strom_without_its_threshold_names_the_solver_file_and_line(tmp_path, monkeypatch,
                                                                     capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "net.prototxt").write_text(NET.replace('name: "ip" type: "InnerProduct" bottom: '
                                                       '"a"', 'name: "ip2" type: "InnerProduct" '
                                                       'bottom: "a"'))
    (tmp_path / "solver.prototxt").write_text(SOLVER + 'comm {\n  codec: "strom"\n}\n')
    assert main(["train", "-solver", "solver.prototxt"]) == 1
    assert _errors(capsys) == ["caffe8: error: solver.prototxt:5:6: comm field 'strom_tau' "
                               "must be > 0 for codec 'strom', got 0"]


def test_a_layer_name_used_twice_says_so_with_both_lines(tmp_path, monkeypatch, capsys):
    """Caffe allows two layers of one name (BVLC's mnist_autoencoder has two "loss" layers),
    but weights go by name: the test net, sharing the train net's weights, takes the first
    'ip' layer's two blobs for the second's one. The error says the name is used twice."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "net.prototxt").write_text(NET)
    (tmp_path / "solver.prototxt").write_text(SOLVER + "test_iter: 1\ntest_interval: 1\n")
    assert main(["train", "-solver", "solver.prototxt"]) == 1
    (line,) = _errors(capsys)
    assert "layer 'ip'" in line and "incompatible number of blobs" in line
    assert re.search(r"the layer name 'ip' is used 2 times \(net\.prototxt:2:\d+, "
                     r"net\.prototxt:3:\d+\) and weights are matched by name", line), line
