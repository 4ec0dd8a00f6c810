"""The PyTorch consumer of tests/gpu_namespaces.rs, started (under `unshare` when isolated) with
the cell in its environment. Reads every message of the ring as a tensor (`torch.from_dlpack`)
and compares every byte with its pattern on the GPU; then waits for the producer's death.
Where the cell expects a refusal, checks that the open fails at once saying what is missing.
Tells the test where it is with '@gpuring-ns ' lines on stderr."""
import os
import sys
import time

import torch

import gpuring

MUL = 0x9E3779B97F4A7C15  # src/testing/pattern.rs
cell, ring, ring_dir = os.environ["NS_CELL"], os.environ["NS_RING"], os.environ["NS_DIR"]
total, size = int(os.environ["NS_TOTAL"]), int(os.environ["NS_SIZE"])
refusal = [w for w in os.environ["NS_REFUSAL"].split("|") if w]  # what a refusal must say


def mark(what):
    print(f"@gpuring-ns {what}", file=sys.stderr, flush=True)


def fail(why):
    print(f"[{cell}] torch consumer: {why}", file=sys.stderr, flush=True)
    sys.exit(1)


def expected(seq, n_words):
    """Message `seq`'s pattern as int64 words on the GPU: seq * MUL + j, wrapping."""
    base = (seq * MUL) % (1 << 64)
    base = base - (1 << 64) if base >= (1 << 63) else base
    return torch.arange(n_words, dtype=torch.int64, device="cuda") + base


start = time.monotonic()
try:
    rx = gpuring.Consumer(ring, dir=ring_dir, start="oldest", wait=30)
except Exception as e:  # noqa: BLE001 - any refusal is checked by its text
    if not refusal:
        fail(f"open: {e}")
    text = str(e)
    if not all(w in text for w in refusal):
        fail(f"the refusal does not say {refusal}: {text}")
    if time.monotonic() - start > 15:
        fail("refused only after a wait")
    mark("refused")
    sys.exit(0)
if refusal:
    fail("opened a ring it was to be refused")
if rx.memory != "cuda":
    fail(f"memory {rx.memory}")

words = size // 8
bad = torch.zeros((), dtype=torch.int64, device="cuda")
for seq in range(total):
    try:
        slot = rx.recv(timeout=30)
    except Exception as e:  # noqa: BLE001
        fail(f"message {seq}: {e!r}")
    with slot:
        if (slot.seq, len(slot), slot.lag) != (seq, size, 0):
            fail(f"message {seq}: seq {slot.seq}, {len(slot)} bytes, lag {slot.lag}")
        t = torch.from_dlpack(slot.view("int64", (words,)))
        bad += (t != expected(seq, words)).sum()
        del t
wrong = int(bad.item())
if wrong:
    fail(f"{wrong} words were wrong")
mark("received")

# The test kills the producer now.
try:
    slot = rx.recv(timeout=30)
    fail(f"message {slot.seq} after the last")
except gpuring.Disconnected:
    pass
except TimeoutError:
    fail("the producer's death not seen in 30 s")
if rx.ended != "died":
    fail(f"ended {rx.ended!r}, not 'died'")
rx.close()
