#!/usr/bin/env python
"""BVLC's LeNet on Fashion-MNIST with PyTorch DDP, gradients exchanged by caffe8's fp8 hook.

One machine, 4 processes::

    apt-get install dataset-fashion-mnist        # IDX files in /usr/share/datasets/fashion-mnist
    torchrun --nproc-per-node 4 examples/pytorch_ddp_fashion_mnist.py

Started by MPICH's mpiexec instead (its PMI_RANK / PMI_SIZE; ``--master`` names rank 0's
address), e.g. on ``caffe8 cluster``'s 2 nodes of 2 processes (docs/PYTORCH.md)::

    .venv/bin/caffe8 cluster run --nodes 2 --rate 1gbit --ppn 2 -- \\
        .venv/bin/python examples/pytorch_ddp_fashion_mnist.py --master 10.208.0.1 \\
        --processes-per-node 2

The two lines that matter are in :func:`register_hook`::

    state = caffe8.ddp.Fp8State(module=model)
    model.register_comm_hook(state, caffe8.ddp.fp8_hook)

``--hook`` compares it with DDP's own exchange (``fp32``: no hook), PyTorch's ``fp16`` and
``bf16`` compression hooks and ``powersgd`` (rank ``--powersgd-rank``, error feedback and the
documented warm start, compressing from iteration ``--powersgd-start``). ``--processes-per-node``
sums fp8 in two levels (nodes of that many consecutive ranks; torchrun's LOCAL_WORLD_SIZE on a
real cluster).

The training is BVLC's ``examples/mnist`` recipe (prototxt/fashion_mnist/lenet_solver.prototxt):
LeNet (conv 20 5×5, max pool, conv 50 5×5, max pool, 500 ReLU, 10), inputs ×1/256, Xavier
weights and zero biases, SGD with momentum 0.9, weight decay 5e-4, lr 0.01 under Caffe's "inv"
policy (γ 1e-4, power 0.75; biases at twice the rate), 10,000 iterations of 64 images in all
(``--batch`` per process = 64 / processes), a test of the 10,000 test images every 500.
Each process reads its own share of every epoch's shuffled order (one permutation per epoch
from ``--seed``, the same on every rank). Rank 0 prints the test accuracy and, as Caffe's log
does, the training loss of that iteration's step; ``--csv`` writes the curve (iteration, test
accuracy, training loss, seconds).
"""
import argparse
import csv
import math
import os
import sys
import time

import numpy
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

DATA = "/usr/share/datasets/fashion-mnist"
FILES = {"train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
         "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")}
HOOKS = ("fp8", "fp32", "fp16", "bf16", "powersgd")


def lenet():
    """BVLC's LeNet (prototxt/lenet/train_val.prototxt) with Caffe's fillers: Xavier weights
    (uniform ±sqrt(3 / fan_in)) and zero biases."""
    nn = torch.nn
    net = nn.Sequential(nn.Conv2d(1, 20, 5), nn.MaxPool2d(2, 2), nn.Conv2d(20, 50, 5),
                        nn.MaxPool2d(2, 2), nn.Flatten(), nn.Linear(800, 500), nn.ReLU(),
                        nn.Linear(500, 10))
    for m in net:
        if isinstance(m, (nn.Conv2d, nn.Linear)):
            bound = math.sqrt(3.0 / (m.weight[0].numel()))
            nn.init.uniform_(m.weight, -bound, bound)
            nn.init.zeros_(m.bias)
    return net


