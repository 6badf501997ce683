"""Caffe's glog line format, so Caffe's log tools (tools/extra/parse_log.py) read our logs.

Line: ``<L><MMDD> <HH:MM:SS.uuuuuu> <thread id, width 5> <file>:<line>] <message>``.
Numbers are formatted like C++ ostream defaults (6 significant digits, ``%g``).
Only rank 0 writes INFO lines; warnings and errors are written by every rank. glog's
``GLOG_minloglevel`` is honoured: 1 drops INFO lines, 2 warnings too, 3 errors too. A tqdm
progress bar on the terminal is cleared before a line is written and drawn again after it.
"""
import datetime
import os
import sys
import threading


def fmt(x):
    """A float as C++'s ``ostream << float`` prints it (6 significant digits)."""
    return "%g" % float(x)


_BASENAMES = {}    # a code object's file name -> its base name, as the log lines show it

#: glog's levels, by the letter that starts a line
LEVELS = {"I": 0, "W": 1, "E": 2}


def env_min_level():
    """glog's ``GLOG_minloglevel`` from the environment (0 when unset or not a number)."""
    try:
        return int(os.environ.get("GLOG_minloglevel") or 0)
    except ValueError:
        return 0


def _progress_bars():
    """tqdm's class while it has bars open (they are cleared around a log line), else None."""
    tqdm = getattr(sys.modules.get("tqdm"), "tqdm", None)
    return tqdm if tqdm is not None and getattr(tqdm, "_instances", None) else None


def warning(message):
    """A glog warning line on stderr, from code that has no log at hand (every rank writes it)."""
    GLog(enabled=False).warning(message, _depth=3)


class GLog:
    """Writes glog-format lines to stderr and optionally a file.

    ``enabled=False`` (non-root ranks) drops INFO lines but keeps warnings and errors.
    ``min_level``: the lowest level written (glog's minloglevel; default ``GLOG_minloglevel``).
    Messages must not contain blank lines: parse_log.py crashes on an empty line.
    """

    def __init__(self, path=None, enabled=True, stream=None, min_level=None):
        self.enabled = enabled
        self.min_level = env_min_level() if min_level is None else int(min_level)
        self._stream = stream    # None: whatever sys.stderr is when a line is written
        self.file = open(path, "a", encoding="utf-8") if (path and enabled) else None
        self._lock = threading.Lock()
        self._pid = os.getpid()

    @property
    def stream(self):
        """Where lines go: the stream given, else the current ``sys.stderr`` (not the one of
        when the log was made, which a test harness or a notebook may have closed since)."""
        return self._stream if self._stream is not None else sys.stderr

    def _write(self, level, message, depth):
        if LEVELS[level] < self.min_level:
            return
        frame = sys._getframe(depth)  # cheap, unlike inspect.stack(), which reads source files
        now = datetime.datetime.now()
        name = _BASENAMES.get(frame.f_code.co_filename)
        if name is None:
            name = _BASENAMES[frame.f_code.co_filename] = os.path.basename(frame.f_code.co_filename)
        prefix = (f"{level}{now.month:02d}{now.day:02d} {now.hour:02d}:{now.minute:02d}:"
                  f"{now.second:02d}.{now.microsecond:06d} {self._pid % 100000:>5d} "
                  f"{name}:{frame.f_lineno}] ")
        message = str(message)
        if "\n" not in message:   # the common case, without a list of one (100,000-layer nets)
            if not message.strip():
                return
            text = prefix + message + "\n"
        else:
            lines = [prefix + part for part in message.split("\n") if part.strip()]
            if not lines:
                return  # a blank line would crash parse_log.py
            text = "\n".join(lines) + "\n"
        bars = _progress_bars()
        if bars is None:
            self._emit(text)
        else:
            with bars.external_write_mode(file=self.stream):  # the bar off the line's way
                self._emit(text)

    def _emit(self, text):
        with self._lock:
            self.stream.write(text)
            self.stream.flush()
            if self.file:
                self.file.write(text)
                self.file.flush()

    def info(self, message, _depth=2):
        if self.enabled:
            self._write("I", message, _depth)

    def warning(self, message, _depth=2):
        self._write("W", message, _depth)

    def error(self, message, _depth=2):
        self._write("E", message, _depth)

    def __call__(self, message):
        self.info(message, _depth=3)

    def close(self):
        if self.file:
            self.file.close()
            self.file = None
