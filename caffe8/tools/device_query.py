"""``caffe8 device_query``: Caffe's ``caffe device_query``: the properties of the GPU(s) given
by -gpu (all by default)."""
NAME = "device_query"
HELP = "show the GPU(s) properties (Caffe's device_query)"
GROUP = "training"


def add_arguments(p):
    p.add_argument("--gpu", help="device id(s), comma separated, or 'all' (default)")


def run(args):
    from caffe8.device import device_query
    for line in device_query(args.gpu):
        print(line)
    return 0
