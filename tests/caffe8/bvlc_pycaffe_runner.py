"""Run BVLC's pycaffe unit tests (``python/caffe/test`` of a BVLC source tree, unchanged) with
``caffe`` = caffe8 (``caffe8.caffe_alias``, what ``caffe8 pycaffe enable`` installs) and print one
JSON line: tests run, the ids of failures and errors, and the tests left out because this
machine lacks what they need.

    python bvlc_pycaffe_runner.py BVLC_SRC

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
    from caffe8 import caffe_alias
    caffe_alias.install()     # BVLC's python/ folder is not on sys.path: its caffe is not built
    sys.path.insert(0, folder)
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
