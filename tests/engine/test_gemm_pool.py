"""engine/gemm_pool.py: the host GEMM's blocks on the C thread pool give the bits of the same
blocks run one by one from Python, over training steps, for any worker count."""
import numpy
import pytest

from caffe8.engine import blas, gemm_pool
from caffe8.engine.net import Net
from caffe8.engine.prototxt import parse_text
from caffe8.solvers.sgd import SGDSolver

needs_pool = pytest.mark.skipif(not blas.available() or gemm_pool.call() is None,
                                reason="no caffe8 OpenBLAS or no C pool")

#: products the blocks split: per-image convolutions (4 items), an inner product split along
#: its outputs and a weight gradient along its rows
NET = '''
layer { name: "in" type: "Input" top: "data" top: "label"
  input_param { shape { dim: 4 dim: 8 dim: 24 dim: 24 } shape { dim: 4 } } }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
  convolution_param { num_output: 16 kernel_size: 3 pad: 1 weight_filler { type: "msra" } } }
layer { name: "relu" type: "ReLU" bottom: "conv" top: "conv" }
layer { name: "pool" type: "Pooling" bottom: "conv" top: "pool"
  pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layer { name: "fc1" type: "InnerProduct" bottom: "pool" top: "fc1"
  inner_product_param { num_output: 256 weight_filler { type: "xavier" } } }
layer { name: "fc2" type: "InnerProduct" bottom: "fc1" top: "fc2"
  inner_product_param { num_output: 5 weight_filler { type: "xavier" } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "fc2" bottom: "label" top: "loss" }'''
SOLVER = 'base_lr: 0.01 momentum: 0.9 weight_decay: 0.0005 lr_policy: "fixed"'


def train(pool, workers, partition, steps=3):
    """Parameters and their gradients (bytes) after ``steps`` SGD steps on changing batches."""
    saved = (gemm_pool.use_pool(pool), blas.threads(), blas.partition())
    blas.set_num_threads(workers)
    blas.set_partition(partition)
    blas._plans.clear()
    try:
        net = Net(parse_text(NET, "n.prototxt", "NetParameter"))
        rng = numpy.random.default_rng(1)
        net.flat_data[...] = rng.standard_normal(net.flat_data.size) * 0.05
        solver = SGDSolver(parse_text(SOLVER, "s.prototxt", "SolverParameter"), net)
        for _ in range(steps):
            net.blobs["data"].data[...] = rng.standard_normal(net.blobs["data"].shape)
            net.blobs["label"].data[...] = rng.integers(0, 5, 4)
            net.clear_param_diffs()
            net.forward_backward()
            solver.apply_update()
        return net.flat_data.tobytes() + net.flat_diff.tobytes()
    finally:
        gemm_pool.use_pool(saved[0])
        blas.set_num_threads(saved[1])
        blas.set_partition(saved[2])
        blas._plans.clear()


@needs_pool
@pytest.mark.parametrize("partition", [2, 3])
def test_the_pool_gives_the_python_workers_bits_for_any_worker_count(partition):
    reference = train(pool=False, workers=2, partition=partition)
    for workers in (1, 2, 3):
        assert train(pool=True, workers=workers, partition=partition) == reference
    assert gemm_pool.pool_threads() >= 2              # the pool ran blocks on its threads


@needs_pool
def test_a_product_split_in_blocks_is_the_float64_product():
    """The pool's blocks cover the output exactly once, plain and accumulating."""
    rng = numpy.random.default_rng(3)
    a = rng.standard_normal((4, 70, 300)).astype(numpy.float32)      # 4 items
    b = rng.standard_normal((300, 900)).astype(numpy.float32)
    start = rng.standard_normal((4, 70, 900)).astype(numpy.float32)
    exact = a.astype(numpy.float64) @ b.astype(numpy.float64)
    saved = blas.threads()
    blas.set_num_threads(3)
    try:
        out = blas.matmul(a, b)
        acc = start.copy()
        blas.matmul(a, b, out=acc, accumulate=True)
    finally:
        blas.set_num_threads(saved)
    numpy.testing.assert_allclose(out, exact, atol=1e-3)
    numpy.testing.assert_allclose(acc, exact + start, atol=1e-3)
