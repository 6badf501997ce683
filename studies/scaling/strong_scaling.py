#!/usr/bin/env python
"""Strong scaling: global batch fixed and divided by P, P = 1, 2, 4, ... processes.

Usage (from the repository root)::

    python -m studies.scaling.strong_scaling --out docs/figures/strong --procs 1,2,4 --global-batch 8 \
        --codecs fp32,fp8 --async false --processes-per-node 2 --max-iter 30

Each P trains a copy of the net whose data layers' batch is GLOBAL/P (P must divide it), with the
solver's ``comm`` block set per codec and mode; writes OUT/strong_scaling.csv and
OUT/strong_scaling.png (throughput and speedup vs one process). See weak_scaling.py for the layout
of OUT.
"""
import sys

from studies.scaling._sweep import scaling_main


def main(argv=None):
    return scaling_main(sys.argv[1:] if argv is None else argv, "strong", __doc__.splitlines()[0])


if __name__ == "__main__":
    sys.exit(main())
