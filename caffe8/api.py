"""pycaffe's surface: ``import caffe8 as caffe`` and use it as ``caffe``.

Nets (``Net``, ``TRAIN``/``TEST``), solvers (``SGDSolver`` ... ``get_solver``), the device
(``set_mode_cpu``, ``set_mode_gpu``, ``set_device``, ``set_random_seed``), ``io``,
``Classifier``, ``Detector``, ``NetSpec`` with ``layers``/``params``, ``proto.caffe_pb2``,
``coord_map``, ``Timer``, and the multi-GPU names mapped onto MPI (``solver_count`` is the
world size, ``solver_rank`` the rank, ``NCCL`` a no-op, ``has_nccl()`` False).
"""
import importlib

from caffe8.wiring import register_all

register_all()

from caffe8 import io, proto  # noqa: E402
from caffe8.classifier import Classifier  # noqa: E402
from caffe8.detector import Detector  # noqa: E402
from caffe8.device import (NCCL, Timer, has_nccl, layer_type_list, set_device,  # noqa: E402
                           set_mode_cpu, set_mode_gpu, set_multiprocess, set_random_seed,
                           set_solver_count, set_solver_rank, solver_count, solver_rank)
from caffe8 import coord_map  # noqa: E402, F401  (pycaffe's caffe.coord_map)
from caffe8 import draw  # noqa: E402, F401  (pycaffe's caffe.draw; pydot loads when it draws)
from caffe8 import layers  # noqa: E402  (the layer package doubles as NetSpec's factory, `L`)
from caffe8.engine import net_spec  # noqa: E402, F401  (pycaffe's caffe.net_spec)
from caffe8.engine.net_spec import NetSpec, params, to_proto  # noqa: E402
importlib.import_module("caffe8.proto.caffe_pb2")  # so that caffe8.proto.caffe_pb2 resolves
from caffe8.pylog import init_log, log  # noqa: E402
from caffe8.pynet import Blob, Layer, Net  # noqa: E402
from caffe8.pysolver import (AdaDeltaSolver, AdaGradSolver, AdamSolver,  # noqa: E402
                             NesterovSolver, RMSPropSolver, SGDSolver, Solver, get_solver)

#: Caffe's Phase enum, as pycaffe exposes it
TRAIN, TEST = 0, 1

__all__ = ["Net", "Blob", "Layer", "TRAIN", "TEST", "Solver", "SGDSolver", "NesterovSolver",
           "AdaGradSolver", "RMSPropSolver", "AdaDeltaSolver", "AdamSolver", "get_solver",
           "set_mode_cpu", "set_mode_gpu", "set_device", "set_random_seed", "layer_type_list",
           "io", "proto", "Classifier", "Detector", "NetSpec", "layers", "params", "to_proto",
           "init_log", "log", "Timer", "NCCL", "has_nccl", "solver_count", "set_solver_count",
           "solver_rank", "set_solver_rank", "set_multiprocess", "coord_map", "net_spec", "draw"]
