#!/usr/bin/env python3
"""What one Python receive costs: recv -> DLPack tensor -> release, against the same loop in Rust.

A Rust pipeline producer runs free (`pipeline --consumers 0 --external 1 --fps 0`, 320x240
RGBA frames, lossless), and one consumer at a time reads it:

  rust      examples/recv_loop.rs: recv, drop (release), nothing else
  release   Python: `rx.recv().release()`
  tensor    Python: `with slot: t = from_dlpack(slot)`; the tensor lives until the next
            frame's replaces it, so it outlives the release (the usual loop)
  del       Python: `with slot: t = from_dlpack(slot); del t`: the tensor is freed first
  direct    as `tensor`, with the capsule handed to torch's importer itself,
            `torch._C._from_dlpack(slot.__dlpack__())`, skipping the wrapper that looks up the
            current stream by device (torch only; the consumer's stream is the default one, so
            nothing changes in the ordering)
  torch     as `tensor`, with gpuring's own `slot.torch()`, which does what `direct` does and
            orders torch's current stream as `torch.from_dlpack` does (torch only)

`from_dlpack` is `torch.from_dlpack`, or `numpy.from_dlpack` where torch is missing (host
rings only). Each loop is timed two ways, in microseconds per frame:

  free      the loop as it runs against the free-running producer: the time per frame
            received. When the producer is the slower side this is its period, whatever the
            consumer does.
  backlog   the consumer's own work: the loop sleeps until the ring has filled (the producer
            waits for a lossless consumer a ring behind), stops the producer (SIGSTOP), receives
            what is waiting with `try_recv`, timing only that, and lets the producer go on
            (SIGCONT). Nothing else of the pipeline runs while the clock does.

Each repetition starts a fresh producer and measures every loop against it in turn (each
consumer joins with start="next"). The table gives the median over repetitions, and the
tensor's cost over the bare receive (median of each repetition's difference).

Here, with a release build of the examples and the package installed:
    python3 benches/python_recv.py [--memory host] [--reps 5] [--json out.json]
On a GPU machine, from a bundle (../shared/gpu-bundle, then scripts/python-bundle.sh):
    PYTHONPATH=$PWD/target/gpu-bundle/py/site python3 benches/python_recv.py \
        --bin-dir target/gpu-bundle/bin --memory cuda --json out/python-recv.json
"""
import argparse
import json
import os
import pathlib
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
LOOPS = ("rust", "release", "tensor", "del", "direct", "torch")
TITLES = {
    "rust": "Rust recv + drop",
    "release": "Python recv + release",
    "tensor": "Python recv + tensor (`with slot: t = ...`)",
    "del": "Python recv + tensor, del t before release",
    "direct": "Python recv + tensor through torch._C._from_dlpack",
    "torch": "Python recv + slot.torch()",
}

from_dlpack = None  # torch.from_dlpack or numpy.from_dlpack, chosen in main()


# Each Python loop receives with `get` (rx.recv, which never returns None, or rx.try_recv)
# until it has `n` frames or `get` finds none, and returns how many it received. The bodies
# differ only in what they do with a frame; each is written out rather than passed as a
# callback, so that no extra Python call per frame is timed.

def loop_release(get, n):
    k = 0
    while k < n:
        slot = get()
        if slot is None:
            break
        slot.release()
        k += 1
    return k


def loop_tensor(get, n):
    k = 0
    while k < n:
        slot = get()
        if slot is None:
            break
        with slot:
            t = from_dlpack(slot)  # noqa: F841  (freed when the next frame's replaces it)
        k += 1
    return k


def loop_del(get, n):
    k = 0
    while k < n:
        slot = get()
        if slot is None:
            break
        with slot:
            t = from_dlpack(slot)
            del t
        k += 1
    return k


def loop_direct(get, n):
    k = 0
    while k < n:
        slot = get()
        if slot is None:
            break
        with slot:
            t = import_capsule(slot.__dlpack__())  # noqa: F841
        k += 1
    return k


def loop_torch(get, n):
    k = 0
    while k < n:
        slot = get()
        if slot is None:
            break
        with slot:
            t = slot.torch()  # noqa: F841
        k += 1
    return k


import_capsule = None  # torch._C._from_dlpack, with torch

PY_LOOPS = {"release": loop_release, "tensor": loop_tensor, "del": loop_del, "direct": loop_direct,
            "torch": loop_torch}


