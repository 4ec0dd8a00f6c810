#!/usr/bin/env python3
"""Many cameras, one batcher, PyTorch consumers running ResNet-18 on the batches (docs/batching.md).

Each camera is a process that publishes RGB frames into a CUDA ring at a fixed rate (each frame
a pattern of its camera and sequence number, made on the GPU); `gpuring batch --memory cuda`
batches the rings into one; each consumer is a process that receives the newest batch
(`mode="latest"`), takes it as a `[K, H, W, 3]` tensor with no copy (`slot.torch()`), checks
every byte against the sequence numbers in the batch table, and runs ResNet-18 (`weights=None`)
on it as a `[K, 3, H, W]` half-precision tensor. Reported: batches/s, per-camera frame age from
the camera's publish to the batch's publish (p50/p99), present/stale/absent counts, bad bytes.

`--roofline`: the cameras send as fast as they can, the consumers receive every batch
(`mode="lossless"`) without reading it, and the batcher's copy rate (bytes of new frames
batched per second) is set against a device-to-device copy of one batch's bytes, measured here
first (the floor).

    python3 benches/batch/resnet.py --gpuring target/release/gpuring [--cameras 8]
        [--width 1280 --height 720] [--fps 30] [--seconds 20] [--consumers 2] [--roofline]
        [--json out.json]
"""
import argparse
import json
import multiprocessing as mp
import os
import struct
import subprocess
import sys
import time

import torch


def value(cam, seq):
    """The pattern's base value of camera `cam`'s frame `seq`: row r holds (value + r) % 256."""
    return (seq * 7 + cam * 31) % 256


def camera(k, name, w, h, fps, stop_at, out):
    import gpuring
    torch.cuda.set_device(0)
    tx = gpuring.Producer(name, w * h * 3, capacity=4, memory="cuda", header_size=64)
    rows = torch.arange(h, device="cuda", dtype=torch.int32).view(h, 1, 1)
    buf = torch.empty((h, w, 3), dtype=torch.uint8, device="cuda")
    period = 1.0 / fps if fps > 0 else 0.0
    seq, t_next = 0, time.perf_counter()
    while time.perf_counter() < stop_at:
        buf.copy_(((rows + value(k, seq)) % 256).expand(h, w, 3))
        assert tx.send(buf) == seq  # a copy on torch's stream, after the fill; no CPU sync
        seq += 1
        if period:
            t_next += period
            time.sleep(max(0.0, t_next - time.perf_counter()))
    tx.close()
    out.put(("camera", k, seq))


def parse(header):
    """The batch table (docs/batching.md): batch number and per camera (seq, ts, skipped, epoch,
    state)."""
    o = 128
    assert header[o:o + 4] == b"GRBT", "not a batch"
    (k,) = struct.unpack_from("<I", header, o + 8)
    batch, closed = struct.unpack_from("<QQ", header, o + 16)
    cams = [struct.unpack_from("<QQQQI", header, o + 32 + 40 * i) for i in range(k)]
    return batch, closed, cams


def consumer(j, name, w, h, roofline, stop_at, ready, out):
    import gpuring
    import torchvision
    torch.cuda.set_device(0)
    model = None
    if not roofline:
        model = torchvision.models.resnet18(weights=None).cuda().eval().half()
        model = model.to(memory_format=torch.channels_last)
    rows = torch.arange(h, device="cuda", dtype=torch.int32).view(h, 1, 1)
    rx = gpuring.Consumer(name, wait=60, mode="lossless" if roofline else "latest", start="next")
    ready.put(j)
    bad = torch.zeros((), dtype=torch.int64, device="cuda")
    n, ages, to_close, states, infer = 0, [], [], [0, 0, 0, 0], []
    start = None
    while time.perf_counter() < stop_at:
        try:
            slot = rx.recv(timeout=0.5)
        except TimeoutError:
            continue
        with slot:
            if start is None:
                start = time.perf_counter()
            t = slot.torch()  # [K, H, W, 3] uint8, no copy
            _, closed, cams = parse(slot.header)
            for k, (seq, ts, _skipped, _epoch, state) in enumerate(cams):
                states[state] += 1
                if roofline:
                    continue
                if ts:
                    want = ((rows + value(k, seq)) % 256).to(torch.uint8)
                    bad += (t[k] != want).sum()
                    if state == 1:
                        ages.append(slot.timestamp_ns - ts)
                        to_close.append(closed - ts)
                else:
                    bad += (t[k] != 0).sum()
            if model is not None:
                t0 = time.perf_counter()
                x = t.permute(0, 3, 1, 2).half().div_(255)
                x = x.contiguous(memory_format=torch.channels_last)
                with torch.no_grad():
                    model(x)
                torch.cuda.current_stream().synchronize()
                infer.append(time.perf_counter() - t0)
            elif not roofline:
                torch.cuda.current_stream().synchronize()  # read before the release
        n += 1
    secs = time.perf_counter() - (start or time.perf_counter())
    rx.close()
    out.put(("consumer", j, n, secs, int(bad.item()), ages, to_close, states, infer))


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))] if xs else None


