"""gpuring's Python package on CUDA rings, with PyTorch. Skipped without torch or a GPU."""
import gc
import signal
import subprocess
import sys
import threading
import time

import pytest

import gpuring
from conftest import MUL, start_pipeline

torch = pytest.importorskip("torch", reason="needs a CUDA GPU and torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU and torch", allow_module_level=True)


def expected_words(seq, n_words):
    """The pattern's u64 words (src/testing/pattern.rs) as int64, on the GPU: seq * MUL + j, wrapping."""
    base = (seq * MUL) % (1 << 64)
    base = base - (1 << 64) if base >= (1 << 63) else base
    return torch.arange(n_words, dtype=torch.int64, device="cuda") + base


# CUDA IPC handles cannot be opened in the process that made them, so every producer here runs
# in a child process, driven one command per line on its stdin; it answers one line each.
PRODUCER = r"""
import sys, time, torch, gpuring
MUL = 0x9E3779B97F4A7C15
name, size, capacity, fence = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
# No spare buffers: a held message then stalls the producer, which is how these tests see holds.
tx = gpuring.Producer(name, size, memory="cuda", capacity=capacity, spares=0, fence=fence)
print("ready", flush=True)
for line in sys.stdin:
    cmd, *args = line.split()
    if cmd == "wait":  # for N consumers to join
        while tx.consumer_count < int(args[0]):
            time.sleep(0.001)
        print("ok", flush=True)
    elif cmd == "randn":  # float32[64, 32] from seed S
        torch.manual_seed(int(args[0]))
        print(tx.send(torch.randn(64, 32, device="cuda")), flush=True)
    elif cmd == "fill":  # SIZE bytes of VALUE, waiting at most TIMEOUT s for a slot
        t = torch.full((size,), int(args[0]), dtype=torch.uint8, device="cuda")
        try:
            tx.send(t, timeout=float(args[1]))
            print("sent", flush=True)
        except TimeoutError:
            print("stalled", flush=True)
    elif cmd == "slow":  # N pattern messages, each written by slow kernels on a side stream
        side = torch.cuda.Stream()
        for seq in range(int(args[0])):
            with torch.cuda.stream(side):
                base = (seq * MUL) % (1 << 64)
                base = base - (1 << 64) if base >= (1 << 63) else base
                frame = torch.arange(size // 8, dtype=torch.int64, device="cuda") + base
                for _ in range(3):
                    frame = frame * 1 + 0
                tx.send(frame, stream=side)
        print("ok", flush=True)
"""


