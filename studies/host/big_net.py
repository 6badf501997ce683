"""How long a net of many layers takes to parse and build: writes a prototxt of ``--layers``
layers (Convolution, ReLU, BatchNorm, Scale in turn, as a ResNet-style tower is written out by
a model converter: multi-line fields and a comment block a layer, about 490 bytes a layer, so
100,000 layers make a 49 MB file) and trains it for one iteration with ``caffe8 train``.

Usage (repository root)::

    python -m studies.host.big_net --layers 100000 --rounds 3 --out docs/figures/big_net.csv

Prints and writes one row per run: seconds from the process's start to the log's "Initializing
net from parameters" (the solver and net files parsed, filtered and split), to "Network
initialization done." (every layer built and set up, the log's copy of the net written), and
to the process's exit (one training iteration through every layer, then the exit), with the
file's size and the machine's load.
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time

from studies._runs import REPO, write_rows

FIELDS = ("layers", "megabytes", "round", "parsed_s", "built_s", "exit_s", "load_1min")
KINDS = ("conv", "relu", "bn", "scale")
_BODIES = {
    "conv": ('  type: "Convolution"\n  bottom: "{b}"\n  top: "{t}"\n'
             "  param {{\n    lr_mult: 1\n    decay_mult: 1\n  }}\n"
             "  param {{\n    lr_mult: 2\n    decay_mult: 0\n  }}\n"
             "  convolution_param {{\n    num_output: 4\n    pad: 1\n    kernel_size: 3\n"
             "    stride: 1\n    weight_filler {{\n      type: \"gaussian\"\n      std: 0.01\n"
             "    }}\n    bias_filler {{\n      type: \"constant\"\n      value: 0\n    }}\n"
             "  }}\n"),
    "relu": ('  type: "ReLU"\n  bottom: "{b}"\n  top: "{t}"\n'
             "  relu_param {{\n    negative_slope: 0\n  }}\n"),
    "bn": ('  type: "BatchNorm"\n  bottom: "{b}"\n  top: "{t}"\n'
           "  batch_norm_param {{\n    use_global_stats: false\n"
           "    moving_average_fraction: 0.999\n    eps: 1e-05\n  }}\n"),
    "scale": ('  type: "Scale"\n  bottom: "{b}"\n  top: "{t}"\n'
              "  param {{\n    lr_mult: 1\n    decay_mult: 0\n  }}\n"
              "  scale_param {{\n    bias_term: true\n"
              "    filler {{\n      type: \"constant\"\n      value: 1\n    }}\n"
              "    bias_filler {{\n      type: \"constant\"\n      value: 0\n    }}\n  }}\n"),
}


def write_net(path, layers):
    """A net of an Input layer and ``layers`` layers in a chain; returns the file's size."""
    with open(path, "w") as f:
        f.write('name: "many_layers"\nlayer {\n  name: "data"\n  type: "Input"\n  top: "x0"\n'
                "  input_param {\n    shape {\n      dim: 2\n      dim: 4\n      dim: 6\n"
                "      dim: 6\n    }\n  }\n}\n")
        for i in range(layers):
            kind = KINDS[i % len(KINDS)]
            f.write(f"# ---- block {i}: the {kind} stage of tower unit {i // len(KINDS)}, as "
                    f"the model converter wrote it ({i % 97} / {i % 89})\n# {'-' * 110}\n")
            f.write(f'layer {{\n  name: "layer_{i:06d}_{kind}"\n'
                    + _BODIES[kind].format(b=f"x{i}", t=f"x{i + 1}") + "}\n")
    return os.path.getsize(path)


def _seconds(line):
    """Seconds since midnight of a glog line's time stamp."""
    clock = line.split()[1]
    h, m, s = clock.split(":")
    return int(h) * 3600 + int(m) * 60 + float(s)


def phases(log_text, start):
    """(parsed_s, built_s): seconds from ``start`` (seconds since midnight, local time) to the
    first "Initializing net from parameters" and the first "Network initialization done."."""
    parsed = built = None
    for line in log_text.splitlines():
        if parsed is None and "Initializing net from parameters" in line:
            parsed = _seconds(line)
        elif "Network initialization done." in line:
            built = _seconds(line)
            break
    if parsed is None or built is None:
        raise RuntimeError("the log has no 'Initializing net from parameters' ... "
                           "'Network initialization done.' lines")
    return (parsed - start) % 86400, (built - start) % 86400


def run_once(folder, net):
    solver = os.path.join(folder, "solver.prototxt")
    with open(solver, "w") as f:
        f.write(f'net: "{net}"\nbase_lr: 0.01\nlr_policy: "fixed"\nmax_iter: 1\ndisplay: 1\n'
                "snapshot_after_train: false\n")
    now = time.time()
    lt = time.localtime(now)
    start = lt.tm_hour * 3600 + lt.tm_min * 60 + lt.tm_sec + now % 1
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "caffe8.cli", "train", "-solver", solver],
                       cwd=folder, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       env=dict(os.environ, PYTHONPATH=REPO))
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        raise RuntimeError(f"caffe8 train failed (rc {r.returncode}):\n{r.stdout[-2000:]}")
    parsed, built = phases(r.stdout, start)
    return parsed, built, wall


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=100000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", help="CSV file to write the rows to")
    args = ap.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="c8big") as folder:
        net = os.path.join(folder, "net.prototxt")
        size = write_net(net, args.layers)
        for rnd in range(args.rounds):
            parsed, built, wall = run_once(folder, net)
            row = dict(layers=args.layers, megabytes=round(size / 1e6, 1), round=rnd,
                       parsed_s=round(parsed, 2), built_s=round(built, 2), exit_s=round(wall, 2),
                       load_1min=os.getloadavg()[0])
            print(",".join(str(row[k]) for k in FIELDS), flush=True)
            rows.append(row)
    if args.out:
        write_rows(rows, FIELDS, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
