"""The README's examples are real: its comm block parses with the solver schema, its quick start
has exactly two commands, and every `caffe8` subcommand it shows exists."""
import os
import re

from caffe8.cli import build_parser
from engine.prototxt import parse_text

README = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md")


def _text():
    with open(README, encoding="utf-8") as f:
        return f.read()


def test_quick_start_is_two_commands():
    block = re.search(r"## Quick start\s+```\n(.*?)```", _text(), re.S).group(1)
    lines = [l for l in block.splitlines() if l.strip()]
    assert len(lines) == 2
    assert "mpiexec -n 2" in lines[0] and "caffe8 train" in lines[0]
    assert "pytest" in lines[1]


def test_comm_block_parses_as_a_solver_field():
    block = re.search(r"```\n(comm \{.*?\n\})\n```", _text(), re.S).group(1)
    sp = parse_text(block, "README.md", "SolverParameter")
    assert sp.comm.codec == "fp8" and sp.comm.quantile == sp.comm.quantile  # parsed, not NaN
    assert getattr(sp.comm, "async") is True and sp.comm.samples == 1024


def test_subcommands_shown_exist():
    block = re.search(r"## Command line.*?```\n(.*?)```", _text(), re.S).group(1)
    shown = set(re.findall(r"^caffe8 (\w+)", block, re.M))
    sub = build_parser()._subparsers._group_actions[0].choices
    assert shown and shown <= set(sub)
