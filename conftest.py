"""Repository-root pytest configuration: the repository root is importable, GPU tests skip cleanly."""
import pytest


def pytest_sessionstart(session):
    from tests.faults import mpich_shm
    session.config._mpich_shm_before = mpich_shm.mpich_files()


def pytest_sessionfinish(session):
    """MPICH's /dev/shm files that this session's jobs left (MPI_Abort, kill -9) are removed."""
    from tests.faults import mpich_shm
    before = getattr(session.config, "_mpich_shm_before", None)
    if before is not None:
        mpich_shm.remove_left(before)


def pytest_configure(config):
    from caffe8.wiring import register_all
    register_all()  # what `import caffe8` does: tests build nets through engine directly
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU and CuPy")
    config.addinivalue_line("markers", "mpi: runs rank programs under mpiexec")
    config.addinivalue_line("markers", "slow: full-size nets on the CPU (deselect with -m 'not slow')")


def pytest_collection_modifyitems(config, items):
    from caffe8.engine import backend
    if backend.gpu_available():
        return
    skip = pytest.mark.skip(reason="no CUDA GPU / CuPy on this machine")
    for item in items:
        if item.get_closest_marker("gpu") is not None:  # not keywords: they hold directory names
            item.add_marker(skip)
