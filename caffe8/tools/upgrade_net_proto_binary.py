"""``caffe8 upgrade_net_proto_binary IN OUT``: Caffe's tools/upgrade_net_proto_binary.cpp
Shared code: caffe8.tools._upgrade."""
from caffe8.tools._upgrade import tool

NAME, HELP, GROUP, add_arguments, run = tool(
    "upgrade_net_proto_binary", "NetParameter", True, "binary net (.caffemodel)",
    "upgrade a binary net (.caffemodel with V0/V1 layers) to the current format")