def d2d_floor(nbytes, seconds=1.0):
    """Bytes/s of a device-to-device copy of `nbytes` (torch, one stream), as the batcher's floor."""
    torch.cuda.set_device(0)
    a = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    b.copy_(a)
    torch.cuda.synchronize()
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(10):
            b.copy_(a)
        torch.cuda.synchronize()
        n += 10
    return n * nbytes / (time.perf_counter() - t0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpuring", required=True, help="the gpuring binary")
    ap.add_argument("--cameras", type=int, default=8)
    ap.add_argument("--width", type=int, default=1280)
    ap.add_argument("--height", type=int, default=720)
    ap.add_argument("--fps", type=float, default=30)
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--consumers", type=int, default=2)
    ap.add_argument("--max-wait-ms", type=int, default=20)
    ap.add_argument("--spares", type=int, help="the batch ring's spare buffers (default: gpuring's)")
    ap.add_argument("--roofline", action="store_true")
    ap.add_argument("--warm", type=float, default=15.0,
                    help="seconds for processes, CUDA contexts and the model to start")
    ap.add_argument("--json")
    a = ap.parse_args()
    if a.roofline:
        a.fps = 0
    k, w, h = a.cameras, a.width, a.height
    frame = w * h * 3
    floor = d2d_floor(k * frame) if a.roofline else None
    tag = f"{os.getpid()}"
    cams = [f"bcam{i}-{tag}" for i in range(k)]
    ring = f"batch-{tag}"
    ctx = mp.get_context("spawn")
    out, ready = ctx.Queue(), ctx.Queue()
    batcher = subprocess.Popen([a.gpuring, "batch", "--memory", "cuda", "--ring", ring,
                                "--max-wait-ms", str(a.max_wait_ms), "--inputs", ",".join(cams)]
                               + (["--spares", str(a.spares)] if a.spares else []),
                               stderr=subprocess.PIPE, text=True)
    warm = a.warm
    stop_at = time.perf_counter() + warm + a.seconds
    consumers = [ctx.Process(target=consumer,
                             args=(j, ring, w, h, a.roofline, stop_at, ready, out))
                 for j in range(a.consumers)]
    cameras = [ctx.Process(target=camera, args=(i, cams[i], w, h, a.fps, stop_at, out))
               for i in range(k)]
    for p in cameras + consumers:
        p.start()
    results = [out.get(timeout=a.seconds + warm + 120) for _ in range(k + a.consumers)]
    for p in cameras + consumers:
        p.join()
    batcher.terminate()
    _, err = batcher.communicate(timeout=30)
    sent = {r[1]: r[2] for r in results if r[0] == "camera"}
    report = {"cameras": k, "frame": [h, w, 3], "fps": a.fps, "seconds": a.seconds,
              "sent": sent, "consumers": []}
    for r in sorted(x for x in results if x[0] == "consumer"):
        _, j, n, secs, bad, ages, to_close, states, infer = r
        c = {"batches": n, "batches_per_s": n / secs if secs else 0, "bad_bytes": bad,
             "age_ms_p50": (pct(ages, 50) or 0) / 1e6, "age_ms_p99": (pct(ages, 99) or 0) / 1e6,
             # Of the age, the part until the batch closed (the rest is the fill and publish).
             "to_close_ms_p50": (pct(to_close, 50) or 0) / 1e6,
             "to_close_ms_p99": (pct(to_close, 99) or 0) / 1e6,
             "absent": states[0], "present": states[1], "stale": states[2], "refused": states[3]}
        if infer:
            c["resnet18_ms_p50"] = pct(infer, 50) * 1e3
        if a.roofline:
            c["copy_bytes_per_s"] = states[1] * frame / secs if secs else 0
            c["d2d_floor_bytes_per_s"] = floor
            c["share_of_floor"] = c["copy_bytes_per_s"] / floor if floor else None
        report["consumers"].append(c)
    report["batcher_stderr_tail"] = err.strip().splitlines()[-(k + 2):]
    text = json.dumps(report, indent=1)
    print(text)
    if a.json:
        with open(a.json, "w") as f:
            f.write(text)
    bad = sum(c["bad_bytes"] for c in report["consumers"])
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
