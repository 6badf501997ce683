"""Run BVLC's pycaffe unit tests (``python/caffe/test`` of a BVLC source tree, unchanged) with
``caffe`` = caffe8 (the package beside this file) and print one JSON line: tests run, the ids of
failures and errors, and the tests left out because this machine lacks what they need.

    python run_bvlc.py BVLC_SRC

Left out: test_draw without graphviz's ``dot`` (it renders every BVLC prototxt to PNG).
"""
import json
import os
import shutil
import sys
import unittest


def _cases(suite):
    for item in suite:
        if isinstance(item, unittest.TestSuite):
            yield from _cases(item)
        else:
            yield item


def main(src):
    folder = os.path.join(src, "python", "caffe", "test")
    sys.path[:0] = [os.path.dirname(os.path.abspath(__file__)), folder]
    cases = list(_cases(unittest.defaultTestLoader.discover(folder, pattern="test_*.py")))
    skipped = []
    if shutil.which("dot") is None:
        skipped = [c.id() for c in cases if c.id().startswith("test_draw.")]
    suite = unittest.TestSuite(c for c in cases if c.id() not in skipped)
    with open(os.devnull, "w") as quiet:
        result = unittest.TextTestRunner(stream=quiet).run(suite)
    print(json.dumps({"run": result.testsRun, "skipped": skipped,
                      "failed": [(c.id(), text) for c, text in result.failures + result.errors]}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