def resnet():
    """The small bottleneck ResNet of prototxt/fashion_mnist/paper/resnet_b16.prototxt (He,
    Zhang, Ren and Sun's layout as in KaimingHe's ResNet-50 prototxt; docs/ACCURACY.md): a 3×3
    stem of 16 channels, three bottleneck blocks with 1×1 projection shortcuts at 28×28, 14×14
    and 7×7 (1×1 → 3×3 → 1×1 branches, the stride on the first 1×1), BatchNorm with a learned
    scale and shift after each of the 13 convolutions (no convolution bias; running statistics
    averaged by 0.99 a step, the prototxt's moving_average_fraction), global average pooling and
    one linear layer: 20,506 learned values. Weights as Caffe's "msra" filler (normal, variance
    2 / fan_in), zero biases."""
    nn = torch.nn

    def conv(cin, cout, k, stride=1, relu=True):
        layers = [nn.Conv2d(cin, cout, k, stride, padding=k // 2, bias=False),
                  nn.BatchNorm2d(cout, momentum=0.01)]
        return layers + [nn.ReLU()] if relu else layers

    class Bottleneck(nn.Module):
        def __init__(self, cin, mid, cout, stride):
            super().__init__()
            self.branch1 = nn.Sequential(*conv(cin, cout, 1, stride, relu=False))
            self.branch2 = nn.Sequential(*conv(cin, mid, 1, stride), *conv(mid, mid, 3),
                                         *conv(mid, cout, 1, relu=False))

        def forward(self, x):
            return torch.relu(self.branch1(x) + self.branch2(x))

    net = nn.Sequential(*conv(1, 16, 3), Bottleneck(16, 8, 16, 1), Bottleneck(16, 16, 32, 2),
                        Bottleneck(32, 32, 64, 2), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                        nn.Linear(64, 10))
    for m in net.modules():
        if isinstance(m, (nn.Conv2d, nn.Linear)):
            nn.init.kaiming_normal_(m.weight, mode="fan_in", nonlinearity="relu")
            if m.bias is not None:
                nn.init.zeros_(m.bias)
    return net


def lenet_recipe(model, iterations):
    """BVLC's examples/mnist solver: lr 0.01 (biases 0.02), momentum 0.9, weight decay 5e-4
    (biases too, as Caffe's decay_mult 1), Caffe's "inv" policy."""
    decay, biases = [], []
    for name, p in model.named_parameters():
        (biases if name.endswith("bias") else decay).append(p)
    opt = torch.optim.SGD([{"params": decay}, {"params": biases, "lr": 0.02}], lr=0.01,
                          momentum=0.9, weight_decay=5e-4)
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, caffe_inv())


def resnet_recipe(model, iterations):
    """prototxt/fashion_mnist/paper/resnet_solver_4p.prototxt: lr 0.1, momentum 0.9, weight
    decay 1e-4 on the convolution and linear weights only (decay_mult 0 on BatchNorm's scale and
    shift and on the linear bias, which learns at twice the rate), decayed linearly to zero over
    the run (Caffe's "poly", power 1)."""
    bias = model.module[-1].bias                      # the linear layer's
    weights = [p for p in model.parameters() if p.dim() > 1]
    flat = [p for p in model.parameters() if p.dim() == 1 and p is not bias]
    opt = torch.optim.SGD([{"params": weights}, {"params": flat, "weight_decay": 0.0},
                           {"params": [bias], "lr": 0.2, "weight_decay": 0.0}],
                          lr=0.1, momentum=0.9, weight_decay=1e-4)
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda it: 1.0 - it / iterations)


#: --net: (model, optimizer and schedule, iterations, test interval) — the prototxt recipes
NETS = {"lenet": (lenet, lenet_recipe, 10000, 500),
        "resnet": (resnet, resnet_recipe, 1000, 250)}


def read_fashion_mnist(folder, split):
    """(images as float32 N×1×28×28 scaled by 1/256, labels as int64) of an IDX pair in
    ``folder`` (gzipped or not), read by caffe8's convert_mnist_data reader."""
    from caffe8.tools.convert_mnist_data import IMAGES_MAGIC, LABELS_MAGIC, read_idx
    images_name, labels_name = FILES[split]

    def find(name):
        for candidate in (name + ".gz", name):
            path = os.path.join(folder, candidate)
            if os.path.exists(path):
                return path
        raise SystemExit(f"pytorch_ddp_fashion_mnist: no {name}[.gz] in {folder} "
                         f"(apt-get install dataset-fashion-mnist, or --data FOLDER)")
    dims, pixels = read_idx(find(images_name), IMAGES_MAGIC, f"{split} images")
    _, labels = read_idx(find(labels_name), LABELS_MAGIC, f"{split} labels")
    if labels.size != dims[0]:
        raise SystemExit(f"pytorch_ddp_fashion_mnist: {dims[0]} {split} images but "
                         f"{labels.size} labels in {folder}")
    x = torch.from_numpy(pixels.reshape(dims[0], 1, dims[1], dims[2]).astype(numpy.float32))
    return x * (1.0 / 256), torch.from_numpy(labels.astype(numpy.int64))


