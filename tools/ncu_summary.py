#!/usr/bin/env python3
"""tools/ncu_summary.py CSV [--step-marker NAME] - the kernels of an Nsight Compute capture
(`ncu --metrics gpu__time_duration.sum --csv --log-file CSV ...`, as tools/gpu_check.sh writes
ncu.csv and ncu_train.csv) grouped by kernel name: launches, total time, share, mean.

With --step-marker, only the kernels between the first two launches whose name contains NAME
(a kernel that runs once a step, e.g. argmax_kernel for a greedy decode step) are counted: one
whole step. ncu runs each kernel alone at locked clocks, so the total is an upper bound of
the step's kernel time, not its wall time.
"""
import argparse
import collections
import csv
import re
import sys


def read(path):
    with open(path, newline="") as f:
        rows = list(csv.reader(line for line in f if line.startswith('"')))
    if not rows:
        sys.exit(f"ncu_summary: no CSV rows in {path}")
    head, body = rows[0], rows[1:]
    ki, mi, vi = head.index("Kernel Name"), head.index("Metric Name"), head.index("Metric Value")
    out = []
    for r in body:
        if r[mi] != "gpu__time_duration.sum":
            continue
        name = re.sub(r"\(.*", "", r[ki]).replace("void ", "").strip()
        out.append((name, float(r[vi].replace(",", "")) / 1000.0))  # ns -> us
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("csv")
    ap.add_argument("--step-marker", help="count one step: the kernels between the first two launches of this name")
    ap.add_argument("--top", type=int, default=25)
    a = ap.parse_args()
    ks = read(a.csv)
    if a.step_marker:
        at = [i for i, (n, _) in enumerate(ks) if a.step_marker in n]
        if len(at) < 2:
            sys.exit(f"ncu_summary: fewer than two launches of {a.step_marker}")
        ks = ks[at[0] + 1:at[1] + 1]
    total = sum(t for _, t in ks)
    groups = collections.defaultdict(lambda: [0, 0.0])
    for n, t in ks:
        groups[n][0] += 1
        groups[n][1] += t
    print(f"{len(ks)} kernels, {total:.1f} us of kernel time" + (" (one step)" if a.step_marker else ""))
    print(f"{'launches':>8} {'total us':>10} {'share':>6} {'mean us':>8}  kernel")
    for n, (c, t) in sorted(groups.items(), key=lambda kv: -kv[1][1])[:a.top]:
        print(f"{c:8d} {t:10.1f} {100 * t / total:5.1f}% {t / c:8.2f}  {n[:100]}")


if __name__ == "__main__":
    main()
