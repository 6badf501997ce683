"""``python -m caffe8 train -solver S``: the ``caffe8`` command without the installed script."""
import sys

from caffe8.cli import main

sys.exit(main())