def register_hook(model, hook, processes_per_node=None, powersgd_rank=4, powersgd_start=2):
    """Put exchange ``hook`` (one of HOOKS) on the DDP ``model``; returns its state."""
    if hook == "fp8":
        import caffe8.ddp
        state = caffe8.ddp.Fp8State(module=model, processes_per_node=processes_per_node)
        model.register_comm_hook(state, caffe8.ddp.fp8_hook)
        return state
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
    if hook == "fp16":
        model.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif hook == "bf16":
        # DDP refuses to register bf16_compress_hook itself unless on NCCL (or XCCL); the same
        # function called from another one runs on gloo too
        model.register_comm_hook(None, lambda state, bucket:
                                 default_hooks.bf16_compress_hook(state, bucket))
    elif hook == "powersgd":
        # PyTorch's documented defaults (error feedback, warm start: each iteration starts from
        # the last one's Q), compressing from iteration powersgd_start (> 1, as it requires)
        state = powerSGD_hook.PowerSGDState(process_group=None,
                                            matrix_approximation_rank=powersgd_rank,
                                            start_powerSGD_iter=powersgd_start,
                                            use_error_feedback=True, warm_start=True)
        hook = powerSGD_hook.powerSGD_hook
        model.register_comm_hook(state, one_bucket_at_a_time(hook)
                                 if dist.get_backend() == "gloo" else hook)
        return state
    elif hook != "fp32":
        raise SystemExit(f"pytorch_ddp_fashion_mnist: --hook {hook!r}: one of {', '.join(HOOKS)}")
    return None


def one_bucket_at_a_time(hook):
    """``hook`` that first waits for the previous bucket's future. PowerSGD starts its second
    and third all-reduces from the completion callback of the first; on gloo those callbacks
    run on gloo's worker threads, so with two buckets in flight the ranks can start them in
    different orders and wait for each other forever (seen with 2 processes and 2 buckets, in
    powerSGD_hook's unpack_uncompressed_tensors_and_allreduce_ps on one rank and compute_qs on
    the other). Waiting keeps PowerSGD correct on gloo at the price of its buckets' overlap
    with each other and with the rest of backward. NCCL needs no such wait."""
    last = []

    def hook_in_order(state, bucket):
        if last:
            last.pop().wait()
        future = hook(state, bucket)
        last.append(future)
        return future
    return hook_in_order


def caffe_inv(gamma=1e-4, power=0.75):
    """Caffe's "inv" learning-rate policy as a LambdaLR factor of the iteration."""
    return lambda it: (1.0 + gamma * it) ** (-power)


