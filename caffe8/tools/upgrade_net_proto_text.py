"""``caffe8 upgrade_net_proto_text IN OUT``: Caffe's tools/upgrade_net_proto_text.cpp
Shared code: caffe8.tools._upgrade."""
from caffe8.tools._upgrade import tool

NAME, HELP, GROUP, add_arguments, run = tool(
    "upgrade_net_proto_text", "NetParameter", False, "net prototxt",
    "upgrade a net prototxt (V0/V1 layers) to the current format")
