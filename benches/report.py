#!/usr/bin/env python3
"""Prints the ratio table of BENCHMARKS.md from criterion's estimates.

    python3 benches/report.py [CRITERION_DIR]

CRITERION_DIR defaults to $CARGO_TARGET_DIR/criterion, else target/criterion.
Each row reads <group>/<function>/new/estimates.json for hwqueue's case and
its baseline (from the same `cargo bench` run) and divides the medians.
Standard library only.
"""

import json
import os
import sys

# (group, hwqueue's case, baseline, target ratio or None for context only)
ROWS = [
    ("dispatch", "generic", "direct", 1.02),
    ("dispatch", "enum", "direct", None),
    ("dispatch", "dyn", "direct", None),
    ("signal_set", "hwqueue", "fetch_max", 1.3),
    ("signal_set", "hwqueue", "lock_notify", None),
    ("signal_wait_reached", "hwqueue", "atomic_load", 2.0),
    ("signal_wake", "hwqueue", "parking_lot_condvar", 1.1),
    ("queue_roundtrip", "hwqueue", "rayon_spawn", 2.0),
    ("queue_roundtrip", "hwqueue", "crossbeam_channel", None),
    ("queue_roundtrip", "hwqueue", "channel", 1.5),
    ("queue_throughput", "hwqueue", "crossbeam_worker", 1.0),
    ("queue_throughput", "hwqueue", "boxed_closures", 1.0),
    ("exec_bandwidth", "hwqueue", "scoped_threads", 1.1),
    ("copy_bandwidth", "hwqueue", "copy_from_slice", 1.1),
    ("exec_launch_wide", "hwqueue", "rayon", 1.0),
    ("exec_matmul", "hwqueue", "rayon", 1.05),
    ("exec_matmul_16_rows", "hwqueue", "rayon", 1.05),
    ("profile_overhead", "on", "off", 1.5),
    ("fill_bandwidth", "hwqueue", "slice_fill", 1.1),
    ("transfer_roundtrip", "hwqueue", "copy_from_slice", 1.2),
    ("exec_views", "views", "whole", 1.02),
    ("signal_wake_any", "wait_any_2", "wait", 1.3),
    ("signal_wake_any", "wait_any_4", "wait", 1.3),
    ("alloc_free_mixed", "pooled_uninit", "system_uninit", 1.0),
    ("alloc_free_mixed", "pooled_uninit", "device_alloc", 0.10),
    ("alloc_free_mixed", "pooled_zeroed", "device_alloc", 1.0),
    ("alloc_free_mixed", "touch_only", "device_alloc", None),
    ("alloc_free_mixed", "pooled_uninit", "touch_only", None),
    ("alloc_free_small", "pooled_uninit", "system_uninit", 1.0),
    ("alloc_free_small", "pooled_zeroed", "device_alloc", 1.0),
    ("alloca_cycle", "alloca", "alloc_drop", 1.0),
    ("executor_replay", "hwqueue", "manual", 1.1),
    ("rebind_run", "rebound", "unchanged", 1.05),
    ("vulkan_roundtrip", "hwqueue", "raw_ash", 1.1),
    ("vulkan_dispatch", "hwqueue", "raw_ash", 1.1),
    ("vulkan_transfer", "hwqueue", "raw_ash", 1.1),
    ("vulkan_transfer", "hwqueue_borrowed", "raw_ash", None),
    ("vulkan_transfer_small", "hwqueue", "raw_ash", None),
    ("plan_replay_vulkan", "hwqueue", "raw_ash_prerecorded", 1.1),
    ("plan_replay_vulkan", "hwqueue_rerecorded", "raw_ash_prerecorded", None),
]

# Paired groups (benches/support: `Ratio`): criterion's estimate is the
# ratio itself, each iteration timed next to one of the baseline.
# (group, case, target ratio or None)
PAIRED = [
    ("vulkan_roundtrip_paired", "hwqueue_over_raw_ash", 1.1),
    ("vulkan_dispatch_paired", "hwqueue_over_raw_ash", 1.1),
    ("vulkan_dispatch_paired", "raw_ash_over_raw_ash", None),
    ("vulkan_transfer_paired", "hwqueue_over_raw_ash", 1.1),
    ("vulkan_transfer_paired", "raw_ash_over_raw_ash", None),
]

# Rows that need a GPU: reported, never measured here.
GPU_ROWS = ["cuda_launch", "cuda_signal"]


def criterion_dir():
    if len(sys.argv) > 1:
        return sys.argv[1]
    target = os.environ.get("CARGO_TARGET_DIR", "target")
    return os.path.join(target, "criterion")


def median(root, group, function):
    """The median estimate in ns and its 95% interval, or None if not run."""
    path = os.path.join(root, group, function, "new", "estimates.json")
    try:
        with open(path) as f:
            m = json.load(f)["median"]
    except FileNotFoundError:
        return None
    ci = m["confidence_interval"]
    return m["point_estimate"], ci["lower_bound"], ci["upper_bound"]


def fmt_time(ns):
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("µs", 1e3), ("ns", 1.0)):
        if ns >= scale:
            return f"{ns / scale:.3g} {unit}"
    return f"{ns * 1e3:.3g} ps"


def verdict(ratio, target):
    """The table's "met" and "target" cells for `ratio` against `target`."""
    if target is None:
        return "", "–"
    return ("yes" if ratio <= target else "**no**"), f"≤ {target}"


def main():
    root = criterion_dir()
    if not os.path.isdir(root):
        sys.exit(f"no criterion results in {root}: run `cargo bench` first")
    print(f"results: {root}\n")
    print("| group | case | median | baseline | median | ratio | target | met |")
    print("|---|---|---:|---|---:|---:|---:|:---:|")
    missed = 0
    for group, case, base, target in ROWS:
        ours, theirs = median(root, group, case), median(root, group, base)
        if ours is None or theirs is None:
            if target is not None:
                print(f"| {group} | {case} | – | {base} | – | – | ≤ {target} | not run |")
            continue
        ratio = ours[0] / theirs[0]
        # The ratio's range if both medians sat at opposite ends of their
        # 95% intervals: a rough noise band, not a statistical interval.
        low, high = ours[1] / theirs[2], ours[2] / theirs[1]
        met, target_text = verdict(ratio, target)
        missed += met == "**no**"
        print(
            f"| {group} | {case} | {fmt_time(ours[0])} | {base} | {fmt_time(theirs[0])} "
            f"| {ratio:.3f} ({low:.2f}–{high:.2f}) | {target_text} | {met} |"
        )
    for group, case, target in PAIRED:
        ratio = median(root, group, case)
        if ratio is None:
            if target is not None:
                print(f"| {group} | {case} | paired | – | – | – | ≤ {target} | not run |")
            continue
        met, target_text = verdict(ratio[0], target)
        missed += met == "**no**"
        print(
            f"| {group} | {case} | paired | – | – "
            f"| {ratio[0]:.3f} ({ratio[1]:.2f}–{ratio[2]:.2f}) | {target_text} | {met} |"
        )
    for name in GPU_ROWS:
        print(f"| {name} | hwqueue | not measured (no GPU) | – | – | – | – | – |")
    print(f"\ntargets missed: {missed}")


if __name__ == "__main__":
    main()