def python_run(args, name, loop, producer):
    """Times one Python loop, free then backlog; µs per frame for each."""
    import gpuring

    body = PY_LOOPS[loop]
    with gpuring.Consumer(name, wait=30, start="next", dir=args.dir) as rx:
        body(rx.recv, args.warmup)
        t0 = time.perf_counter_ns()
        got = body(rx.recv, args.frames)
        free = (time.perf_counter_ns() - t0) / 1e3 / got
        got, took = 0, 0
        while got < args.backlog_frames:
            time.sleep(args.pause_ms / 1e3)
            producer.send_signal(signal.SIGSTOP)
            try:
                t0 = time.perf_counter_ns()
                # A consumer slower than the producer never empties the ring: bound a burst.
                got += body(rx.try_recv, min(args.backlog_frames - got, 4096))
                took += time.perf_counter_ns() - t0
            finally:
                producer.send_signal(signal.SIGCONT)
        return free, took / 1e3 / got


def rust_run(args, name, producer):
    """Times examples/recv_loop.rs, free then backlog; µs per frame for each."""
    out = []
    for backlog in (False, True):
        frames = args.backlog_frames if backlog else args.frames
        cmd = [str(args.bin_dir / "recv_loop"), name, "--frames", str(frames),
               "--warmup", str(args.warmup)]
        if backlog:
            cmd += ["--backlog", "--pause-ms", str(args.pause_ms), "--stop-pid", str(producer.pid)]
        if args.dir:
            cmd += ["--dir", args.dir]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if r.returncode != 0:
            sys.exit(f"python_recv: {' '.join(cmd)} failed:\n{r.stderr}")
        out.append(json.loads(r.stdout.strip().splitlines()[-1])["us_per_frame"])
    return tuple(out)


def repetition(args, rep):
    """One producer run, every loop against it in turn: {loop: (free, backlog)}."""
    name = f"pyrecv-{os.getpid()}-{rep}"
    cmd = [str(args.bin_dir / "pipeline"), "--consumers", "0", "--external", "1",
           "--name", name, "--fps", "0", "--width", str(args.width), "--height", str(args.height),
           "--capacity", str(args.capacity), "--seconds", "0", "--memory", args.memory]
    if args.dir:
        cmd += ["--dir", args.dir]
    log = tempfile.TemporaryFile(mode="w+")
    producer = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    results = {}
    try:
        for loop in args.loops:
            if producer.poll() is not None:
                break
            if loop == "rust":
                results[loop] = rust_run(args, name, producer)
            else:
                results[loop] = python_run(args, name, loop, producer)
    finally:
        if producer.poll() is None:
            producer.send_signal(signal.SIGCONT)  # in case a measurement failed while stopped
            producer.send_signal(signal.SIGTERM)  # `--seconds 0`: publishes until stopped
        try:
            rc = producer.wait(timeout=30)
        except subprocess.TimeoutExpired:
            producer.kill()
            rc = producer.wait()
        log.seek(0)
        text = log.read()
        if rc != 0:
            sys.exit(f"python_recv: the producer ({' '.join(cmd)}) exited {rc}:\n{text[-3000:]}")
    if len(results) < len(args.loops):
        sys.exit(f"python_recv: the producer ({' '.join(cmd)}) ended early:\n{text[-3000:]}")
    if rep == 0:
        print(text.splitlines()[0] if text else "(no producer output)", flush=True)
    return results


