#!/usr/bin/env python
"""Weak scaling (seed figure 7): per-process batch fixed, P = 1, 2, 4, ... processes.

Usage (from the repository root)::

    python scripts/weak_scaling.py --out docs/figures/weak --procs 1,2,4 --codecs fp32,fp8 \
        --async false --processes-per-node 2 --max-iter 30

For every codec, communication mode and P it writes a copy of the solver and net into
OUT/p<P>_<codec>_<sync|async>/, trains with ``mpiexec -n P python -m engine.cli train
--timing-log ...`` (one log per rank), and writes OUT/weak_scaling.csv (mean iteration seconds,
samples/s, speedup vs one process without communication) and OUT/weak_scaling.png.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _runs import scaling_main  # noqa: E402  (after the path fix above)

if __name__ == "__main__":
    sys.exit(scaling_main(sys.argv[1:], "weak", __doc__.splitlines()[0]))
