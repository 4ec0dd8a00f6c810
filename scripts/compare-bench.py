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


def table(kind, files, read, side_of=lambda f: os.path.basename(f).split("-")[1]):
    """One row per figure: each side's median over its rounds, and each side's over old's."""
    sides = {}
    names = []
    for f in files:
        side = side_of(f)
        if side not in names:
            names.append(side)
        for k, v in read(f).items():
            sides.setdefault(k, {}).setdefault(side, []).append(v)
    names.sort(key=lambda n: (n != "old", n != "new", n))
    others = [n for n in names if n != "old"]
    print(f"\n### {kind}: median of each side's rounds, and its ratio to old's\n")
    print("| figure | " + " | ".join(names) + " | " + " | ".join(f"{n}/old" for n in others) + " |")
    print("|---" * (1 + len(names) + len(others)) + "|")
    for k in sorted(sides):
        med = {n: statistics.median(sides[k].get(n, [float("nan")])) for n in names}
        o = med.get("old", float("nan"))
        ratios = [f"{med[n] / o:.3f}" if o else "nan" for n in others]
        print(f"| {k} | " + " | ".join(f"{med[n]:,.0f}" for n in names) + " | " +
              " | ".join(ratios) + " |")


def main():
    d = sys.argv[1]
    hosts = sorted(glob.glob(os.path.join(d, "host-*.log")))
    if hosts:
        table("host bench", hosts, host)
    gpus = sorted(glob.glob(os.path.join(d, "gpu-*.json")))
    if gpus:
        table("GPU bench (MPS on)", gpus, gpu)
    hops = sorted(glob.glob(os.path.join(d, "hop-mps-off-*.json")))
    if hops:
        table("GPU bench floors and hop (MPS off)", hops, gpu,
              lambda f: os.path.basename(f)[len("hop-mps-off-"):-len(".json")])


if __name__ == "__main__":
    main()
