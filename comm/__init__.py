"""Gradient exchange: number formats, codecs, MPI ops and datatypes, allreduce algorithms, the communication thread."""
