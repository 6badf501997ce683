"""Dev tools: caffe8 against PyTorch DDP on the emulated cluster (the cluster itself is the
package's, caffe8/cluster.py), caffe8 against PyTorch on one machine, the GPU check, the
exchange's timeline plot, net and proto generators.

Run from the repository root as modules, e.g. ``python -m scripts.cluster_bench --help``. They
use the studies' library, ``studies._runs`` (runs of ``caffe8 train`` under mpiexec, CSV
writing, timing logs, figures); nothing here imports tests/.
"""
