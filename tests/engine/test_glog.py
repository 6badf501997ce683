"""engine.glog: Caffe's line format, GLOG_minloglevel, and a terminal progress bar cleared
before each line (never a bar glued to the start of a log line)."""
import io
import re

import pytest
from tqdm import tqdm

from caffe8.engine import glog
from caffe8.engine.glog import GLog

LINE = re.compile(r"^([IWE])\d{4} \d\d:\d\d:\d\d\.\d{6} +\d+ test_glog\.py:\d+\] (.*)$")


def written(stream):
    return [LINE.match(line).groups() for line in stream.getvalue().splitlines()]


@pytest.mark.parametrize("level,kept", [("0", "IWE"), ("1", "WE"), ("2", "E"), ("3", ""),
                                        ("", "IWE"), ("x", "IWE")])
def test_glog_minloglevel_drops_the_lower_levels(monkeypatch, level, kept):
    monkeypatch.setenv("GLOG_minloglevel", level)
    out = io.StringIO()
    log = GLog(stream=out)
    log("an info")
    log.warning("a warning")
    log.error("an error")
    assert [letter for letter, _ in written(out)] == list(kept)
    assert glog.env_min_level() == (int(level) if level.isdigit() else 0)


def test_an_explicit_level_wins_over_the_environment(monkeypatch):
    monkeypatch.setenv("GLOG_minloglevel", "2")
    out = io.StringIO()
    GLog(stream=out, min_level=0)("kept")
    assert written(out) == [("I", "kept")]


class Terminal(io.StringIO):
    """stdout and stderr of one terminal: what both write, in order."""


def test_a_progress_bar_is_cleared_before_a_log_line_and_drawn_again(monkeypatch):
    term = Terminal()
    monkeypatch.setattr("sys.stdout", term)
    monkeypatch.setattr("sys.stderr", term)
    bar = tqdm(total=10, file=term, unit="iter", mininterval=0, ascii=True)
    try:
        bar.update(3)
        log = GLog(stream=term)
        log("Iteration 3, loss = 1")
    finally:
        bar.close()
    text = term.getvalue()
    at = text.index("I")  # the log line's first character
    # the bar drawn before the line was erased first (a carriage return, blanks over it, a
    # carriage return), so the line starts at column 0 of an empty row ...
    assert re.search(r"3/10 [^\r]*iter/s\]\r +\r$", text[:at]), repr(text[:at])
    # ... and the bar is drawn again after it
    assert re.search(r"\] Iteration 3, loss = 1\n\r[^\n]*3/10", text[at:]), repr(text[at:])
