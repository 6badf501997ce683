"""The composition root's wiring: registries filled, trainer + solver + exchange put together.

``engine/`` knows only its own registries and the solver-callback seam; this module imports the
packages that register layer and solver types, checks the solver's ``comm`` block, and attaches
the gradient exchange (``comm/``) to a trainer as a callback, the way Caffe's tool adds its NCCL
callback to a solver.
"""


def register_all():
    """Import every package that registers layer types and solver types (idempotent)."""
    import layers  # noqa: F401  (each layer module registers its Caffe type string)
    import solvers  # noqa: F401  (each solver module registers its type)


def make_exchange(world, comm_param, net):
    """The solver's ``comm`` block → the per-layer gradient exchange (a solver callback), every
    collective under the collective watchdog (``comm.stall_timeout``), the world's included."""
    from comm.exchange import Exchange
    from comm.watchdog import Watchdog
    watchdog = Watchdog(world.comm, comm_param.stall_timeout)
    world.watchdog = watchdog
    return Exchange(world, comm_param, net, watchdog)


def build_trainer(solver_path, world=None, log=None, timing=None, param=None):
    """A ``engine.trainer.Trainer`` for ``solver_path`` with the exchange attached when the
    world has more than one process. The ``comm`` block is checked first on every rank, for
    single-process runs too, before any collective."""
    register_all()
    from comm.config import validate_comm
    from engine.prototxt import parse_file
    from engine.trainer import Trainer
    from engine.world import SingleProcessWorld
    world = world or SingleProcessWorld()
    param = param if param is not None else parse_file(solver_path, "SolverParameter")
    validate_comm(param.comm, world.size)
    trainer = Trainer(solver_path, world=world, log=log, timing=timing, param=param)
    if trainer.world.size > 1:
        try:
            trainer.add_callback(make_exchange(trainer.world, trainer.param.comm, trainer.net))
        except BaseException:
            trainer.close()
            raise
    return trainer
