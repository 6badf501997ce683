"""Dev tools and the product features still on their way into the package: the emulated
cluster and caffe8-vs-DDP across it, caffe8-vs-PyTorch, the GPU check, net and proto generators.

Run from the repository root as modules, e.g. ``python -m scripts.cluster_bench --help``; the
helpers they and the studies (studies/) share (runs of ``caffe8 train`` under mpiexec, CSV
writing, timing logs, figures) live in ``studies._runs``.
"""
