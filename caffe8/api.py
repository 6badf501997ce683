"""pycaffe's surface: ``import caffe8 as caffe`` and use it as ``caffe``."""
from caffe8.wiring import register_all

register_all()

from engine.net import Net  # noqa: E402

__all__ = ["Net"]