def main():
    global from_dlpack, import_capsule
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin-dir", type=pathlib.Path, default=ROOT / "target" / "release" / "examples",
                    help="where pipeline and recv_loop are (a bundle's bin/)")
    ap.add_argument("--memory", choices=["auto", "host", "cuda"], default="auto")
    ap.add_argument("--width", type=int, default=320)
    ap.add_argument("--height", type=int, default=240)
    ap.add_argument("--capacity", type=int, default=64,
                    help="ring slots: the longest burst a backlog measurement drains")
    ap.add_argument("--frames", type=int, default=20000, help="frames timed running free")
    ap.add_argument("--backlog-frames", type=int, default=5000, help="frames timed from a backlog")
    ap.add_argument("--warmup", type=int, default=1000)
    ap.add_argument("--pause-ms", type=float, default=5.0, help="sleep that lets the ring fill")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--lib", choices=["auto", "torch", "numpy"], default="auto",
                    help="whose from_dlpack makes the tensor (auto: torch if installed)")
    ap.add_argument("--loops", nargs="+", choices=LOOPS, default=list(LOOPS))
    ap.add_argument("--dir", help="ring directory (default: GPURING_DIR, else /dev/shm)")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    for exe in ("pipeline", "recv_loop"):
        if not (args.bin_dir / exe).exists():
            sys.exit(f"python_recv: no {args.bin_dir / exe}: cargo build --release --example "
                     f"pipeline --example recv_loop, or pass --bin-dir")

    import gpuring
    lib = args.lib
    if lib == "auto":
        try:
            import torch  # noqa: F401
            lib = "torch"
        except ImportError:
            lib = "numpy"
    if lib == "torch":
        import torch
        from_dlpack = torch.from_dlpack
        import_capsule = torch._C._from_dlpack
        if args.memory != "host" and torch.cuda.is_available():
            torch.zeros(1, device="cuda").sum().item()  # CUDA initialised before any clock
        version = f"torch {torch.__version__}"
    else:
        import numpy
        from_dlpack = numpy.from_dlpack
        args.loops = [loop for loop in args.loops if loop not in ("direct", "torch")]
        version = f"numpy {numpy.__version__}"
    # As scripts/mps.sh starts it: with CUDA_MPS_PIPE_DIRECTORY set.
    mps = "on" if os.environ.get("CUDA_MPS_PIPE_DIRECTORY") else "off"
    print(f"gpuring {gpuring.__version__}, {version}, Python {sys.version.split()[0]}, "
          f"MPS {mps}, {args.width}x{args.height} RGBA, capacity {args.capacity}", flush=True)

    floor = {}
    if lib == "torch" and args.memory != "host" and torch.cuda.is_available():
        # torch importing its own CUDA tensor's capsule: what any DLPack source pays at least.
        x = torch.zeros(args.width * args.height * 4, dtype=torch.uint8, device="cuda")
        for what, f in (("torch.from_dlpack(tensor)", lambda: torch.from_dlpack(x)),
                        ("torch._C._from_dlpack(tensor.__dlpack__())",
                         lambda: torch._C._from_dlpack(x.__dlpack__()))):
            for _ in range(args.warmup):
                f()
            t0 = time.perf_counter_ns()
            for _ in range(args.frames):
                f()
            floor[what] = (time.perf_counter_ns() - t0) / 1e3 / args.frames
            print(f"torch floor: {what}: {floor[what]:.2f} µs", flush=True)

    runs = []
    for rep in range(args.reps):
        r = repetition(args, rep)
        runs.append(r)
        print(f"rep {rep + 1}/{args.reps}: " + ", ".join(
            f"{k} {v[0]:.2f}/{v[1]:.2f}" for k, v in r.items()) + " µs (free/backlog)", flush=True)

    def median(loop, i):
        return statistics.median(r[loop][i] for r in runs)

    def over(loop, i):
        return statistics.median(r[loop][i] - r["release"][i] for r in runs)

    summary = {loop: {"free_us": median(loop, 0), "backlog_us": median(loop, 1)}
               for loop in args.loops}
    print(f"\nµs per frame, median of {args.reps} ({lib}.from_dlpack):")
    print("| loop | free running | backlog (consumer alone) |")
    print("|---|---|---|")
    for loop in args.loops:
        s = summary[loop]
        print(f"| {TITLES[loop]} | {s['free_us']:.2f} | {s['backlog_us']:.2f} |")
    extra = {}
    if "release" in args.loops:
        for loop in ("tensor", "del", "direct", "torch"):
            if loop in args.loops:
                extra[loop] = {"free_us": over(loop, 0), "backlog_us": over(loop, 1)}
                print(f"| tensor over bare receive ({loop}) | {extra[loop]['free_us']:+.2f} | "
                      f"{extra[loop]['backlog_us']:+.2f} |")
        if "rust" in args.loops:
            extra["python_over_rust"] = {"free_us": -over("rust", 0),
                                         "backlog_us": -over("rust", 1)}
            print(f"| Python recv + release over Rust | {extra['python_over_rust']['free_us']:+.2f} | "
                  f"{extra['python_over_rust']['backlog_us']:+.2f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"config": {k: str(v) if isinstance(v, pathlib.Path) else v
                                  for k, v in vars(args).items()} | {"lib": lib},
                       "median": summary, "over_bare": extra, "torch_floor_us": floor,
                       "runs": runs}, f, indent=1)


if __name__ == "__main__":
    main()
