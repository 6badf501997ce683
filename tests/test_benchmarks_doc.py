"""docs/BENCHMARKS.md stays short and true: at most 400 lines, opening with one headline table of
today's figures in the agreed columns; every row's command is a section of the file and a row
measured before the GEMM change says it needs re-measuring; every `python -m` module and every
`caffe8` subcommand the file shows exists; every figure path it names is there; and the links of
it and of docs/history/ (the past rounds, one file a day) reach files and headings that exist."""
import glob
import importlib.util
import itertools
import os
import re
import shutil
import subprocess

import pytest

from caffe8.cli import build_parser

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = os.path.join(REPO, "docs", "BENCHMARKS.md")
HISTORY = os.path.join(REPO, "docs", "history")
COLUMNS = ["figure", "caffe8", "peer", "ratio", "machine", "date", "commit", "command", "state"]
#: host GEMM on one OpenBLAS thread, products split into blocks by caffe8: rows measured before
#: it are marked for re-measuring
GEMM_CHANGE = "5c4b28f"
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def _read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def _prose(text):
    """The text without its fenced code blocks (their lines are not headings or links)."""
    return FENCE.sub("", text)


def _code(text):
    """Fenced blocks and inline code spans: where commands are written."""
    return FENCE.findall(text) + re.findall(r"`([^`]+)`", _prose(text))


def slug(heading):
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(text):
    seen, out = {}, set()
    for m in re.finditer(r"^#{1,6} (.+)$", _prose(text), re.M):
        base = slug(m.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def _cells(line):
    return [c.strip() for c in line.strip().strip("|").split("|")]


def headline():
    """(header, rows) of the first table under '## Headline figures'."""
    text = _read(DOC)
    block = text[text.index("## Headline figures"):]
    lines = block.splitlines()
    start = next(i for i, l in enumerate(lines) if l.startswith("|"))
    table = list(itertools.takewhile(lambda l: l.startswith("|"), lines[start:]))
    return _cells(table[0]), [_cells(l) for l in table[2:]]


def _git(*args):
    return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True)


def test_short_and_opens_with_the_headline_table():
    text = _read(DOC)
    assert len(text.splitlines()) <= 400
    assert re.findall(r"^## .+$", _prose(text), re.M)[0] == "## Headline figures"
    header, rows = headline()
    assert header == COLUMNS
    assert len(rows) >= 10


def test_every_row_names_a_defined_machine_a_date_a_commit_and_its_section():
    text = _read(DOC)
    machines = set(re.findall(r"Machine \*\*(\w+)\*\*", text)) | (
        {"any"} if "**any**:" in text else set())
    targets = anchors(text)
    _, rows = headline()
    for row in rows:
        cell = dict(zip(COLUMNS, row))
        assert len(row) == len(COLUMNS), row
        assert cell["machine"] in machines, row
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", cell["date"]), row
        assert re.fullmatch(r"[0-9a-f]{7,40}", cell["commit"]), row
        links = re.findall(r"\]\(#([^)]+)\)", cell["command"])
        assert links and set(links) <= targets, row
        assert cell["state"] in ("re-measure", "tested", "current"), row


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_rows_measured_before_the_gemm_change_say_re_measure():
    if _git("cat-file", "-e", GEMM_CHANGE + "^{commit}").returncode:
        pytest.skip("a checkout without the history")
    checked = 0
    for row in headline()[1]:
        cell = dict(zip(COLUMNS, row))
        if _git("cat-file", "-e", cell["commit"] + "^{commit}").returncode:
            continue
        if _git("merge-base", "--is-ancestor", cell["commit"], GEMM_CHANGE).returncode == 0:
            assert cell["state"] == "re-measure", row
            checked += 1
    assert checked


def test_commands_name_modules_and_subcommands_that_exist():
    code = _code(_read(DOC))
    modules = {m for c in code for m in re.findall(r"python -m ([\w.]+)", c)}
    subcommands = {s for c in code for s in re.findall(r"(?:^|[\s(])caffe8 ([a-z_]+)", c, re.M)}
    assert modules and subcommands
    for name in sorted(modules):
        assert importlib.util.find_spec(name) is not None, f"python -m {name}: no such module"
    registered = set(build_parser()._subparsers._group_actions[0].choices)
    assert subcommands <= registered, subcommands - registered


def _expand(path):
    m = re.search(r"\{([^}]*)\}", path)
    if not m:
        return [path]
    return [p for alt in m.group(1).split(",")
            for p in _expand(path[:m.start()] + alt + path[m.end():])]


def test_figure_paths_exist():
    paths = set(re.findall(r"docs/figures/[\w./{},-]*[\w}]", _read(DOC)))
    assert paths
    for path in sorted(paths):
        for one in _expand(path):
            assert os.path.exists(os.path.join(REPO, one)), one


def _docs():
    return [DOC] + sorted(glob.glob(os.path.join(HISTORY, "*.md")))


@pytest.mark.parametrize("path", _docs(), ids=os.path.basename)
def test_links_reach_files_and_headings(path):
    for target in re.findall(r"\]\(([^)\s]+)\)", _prose(_read(path))):
        if re.match(r"[a-z]+:", target):
            continue
        file, _, anchor = target.partition("#")
        full = os.path.normpath(os.path.join(os.path.dirname(path), file)) if file else path
        assert os.path.exists(full), f"{os.path.basename(path)}: {target}"
        if anchor and full.endswith(".md"):
            assert anchor in anchors(_read(full)), f"{os.path.basename(path)}: {target}"


def test_history_files_are_dated_records_linked_from_the_benchmarks():
    files = sorted(glob.glob(os.path.join(HISTORY, "*")))
    assert files
    text = _read(DOC)
    for path in files:
        name = os.path.basename(path)
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}\.md", name), name
        first = _read(path).split("\n\n")[:2]
        assert first[0].startswith("# ") and name[:-3] in first[0], name
        assert "historical record" in first[1], name
        assert len(re.findall(r"\b[0-9a-f]{7}\b", first[1])) >= 2, name   # its commit range
        assert f"(history/{name})" in text, name
