"""pycaffe's process-wide settings: CPU or GPU mode, the device, the random seed."""
from engine import backend
from engine.errors import CaffeError

_device = 0


def set_mode_cpu():
    """Nets built from now on keep their arrays in host memory (NumPy)."""
    backend.use_cpu()


def set_mode_gpu():
    """Nets built from now on live on the GPU chosen by :func:`set_device` (CuPy)."""
    if not backend.gpu_available():
        raise CaffeError("set_mode_gpu: no CUDA GPU / CuPy is available on this machine")
    backend.use_gpu(_device)


def set_device(device_id):
    """The GPU used by :func:`set_mode_gpu` (and at once, when already in GPU mode)."""
    global _device
    _device = int(device_id)
    if backend.on_gpu():
        backend.use_gpu(_device)


def set_random_seed(seed):
    """Seed the generator fillers, Dropout and data shuffling draw from."""
    backend.seed(int(seed))


def layer_type_list():
    """The registered layer type strings, sorted."""
    from engine.layer import LAYERS
    return sorted(LAYERS)
