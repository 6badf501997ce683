"""The ``caffe8`` command: the dispatcher of the subcommands, one module each in
``caffe8.tools`` (``caffe8 --help`` lists them by group).

Caffe's own spellings work as well as the ``--long`` ones: ``caffe8 train -solver S -weights W
-gpu 0``, ``caffe8 time -model M -iterations 10``, ``-flag=value``. Run under ``mpiexec -n P``
for data-parallel training; without mpiexec (or with one process) caffe8 never imports mpi4py,
so the single-process path works with no MPI installed. The dispatcher checks each tool's file
arguments before it runs, and turns an error into one line (under MPI: once per job, ending
every rank).
"""
import argparse
import os
import sys

from caffe8.engine.errors import CaffeError, relative_to_cwd
from caffe8.wiring import launched_by_mpiexec

DESCRIPTION = ("caffe8: Caffe's command line tool, with data-parallel training under mpiexec\n"
               "and an 8-bit float gradient exchange.")


# --- file arguments, checked before any work -------------------------------------------------
#: every command's log flags (its own file arguments: the tool's FILES): "log" is a file to
#: write whose folder is made when missing (as -log_dir's), "dir" a folder made when missing.
#: The kinds of a tool's FILES: "in" (a file to read), "in-list" (comma-separated files to
#: read), "out" (a file to write, in a folder that exists)
_LOG_ARGS = {"log": "log", "log_dir": "dir"}


def _flag(dest):
    return dest if dest in ("src", "dst") else "--" + dest.replace("_", "-")


def _check_readable(flag, path):
    if os.path.isdir(path):
        raise CaffeError(f"{flag} {path}: is a directory, not a file")
    try:
        with open(path, "rb"):
            pass
    except OSError as e:
        raise CaffeError(f"{flag} {path}: cannot be read: {e.strerror}{relative_to_cwd(path)}") \
            from None


def _check_writable(flag, path, folder, make_folder=False):
    """``path`` can be written as a file (``folder`` False) or used as a folder (True): it is
    not the other kind, nothing on the way to it is a file, and (for a file) its folder exists
    or (``make_folder``) can be made."""
    if os.path.exists(path) and os.path.isdir(path) != folder:
        kind = "a directory, not a file" if not folder else "a file, not a directory"
        raise CaffeError(f"{flag} {path}: is {kind}")
    parent = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(parent):
        if not folder and not make_folder:
            raise CaffeError(f"{flag} {path}: folder {os.path.dirname(path) or '.'} does not "
                             "exist")
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise CaffeError(f"{flag} {path}: {parent} is a file, not a directory")


def check_file_arguments(args):
    """Every file argument of ``args`` (its tool's ``FILES`` and the log flags) checked up
    front, each failure one line naming the flag: inputs exist, are files and can be read;
    outputs are not folders and their folder exists (or, for logs, can be made)."""
    table = dict(getattr(args, "files", None) or {}, **_LOG_ARGS)
    for dest, kind in table.items():
        value = getattr(args, dest, None)
        if value is None or (dest == "snapshot" and value == "latest"):
            continue
        flag = _flag(dest)
        if kind == "in-list":
            parts = str(value).split(",")
            if not all(parts):
                raise CaffeError(f"{flag} {value}: empty file name in the comma-separated list")
            for part in parts:
                _check_readable(flag, part)
        elif kind == "in":
            _check_readable(flag, str(value))
        else:
            _check_writable(flag, str(value), folder=kind == "dir", make_folder=kind == "log")


class _Version(argparse.Action):
    """``--version``: the release and, from a clone, the commit (``caffe8.version``); asked of
    git only when the flag is given."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS,
                 help="show caffe8's version (with the commit, in a git clone) and exit"):
        super().__init__(option_strings, dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        from caffe8.version import describe
        print(f"caffe8 {describe()}")
        parser.exit()


def build_parser():
    """``caffe8``'s parser: a subcommand per module of ``caffe8.tools``, listed by group."""
    from caffe8.tools import add_subcommands, grouped_help, tool_modules
    ap = argparse.ArgumentParser(
        prog="caffe8", usage="caffe8 [-h] [--version] COMMAND ...", description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=grouped_help(tool_modules()) + "\n\nFlags may be spelled as in Caffe: -solver, "
        "-weights, -model, -iterations, -gpu, -sigint_effect ...\n'caffe8 COMMAND --help' "
        "lists a command's own.")
    ap.add_argument("--version", "-version", action=_Version)
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND", prog="caffe8",
                            help=argparse.SUPPRESS)
    add_subcommands(sub)
    return ap


