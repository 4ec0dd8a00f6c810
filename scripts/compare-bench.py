#!/usr/bin/env python3
"""The ratios new/old from scripts/compare-bench.sh's folder: per figure, the median over the
rounds of each side, and new/old (above 1: new is faster, for rates; below 1 for times).

    python3 scripts/compare-bench.py DIR
"""
import glob
import json
import os
import re
import statistics
import sys


def host(path):
    """{figure: ns} from one host bench log: the one-thread cost and each round trip."""
    out = {}
    for line in open(path, errors="replace"):
        m = re.match(r"\s*(\S+): (\d+) ns per message", line)
        if m:
            out[f"same thread {m[1]} (ns)"] = float(m[2])
        m = re.match(r"\| 1->(\d+) \| (\S+) \| ([^|]+) \| ([^|]+) \|", line)
        if m:
            out[f"round trip 1->{m[1]} {m[2]} (ns)"] = parse_ns(m[4])
            out[f"floor 1->{m[1]} {m[2]} (ns)"] = parse_ns(m[3])
    return out


def parse_ns(s):
    m = re.match(r"([\d.]+)\s*(ns|µs|us|ms)?", s)
    if not m:
        return float("nan")
    scale = {"ns": 1, "µs": 1e3, "us": 1e3, "ms": 1e6}.get(m[2] or "ns", 1)
    return float(m[1]) * scale


def gpu(path):
    """{figure: value} from one gpu_bench JSON: hops and frames/s per cell."""
    j = json.load(open(path))
    out = {}
    for row in j.get("latency", []):
        size = row["size"]
        out[f"hop p50 {size} B, ring (ns)"] = row["ring_p50_ns"]
        out[f"hop p50 {size} B, raw events floor (ns)"] = row["raw_p50_ns"]
        out[f"hop p50 {size} B, memory-op floor (ns)"] = row["memop_p50_ns"]
    for c in j.get("cells", []):
        key = f"1->{c['consumers']} {c['size']} B {c['policy']}"
        fps = c["consumer_fps"]
        out[f"{key} frames/s per consumer"] = sum(fps) / len(fps)
        out[f"{key} p50 (ns)"] = c["p50_ns"]
    return out


def table(kind, files, read):
    sides = {}
    for f in files:
        side = os.path.basename(f).split("-")[1]
        for k, v in read(f).items():
            sides.setdefault(k, {}).setdefault(side, []).append(v)
    print(f"\n### {kind}: median of each side's rounds, new/old\n")
    print("| figure | old | new | new/old |")
    print("|---|---|---|---|")
    for k in sorted(sides):
        o = statistics.median(sides[k].get("old", [float("nan")]))
        n = statistics.median(sides[k].get("new", [float("nan")]))
        print(f"| {k} | {o:,.0f} | {n:,.0f} | {n / o if o else float('nan'):.3f} |")


def main():
    d = sys.argv[1]
    hosts = sorted(glob.glob(os.path.join(d, "host-*.log")))
    if hosts:
        table("host bench", hosts, host)
    gpus = sorted(glob.glob(os.path.join(d, "gpu-*.json")))
    if gpus:
        table("GPU bench (MPS on)", gpus, gpu)


if __name__ == "__main__":
    main()
