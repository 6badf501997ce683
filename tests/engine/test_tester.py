"""engine/tester.py: the test passes of a job spread over its ranks (as Caffe's root solver runs
test_iter batches once), and the averages over passes and ranks."""
import time

import numpy
import pytest

from caffe8.engine.net import Net
from caffe8.engine.prototxt import parse_text
from caffe8.engine.tester import average_outputs, passes_per_rank
from caffe8.wiring import register_all

register_all()


@pytest.mark.parametrize("iterations, ranks, each", [(100, 1, 100), (100, 4, 25), (10, 4, 3),
                                                     (3, 4, 1), (1, 2, 1), (0, 4, 0)])
def test_passes_per_rank_cover_the_job_once(iterations, ranks, each):
    assert passes_per_rank(iterations, ranks) == each
    assert each * ranks >= iterations and (each - 1) * ranks < iterations or each == 0


class FourRanks:
    """Rank 0 of 4 whose peers report what the test hands them (sums times 4)."""
    rank, size = 0, 4

    def __init__(self, others):
        self.others = others

    def allreduce_sum_array(self, array):
        array += self.others


def _counting_net():
    net = Net(parse_text('layer { name: "in" type: "Input" top: "x" '
                         'input_param { shape { dim: 2 } } }\n'
                         'layer { name: "p" type: "Power" bottom: "x" top: "y" '
                         'power_param { shift: 1 } }', "t.prototxt"), phase="TEST")
    calls = []
    net.add_forward_hook(lambda i, layer: calls.append(i) if layer.name == "p" else None)
    return net, calls


def test_each_rank_runs_its_share_and_the_means_average_over_ranks():
    net, calls = _counting_net()
    others = numpy.array([3.0 * 2.0, 3.0 * 4.0, 0.0])  # three ranks whose y means were 2 and 4
    outputs, means, loss = average_outputs(net, 100, FourRanks(others))
    assert len(calls) == 25                       # not 100: the job's 100 passes, 4 ranks
    assert [name for name, _, _ in outputs] == ["y"]
    numpy.testing.assert_allclose(means, [(1.0 + 6.0) / 4, (1.0 + 12.0) / 4])
    assert loss == 0.0


class OneRank:
    rank, size = 0, 1


def test_caffe8_test_logs_each_element_under_the_blobs_own_name_as_caffe(tmp_path):
    """BVLC's tools/caffe.cpp test(): ``Batch i, <output name> = score`` for every element
    (no index), then ``<output name> = mean`` per element, weighted losses with their product."""
    from caffe8.engine.tester import run_test
    path = tmp_path / "t.prototxt"
    path.write_text('layer { name: "in" type: "DummyData" top: "x" dummy_data_param { '
                    'shape { dim: 2 } data_filler { type: "constant" value: 2 } } }\n'
                    'layer { name: "p" type: "Power" bottom: "x" top: "ip" '
                    'power_param { scale: 1.5 } }\n'
                    'layer { name: "s" type: "Reduction" bottom: "x" top: "loss" '
                    'loss_weight: 0.5 }\n')
    lines = []
    scores, loss = run_test(str(path), None, 2, OneRank(), lines.append)
    assert "Network initialization done." in lines  # the net's setup log first, as Caffe's
    lines = lines[lines.index("Running for 2 iterations."):]
    assert lines == ["Running for 2 iterations.",
                     "Batch 0, ip = 3", "Batch 0, ip = 3", "Batch 0, loss = 4",
                     "Batch 1, ip = 3", "Batch 1, ip = 3", "Batch 1, loss = 4",
                     "Loss: 2", "ip = 3", "ip = 3", "loss = 4 (* 0.5 = 2 loss)"]
    assert scores == {"ip": [3.0, 3.0], "loss": 4.0} and loss == 2.0


DEPLOY = """name: "deploy"
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 2 dim: 3 dim: 8 dim: 8 } } }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
  convolution_param { num_output: 4 kernel_size: 3 } }
layer { name: "relu1" type: "ReLU" bottom: "conv1" top: "conv1" }
layer { name: "fc" type: "InnerProduct" bottom: "conv1" top: "fc" inner_product_param { num_output: 5 } }
layer { name: "prob" type: "Softmax" bottom: "fc" top: "prob" }
"""


