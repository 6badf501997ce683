"""The other seeds' methods as exchange codecs: APS (seed 001), Dettmers' 8-bit types (seed 000),
Strom's threshold quantisation (seed 004).

These codecs bring their own collective (allgather-based, summed in rank order, so every rank
gets bit-identical means), unlike fp32/fp16/fp8 whose wire format is summed inside the
allreduce. ``create_gather_codec(name, comm_param)`` returns a callable
``mean(comm, grad, key, iteration) -> array`` or None for names that are not of this kind.
"""
from comm.aps import APSCodec
from comm.dettmers import DettmersCodec
from comm.strom import StromCodec

GATHER_CODECS = ("aps", "dettmers", "strom")


def create_gather_codec(name, comm_param):
    """The mean function of gather codec ``name`` configured from the solver's ``comm`` block."""
    if name == "aps":
        codec = APSCodec(getattr(comm_param, "aps_format", "E5M2"), getattr(comm_param, "kahan", False))
        return lambda comm, grad, key, iteration: codec.allreduce_mean(comm, grad, iteration, str(key))
    if name == "dettmers":
        codec = DettmersCodec(getattr(comm_param, "dettmers_type", "dynamic_tree"))
        return lambda comm, grad, key, iteration: codec.allreduce_mean(comm, grad)
    if name == "strom":
        codec = StromCodec(getattr(comm_param, "strom_tau", 0.0))
        return lambda comm, grad, key, iteration: codec.allreduce_mean(comm, grad, key)
    return None
