#!/usr/bin/env python3
"""Summarize an `ncu --csv --metrics gpu__time_duration.sum` log: device time per kernel
name (summed over launches), launches, and the total, largest first.

    python3 bench/gpu/ncu_summary.py ncu.csv [--top 30]
"""
import argparse
import csv
import collections
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=30)
    a = ap.parse_args()
    with open(a.csv, newline="") as f:
        # ncu prints its own lines (==PROF== ...) before the CSV header.
        lines = [l for l in f if l.startswith('"')]
    rows = list(csv.DictReader(lines))
    if not rows:
        sys.exit(f"{a.csv}: no CSV rows (did ncu profile any kernel?)")
    total = collections.Counter()
    count = collections.Counter()
    for r in rows:
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        name = r["Kernel Name"]
        name = name if len(name) <= 90 else name[:87] + "..."
        unit = r.get("Metric Unit", "nsecond")
        v = float(r["Metric Value"].replace(",", ""))
        scale = {"ns": 1e-6, "nsecond": 1e-6, "us": 1e-3, "usecond": 1e-3, "ms": 1.0, "msecond": 1.0, "s": 1e3, "second": 1e3}[unit]
        total[name] += v * scale
        count[name] += 1
    all_ms = sum(total.values())
    print(f"{sum(count.values())} kernel launches, {all_ms:.2f} ms of device time in all")
    print(f"{'ms':>9} {'share':>6} {'launches':>8}  kernel")
    for name, ms in total.most_common(a.top):
        print(f"{ms:9.3f} {100 * ms / all_ms:5.1f}% {count[name]:8d}  {name}")


if __name__ == "__main__":
    main()
