"""Every tool of caffe8.tools is a subcommand that answers --help with its Caffe arguments."""
import pytest

from caffe8.tools import TOOLS, tool_modules
from tests.caffe8.tools.tool_helpers import cli

FIRST_ARGUMENT = {"convert_imageset": "ROOTFOLDER/", "convert_mnist_data": "input_image_file",
                  "compute_image_mean": "INPUT_DB", "extract_features": "pretrained_net_param",
                  "upgrade_net_proto_text": "IN", "upgrade_net_proto_binary": "IN",
                  "upgrade_solver_proto_text": "IN", "draw_net": "input_net_proto_file",
                  "plot_training_log": "CHART_TYPE", "perf_model": "--model"}


def test_every_caffe_tool_is_registered():
    assert [m.NAME for m in tool_modules()] == list(TOOLS) == list(FIRST_ARGUMENT)


@pytest.mark.parametrize("name", TOOLS)
def test_help(name, capsys):
    with pytest.raises(SystemExit) as e:
        cli(name, "--help")
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: caffe8 {name}") and FIRST_ARGUMENT[name] in out
