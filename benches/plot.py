#!/usr/bin/env python3
"""Draws docs/benchmarks.png from criterion's results (needs matplotlib).

    pip install matplotlib
    python3 benches/plot.py [CRITERION_DIR] [OUT_PNG]   # default: docs/benchmarks.png

Left: each group's median ratio hwqueue / baseline against its target.
Right: the latency distributions behind the two wake-up groups, one dot per
criterion sample (the sample's mean time per round trip), hwqueue against
its baseline.
"""

import json
import os
import sys

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from report import ROWS, criterion_dir, median  # noqa: E402

WAKE_GROUPS = [
    ("signal_wake", "hwqueue", "parking_lot_condvar", "signal ping-pong\n(2 wake-ups)"),
    ("queue_roundtrip", "hwqueue", "channel", "queue round trip\n(submit, wait)"),
]


def per_iteration_us(root, group, function):
    path = os.path.join(root, group, function, "new", "sample.json")
    with open(path) as f:
        sample = json.load(f)
    return [t / n / 1e3 for t, n in zip(sample["times"], sample["iters"])]


def main():
    root = criterion_dir() if len(sys.argv) > 1 else os.path.join(
        os.environ.get("CARGO_TARGET_DIR", "target"), "criterion")
    out = sys.argv[2] if len(sys.argv) > 2 else "docs/benchmarks.png"

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4.2), dpi=90,
                                      gridspec_kw={"width_ratios": [1.25, 1]})

    labels, ratios, targets = [], [], []
    for group, case, base, target in ROWS:
        if target is None:
            continue
        ours, theirs = median(root, group, case), median(root, group, base)
        if ours is None or theirs is None:
            continue
        labels.append(f"{group}\n{case} / {base}")
        ratios.append(ours[0] / theirs[0])
        targets.append(target)
    y = range(len(labels))
    colors = ["tab:green" if r <= t else "tab:red" for r, t in zip(ratios, targets)]
    left.barh(y, ratios, color=colors, height=0.6)
    for i, t in enumerate(targets):
        left.plot([t, t], [i - 0.4, i + 0.4], color="black", linewidth=2)
    left.axvline(1.0, color="grey", linewidth=0.8, linestyle=":")
    left.set_yticks(list(y), labels, fontsize=7)
    left.invert_yaxis()
    left.set_xscale("log")
    left.xaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
    left.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    left.set_xticks([0.25, 0.5, 1, 2])
    left.set_xlabel("median ratio hwqueue / baseline (log; black bar: target)", fontsize=8)
    left.set_title("ratios against targets (green: met)", fontsize=10)

    data, names = [], []
    for group, case, base, title in WAKE_GROUPS:
        try:
            data += [per_iteration_us(root, group, case), per_iteration_us(root, group, base)]
        except FileNotFoundError:
            continue
        names += [f"{title}\nhwqueue", base]
    if data:
        parts = right.violinplot(data, orientation="horizontal", showmedians=True)
        for i, body in enumerate(parts["bodies"]):
            body.set_facecolor("tab:blue" if i % 2 == 0 else "tab:orange")
        right.set_yticks(range(1, len(names) + 1), names, fontsize=7)
        right.invert_yaxis()
        right.set_xscale("log")
        right.xaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
        right.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        right.set_xlabel("µs per round trip (dots: criterion samples)", fontsize=8)
        for i, values in enumerate(data, start=1):
            right.scatter(values, [i] * len(values), s=3, color="black", alpha=0.4)
    right.set_title("wake-up latency", fontsize=10)

    fig.tight_layout()
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    fig.savefig(out)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
