"""``caffe8 draw_net``: Caffe's python/draw_net.py through ``caffe8.draw`` (pycaffe's
``caffe.draw``). The output format is the file's extension (.png, .svg, .pdf need graphviz's
``dot``; .dot needs nothing)."""
from caffe8.engine.errors import CaffeError
from caffe8.tools._common import require_file

NAME = "draw_net"
HELP = "draw a net prototxt as a graph (.png/.svg/.dot, by the output's extension)"
GROUP = "models"


def add_arguments(p):
    p.add_argument("input_net_proto_file", help="input network prototxt file")
    p.add_argument("output_image_file", help="output image file")
    p.add_argument("--rankdir", default="LR",
                   help="one of TB (top-bottom, i.e. vertical), RL (right-left, i.e. horizontal)"
                   " or another valid dot option (default LR)")
    p.add_argument("--phase", default="ALL", type=str.upper, choices=("TRAIN", "TEST", "ALL"),
                   help="which network phase to draw; ALL draws every layer (default)")
    p.add_argument("--display_lrm", "--display-lrm", action="store_true",
                   help="show the non-zero learning rate multipliers of learning layers")


def run(args):
    from google.protobuf import text_format
    from caffe8 import draw
    from caffe8.engine.proto import caffe_pb2
    require_file(args.input_net_proto_file, "net prototxt")
    net = caffe_pb2.NetParameter()
    try:
        with open(args.input_net_proto_file, encoding="utf-8") as f:
            text_format.Merge(f.read(), net)
    except Exception as e:  # protobuf's ParseError, a UnicodeDecodeError
        raise CaffeError(f"{args.input_net_proto_file}: not a NetParameter prototxt: "
                         f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    print(f"Drawing net to {args.output_image_file}")
    phase = None if args.phase == "ALL" else caffe_pb2.Phase.Value(args.phase)
    try:
        draw.draw_net_to_file(net, args.output_image_file, args.rankdir, phase, args.display_lrm)
    except OSError as e:
        raise CaffeError(f"{args.output_image_file}: cannot write: {e.strerror or e}") from None
    return 0
