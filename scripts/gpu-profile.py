#!/usr/bin/env python3
"""Reads the per-frame traces of one GPU bench cell (scripts/gpu-profile.sh) into where each
frame's time goes. Markdown on stdout.

    python3 scripts/gpu-profile.py TRACE_DIR [--title T]

TRACE_DIR holds fill.tsv (the producer) and read-*.tsv (one per consumer), one line per
measured frame (benches/gpu/trace.rs): seq, kernel start, kernel end on the GPU's clock, and
four CPU moments moved onto it (producer: acquire called, acquire returned, fill launched,
publish returned; consumer: recv called, recv returned, read launched, release returned).
Frames are matched by sequence number, so every figure compares one frame's own moments.
"""
import argparse
import glob
import os
import statistics


def load(path):
    rows = {}
    for line in open(path):
        f = [int(x) for x in line.split()]
        rows[f[0]] = f[1:]
    return rows


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def row(name, xs):
    us = [x / 1e3 for x in xs]
    mean = statistics.fmean(us) if us else float("nan")
    return f"| {name} | {pct(us, 0.1):.2f} | {pct(us, 0.5):.2f} | {pct(us, 0.9):.2f} | {mean:.2f} |"


def union(spans):
    busy, cur = 0, None
    for s, e in sorted(spans):
        if cur is None or s > cur[1]:
            if cur:
                busy += cur[1] - cur[0]
            cur = [s, e]
        else:
            cur[1] = max(cur[1], e)
    return busy + (cur[1] - cur[0] if cur else 0)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir")
    ap.add_argument("--title", default="")
    a = ap.parse_args()
    fill = load(os.path.join(a.dir, "fill.tsv"))
    reads = {os.path.basename(p)[5:-4]: load(p) for p in sorted(glob.glob(os.path.join(a.dir, "read-*.tsv")))}
    seqs = sorted(set(fill).intersection(*[set(r) for r in reads.values()]))
    # Leave out the first and last tenth: start-up and drain.
    cut = len(seqs) // 10
    seqs = seqs[cut:len(seqs) - cut]
    if len(seqs) < 10:
        raise SystemExit(f"only {len(seqs)} frames in common")
    n = len(seqs)
    t0, t1 = fill[seqs[0]][0], fill[seqs[-1]][1]
    per = (t1 - t0) / (n - 1)
    print(f"# Profile: {a.title or a.dir}\n")
    print(f"{n} frames, {len(reads)} consumer(s): **{per / 1e3:.2f} µs per frame** "
          f"({1e9 / per:,.0f} frames/s) over the window.\n")
    print("| µs per frame | p10 | p50 | p90 | mean |")
    print("|---|---|---|---|---|")
    F = [fill[s] for s in seqs]  # start, end, acq0, acq1, launched, published
    print(row("producer: acquire (call to return)", [f[3] - f[2] for f in F]))
    print(row("producer: fill launch (acquire returned -> launched)", [f[4] - f[3] for f in F]))
    print(row("producer: publish (launched -> returned)", [f[5] - f[4] for f in F]))
    print(row("producer: loop (acquire called -> next acquire called)",
              [fill[b][2] - fill[a_][2] for a_, b in zip(seqs, seqs[1:])]))
    print(row("fill: launch returned -> kernel start (GPU)", [f[0] - f[4] for f in F]))
    print(row("fill: kernel duration (GPU)", [f[1] - f[0] for f in F]))
    print(row("fill: previous fill's end -> this fill's start (producer stream idle)",
              [fill[b][0] - fill[a_][1] for a_, b in zip(seqs, seqs[1:])]))
    for c, R in reads.items():
        X = [R[s] for s in seqs]  # start, end, recv0, recv1, launched, released
        print(row(f"consumer {c}: recv (call to return)", [x[3] - x[2] for x in X]))
        print(row(f"consumer {c}: publish returned -> recv returned",
                  [x[3] - f[5] for x, f in zip(X, F)]))
        print(row(f"consumer {c}: fill end (GPU) -> recv returned",
                  [x[3] - f[1] for x, f in zip(X, F)]))
        print(row(f"consumer {c}: read launch (recv returned -> launched)", [x[4] - x[3] for x in X]))
        print(row(f"consumer {c}: release (launched -> returned)", [x[5] - x[4] for x in X]))
        print(row(f"consumer {c}: read launch returned -> kernel start (GPU)", [x[0] - x[4] for x in X]))
        print(row(f"consumer {c}: read kernel duration (GPU)", [x[1] - x[0] for x in X]))
        print(row(f"consumer {c}: fill end -> read start (the hop)", [x[0] - f[1] for x, f in zip(X, F)]))
        print(row(f"consumer {c}: previous read's end -> this read's start (stream idle)",
                  [R[b][0] - R[a_][1] for a_, b in zip(seqs, seqs[1:])]))
    spans = [(f[0], f[1]) for f in F] + [(R[s][0], R[s][1]) for R in reads.values() for s in seqs]
    print(f"\nA bench kernel runs on the GPU {100 * union(spans) / (t1 - t0):.1f} % of the window; "
          f"fills alone {100 * union([(f[0], f[1]) for f in F]) / (t1 - t0):.1f} %.\n")
    mid = seqs[n // 2]
    print("Four frames in the middle (µs from the first one's acquire call):\n\n```")
    ev = []
    for s in range(mid, mid + 4):
        if s not in fill:
            continue
        f = fill[s]
        for t, w in zip(f, ["fill start (GPU)", "fill end (GPU)", "acquire called", "acquire returned",
                            "fill launched", "publish returned"]):
            ev.append((t, f"P  #{s} {w}"))
        for c, R in reads.items():
            if s in R:
                for t, w in zip(R[s], ["read start (GPU)", "read end (GPU)", "recv called",
                                       "recv returned", "read launched", "release returned"]):
                    ev.append((t, f"C{c} #{s} {w}"))
    base = fill[mid][2]
    for t, w in sorted(ev):
        print(f"{(t - base) / 1e3:9.2f}  {w}")
    print("```")


if __name__ == "__main__":
    main()
