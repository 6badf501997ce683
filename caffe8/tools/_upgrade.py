"""What upgrade_net_proto_text / _binary and upgrade_solver_proto_text share (Caffe's
tools/upgrade_*.cpp): read the file as Caffe does (protobuf's text or binary parser), upgrade it
with ``engine.upgrade`` (V0/V1 ``layers`` → ``layer``, BatchNorm params, V0 ``input`` /
``input_dim`` → an Input layer; a solver's ``solver_type`` enum → ``type``), and write it as
WriteProtoToTextFile / WriteProtoToBinaryFile do (protobuf's text format as its C++ library
prints it, floats included: ``1``, not Python's ``1.0``; its serialisation). A file already in
the latest format is logged as such ("File already in latest proto format") and written
unchanged."""
import io
from caffe8.engine.errors import CaffeError
from caffe8.tools._common import logger, require_file


def add_in_out(p, what):
    p.add_argument("input", metavar="IN", help=f"old {what} file to read")
    p.add_argument("output", metavar="OUT", help=f"upgraded {what} file to write")


def read_pb(path, type_name, binary):
    from google.protobuf import text_format
    from caffe8.engine.proto import caffe_pb2
    require_file(path, "input file")
    pb = getattr(caffe_pb2, type_name)()
    try:
        if binary:
            with open(path, "rb") as f:
                pb.ParseFromString(f.read())
        else:
            with open(path, encoding="utf-8") as f:
                text_format.Merge(f.read(), pb)
    except Exception as e:  # protobuf's ParseError / DecodeError, a UnicodeDecodeError
        kind = "binary" if binary else "text"
        raise CaffeError(f"{path}: failed to parse input {kind} file as {type_name}: "
                         f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    return pb


def upgraded(pb, path):
    """The upgraded copy of NetParameter or SolverParameter ``pb``."""
    from caffe8.engine import upgrade
    from caffe8.engine.net_graph import upgrade_net_input
    from caffe8.engine.proto.convert import from_pb, to_pb

    def net(n):  # Caffe's UpgradeNetAsNeeded: layers, then the inputs into an Input layer
        return upgrade_net_input(upgrade.upgrade_net(n))
    msg = from_pb(pb, str(path))
    if pb.DESCRIPTOR.name == "NetParameter":
        msg = net(msg)
    else:
        for field in ("net_param", "train_net_param"):
            if msg.has(field):
                setattr(msg, field, net(getattr(msg, field)))
        if msg.has("test_net_param"):
            msg.test_net_param = [net(n) for n in msg.test_net_param]
        upgrade.upgrade_solver(msg)
    return to_pb(msg)


def cpp_float(value, double=False):
    """A float as protobuf's C++ text format prints it (SimpleFtoa / SimpleDtoa): 6 (15)
    significant digits when they read back to the same value, else 9 (17); ``inf``, ``nan``."""
    import math
    import numpy
    if math.isinf(value) or math.isnan(value):
        return ("-" if value < 0 else "") + ("inf" if math.isinf(value) else "nan")
    kind, digits = (numpy.float64, (15, 17)) if double else (numpy.float32, (6, 9))
    value = float(kind(value))  # what the field holds
    short = "%.*g" % (digits[0], value)
    return short if kind(short) == value else "%.*g" % (digits[1], value)


def cpp_text(pb, indent=0):
    """``pb`` in protobuf's text format as the C++ library writes it (TextFormat::Print):
    fields in number order, two spaces per level, floats by :func:`cpp_float`."""
    from google.protobuf import descriptor, text_format
    fd = descriptor.FieldDescriptor
    pad, out = "  " * indent, io.StringIO()
    for field, value in pb.ListFields():
        for item in (value if field.is_repeated else [value]):
            if field.type == fd.TYPE_MESSAGE:
                out.write(f"{pad}{field.name} {{\n{cpp_text(item, indent + 1)}{pad}}}\n")
            elif field.type in (fd.TYPE_FLOAT, fd.TYPE_DOUBLE):
                out.write(f"{pad}{field.name}: {cpp_float(item, field.type == fd.TYPE_DOUBLE)}\n")
            else:
                out.write(f"{pad}{field.name}: ")
                text_format.PrintFieldValue(field, item, out)
                out.write("\n")
    return out.getvalue()


def run_upgrade(args, type_name, binary):
    log = logger()
    pb = read_pb(args.input, type_name, binary)
    new = upgraded(pb, args.input)
    if new == pb:
        log.error(f"File already in latest proto format: {args.input}")
    try:
        if binary:
            with open(args.output, "wb") as f:
                f.write(new.SerializeToString())
        else:
            with open(args.output, "w", encoding="utf-8") as f:
                f.write(cpp_text(new))
    except OSError as e:
        raise CaffeError(f"{args.output}: cannot write: {e.strerror}") from None
    form = "binary" if binary else "text"
    log(f"Wrote upgraded {type_name} {form} proto to {args.output}")
    return 0


def tool(name, type_name, binary, what, help_text):
    """(NAME, HELP, GROUP, add_arguments, run) of one upgrade tool, for its module's globals."""
    def add_arguments(p):
        add_in_out(p, what)

    def run(args):
        return run_upgrade(args, type_name, binary)
    return name, help_text, "models", add_arguments, run
