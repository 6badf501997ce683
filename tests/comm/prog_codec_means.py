"""Rank program: mpiexec -n 3 python tests/comm/prog_codec_means.py {dettmers|aps|strom}

Every rank draws its gradients from a seed that depends on its rank, runs the codec's
``allreduce_mean`` for a few steps, and checks (1) all ranks hold the same bytes and (2) they
equal a reference that this rank computes alone by simulating every rank with the codec's pure
pieces (compress/decompress per simulated rank, float64 sums for bounds, rank-order float32
sums for exactness). A failed check aborts the whole job (non-zero exit, no hang).
"""
import os
import sys

import numpy

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from mpi4py import MPI  # noqa: E402

SHAPE = (7, 33)
STEPS = 4


def grads(rank, step):
    rng = numpy.random.default_rng([rank, step, 12345])
    g = rng.standard_normal(SHAPE).astype(numpy.float32)
    return g * numpy.float32(10.0 ** (rank - 1))      # ranks differ in scale on purpose


def check_dettmers(comm, P):
    from comm.dettmers import DettmersCodec, KINDS
    for kind in KINDS:
        codec = DettmersCodec(kind)
        for step in range(STEPS):
            mean = codec.allreduce_mean(comm, grads(comm.rank, step))
            ref = numpy.zeros(SHAPE, numpy.float32)
            for r in range(P):
                ref += codec.decompress(*codec.compress(grads(r, step)))
            yield f"dettmers {kind} step {step}", mean, ref / numpy.float32(P)


def rank_order_sum(parts, kahan):
    """float32 sum of ``parts`` in list order; Kahan-compensated when ``kahan`` (written here,
    independently of comm.aps)."""
    s = numpy.zeros(SHAPE, numpy.float32)
    c = numpy.zeros(SHAPE, numpy.float32)
    for x in parts:
        if not kahan:
            s = s + x
            continue
        y = x - c
        t = s + y
        c = (t - s) - y
        s = t
    return s


def check_aps(comm, P):
    from comm.aps import APSCodec, local_exponent
    for fmt in ("E5M2", "E4M3", "E3M0"):
        for kahan in (False, True):
            codec = APSCodec(fmt, kahan=kahan, fp32_iters=1)
            for step in range(STEPS):
                mean = codec.allreduce_mean(comm, grads(comm.rank, step), iteration=step)
                gs = [grads(r, step) for r in range(P)]
                if step < 1:      # hybrid: float32 for the first iteration
                    ref = rank_order_sum(gs, kahan) / numpy.float32(P)
                else:             # power-of-two unscaling commutes with the float32 sums
                    e = max(local_exponent(g) for g in gs)
                    parts = [codec.decompress(*codec.compress(g, e, P, iteration=step)) for g in gs]
                    ref = rank_order_sum(parts, kahan) / numpy.float32(P)
                    exact = sum(p.astype(numpy.float64) for p in parts) / P
                    tol = 1e-6 * numpy.abs(exact).max()
                    assert numpy.allclose(mean, exact, rtol=0, atol=tol), (fmt, kahan, step)
                yield f"aps {fmt} kahan={kahan} step {step}", mean, ref


def check_strom(comm, P):
    from comm.strom import StromCodec
    codec = StromCodec(tau=0.75)
    sims = [StromCodec(tau=0.75) for _ in range(P)]
    for step in range(STEPS):
        mean = codec.allreduce_mean(comm, grads(comm.rank, step), key="w")
        ref = numpy.zeros(SHAPE, numpy.float32)
        for r in range(P):
            ref += sims[r].decompress(*sims[r].compress(grads(r, step), key="w"))
        yield f"strom step {step}", mean, ref / numpy.float32(P)


def main():
    comm = MPI.COMM_WORLD
    P = comm.Get_size()
    check = {"dettmers": check_dettmers, "aps": check_aps, "strom": check_strom}[sys.argv[1]]
    try:
        for what, mean, ref in check(comm, P):
            blobs = comm.allgather(mean.tobytes())
            assert len(set(blobs)) == 1, f"{what}: ranks differ"
            assert mean.dtype == numpy.float32 and mean.shape == SHAPE, what
            assert numpy.array_equal(mean, ref), f"{what}: max diff {numpy.abs(mean - ref).max()}"
    except Exception:
        import traceback
        traceback.print_exc()
        sys.stdout.flush()
        comm.Abort(1)
        os._exit(1)       # never reach the Barrier below, whatever Abort does
    comm.Barrier()
    if comm.rank == 0:
        print(f"{sys.argv[1]}: OK on {P} ranks", flush=True)


if __name__ == "__main__":
    main()
