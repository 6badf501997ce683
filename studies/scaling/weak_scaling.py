#!/usr/bin/env python
"""Weak scaling (Oyama et al.'s figure 7): per-process batch fixed, P = 1, 2, 4, ... processes.

Usage (from the repository root)::

    python -m studies.scaling.weak_scaling --out runs/weak --procs 1,2,4 --codecs fp32,fp8 \
        --async false,true --processes-per-node 2 --max-iter 30 --repeats 3 --stat median

For every codec, communication mode and P it writes a copy of the solver and net into
OUT/p<P>_<codec>_<sync|async>/, trains with ``mpiexec -n P python -m caffe8.cli train
--timing-log ...`` (one log per rank), and writes OUT/weak_scaling.csv (mean iteration seconds,
samples/s, speedup vs one process without communication) and OUT/weak_scaling.png.
``--emulate LAYER=FWD_MS:BWD_MS,...`` inserts EmulatedCompute layers (GPU-like compute that
sleeps, leaving the cores to the communication) and ``--repeats N`` runs every point N times,
round robin, pooling the iterations (for a shared, noisy machine).
"""
import sys

from studies.scaling._sweep import scaling_main


def main(argv=None):
    return scaling_main(sys.argv[1:] if argv is None else argv, "weak", __doc__.splitlines()[0])


if __name__ == "__main__":
    sys.exit(main())
