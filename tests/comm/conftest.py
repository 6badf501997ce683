"""Fixtures of the comm tests."""
import pytest

from caffe8.comm import kernels
from caffe8.engine import backend


def pytest_configure(config):
    config.addinivalue_line("markers", "device: runs on the GPU where there is one, else on the "
                            "stand-in device (the 'device' fixture); scripts/gpu_check runs "
                            "them with the gpu tests")


@pytest.fixture(params=kernels.paths())
def path(request):
    """Each compiled CPU kernel path of this machine in turn (``kernels.use_path``)."""
    before = kernels.current_path()
    kernels.use_path(request.param)
    yield request.param
    kernels.use_path(before)


@pytest.fixture
def device(monkeypatch):
    """The GPU path's CuPy on device 0: the real one where a GPU is, else the stand-in device
    (tests/device_standin), which fails on any access CUDA leaves unordered."""
    if not backend.gpu_available():
        from tests.device_standin import install
        install(monkeypatch)
    backend.use_gpu(0)
    yield backend.cupy
    backend.use_cpu()