def test_time_runs_every_layers_backward_on_a_deploy_net(monkeypatch):
    """BVLC's time() calls Backward on each layer whether or not the net needs it: a deploy net
    (no loss, so no layer needs backward) still reports its layers' backward work."""
    from caffe8.engine.layer import LAYERS
    from caffe8.engine.tester import run_time
    calls = {}
    for kind in ("Convolution", "ReLU", "InnerProduct", "Softmax"):
        real = LAYERS[kind].backward

        def counted(self, top, propagate_down, bottom, real=real, kind=kind):
            calls[kind] = calls.get(kind, 0) + 1
            assert not any(propagate_down)  # the net's flags: nothing needs a bottom gradient
            return real(self, top, propagate_down, bottom)
        monkeypatch.setattr(LAYERS[kind], "backward", counted)
    lines = []
    fwd, bwd = run_time(parse_text(DEPLOY, "deploy.prototxt"), 3, lines.append, phase="TEST")
    assert calls == {"Convolution": 3, "ReLU": 3, "InnerProduct": 3, "Softmax": 3}
    assert len(bwd) == 5 and bwd[1] > 0 and bwd[3] > 0
    assert any(line.startswith("Average Backward pass: ") for line in lines)


def test_time_reports_the_nets_own_pass_beside_the_layers(monkeypatch):
    """After Caffe's lines, ``time`` runs passes through the Net itself and splits such a pass
    into its layers' calls (timed by the Net's hooks) and the Net's own dispatch, the rest; on a
    GPU each layer's host time follows (here the GPU branch with the host times given)."""
    import re
    from caffe8.engine import tester
    lines = []
    tester.run_time(parse_text(DEPLOY, "deploy.prototxt"), 2, lines.append, phase="TEST")
    text = "\n".join(lines)
    found = re.search(r"Average Forward-Backward through the Net: ([0-9.e-]+) ms; timed layer "
                      r"by layer with its hooks, ([0-9.e-]+) ms: the layers' calls ([0-9.e-]+) "
                      r"ms, the Net's dispatch and the hooks ([0-9.e-]+) ms\.", text)
    assert found and float(found.group(1)) > 0 and 0 < float(found.group(3)) < float(found.group(2))
    assert float(found.group(4)) == pytest.approx(float(found.group(2)) - float(found.group(3)),
                                                  rel=1e-4, abs=1e-4)
    assert lines.index(found.group(0)) < len(lines) - 2          # before Total Time
    assert "host forward" not in text                            # the host is the device here
    net = Net(parse_text(DEPLOY, "deploy.prototxt"), phase="TEST")
    monkeypatch.setattr(tester.backend, "on_gpu", lambda: True)
    monkeypatch.setattr(tester, "net_pass_ms", lambda net, iterations: 7.0)
    monkeypatch.setattr(tester, "layer_calls_in_net_ms", lambda net, iterations: (8.0, 5.0))
    gpu = []
    host = numpy.arange(2 * len(net.layers), dtype=float).reshape(2, -1)
    tester._log_framework_cost(net, 2, host, gpu.append)
    assert gpu[0] == ("Average Forward-Backward through the Net: 7 ms; timed layer by layer with "
                      "its hooks, 8 ms: the layers' calls 5 ms, the Net's dispatch and the hooks "
                      "3 ms.")
    assert gpu[3].endswith("host forward: 1 ms, host backward: 6 ms.")   # layer 1: n + 1
    assert gpu[-1] == f"Average host time of the layers: {tester.fmt(host.sum())} ms."


def test_the_layers_calls_in_a_net_pass_are_timed_by_its_hooks(monkeypatch):
    """layer_calls_in_net_ms adds up the time between the Net's before and after hooks of
    every layer, forward and backward: layers that sleep a known time are found in it."""
    from caffe8.engine import tester
    from caffe8.engine.layer import LAYERS
    monkeypatch.setattr(LAYERS["ReLU"], "forward",
                        lambda self, bottom, top: time.sleep(0.01))
    net = Net(parse_text(DEPLOY, "deploy.prototxt"), phase="TEST")
    hooked, inside = tester.layer_calls_in_net_ms(net, 3)
    assert 10 <= inside <= hooked < 10 + 1000
