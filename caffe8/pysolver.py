"""pycaffe's solvers: ``caffe.SGDSolver(path)`` ... ``caffe.get_solver(path)``.

A solver is the training loop of ``engine.trainer.Trainer`` put together by ``caffe8.wiring``
(``read_solver``, ``build_trainer``) as ``caffe8 train``'s is, so a script under
``mpiexec -n P`` trains data parallel with the solver's ``comm`` exchange, as the tool does.
"""
from caffe8.engine.callbacks import SolverCallback
from caffe8.engine.errors import SolverError


class _PythonCallback(SolverCallback):
    """pycaffe's ``solver.add_callback(on_start, on_gradients_ready)``."""

    def __init__(self, on_start, on_gradients_ready):
        self._on_start, self._on_ready = on_start, on_gradients_ready

    def on_start(self):
        self._on_start()

    def on_gradients_ready(self):
        self._on_ready()


class Solver:
    """A solver built from a solver prototxt; see the module docstring.

    ``solver_type`` forces the algorithm as pycaffe's typed constructors do (``SGDSolver(path)``
    runs SGD whatever the file's ``type``); None keeps the file's type (``get_solver``).
    """

    solver_type = None

    def __init__(self, solver_file):
        from caffe8 import pylog
        from caffe8.pynet import Net
        from caffe8.wiring import build_trainer, make_world, read_solver
        param = read_solver(solver_file, self.solver_type)
        world = make_world()
        log = pylog.logger(world.rank)
        if param.has("solver_mode"):  # the mode is set_mode_gpu()'s, as in BVLC's pycaffe
            from caffe8.device import note_solver_mode
            note_solver_mode(param.solver_mode, log)
        self._trainer = build_trainer(str(solver_file), world=world, log=log, param=param)
        self._net = Net._wrap(self._trainer.net)
        self._test_nets = [Net._wrap(n) for n in self._trainer.test_nets]

    @property
    def net(self):
        return self._net

    @property
    def test_nets(self):
        return list(self._test_nets)

    @property
    def iter(self):
        return self._trainer.iter

    @property
    def param(self):
        """The parsed SolverParameter."""
        return self._trainer.param

    @property
    def lr(self):
        """pycaffe's ``SGDSolver.lr`` (Caffe's GetLearningRate): the rate of the next update."""
        return self._trainer.solver.learning_rate()

    @property
    def type(self):
        """Caffe's type string of the algorithm ("SGD", "Adam", ...)."""
        from caffe8.engine.solver import SOLVERS
        cls = type(self._trainer.solver)
        return next(name for name, c in SOLVERS.items() if c is cls)

    def step(self, iters):
        """Run ``iters`` iterations (tests, display and snapshots as the solver file says)."""
        from caffe8.device import check_mode
        check_mode("Solver.step")
        self._trainer.step(int(iters))

    def solve(self, resume_file=None, resume=None):
        """Train to ``max_iter`` (Caffe's Solve), optionally resuming from a solver state."""
        from caffe8.device import check_mode
        check_mode("Solver.solve")
        self._trainer.solve(resume_file=resume_file or resume)

    def restore(self, path):
        self._trainer.restore(str(path))

    def snapshot(self):
        """Write the model and solver state now; returns their paths."""
        return self._trainer.snapshot()

    def apply_update(self):
        """One parameter update from the current gradients (Caffe's ApplyUpdate)."""
        self._trainer.solver.apply_update()

    def share_weights(self, net):
        """Let ``net`` use this solver's train-net weights (layers of the same name)."""
        net.share_with(self._net)

    def add_callback(self, on_start, on_gradients_ready=None):
        """Call ``on_start()`` at the start of every iteration and ``on_gradients_ready()``
        once the gradients are final (after the exchange's own callback, under MPI).
        ``add_callback(nccl)`` with a :class:`caffe8.NCCL` is accepted and does nothing (the
        MPI exchange is built in)."""
        from caffe8.device import NCCL
        if isinstance(on_start, NCCL) and on_gradients_ready is None:
            return
        if on_gradients_ready is None:
            raise SolverError("add_callback(on_start, on_gradients_ready): give both functions "
                              "(or one caffe8.NCCL)")
        self._trainer.add_callback(_PythonCallback(on_start, on_gradients_ready))

    def close(self):
        """End the exchange's threads (under MPI); the solver cannot train afterwards."""
        self._trainer.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _typed(name, type_string):
    cls = type(name, (Solver,), {"solver_type": type_string,
                                 "__doc__": f"pycaffe's ``{name}(path)``: the {type_string} "
                                            "solver, whatever the file's ``type``."})
    cls.__module__ = __name__
    return cls


SGDSolver = _typed("SGDSolver", "SGD")
NesterovSolver = _typed("NesterovSolver", "Nesterov")
AdaGradSolver = _typed("AdaGradSolver", "AdaGrad")
RMSPropSolver = _typed("RMSPropSolver", "RMSProp")
AdaDeltaSolver = _typed("AdaDeltaSolver", "AdaDelta")
AdamSolver = _typed("AdamSolver", "Adam")


def get_solver(solver_file):
    """The solver of the type the file names (``type``, or the legacy ``solver_type``)."""
    if not str(solver_file):
        raise SolverError("get_solver: no solver file given")
    return Solver(solver_file)
