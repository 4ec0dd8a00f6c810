#!/usr/bin/env python3
"""Video to inference: decode a real compressed video, publish each frame on the GPU, and run a
torchvision model on it in several consumer processes, zero-copy.

The producer (this process) first writes a short synthetic video file of its own with OpenCV
(moving shapes and the frame number, compressed with MPEG-4 Part 2 in an .mp4, or Motion JPEG
in an .avi where that codec is missing), so nothing is downloaded. It then decodes it with
OpenCV, frame by frame, in a loop for `--seconds`, uploads each frame to the GPU and publishes
it (uint8[H, W, 3], RGB) into a CUDA ring. Each consumer process opens the ring in the `latest`
delivery mode, the one a live inference consumer wants: every receive returns the newest frame
and skips the ones it had no time for (counted as lost, never queued up as latency). It runs a
ResNet-18 (random weights: nothing is downloaded) on every frame it receives, straight from the
producer's GPU memory (DLPack), and at the end prints its frames/s, the frames it skipped, and
the end-to-end latency from the producer's publish to the model's output being on the CPU.

Run (a GPU, PyTorch, torchvision and OpenCV needed; the gpuring package installed or on
PYTHONPATH):

    python3 examples/python/video_inference.py --consumers 2 --seconds 10

Options: `--fps 0` publishes as fast as the decoder goes (the default paces at the video's
30 frames/s, like a camera); `--sharing vmm` shares the GPU memory by file descriptor
(docs/gpu.md, "Sharing modes"); `--width`/`--height` set the video's size.
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time

import numpy as np


def make_video(path_base, width, height, frames, fps):
    """Writes a synthetic video; returns its path and codec name."""
    import cv2

    for fourcc, ext in (("mp4v", ".mp4"), ("MJPG", ".avi")):
        path = path_base + ext
        writer = cv2.VideoWriter(path, cv2.VideoWriter_fourcc(*fourcc), fps, (width, height))
        if not writer.isOpened():
            continue
        yy, xx = np.mgrid[0:height, 0:width]
        for i in range(frames):
            img = np.empty((height, width, 3), np.uint8)
            img[..., 0] = (xx + 3 * i) % 256
            img[..., 1] = (yy + 2 * i) % 256
            img[..., 2] = ((xx + yy) // 4 + i) % 256
            cx = int((width - 80) * (0.5 + 0.45 * np.sin(i / 15)))
            cy = int((height - 80) * (0.5 + 0.45 * np.cos(i / 20)))
            cv2.rectangle(img, (cx, cy), (cx + 80, cy + 80), (255, 255, 255), -1)
            cv2.putText(img, f"frame {i}", (20, 40), cv2.FONT_HERSHEY_SIMPLEX, 1.2,
                        (0, 0, 0), 3)
            writer.write(img)
        writer.release()
        if os.path.getsize(path) > 0:
            return path, fourcc
    raise SystemExit("video_inference: OpenCV can write neither mp4v nor MJPG video here")


def producer(args):
    import cv2
    import torch

    import gpuring

    name = args.name or f"video-{os.getpid()}"
    tmp = tempfile.mkdtemp(prefix="gpuring-video-")
    path, codec = make_video(os.path.join(tmp, "synthetic"), args.width, args.height,
                             args.video_frames, 30)
    size = os.path.getsize(path)
    print(f"video_inference: wrote {path} ({args.video_frames} frames {args.width}x{args.height},"
          f" {codec}, {size / 1e6:.2f} MB)", flush=True)
    frame_bytes = args.width * args.height * 3
    tx = gpuring.Producer(name, frame_bytes, memory="cuda", capacity=4, sharing=args.sharing)
    me = os.path.abspath(__file__)
    children = [
        subprocess.Popen([sys.executable, me, "--role-consumer", str(k), "--name", name,
                          "--model", args.model])
        for k in range(args.consumers)
    ]
    t = time.monotonic()
    while tx.consumer_count < args.consumers:
        if time.monotonic() - t > 120:
            raise SystemExit("video_inference: the consumers did not join within 120 s")
        time.sleep(0.01)
    cap = cv2.VideoCapture(path)
    period = 1.0 / args.fps if args.fps > 0 else 0.0
    published, decode_s, start = 0, 0.0, time.monotonic()
    next_at = start
    while time.monotonic() - start < args.seconds:
        t0 = time.monotonic()
        ok, bgr = cap.read()
        if not ok:  # end of the file: loop, as a camera keeps going
            cap.release()
            cap = cv2.VideoCapture(path)
            ok, bgr = cap.read()
            if not ok:
                raise SystemExit(f"video_inference: cannot decode {path}")
        rgb = np.ascontiguousarray(bgr[..., ::-1])
        decode_s += time.monotonic() - t0
        frame = torch.from_numpy(rgb).to("cuda", non_blocking=False)  # uint8[H, W, 3]
        tx.send(frame)  # the copy into the slot goes on torch's stream; the CPU does not wait
        published += 1
        if period:
            next_at += period
            delay = next_at - time.monotonic()
            if delay > 0:
                time.sleep(delay)
    elapsed = time.monotonic() - start
    cap.release()
    tx.close()  # consumers receive what was published, then the end
    codes = [c.wait() for c in children]
    print(f"producer: decoded and published {published} frames in {elapsed:.1f} s "
          f"({published / elapsed:.1f} frames/s; decoding {decode_s / max(published, 1) * 1e3:.2f}"
          f" ms/frame on the CPU)", flush=True)
    os.remove(path)
    os.rmdir(tmp)
    if any(codes):
        raise SystemExit(f"video_inference: a consumer failed: exit codes {codes}")


def consumer(args, k):
    import torch
    import torchvision

    import gpuring

    torch.backends.cudnn.benchmark = True
    model = getattr(torchvision.models, args.model)(weights=None).cuda().eval().half()
    mean = torch.tensor([0.485, 0.456, 0.406], device="cuda").view(1, 3, 1, 1).half()
    std = torch.tensor([0.229, 0.224, 0.225], device="cuda").view(1, 3, 1, 1).half()
    with torch.inference_mode():  # warm up (cuDNN picks its kernels) before joining the ring
        for _ in range(5):
            model(torch.zeros(1, 3, 224, 224, device="cuda", dtype=torch.half))
        torch.cuda.synchronize()
    latencies, frames, skipped, first = [], 0, 0, None
    with gpuring.Consumer(args.name, mode="latest", wait=60) as rx, torch.inference_mode():
        memory = rx.memory
        for slot in rx:
            with slot:
                img = slot.torch()  # uint8[H, W, 3] in the producer's GPU memory
                x = img.permute(2, 0, 1).unsqueeze(0).half().div_(255)
                x = torch.nn.functional.interpolate(x, size=(224, 224), mode="bilinear")
                logits = model((x - mean) / std)
                top = int(logits.argmax())  # waits for the model: the result is on the CPU
            now = time.monotonic_ns()
            first = first or now
            latencies.append((now - slot.timestamp_ns) / 1e6)
            skipped += slot.lag
            frames += 1
            assert 0 <= top < 1000
    elapsed = max((time.monotonic_ns() - first) / 1e9, 1e-9) if first else 0.0
    lat = np.array(latencies or [0.0])
    print(f"consumer {k}: {frames} frames in {elapsed:.1f} s ({frames / max(elapsed, 1e-9):.1f}"
          f" frames/s), {skipped} skipped (latest mode), publish->result latency p50 "
          f"{np.percentile(lat, 50):.2f} ms p99 {np.percentile(lat, 99):.2f} ms "
          f"({args.model}, fp16, {memory} memory)", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--consumers", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--fps", type=float, default=30.0, help="0: as fast as decoding goes")
    ap.add_argument("--width", type=int, default=1280)
    ap.add_argument("--height", type=int, default=720)
    ap.add_argument("--video-frames", type=int, default=150, help="frames in the video file")
    ap.add_argument("--model", default="resnet18", help="a torchvision classification model")
    ap.add_argument("--sharing", default="legacy", choices=["legacy", "vmm"])
    ap.add_argument("--name", default=None, help="ring name (default video-PID)")
    ap.add_argument("--role-consumer", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.role_consumer is None:
        producer(args)
    else:
        consumer(args, args.role_consumer)


if __name__ == "__main__":
    main()
