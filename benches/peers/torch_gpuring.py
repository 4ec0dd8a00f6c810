#!/usr/bin/env python3
"""Torch consumers fed through gpuring, against the torch.multiprocessing floor, in one run.

For each frame size and consumer count this runs benches/peers/torch_mp.py's benchmark (the
floor: a Queue of CUDA tensors from a pool the producer keeps alive), then the same job
through a gpuring CUDA ring: the producer fills a pool tensor on the GPU exactly as torch_mp
does and publishes it with `Producer.send` (a device-to-device copy into the slot, no CPU
sync); each consumer takes `slot.torch()` (zero-copy, what `torch.from_dlpack(slot)` makes), reads every byte with the
same kernel (a sum over int64 words), syncs, and releases. Frames/s per consumer is reported
for both, with gpuring's as a ratio to the floor.

Run on a machine with a GPU, PyTorch and the gpuring wheel:
    python3 benches/peers/torch_gpuring.py [--seconds 3] [--consumers 1 4]
        [--sizes 1048576 8388608] [--json out.json]
"""
import argparse
import json
import os
import pathlib
import sys
import time

import torch
import torch.multiprocessing as mp

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import torch_mp  # noqa: E402  (the floor, measured in this same run)

POOL = torch_mp.POOL


def consumer(k, name, frames_out, ready):
    import gpuring
    torch.cuda.set_device(0)
    torch.zeros(1, device="cuda").sum().item()  # CUDA initialised before the clock starts
    rx = gpuring.Consumer(name, wait=30, start="next")
    ready.put(k)
    n = 0
    checksum = 0
    start = None
    for slot in rx:
        with slot:
            if start is None:
                start = time.perf_counter()
            t = slot.torch()
            checksum ^= int(t.view(torch.int64).sum().item())  # reads every byte, then syncs
            del t
        n += 1
    secs = time.perf_counter() - (start or time.perf_counter())
    rx.close()
    frames_out.put((k, n, secs, checksum))


def run(size, consumers, seconds):
    import gpuring
    ctx = mp.get_context("spawn")
    name = f"bench-torch-{os.getpid()}-{size}-{consumers}"
    tx = gpuring.Producer(name, size, capacity=POOL, memory="cuda", header_size=64)
    frames_out = ctx.Queue()
    ready = ctx.Queue()
    procs = [ctx.Process(target=consumer, args=(k, name, frames_out, ready)) for k in range(consumers)]
    for p in procs:
        p.start()
    pool = [torch.empty(size, dtype=torch.uint8, device="cuda") for _ in range(POOL)]
    for _ in range(consumers):
        ready.get()
    while tx.consumer_count < consumers:
        time.sleep(0.001)
    seq = 0
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        idx = seq % POOL
        pool[idx].fill_(seq & 0xFF)
        tx.send(pool[idx])  # copy on the current (default) stream, then publish: no CPU sync
        seq += 1
    tx.close()
    results = [frames_out.get() for _ in range(consumers)]
    for p in procs:
        p.join()
    return torch_mp.summary(size, consumers, seq, results)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--consumers", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1 << 20, 8 << 20])
    ap.add_argument("--json")
    args = ap.parse_args()
    import gpuring
    print(f"torch {torch.__version__}, gpuring {gpuring.__version__}, {torch.cuda.get_device_name(0)}, "
          f"MPS {'on' if os.environ.get('CUDA_MPS_PIPE_DIRECTORY') else 'off'}")
    print("| frame | consumers | torch.multiprocessing frames/s | gpuring frames/s | ratio | gpuring min |")
    print("|---|---|---|---|---|---|")
    rows = []
    for n in args.consumers:
        for size in args.sizes:
            floor = torch_mp.run(size, n, args.seconds)
            ours = run(size, n, args.seconds)
            ratio = ours["fps_per_consumer_mean"] / floor["fps_per_consumer_mean"]
            rows.append({"torch_mp": floor, "gpuring": ours, "ratio": ratio})
            print(f"| {size >> 20} MiB | {n} | {floor['fps_per_consumer_mean']:.0f} | "
                  f"{ours['fps_per_consumer_mean']:.0f} | {ratio:.1f}x | {ours['fps_per_consumer_min']:.0f} |",
                  flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