def evaluate(model, x, y, batch=500):
    """Correct answers of this rank's share of the test set, summed over the ranks: accuracy."""
    rank, size = dist.get_rank(), dist.get_world_size()
    correct = torch.zeros(2, dtype=torch.float64)
    model.eval()
    with torch.no_grad():
        for start in range(rank * batch, x.shape[0], size * batch):
            out = model.module(x[start:start + batch])
            correct[0] += (out.argmax(1) == y[start:start + batch]).sum()
            correct[1] += out.shape[0]
    model.train()
    dist.all_reduce(correct)
    return float(correct[0] / correct[1])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=DATA, help=f"folder of the IDX files (default {DATA})")
    ap.add_argument("--hook", default="fp8", choices=HOOKS)
    ap.add_argument("--net", default="lenet", choices=tuple(NETS),
                    help="lenet: BVLC's LeNet recipe; resnet: docs/ACCURACY.md's small ResNet")
    ap.add_argument("--iterations", type=int, default=None,
                    help="steps of 64 images in all (default: the net's recipe, 10000 / 1000)")
    ap.add_argument("--batch", type=int, default=None,
                    help="images per process and step (default 64 / processes)")
    ap.add_argument("--test-interval", type=int, default=None,
                    help="steps between tests (default: the net's recipe, 500 / 250)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--processes-per-node", type=int, default=None,
                    help="fp8: sum in two levels, nodes of this many consecutive ranks")
    ap.add_argument("--powersgd-rank", type=int, default=4)
    ap.add_argument("--powersgd-start", type=int, default=2)
    ap.add_argument("--backend", default="gloo")
    ap.add_argument("--master", default=None,
                    help="rank 0's address when started by mpiexec rather than torchrun")
    ap.add_argument("--port", type=int, default=29531, help="with --master: its port")
    ap.add_argument("--csv", default=None, help="write the test curve here (rank 0)")
    args = ap.parse_args(argv)
    build, recipe, iterations, interval = NETS[args.net]
    args.iterations = iterations if args.iterations is None else args.iterations
    args.test_interval = interval if args.test_interval is None else args.test_interval

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    x, y = read_fashion_mnist(args.data, "train")
    tx, ty = read_fashion_mnist(args.data, "test")
    if "RANK" not in os.environ and "PMI_RANK" in os.environ:       # MPICH's mpiexec
        os.environ.update(RANK=os.environ["PMI_RANK"], WORLD_SIZE=os.environ["PMI_SIZE"],
                          MASTER_ADDR=args.master or "127.0.0.1", MASTER_PORT=str(args.port))
    dist.init_process_group(args.backend)
    rank, size = dist.get_rank(), dist.get_world_size()
    batch = args.batch or max(1, 64 // size)
    torch.manual_seed(args.seed)                     # the same initial weights on every rank
    model = DDP(build())
    state = register_hook(model, args.hook, args.processes_per_node, args.powersgd_rank,
                          args.powersgd_start)
    opt, schedule = recipe(model, args.iterations)
    order, epoch, at = None, 0, 0
    rows, start, loss = [], time.perf_counter(), None

    def report(it, acc, loss):
        rows.append((it, acc, loss, time.perf_counter() - start))
        if rank == 0:
            trained = "no step yet" if loss is None else f"{loss:.4f}"      # --iterations 0
            print(f"iteration {it}: test accuracy {acc:.4f}, loss {trained}", flush=True)

    for it in range(args.iterations + 1):
        # as Caffe's solver: the test at iteration `it` sees the weights before that step, and
        # the loss beside it is that step's training loss (the final test's: the last step's)
        tested = it % args.test_interval == 0 or it == args.iterations
        acc = evaluate(model, tx, ty) if tested else None
        if it == args.iterations:
            report(it, acc, loss)
            break
        if order is None or at + batch * size > order.numel():
            gen = torch.Generator().manual_seed(args.seed * 1000 + epoch)
            order, epoch, at = torch.randperm(x.shape[0], generator=gen), epoch + 1, 0
        idx = order[at + rank * batch:at + (rank + 1) * batch]
        at += batch * size
        opt.zero_grad()
        out = torch.nn.functional.cross_entropy(model(x[idx]), y[idx])
        out.backward()
        opt.step()
        schedule.step()
        loss = out.item()
        if tested:
            report(it, acc, loss)
    if rank == 0:
        print(f"final test accuracy {rows[-1][1]:.4f} ({args.net}, {args.hook}, {size} processes, "
              f"{args.iterations} iterations, {rows[-1][3]:.1f} s)", flush=True)
        if args.csv:
            with open(args.csv, "w", newline="") as f:
                w = csv.writer(f)
                w.writerow(("iteration", "accuracy", "loss", "seconds"))
                w.writerows(rows)
    if hasattr(state, "close"):          # caffe8's hook: its thread ends before the groups do
        state.close()
    dist.destroy_process_group()
    return 0


def exit_without_teardown(code):
    """Leave the process now, its output flushed, without the interpreter's teardown. PyTorch's
    gloo worker threads can still be releasing a finished collective's tensors when the teardown
    starts; a thread that then needs the GIL is stopped by Python, and the process aborts
    ("terminate called without an active exception", exit -6) after a run that went right. Seen
    here in 1 of 20 runs of plain DDP on gloo (torch 2.13), the gloo thread caught in gdb in a
    tensor's deallocation; PyTorch's own fix, an exit handler, was not merged
    (pytorch/pytorch#179291). Call it after ``destroy_process_group()`` and after closing
    caffe8's hook state (exit handlers do not run)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    exit_without_teardown(main())
