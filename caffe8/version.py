"""caffe8's version as ``caffe8 --version`` says it: the release (``caffe8.__version__``, which
setup.cfg reads too) and, when this caffe8 runs from a git clone (an editable install), the
commit: ``0.1.0+g1a2b3c4``, PEP 440's local version label, with ``.dirty`` when tracked files
differ from that commit. An installed wheel, a copy without ``.git`` or a machine without git
says the release alone."""
import os
import subprocess

#: the folder holding this package: the clone's top in a checkout, site-packages in a wheel
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def describe(root=ROOT):
    """The version string (without the ``caffe8`` in front)."""
    from caffe8 import __version__
    if not os.path.exists(os.path.join(root, ".git")):   # a folder, or a worktree's file
        return __version__

    def git(*args):
        return subprocess.run(["git", "-C", root, *args], capture_output=True, text=True,
                              timeout=30)
    try:
        head = git("rev-parse", "--short", "HEAD")
        if head.returncode != 0 or not head.stdout.strip():   # no commit, or not git's to read
            return __version__
        changed = git("status", "--porcelain", "--untracked-files=no").stdout.strip()
    except (OSError, subprocess.SubprocessError):            # no git here
        return __version__
    return f"{__version__}+g{head.stdout.strip()}" + (".dirty" if changed else "")
