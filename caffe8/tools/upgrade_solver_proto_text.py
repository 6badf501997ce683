"""``caffe8 upgrade_solver_proto_text IN OUT``: Caffe's tools/upgrade_solver_proto_text.cpp
Shared code: caffe8.tools._upgrade."""
from caffe8.tools._upgrade import tool

NAME, HELP, GROUP, add_arguments, run = tool(
    "upgrade_solver_proto_text", "SolverParameter", False, "solver prototxt",
    "upgrade a solver prototxt (solver_type enum) to the current format")
