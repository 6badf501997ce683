"""Rank program of the two-rank trajectory oracle (tests/engine/test_trajectory.py):
``mpiexec -n 2 python -m tests.engine.trajectory_prog SOLVER REFERENCE_NET INPUT...``.

Each rank trains through the wiring the CLI uses (fp32 exchange), records its own batch and
local gradients (the recorder runs before the exchange), checks every step against a fresh
reference Net, and after every step the ranks compare their parameters bit for bit. Rank 0
prints ``ORACLE OK`` or what failed."""
import sys

from caffe8 import wiring
from caffe8.comm.collective import bit_identical
from caffe8.engine.callbacks import SolverCallback
from tests.engine import trajectory


class ParameterAgreement(SolverCallback):
    """After each update (at the next step's start, and once at the end): do all ranks hold the
    same parameter bits? (``comm.collective.bit_identical``, the consistency check's own test)"""

    def __init__(self, net, world):
        self.net, self.world, self.disagreements = net, world, []
        self.step = 0

    def check(self):
        if not bit_identical(self.world, self.net.flat_data):
            self.disagreements.append(self.step)
        self.step += 1

    def on_start(self):
        self.check()


def main(solver_path, ref_path, inputs):
    wiring.register_all()
    world = wiring.make_world()
    trainer = wiring.build_trainer(solver_path, world)
    try:
        recorder = trajectory.GradientRecorder(trainer.net, inputs)
        agreement = ParameterAgreement(trainer.net, world)
        trainer.callbacks.insert(0, recorder)
        trainer.callbacks.append(agreement)
        trainer.step(trainer.param.max_iter)
        agreement.check()
        names = trajectory.param_names(trainer.net)
    finally:
        trainer.close()
    with open(ref_path) as f:
        ref = f.read()
    bad = trajectory.failures(trajectory.step_errors(ref, recorder.steps), names)
    bad += [f"ranks' parameters differ after step {k}" for k in agreement.disagreements]
    every = world.comm.gather(bad, root=0)
    if world.rank == 0:
        problems = [f"rank {r}: {b}" for r, rank_bad in enumerate(every) for b in rank_bad]
        print("ORACLE OK" if not problems else "ORACLE FAILED\n" + "\n".join(problems), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], sys.argv[3:]))