class ProducerProcess:
    def __init__(self, name, size, capacity, fence="events"):
        self.p = subprocess.Popen([sys.executable, "-c", PRODUCER, name, str(size), str(capacity), fence],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.ask(None) == "ready"

    def ask(self, command):
        if command is not None:
            self.p.stdin.write(command + "\n")
            self.p.stdin.flush()
        line = self.p.stdout.readline().strip()
        assert line, f"the producer process died on {command!r}"
        return line

    def close(self):
        self.p.stdin.close()
        assert self.p.wait(timeout=30) == 0


@pytest.fixture
def producer(ring_name):
    made = []

    def make(size, capacity=4, fence="events"):
        made.append(ProducerProcess(ring_name, size, capacity, fence))
        return made[-1]
    yield make
    for p in made:
        p.close()


def test_round_trip_through_dlpack_and_the_cuda_array_interface(ring_name, producer):
    tx = producer(1 << 20)
    rx = gpuring.Consumer(ring_name, start="next")
    assert tx.ask("wait 1") == "ok"
    assert (rx.memory, rx.device, rx.stream) == ("cuda", 0, 1)
    assert tx.ask("randn 7") == "0"
    torch.manual_seed(7)
    src = torch.randn(64, 32, device="cuda")
    with rx.recv(timeout=10) as slot:
        assert (slot.dtype, slot.shape, slot.__dlpack_device__()) == ("float32", (64, 32), (2, 0))
        t = torch.from_dlpack(slot)
        assert t.device.type == "cuda" and torch.equal(t, src)
        c = torch.as_tensor(slot, device="cuda")  # __cuda_array_interface__
        assert c.data_ptr() == t.data_ptr() == slot.ptr and torch.equal(c, src)
        with pytest.raises(BufferError):
            memoryview(slot)  # device memory has no buffer protocol
        del t, c
    with pytest.raises(gpuring.ReleasedError):
        torch.from_dlpack(slot)


def test_another_stream_is_ordered_after_the_write_and_before_the_release(ring_name, producer):
    """The producer writes each message with slow kernels on a side stream; we read on a third
    stream. Every read must see the finished write, and no write may land before our reads are
    done (capacity 2, so the producer comes round quickly)."""
    size = 64 << 20
    tx = producer(size, capacity=2)
    rx = gpuring.Consumer(ring_name, start="next")
    assert tx.ask("wait 1") == "ok"
    bad = read_slow_messages(tx, rx, 20, size)
    assert bad == [], f"messages read before their write finished or after reuse: {bad}"


def read_slow_messages(tx, rx, count, size, tensor=torch.from_dlpack):
    """Has producer `tx` write `count` pattern messages of `size` bytes with slow kernels on a
    side stream, reads each on a stream of ours as `tensor(slot)`, and returns the sequence
    numbers of those that were not exact: read before their write finished, or rewritten
    before our reads of them were done."""
    tx.p.stdin.write(f"slow {count}\n")
    tx.p.stdin.flush()
    consume = torch.cuda.Stream()
    bad = []
    for seq in range(count):
        with torch.cuda.stream(consume):
            with rx.recv(timeout=30) as slot:
                assert slot.seq == seq
                t = tensor(slot)  # torch passes `consume` as the DLPack stream
                twice = t.clone()
                if not torch.equal(t, expected_words(seq, size // 8)):
                    bad.append(seq)
                del t
            # Read again after release: a copy taken before it must still be intact.
            if not torch.equal(twice, expected_words(seq, size // 8)):
                bad.append(seq)
    assert tx.ask(None) == "ok"  # the producer finished its sends
    return bad


def test_memory_fences_order_every_message_exactly(ring_name, producer):
    """A producer made with fence="memory" (sequence words in the segment, no IPC event):
    every message written by slow kernels on a side stream reads back exact on a third stream,
    none is rewritten before our reads of it are done (capacity 2), and tensors arrive with
    their type and shape."""
    size = 64 << 20
    tx = producer(size, capacity=2, fence="memory")
    rx = gpuring.Consumer(ring_name, start="next")
    assert tx.ask("wait 1") == "ok"
    bad = read_slow_messages(tx, rx, 20, size)
    assert bad == [], f"messages read before their write finished or after reuse: {bad}"
    for seed in range(5):
        assert tx.ask(f"randn {seed}") == str(20 + seed)
        torch.manual_seed(seed)
        src = torch.randn(64, 32, device="cuda")
        with rx.recv(timeout=10) as slot:
            assert (slot.dtype, slot.shape) == ("float32", (64, 32))
            assert torch.equal(torch.from_dlpack(slot), src)


def test_slot_torch_is_ordered_on_torchs_current_stream(ring_name, producer):
    """`slot.torch()` on the default fence: the same tensor as `torch.from_dlpack(slot)`, and
    every message written by slow kernels reads back exact on torch's current stream (a side
    stream of ours), none rewritten before our reads are done (capacity 2)."""
    size = 64 << 20
    tx = producer(size, capacity=2, fence="auto")
    rx = gpuring.Consumer(ring_name, start="next")
    assert tx.ask("wait 1") == "ok"
    bad = read_slow_messages(tx, rx, 20, size, tensor=lambda slot: slot.torch())
    assert bad == [], f"messages read before their write finished or after reuse: {bad}"
    assert tx.ask("randn 3") == "20"
    torch.manual_seed(3)
    src = torch.randn(64, 32, device="cuda")
    with rx.recv(timeout=10) as slot:
        t = slot.torch()
        assert (t.dtype, tuple(t.shape), t.device.type) == (torch.float32, (64, 32), "cuda")
        assert t.data_ptr() == torch.from_dlpack(slot).data_ptr() == slot.ptr
        assert torch.equal(t, src)
    with pytest.raises(gpuring.ReleasedError):
        slot.torch()


def test_a_tensor_holds_its_message_after_release(ring_name, producer):
    tx = producer(4096, capacity=2)
    rx = gpuring.Consumer(ring_name, start="next")
    assert tx.ask("wait 1") == "ok"
    assert tx.ask("fill 7 5") == "sent"
    slot = rx.recv(timeout=10)
    t = torch.from_dlpack(slot)
    slot.release()
    assert tx.ask("fill 0 5") == "sent"
    rx.recv(timeout=10).release()
    assert tx.ask("fill 0 0.3") == "stalled"  # slot 0 comes round: still held by `t`
    assert int(t.sum()) == 7 * 4096
    del t
    gc.collect()
    assert tx.ask("fill 0 5") == "sent"


def test_a_tensor_freed_on_another_thread(ring_name, producer):
    tx = producer(4096, capacity=2)
    rx = gpuring.Consumer(ring_name, start="next")
    assert tx.ask("wait 1") == "ok"
    assert tx.ask("fill 1 5") == "sent"
    with rx.recv(timeout=10) as slot:
        box = [torch.from_dlpack(slot)]
    assert tx.ask("fill 1 5") == "sent"
    rx.recv(timeout=10).release()
    t = threading.Thread(target=box.clear)  # the tensor's deleter runs on that thread
    t.start()
    t.join()
    # The producer is another process: the slot stays held (the release is queued for this
    # thread) until this thread's next gpuring call.
    assert tx.ask("fill 2 0.3") == "stalled"
    assert rx.try_recv() is None
    assert tx.ask("fill 2 5") == "sent"


CONSUMER = """
import sys, torch, gpuring
MUL = 0x9E3779B97F4A7C15
frames = bad = 0
with gpuring.Consumer(sys.argv[1], wait=30, start="next") as rx:
    for slot in rx:
        with slot:
            t = torch.from_dlpack(slot)  # uint8[height, width, 4], from the tensor header
            assert t.dim() == 3 and t.shape[2] == 4 and t.dtype == torch.uint8, t.shape
            words = t.reshape(-1).view(torch.int64)
            base = (slot.seq * MUL) % (1 << 64)
            base = base - (1 << 64) if base >= (1 << 63) else base
            want = torch.arange(words.numel(), dtype=torch.int64, device="cuda") + base
            bad += int((words != want).sum())
            frames += 1
print(frames, bad)
"""


def test_a_rust_producer_feeds_two_torch_consumers_every_byte_checked(ring_name):
    producer = start_pipeline(ring_name, "cuda", external=2, seconds=3, width=1920, height=1080)
    consumers = [subprocess.Popen([sys.executable, "-c", CONSUMER, ring_name], stdout=subprocess.PIPE,
                                  text=True) for _ in range(2)]
    out, _ = producer.communicate(timeout=180)
    assert producer.returncode == 0, out
    published = int(out.split("published ")[1].split()[0])
    assert published > 0
    for c in consumers:
        stdout, _ = c.communicate(timeout=60)
        assert c.returncode == 0
        frames, bad = map(int, stdout.split())
        print(f"torch consumer: {frames} frames of {published}, {bad} bad bytes")
        assert bad == 0 and frames == published


# A consumer that receives a float32[n, n] frame as a tensor, queues about 1.5 s of kernels
# that read it on a side stream (matrix products; never waiting for them), then sleeps. Its
# `report` hook, registered before gpuring's (so it runs after it), reads the result from pinned
# host memory without synchronising: right only if the exit waited for the kernels.
SIGTERM_CONSUMER = r"""
import atexit, sys, time
result = {}

def report():
    if "host" in result:
        print("result", float(result["host"][0]), result["want"], flush=True)

atexit.register(report)
import torch, gpuring

rx = gpuring.Consumer(sys.argv[1], wait=30, start="next", mode="latest")
value = float(sys.argv[2])
side = torch.cuda.Stream()
host = torch.full((1,), -1.0, dtype=torch.float64, pin_memory=True)
slot = rx.recv(timeout=30)
with torch.cuda.stream(side):
    frame = torch.from_dlpack(slot)  # the producer's memory: side waits for its writes
    n = frame.shape[0]
    acc = torch.zeros(1, dtype=torch.float64, device="cuda")

    def step():  # every product's [0, 0] is value * value * n, exact in float32
        acc.add_((frame @ frame)[0, 0])

    step()
    side.synchronize()
    began = time.monotonic()
    for _ in range(5):
        step()
    side.synchronize()
    steps = max(5, min(5000, int(1.5 / ((time.monotonic() - began) / 5))))
    acc.zero_()
    for _ in range(steps):
        step()
    host.copy_(acc, non_blocking=True)
    result["host"], result["want"] = host, steps * n * value * value
print("launched", steps, flush=True)
try:
    time.sleep(60)
finally:
    print("finally", flush=True)
"""


def test_sigterm_mid_kernel_waits_for_the_kernels(ring_name):
    """SIGTERM reaches a consumer while its kernels still read a slot: it unwinds and exits with
    143 only after they finished (its last result is right), and the producer goes on."""
    n = 4096
    tx = gpuring.Producer(ring_name, n * n * 4, memory="cuda", capacity=4)
    frame = torch.full((n, n), 3.0, device="cuda")
    child = subprocess.Popen([sys.executable, "-c", SIGTERM_CONSUMER, ring_name, "3"],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert tx.wait_for_consumers(1, timeout=60) == 1
        tx.send(frame)
        launched = child.stdout.readline().split()
        assert launched[:1] == ["launched"], launched
        child.send_signal(signal.SIGTERM)
        sent = tx.published
        deadline = time.monotonic() + 20
        while child.poll() is None and time.monotonic() < deadline:  # publishing on meanwhile
            tx.send(frame, timeout=10)
            time.sleep(0.01)
        out, _ = child.communicate(timeout=20)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 128 + signal.SIGTERM, out
    lines = out.splitlines()
    assert lines[0] == "finally", out
    _, got, want = lines[1].split()
    assert float(got) == float(want), f"the exit did not wait for the kernels: {out}"
    deadline = time.monotonic() + 10  # its entry is left, or reclaimed
    while tx.consumer_count and time.monotonic() < deadline:
        tx.send(frame, timeout=10)
    assert tx.consumer_count == 0
    for _ in range(5):
        tx.send(frame, timeout=10)
    assert tx.published >= sent + 5
    tx.close()


def test_vmm_sharing_round_trips_in_one_process(ring_name):
    """VMM sharing: memory handed out by fd, so a consumer may live in the producer's process;
    every element checks out, and legacy-only arguments are refused clearly."""
    tx = gpuring.Producer(ring_name, 64 * 32 * 4, memory="cuda", capacity=4, sharing="vmm")
    rx = gpuring.Consumer(ring_name, start="next")
    for seed in range(20):
        torch.manual_seed(seed)
        sent = torch.randn(64, 32, device="cuda")
        tx.send(sent)
        with rx.recv() as slot:
            got = torch.as_tensor(slot, device="cuda")
            assert torch.equal(got, sent)
    rx.close()
    tx.close()
    with pytest.raises(ValueError, match="vmm"):
        gpuring.Producer(ring_name + "-x", 1024, memory="cuda", allow_uids=[65534])
    with pytest.raises(ValueError, match="sharing"):
        gpuring.Producer(ring_name + "-y", 1024, memory="cuda", sharing="ipc")


# A camera: `frames` uint8[32, 32, 3] frames of value (cam * 100 + seq) % 256, with their
# tensor header, 200 a second.
CAMERA = r"""
import sys, time, torch, gpuring
name, cam, frames = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
tx = gpuring.Producer(name, 32 * 32 * 3, memory="cuda", capacity=4)
while tx.consumer_count < 1:
    time.sleep(0.001)
for seq in range(frames):
    tx.send(torch.full((32, 32, 3), (cam * 100 + seq) % 256, dtype=torch.uint8, device="cuda"))
    time.sleep(0.005)
tx.close()
"""

# A consumer of batches: N batches, every byte checked against the table, and ResNet-18
# (weights=None) run on each as [K, 3, H, W]; prints "batches BAD OUTPUT_SHAPE".
BATCH_CONSUMER = r"""
import sys, torch, torchvision, gpuring
name, want = sys.argv[1], int(sys.argv[2])
model = torchvision.models.resnet18(weights=None).cuda().eval()
rx = gpuring.Consumer(name, wait=30, mode="latest", start="next")
bad, n, shape = 0, 0, None
while n < want:
    with rx.recv(timeout=30) as slot:
        t = slot.torch()
        for k, cam in enumerate(gpuring.batch_table(slot.header)["cameras"]):
            want_v = (k * 100 + cam["seq"]) % 256 if cam["timestamp_ns"] else 0
            bad += int((t[k] != want_v).sum().item())
        with torch.no_grad():
            shape = tuple(model(t.permute(0, 3, 1, 2).float() / 255).shape)
        torch.cuda.current_stream().synchronize()
    n += 1
print(n, bad, shape, flush=True)
"""


def test_a_batcher_feeds_a_resnet_with_batches_of_two_cuda_cameras(ring_name):
    pytest.importorskip("torchvision", reason="needs torchvision")
    cams = [f"{ring_name}-cam{i}" for i in range(2)]
    out = f"{ring_name}-batch"
    cameras = [subprocess.Popen([sys.executable, "-c", CAMERA, c, str(i), "4000"])
               for i, c in enumerate(cams)]  # 20 s of frames at most: killed when done
    b = gpuring.Batcher(out, cams, memory="cuda", max_wait=0.02)
    try:
        # The consumer runs in a process of its own: a CUDA IPC handle cannot be opened in the
        # process that made it (the batch ring's, here).
        got = subprocess.run([sys.executable, "-c", BATCH_CONSUMER, out, "30"],
                             capture_output=True, text=True, timeout=120)
        assert got.returncode == 0, got.stderr[-2000:]
        n, bad, shape = got.stdout.split(" ", 2)
        assert (int(n), int(bad)) == (30, 0)
        assert shape.strip() == "(2, 1000)"
    finally:
        totals = b.stop()
        for c in cameras:
            c.kill()
            c.wait()
    assert totals["batches"] >= 30
