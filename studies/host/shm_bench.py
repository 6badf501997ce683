"""One tensor's sum through node-shared buffers against the message schedule, by size.

    mpiexec -n 2 python -m studies.host.shm_bench [--codec fp8] [--sizes 4K,64K,256K,1M,4M]
        [--repeat 60] [--waiter blocking|watchdog] [--csv runs/shm_bench.csv]

The same transport (rsag over all ranks) sums one buffer taken from its node-shared arena and
one plain buffer, taking turns; both results must be the same bytes. Times: medians (after 5
warm-up repetitions) of the slowest rank, microseconds. ``--waiter watchdog`` completes every
wait under the stall watchdog, as training does.
"""
import argparse
import csv
import os
import sys
import time

import numpy

from caffe8.comm.allreduce import SHARED_MIN_BYTES, create_transport
from caffe8.comm.collective import BLOCKING
from caffe8.comm.mpi import get_world, install_excepthook, mpi_module
from caffe8.comm.ops import padded_length, wire_op

SUFFIX = {"K": 1 << 10, "M": 1 << 20}


def parse_size(text):
    text = text.strip().upper()
    return int(text[:-1]) * SUFFIX[text[-1]] if text[-1] in SUFFIX else int(text)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--codec", default="fp8", choices=("fp8", "fp16", "fp32"))
    p.add_argument("--sizes", default="4K,64K,256K,1M,4M")
    p.add_argument("--repeat", type=int, default=60)
    p.add_argument("--waiter", default="blocking", choices=("blocking", "watchdog"))
    p.add_argument("--csv", default=None)
    args = p.parse_args(argv)
    world = get_world()
    if not world.is_mpi:
        p.error("needs mpi4py (run under mpiexec)")
    install_excepthook(world)
    MPI, comm = mpi_module(), world.comm
    waiter = BLOCKING
    if args.waiter == "watchdog":
        from caffe8.comm.watchdog import Watchdog
        waiter = Watchdog(comm, 60.0)
    transport = create_transport("rsag", comm, 0, waiter)
    wire = wire_op(args.codec)
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    lengths = [padded_length(n, wire.unit, world.size) for n in sizes]
    item = numpy.dtype(wire.dtype).itemsize
    if transport.reserve(sum(n * item + 64 for n in lengths)) is None:
        p.error(f"no node-shared arena: {transport.shared_reason}")
    rng = numpy.random.default_rng(world.rank)
    rows = []
    for n, length in zip(sizes, lengths):
        shared = transport.host_buffer(length, wire.dtype)
        plain = numpy.zeros(length, wire.dtype)
        if args.codec == "fp32":
            src = rng.standard_normal(length).astype(numpy.float32)
        else:   # finite, moderate codes: no saturation in the sums
            src = rng.integers(0, 0x3C00 if args.codec == "fp16" else 0x70, length).astype(wire.dtype)
        times = numpy.zeros((args.repeat, 2))
        for rep in range(args.repeat):
            for i, buf in enumerate((shared, plain)):
                buf[...] = src
                comm.Barrier()
                t = time.perf_counter()
                transport.sum(buf, wire)
                times[rep, i] = time.perf_counter() - t
        if not numpy.array_equal(shared, plain):
            raise SystemExit(f"{n} elements: the shared and the message sums differ")
        worst = numpy.empty_like(times)
        comm.Allreduce(times, worst, MPI.MAX)
        med = numpy.median(worst[5:], axis=0) * 1e6
        path = "shared" if shared.nbytes >= SHARED_MIN_BYTES else "messages (below the minimum)"
        rows.append(dict(codec=args.codec, elements=n, waiter=args.waiter,
                         arena_buffer_us=round(float(med[0]), 1),
                         plain_buffer_us=round(float(med[1]), 1), arena_path=path))
        if world.rank == 0:
            print(f"{args.codec} {n:>9,d} elements  arena buffer {med[0]:8.1f} us ({path})  "
                  f"plain buffer {med[1]:8.1f} us", flush=True)
    if world.rank == 0 and args.csv:
        os.makedirs(os.path.dirname(os.path.abspath(args.csv)), exist_ok=True)
        with open(args.csv, "w", newline="") as f:
            w = csv.DictWriter(f, list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    del shared, plain
    transport.free()
    if waiter is not BLOCKING:
        waiter.free()
    return 0


if __name__ == "__main__":
    sys.exit(main())
