"""``caffe8 plot_training_log``: Caffe's tools/extra/plot_training_log.py.example on caffe8's
glog-format training log (or Caffe's).

``plot_training_log CHART_TYPE OUTPUT_IMAGE LOG [LOG...]``; the chart types are Caffe's:

    0: Test accuracy  vs. Iters        4: Train learning rate  vs. Iters
    1: Test accuracy  vs. Seconds      5: Train learning rate  vs. Seconds
    2: Test loss  vs. Iters            6: Train loss  vs. Iters
    3: Test loss  vs. Seconds          7: Train loss  vs. Seconds

As Caffe's parse_log.sh: test accuracy is "Test net output #0", test loss "#1"; the train loss
is the "Iteration N, loss = x" line's and the learning rate the "Iteration N, lr = x" line's;
seconds count from the "Solving" line (or the log's first line). Each log is one line of the
chart, labelled with its file name less ".log"; drawn with matplotlib (Agg).
"""
import datetime
import os
import re

from caffe8.engine.errors import CaffeError
from caffe8.tools._common import require_file

NAME = "plot_training_log"
HELP = "chart test accuracy/loss or train loss/lr against iterations or seconds from logs"
GROUP = "training"
X_FIELDS = ("Iters", "Seconds")
Y_FIELDS = ("Test accuracy", "Test loss", "Train learning rate", "Train loss")
CHART_TYPES = [f"{y}  vs. {x}" for y in Y_FIELDS for x in X_FIELDS]
_GLOG_TIME = re.compile(r"^[IWEF](\d\d)(\d\d) (\d\d):(\d\d):(\d\d)\.(\d+)")
_ITER = re.compile(r"Iteration (\d+)")
_TEST_OUT = re.compile(r"Test net output #(\d+): \S+ = ([-+.\deEinfa]+)")
_TRAIN_LOSS = re.compile(r"Iteration (\d+).*, loss = ([-+.\deEinfa]+)")
_LR = re.compile(r"Iteration (\d+), lr = ([-+.\deEinfa]+)")


def add_arguments(p):
    p.add_argument("chart_type", type=int, metavar="CHART_TYPE",
                   help="; ".join(f"{i}: {t}" for i, t in enumerate(CHART_TYPES)))
    p.add_argument("output_image", metavar="OUTPUT_IMAGE", help="chart to write (.png, .svg)")
    p.add_argument("logs", nargs="+", metavar="LOG", help="training log(s)")


def _seconds(line, start):
    m = _GLOG_TIME.match(line)
    if not m:
        return None
    month, day, hh, mm, ss, frac = m.groups()
    t = datetime.datetime(2000, int(month), int(day), int(hh), int(mm), int(ss),
                          int(frac.ljust(6, "0")[:6]))
    return t if start is None else (t - start).total_seconds() % (366 * 86400)


def parse_log(path):
    """{"Test": [[iters, seconds, accuracy, loss]], "Train": [[iters, seconds, loss, lr]]}."""
    with open(require_file(path, "log"), encoding="utf-8", errors="replace") as f:
        lines = f.read().splitlines()
    start = next((_seconds(l, None) for l in lines if "Solving" in l and _seconds(l, None)),
                 None) or next((_seconds(l, None) for l in lines if _seconds(l, None)), None)
    if start is None:
        raise CaffeError(f"{path}: no glog-format line (I1125 03:58:30.531525 ...): not a "
                         "training log")
    test, train, it = [], {}, 0
    for line in lines:
        m = _ITER.search(line)
        if m:
            it = int(m.group(1))
        if "Testing net" in line:
            test.append([it, _seconds(line, start), float("nan"), float("nan")])
        elif (m := _TEST_OUT.search(line)) and test and int(m.group(1)) < 2:
            test[-1][2 + int(m.group(1))] = float(m.group(2))
        elif m := _TRAIN_LOSS.search(line):
            train.setdefault(int(m.group(1)), [int(m.group(1)), _seconds(line, start),
                                               float("nan"), float("nan")])[2] = float(m.group(2))
        elif (m := _LR.search(line)) and int(m.group(1)) in train:
            train[int(m.group(1))][3] = float(m.group(2))
    return {"Test": test, "Train": list(train.values())}


def plot_chart(chart_type, path_to_png, logs):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    y_field, x_field = CHART_TYPES[chart_type].split("  vs. ")
    kind = y_field.split()[0]
    column = {"Test accuracy": 2, "Test loss": 3, "Train loss": 2, "Train learning rate": 3}
    fig = plt.figure()
    for path in logs:
        rows = [r for r in parse_log(path)[kind] if r[column[y_field]] == r[column[y_field]]]
        if not rows:
            raise CaffeError(f"{path}: no '{y_field}' values in the log")
        label = os.path.basename(path)
        label = label[:-4] if label.endswith(".log") else label
        plt.plot([r[X_FIELDS.index(x_field)] for r in rows], [r[column[y_field]] for r in rows],
                 label=label, marker="o", markersize=3, linewidth=0.75)
    loc = "upper right" if ("loss" in y_field or "learning rate" in y_field) else "lower right"
    plt.legend(loc=loc, ncol=1)
    plt.title(CHART_TYPES[chart_type])
    plt.xlabel(x_field)
    plt.ylabel(y_field)
    try:
        fig.savefig(path_to_png)
    except (OSError, ValueError) as e:
        raise CaffeError(f"{path_to_png}: cannot write the chart: {e}") from None
    finally:
        plt.close(fig)


def run(args):
    if not 0 <= args.chart_type < len(CHART_TYPES):
        raise CaffeError(f"chart type {args.chart_type} is not one of 0-{len(CHART_TYPES) - 1}: "
                         + "; ".join(f"{i}: {t}" for i, t in enumerate(CHART_TYPES)))
    plot_chart(args.chart_type, args.output_image, args.logs)
    return 0
