"""A ``caffe`` package that is caffe8, for running BVLC's pycaffe tests unchanged (only the test
suite puts this folder on ``sys.path``). ``caffe.io``, ``caffe.draw``, ``caffe.proto``, ... are
caffe8's own modules, registered under ``caffe.`` names so that ``import caffe.draw`` and
``from caffe.proto import caffe_pb2`` find them."""
import importlib
import sys

from caffe8.api import *  # noqa: F401, F403
from caffe8.api import __all__  # noqa: F401

for _name in ("io", "draw", "coord_map", "proto", "proto.caffe_pb2", "classifier", "detector"):
    sys.modules[f"{__name__}.{_name}"] = importlib.import_module(f"caffe8.{_name}")
sys.modules[f"{__name__}.net_spec"] = importlib.import_module("caffe8.engine.net_spec")
draw = sys.modules[f"{__name__}.draw"]
