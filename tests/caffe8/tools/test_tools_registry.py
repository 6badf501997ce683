"""Every subcommand is one module of caffe8.tools, registered by one line in TOOLS: each answers
--help with its own arguments, and ``caffe8 --help`` lists all of them under their groups, in
plain text."""
import os
import re

import pytest

import caffe8.tools
from caffe8.cli import main
from caffe8.tools import GROUPS, TOOLS, tool_modules
from tests.caffe8.tools.tool_helpers import cli

FIRST_ARGUMENT = {"train": "--solver", "test": "--model", "time": "--model",
                  "device_query": "--gpu", "plot_training_log": "CHART_TYPE",
                  "convert_imageset": "ROOTFOLDER/", "convert_mnist_data": "input_image_file",
                  "compute_image_mean": "INPUT_DB", "extract_features": "pretrained_net_param",
                  "inspect": "model", "convert": "src", "upgrade_net_proto_text": "IN",
                  "upgrade_net_proto_binary": "IN", "upgrade_solver_proto_text": "IN",
                  "draw_net": "input_net_proto_file", "cluster": "counters", "bench": "--elements",
                  "perf_model": "--model", "pycaffe": "{enable,disable,status}"}


def test_every_tool_module_is_registered_once_with_the_interface():
    folder = os.path.dirname(caffe8.tools.__file__)
    files = sorted(f[:-3] for f in os.listdir(folder)
                   if f.endswith(".py") and not f.startswith("_"))
    assert sorted(TOOLS) == files and len(set(TOOLS)) == len(TOOLS)
    modules = tool_modules()
    assert [m.NAME for m in modules] == list(TOOLS) and set(TOOLS) == set(FIRST_ARGUMENT)
    for m in modules:
        assert m.GROUP in GROUPS, m.NAME
        assert callable(m.add_arguments) and callable(m.run) and m.HELP.strip(), m.NAME
    # --help lists them group by group, so TOOLS keeps each group together
    assert [m.GROUP for m in modules] == sorted((m.GROUP for m in modules), key=GROUPS.index)


def test_caffe8_help_lists_every_subcommand_by_group_in_plain_text(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "`" not in out and "``" not in out
    listed, group = {}, None
    for line in out.splitlines():
        if re.fullmatch(r"[a-z]+:", line):
            group = line[:-1]
        elif group and re.match(r"  \w", line):
            listed[line.split()[0]] = group
    assert listed == {m.NAME: m.GROUP for m in tool_modules()}
    assert out.startswith("usage: caffe8 [-h] [--version] COMMAND ...")


@pytest.mark.parametrize("name", TOOLS)
def test_help(name, capsys):
    with pytest.raises(SystemExit) as e:
        cli(name, "--help")
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: caffe8 {name}") and FIRST_ARGUMENT[name] in out
