#!/usr/bin/env python3
"""Draws the training and evaluation loss of `shardlm train` runs to a PNG.

  python3 tools/plot_training.py OUT/metrics.jsonl [MORE.jsonl ...] --out curve.png [--title T]

Reads the JSONL metrics that `shardlm train` writes (one {"iter", "loss", "lr", ...} line per
step and one {"iter", "eval_loss", ...} line per evaluation) and plots, per file, the training
loss (thin, with a moving average) and the held-out loss (markers) against the step, with the
learning rate on a second axis. Needs matplotlib (pip install matplotlib).
"""
import argparse
import json
import os
import sys


def read(path):
    steps, loss, lr, ev_steps, ev_loss = [], [], [], [], []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            r = json.loads(line)
            if "eval_loss" in r:
                ev_steps.append(r["iter"])
                ev_loss.append(r["eval_loss"])
            elif "loss" in r:
                steps.append(r["iter"])
                loss.append(r["loss"])
                lr.append(r.get("lr", 0.0))
    return steps, loss, lr, ev_steps, ev_loss


def moving_average(xs, k):
    out, acc = [], 0.0
    for i, x in enumerate(xs):
        acc += x
        if i >= k:
            acc -= xs[i - k]
        out.append(acc / min(i + 1, k))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("metrics", nargs="+")
    ap.add_argument("--out", required=True)
    ap.add_argument("--title", default="shardlm train")
    a = ap.parse_args()
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        sys.exit("plot_training: matplotlib is not installed (pip install matplotlib)")
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=110)
    ax2 = ax.twinx()
    for path in a.metrics:
        steps, loss, lr, ev_steps, ev_loss = read(path)
        name = os.path.basename(os.path.dirname(os.path.abspath(path))) or path
        if steps:
            ax.plot(steps, loss, lw=0.5, alpha=0.35)
            line, = ax.plot(steps, moving_average(loss, 20), lw=1.5, label="%s: train (avg of 20)" % name)
            ax2.plot(steps, lr, lw=0.8, ls=":", color=line.get_color(), alpha=0.6)
        if ev_steps:
            ax.plot(ev_steps, ev_loss, "o-", ms=4, label="%s: held-out" % name)
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats per token)")
    ax2.set_ylabel("learning rate (dotted)")
    ax.set_title(a.title)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(a.out)
    print("wrote %s" % a.out)


if __name__ == "__main__":
    main()
