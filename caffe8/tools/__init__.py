"""Caffe's tools as ``caffe8`` subcommands (``caffe8 convert_imageset ...``).

Each module here is one tool and defines ``NAME`` (the subcommand, Caffe's tool name), ``HELP``
(one line for ``caffe8 --help``), ``add_arguments(parser)`` (Caffe's flags; the CLI translates
Caffe's single-dash spellings) and ``run(args) -> int``. ``TOOLS`` lists them in ``--help``
order; the CLI registers every entry, so adding a tool is one module and one line here.
Modules import their heavy dependencies inside ``run`` so that ``caffe8 --help`` stays fast.
"""
import importlib

#: module names under caffe8.tools, in the order ``caffe8 --help`` lists them
TOOLS = ("convert_imageset", "convert_mnist_data", "compute_image_mean", "extract_features",
         "upgrade_net_proto_text", "upgrade_net_proto_binary", "upgrade_solver_proto_text",
         "draw_net", "plot_training_log", "perf_model")


def tool_modules():
    """The tool modules, imported."""
    return [importlib.import_module(f"{__name__}.{name}") for name in TOOLS]


def add_subcommands(sub):
    """Register every tool as a subcommand of the CLI's subparsers ``sub``."""
    for module in tool_modules():
        p = sub.add_parser(module.NAME, help=module.HELP, description=module.HELP)
        module.add_arguments(p)
        p.set_defaults(fn=module.run)
