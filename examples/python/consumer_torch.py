#!/usr/bin/env python3
"""A PyTorch inference-style consumer of the Rust pipeline producer, with zero copies.

Every frame the producer publishes arrives as a torch tensor that points at the producer's
GPU memory (DLPack): uint8[1080, 1920, 4] for the default 1080p RGBA frames, typed by the
tensor header the producer writes. For each frame this normalises the image the way a vision
model's preprocessing does, takes its per-channel mean, and checks every byte against the
pattern the producer wrote (its u64 words are seq * 0x9E3779B97F4A7C15 + j).

Run (two terminals, or with & as here):

    cargo build --release --example pipeline
    target/release/examples/pipeline --consumers 0 --external 1 --name cam0 --fps 0 &
    python3 examples/python/consumer_torch.py cam0

It works on host rings too (the tensors are then CPU tensors).
"""
import argparse
import sys
import time

import torch

import gpuring

MUL = 0x9E3779B97F4A7C15
MEAN = torch.tensor([0.485, 0.456, 0.406, 0.5])  # ImageNet-style per-channel normalisation
STD = torch.tensor([0.229, 0.224, 0.225, 0.25])


def pattern(seq, n_words, device):
    """The producer's pattern for frame `seq`, as int64 words."""
    base = (seq * MUL) % (1 << 64)
    base = base - (1 << 64) if base >= (1 << 63) else base
    return torch.arange(n_words, dtype=torch.int64, device=device) + base


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("name", help="ring name (the pipeline's --name)")
    ap.add_argument("--wait", type=float, default=30.0, help="seconds to wait for the ring")
    args = ap.parse_args()

    frames = bad_words = lost = 0
    start = last = time.perf_counter()
    with gpuring.Consumer(args.name, wait=args.wait, start="next") as rx:
        print(f"consumer_torch: ring {rx.name!r}, {rx.memory} memory, "
              f"{rx.capacity} slots of {rx.slot_size} bytes")
        mean, std = MEAN, STD
        for slot in rx:  # ends when the producer closes the ring
            with slot:  # released at the end of the block (after the work queued on it)
                frame = slot.torch()  # zero-copy: uint8[H, W, 4] on the GPU (= torch.from_dlpack)
                if mean.device != frame.device:
                    mean, std = MEAN.to(frame.device), STD.to(frame.device)
                x = (frame.float() / 255.0 - mean) / std  # the "inference" work
                channel_means = x.mean(dim=(0, 1))
                words = frame.reshape(-1).view(torch.int64)
                bad_words += int((words != pattern(slot.seq, words.numel(), frame.device)).sum())
                lost += slot.lag
                frames += 1
            now = time.perf_counter()
            if now - last >= 1.0:
                print(f"consumer_torch: {frames} frames, channel means "
                      f"{[round(v, 3) for v in channel_means.tolist()]}")
                last = now
    secs = time.perf_counter() - start
    print(f"consumer_torch: {frames} frames in {secs:.2f} s ({frames / secs:.1f} fps), "
          f"{lost} lost, {bad_words} bad words")
    return 0 if bad_words == 0 and frames > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
