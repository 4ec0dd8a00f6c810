#!/usr/bin/env python3
"""Peer baseline: PyTorch's torch.multiprocessing Queue of CUDA tensors, 1 -> N consumers.

The producer owns a pool of CUDA tensors (like gpuring's slots: torch requires the producer to
keep a shared tensor alive while consumers use it). For every frame it fills a pool tensor on the
GPU and puts it on each consumer's queue; each consumer reads the whole tensor with a kernel
(a sum over int64 words), synchronizes, and acks, and the producer reuses a tensor only after
every consumer acked it. Frames/s per consumer is what gpuring's GPU bench compares against.

Run on a machine with a GPU and PyTorch:
    python3 benches/peers/torch_mp.py [--seconds 3] [--consumers 1 4] [--sizes 65536 1048576 ...]
        [--json out.json]
"""
import argparse
import json
import time

import torch
import torch.multiprocessing as mp

POOL = 8


def consumer(k, queue, acks, frames_out, ready):
    torch.cuda.set_device(0)
    torch.zeros(1, device="cuda").sum().item()  # CUDA initialised before the clock starts
    ready.put(k)
    n = 0
    checksum = 0
    start = None
    while True:
        item = queue.get()
        if item is None:
            break
        idx, t = item
        if start is None:
            start = time.perf_counter()
        checksum ^= int(t.view(torch.int64).sum().item())  # reads every byte, then syncs
        del t
        acks.put(idx)
        n += 1
    secs = time.perf_counter() - (start or time.perf_counter())
    frames_out.put((k, n, secs, checksum))


def run(size, consumers, seconds):
    ctx = mp.get_context("spawn")
    queues = [ctx.Queue() for _ in range(consumers)]
    acks = ctx.Queue()
    frames_out = ctx.Queue()
    ready = ctx.Queue()
    procs = [ctx.Process(target=consumer, args=(k, queues[k], acks, frames_out, ready))
             for k in range(consumers)]
    for p in procs:
        p.start()
    pool = [torch.empty(size, dtype=torch.uint8, device="cuda") for _ in range(POOL)]
    for _ in range(consumers):
        ready.get()  # every consumer is up: measure the steady state, not process start-up
    pending = [0] * POOL  # consumers that have not acked each pool tensor yet
    seq = 0
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        idx = seq % POOL
        while pending[idx] > 0:
            pending[acks.get()] -= 1
        pool[idx].fill_(seq & 0xFF)
        torch.cuda.current_stream().synchronize()  # the tensor must be written before sharing
        for q in queues:
            q.put((idx, pool[idx]))
        pending[idx] = consumers
        seq += 1
    for q in queues:
        q.put(None)
    results = [frames_out.get() for _ in range(consumers)]
    for p in procs:
        p.join()
    return summary(size, consumers, seq, results)


def summary(size, consumers, published, results):
    """One row from the consumers' (k, frames, seconds, checksum) results; every consumer must
    have received every frame."""
    rates = [n / secs if secs > 0 else 0.0 for (_, n, secs, _) in results]
    assert all(n == published for (_, n, _, _) in results), "a consumer missed frames"
    return {"size": size, "consumers": consumers, "published": published,
            "fps_per_consumer_min": min(rates), "fps_per_consumer_mean": sum(rates) / len(rates)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--consumers", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--sizes", type=int, nargs="+", default=[64 << 10, 1 << 20, 8 << 20, 32 << 20])
    ap.add_argument("--json")
    args = ap.parse_args()
    rows = []
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}")
    print("| frame | consumers | frames/s per consumer (mean) | min |")
    print("|---|---|---|---|")
    for n in args.consumers:
        for size in args.sizes:
            r = run(size, n, args.seconds)
            rows.append(r)
            print(f"| {size >> 10} KiB | {n} | {r['fps_per_consumer_mean']:.0f} | {r['fps_per_consumer_min']:.0f} |",
                  flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
