"""Every ``caffe8`` subcommand: one module each (``caffe8 <name>`` is ``caffe8.tools.<name>``).

Each module defines ``NAME`` (the subcommand; Caffe's tool name where there is one), ``HELP``
(one line for ``caffe8 --help``), ``GROUP`` (its heading there, one of :data:`GROUPS`),
``add_arguments(parser)`` (its flags; the dispatcher, ``caffe8.cli``, also takes Caffe's
single-dash spellings) and ``run(args) -> int``. Optional: ``FILES``, {argument: "in" | "in-list"
| "out" | "dir"}, the file arguments the dispatcher checks before ``run`` (one clear line for a
missing or unwritable file), and ``RAW_ARGUMENTS = True`` for a tool that parses its own
arguments (everything after its name reaches ``run`` as ``args.rest``).

Adding a subcommand is one module and one line in :data:`TOOLS`. Modules import their heavy
dependencies inside ``run`` so that ``caffe8 --help`` stays fast; ``_``-prefixed modules are
what tools share.
"""
import importlib

#: the headings of ``caffe8 --help``, in order
GROUPS = ("training", "data", "models", "python", "cluster")

#: module names under caffe8.tools, in the order ``caffe8 --help`` lists them (within a group)
TOOLS = ("train", "test", "time", "device_query", "plot_training_log",
         "convert_imageset", "convert_mnist_data", "compute_image_mean", "extract_features",
         "inspect", "convert", "upgrade_net_proto_text", "upgrade_net_proto_binary",
         "upgrade_solver_proto_text", "draw_net", "pycaffe",
         "cluster", "bench", "perf_model")


def tool_modules():
    """The tool modules, imported, in :data:`TOOLS` order."""
    return [importlib.import_module(f"{__name__}.{name}") for name in TOOLS]


def add_subcommands(sub):
    """Register every tool as a subcommand of the CLI's subparsers ``sub``."""
    for module in tool_modules():
        p = sub.add_parser(module.NAME, help=module.HELP, description=module.HELP)
        module.add_arguments(p)
        p.set_defaults(fn=module.run, files=getattr(module, "FILES", {}))


def grouped_help(modules=None, columns=100):
    """The subcommands as ``caffe8 --help`` lists them: a heading per group, then each name
    and its help, wrapped at ``columns``."""
    import textwrap
    modules = modules or tool_modules()
    width = max(len(m.NAME) for m in modules) + 2
    lines = []
    for group in GROUPS:
        members = [m for m in modules if m.GROUP == group]
        if members:
            lines.append(f"{group}:")
            lines += [textwrap.fill(m.HELP, columns, initial_indent=f"  {m.NAME:<{width}}",
                                    subsequent_indent=" " * (width + 2)) for m in members]
    return "\n".join(lines)
