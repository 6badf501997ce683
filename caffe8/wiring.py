"""The composition root's wiring: registries filled, trainer + solver + exchange put together.

``engine/`` knows only its own registries and the solver-callback seam; this module imports the
packages that register layer and solver types and attaches the gradient exchange (``comm/``) to
a trainer as a callback, the way Caffe's tool adds its NCCL callback to a solver.
"""


def register_all():
    """Import every package that registers layer types and solver types (idempotent)."""
    import layers  # noqa: F401  (each layer module registers its Caffe type string)
    import solvers  # noqa: F401  (each solver module registers its type)


def make_exchange(world, comm_param, net):
    """The solver's ``comm`` block → the per-layer gradient exchange (a solver callback),
    on a communication thread when ``async: true``."""
    from comm.comm_thread import LayerwiseExchange
    from comm.exchange import GradientExchange
    return LayerwiseExchange(GradientExchange(world, comm_param, net), net,
                             asynchronous=getattr(comm_param, "async"))


def build_trainer(solver_path, world=None, log=None, timing=None, param=None):
    """A ``engine.trainer.Trainer`` for ``solver_path`` with the exchange attached when the
    world has more than one process."""
    register_all()
    from engine.trainer import Trainer
    trainer = Trainer(solver_path, world=world, log=log, timing=timing, param=param)
    if trainer.world.size > 1:
        try:
            trainer.add_callback(make_exchange(trainer.world, trainer.param.comm, trainer.net))
        except BaseException:
            trainer.close()
            raise
    return trainer