def _raw_tools():
    """Names of the tools that parse their own arguments (``RAW_ARGUMENTS``)."""
    from caffe8.tools import tool_modules
    return {m.NAME: m for m in tool_modules() if getattr(m, "RAW_ARGUMENTS", False)}


def _long_options(parser):
    """Every ``--name`` option of the parser and its subcommands, without the dashes."""
    names = set()
    for action in parser._actions:
        names.update(o[2:] for o in action.option_strings if o.startswith("--"))
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                names |= _long_options(sub)
    return names


def translate_caffe_flags(argv, parser=None):
    """Caffe's gflags spellings → argparse's: ``-solver x`` / ``-solver=x`` → ``--solver``.

    Only names of known long options are translated (``-h`` and negative numbers stay).
    Arguments after a tool that parses its own (``bench``) reach it unchanged.
    """
    names = _long_options(parser or build_parser())
    raw = _raw_tools()
    out = []
    for k, arg in enumerate(argv):
        if arg in raw and not any(a.startswith("-") for a in argv[:k]):
            return out + list(argv[k:])
        if arg.startswith("-") and not arg.startswith("--"):
            name = arg[1:].split("=", 1)[0]
            if name in names:
                arg = "-" + arg
        out.append(arg)
    return out


def limit_blas_threads():
    """Under mpiexec, split the cores among the ranks of this node instead of oversubscribing
    them (OpenBLAS would start one thread per core in every rank). Must run before NumPy loads;
    the user's own settings win."""
    if not launched_by_mpiexec():
        return
    try:
        local = int(os.environ.get("MPI_LOCALNRANKS")
                    or os.environ.get("OMPI_COMM_WORLD_LOCAL_SIZE") or 0)
    except ValueError:
        local = 0
    if local <= 0:
        return
    from caffe8.engine.cpu_share import usable_cores  # stdlib only: NumPy is not loaded yet
    threads = str(max(1, usable_cores() // local))
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, threads)


def main(argv=None):
    from caffe8.engine.message import freeze_after_builds
    limit_blas_threads()
    freeze_after_builds()  # one run, then exit: its nets are never collected (message.py)
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    raw = _raw_tools().get(argv[0]) if argv else None
    if raw is not None:  # everything after its name, --help included, is the tool's
        args = argparse.Namespace(command=raw.NAME, rest=argv[1:], fn=raw.run)
    else:
        with _only_rank0_prints():  # usage and argparse's error: once per job, not per rank
            args = parser.parse_args(translate_caffe_flags(argv, parser))
    try:
        check_file_arguments(args)
        return args.fn(args)
    except CaffeError as e:
        return _fail(1, f"caffe8: error: {e}", agree=getattr(e, "shared", True))
    except KeyboardInterrupt:
        return _fail(130, None)


def _launch_rank():
    """This process's rank as the process manager tells it (before MPI is initialised)."""
    for var in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return 0


def _only_rank0_prints():
    """Under mpiexec, ranks other than 0 write nothing inside the block (before MPI is
    initialised every rank meets the same argument error; rank 0 reports it)."""
    import contextlib
    import io
    if not launched_by_mpiexec() or _launch_rank() == 0:
        return contextlib.nullcontext()
    stack = contextlib.ExitStack()
    stack.enter_context(contextlib.redirect_stdout(io.StringIO()))
    stack.enter_context(contextlib.redirect_stderr(io.StringIO()))
    return stack


def _mpi_running():
    if not launched_by_mpiexec() or "mpi4py.MPI" not in sys.modules:
        return False
    from mpi4py import MPI
    return MPI.Is_initialized() and not MPI.Is_finalized()


def _fail(code, text, agree=True):
    """Report a failure: one line on stderr and exit status ``code``.

    Under MPI one rank's error must end the whole job (never a hang in a collective):
    ``comm.mpi.fail_job`` returns when every rank failed alike (the job then ends cleanly,
    rank 0 printing, nothing left behind by MPI_Abort), else the first failing rank prints,
    rank-prefixed, and aborts the job. Before MPI is initialised every rank meets the same
    error: rank 0 prints it, the others exit quietly with the same status."""
    if _mpi_running():
        from caffe8.comm.mpi import fail_job
        fail_job(text, code, agree=agree)
        return code
    if launched_by_mpiexec() and _launch_rank() != 0:
        return code
    if text:
        sys.stdout.flush()
        sys.stderr.write(text.rstrip("\n") + "\n")  # one write: never split by other output
        sys.stderr.flush()
    return code


if __name__ == "__main__":
    sys.exit(main())
