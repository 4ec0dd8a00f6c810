"""A PyTorch consumer of a `gpuringsink` ring: each frame as a CUDA tensor, without a copy,
checked against reference frames (raw RGBA, written by `check ref`), by the frame number in
the GStreamer frame header (docs/gstreamer.md).

    python3 torch_consumer.py RING N REF.raw HEIGHT WIDTH
"""
import struct
import sys
import time

import numpy as np
import torch

import gpuring

FRAME_AT = 64  # the frame header's place in the user header


def frame_header(user_header: bytes) -> dict:
    b = user_header[FRAME_AT:FRAME_AT + 192]
    if b[0:4] != b"GRGS":
        raise ValueError("no GStreamer frame header")
    version, planes = struct.unpack_from("<HH", b, 4)
    fmt = b[8:24].rstrip(b"\0").decode()
    width, height, fps_n, fps_d = struct.unpack_from("<IIii", b, 24)
    strides = struct.unpack_from("<4I", b, 80)
    pts, dts, duration, offset = struct.unpack_from("<4Q", b, 96)
    none = 2**64 - 1
    return dict(version=version, planes=planes, format=fmt, width=width, height=height,
                fps=(fps_n, fps_d), stride=strides[0], pts=None if pts == none else pts,
                offset=None if offset == none else offset)


def main() -> int:
    ring, n, ref_path, height, width = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
    ref = torch.from_numpy(np.fromfile(ref_path, np.uint8).reshape(n, height, width, 4)).cuda()
    frames = bad = lost = 0
    first = None
    with gpuring.Consumer(ring, mode="lossless", wait=60.0) as rx:
        for slot in rx:
            first = first or time.perf_counter()
            h = frame_header(slot.header)
            assert (h["format"], h["width"], h["height"]) == ("RGBA", width, height), h
            # The tensor header says [height, width, 4] when rows are packed (pitch = width * 4).
            t = torch.from_dlpack(slot)
            if t.dim() == 1:  # pitched rows: view them through the stride
                t = t.as_strided((height, width, 4), (h["stride"], 4, 1))
            number = h["offset"] if h["offset"] is not None else frames + lost
            bad += int((t != ref[number]).sum().item())
            lost += slot.lag
            frames += 1
            slot.release()
            if number + 1 >= n:
                break
    secs = time.perf_counter() - first if first else 0.0
    fps = (frames - 1) / secs if frames > 1 and secs > 0 else 0.0
    print(f"python/torch consumer of {ring}: {frames} frames, {bad} bad bytes, {lost} lost, {fps:.1f} frames/s")
    return 0 if bad == 0 and frames + lost == n and frames else 1


if __name__ == "__main__":
    sys.exit(main())
