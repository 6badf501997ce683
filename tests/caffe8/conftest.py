"""The digits data prepared once per session in a folder used as the CWD (tests/engine's)."""
from tests.engine.conftest import digits_root, in_digits_cwd  # noqa: F401
