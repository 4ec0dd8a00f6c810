"""gpuring's Python package on host-memory rings: runs on any Linux machine."""
import asyncio
import gc
import os
import pathlib
import queue
import signal
import struct
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import gpuring
from conftest import pattern_bytes, start_pipeline, ROOT


def test_round_trip_takes_type_and_shape_from_the_tensor_header(ring_name):
    tx = gpuring.Producer(ring_name, 4096, memory="host", capacity=4)
    rx = gpuring.Consumer(ring_name, start="next")
    a = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    assert tx.send(a) == 0
    with rx.recv(timeout=5) as slot:
        assert (slot.seq, slot.lag, len(slot), slot.memory) == (0, 0, 96, "host")
        assert (slot.dtype, slot.shape) == ("float32", (2, 3, 4))
        assert slot.header.startswith(gpuring.tensor_header("float32", (2, 3, 4)))
        assert np.array_equal(np.from_dlpack(slot), a)     # DLPack
        assert np.array_equal(np.asarray(slot), a)         # buffer protocol
        assert np.array_equal(slot.__array__(), a)        # numpy's fallback gives the same
        assert slot.__array__(dtype="int16", copy=True).dtype == np.int16
        assert memoryview(slot).readonly
    assert slot.released


def test_slot_torch_makes_the_tensor_from_dlpack_makes(ring_name):
    torch = pytest.importorskip("torch", reason="slot.torch() needs torch")
    tx = gpuring.Producer(ring_name, 4096, memory="host", capacity=4)
    rx = gpuring.Consumer(ring_name, start="next")
    a = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    tx.send(a)
    with rx.recv(timeout=5) as slot:
        t = slot.torch()
        assert (t.dtype, tuple(t.shape), t.device.type) == (torch.float32, (2, 3, 4), "cpu")
        assert t.data_ptr() == torch.from_dlpack(slot).data_ptr()
        assert torch.equal(t, torch.from_numpy(a))
    with pytest.raises(gpuring.ReleasedError):
        slot.torch()


def test_explicit_layouts_override_the_header(ring_name):
    tx = gpuring.Producer(ring_name, 4096, memory="host")
    rx = gpuring.Consumer(ring_name, start="next", dtype="uint8", shape=(-1, 4))
    tx.send(np.arange(16, dtype=np.uint8))
    slot = rx.recv(timeout=5)
    assert slot.shape == (4, 4)
    assert np.from_dlpack(slot.view("int32", (2, 2))).tolist() == \
        np.arange(16, dtype=np.uint8).view(np.int32).reshape(2, 2).tolist()
    with pytest.raises(ValueError):
        slot.view("uint8", (5, 5))  # 25 bytes != 16
    with pytest.raises(TypeError):
        slot.view("complex64")
    slot.release()


def test_tensor_header_matches_the_rust_encoding():
    h = gpuring.tensor_header("uint8", (1080, 1920, 4))
    assert h[:8] == b"GRTN\x01\x01\x08\x03"
    assert [int.from_bytes(h[8 + 8 * i:16 + 8 * i], "little") for i in range(3)] == [1080, 1920, 4]
    assert gpuring.tensor_header("torch.bfloat16", ())[5:7] == b"\x04\x10"


def test_a_released_slot_refuses_new_exports(ring_name):
    tx = gpuring.Producer(ring_name, 64, memory="host")
    rx = gpuring.Consumer(ring_name, start="next")
    tx.send(b"abcdefgh")
    slot = rx.recv(timeout=5)
    slot.release()
    slot.release()  # twice is harmless
    # np.asarray and np.array too: numpy swallows the buffer protocol's error and falls back on
    # __array__, which raises rather than let numpy make an object array of the slot.
    for make in (np.from_dlpack, memoryview, lambda s: s.view("uint8"), np.asarray, np.array):
        with pytest.raises(gpuring.ReleasedError):
            make(slot)
    assert isinstance(gpuring.ReleasedError("x"), BufferError)
    assert slot.seq == 0 and len(slot) == 8  # metadata stays readable


def held_stalls_producer(tx):
    """Whether the producer (block policy, 2 slots, no spares) cannot get a free slot for 0.2 s.

    Rings that use it have no spare buffers: with spares, a held message never stalls the
    producer, and this would say nothing about holds."""
    try:
        tx.send(b"x", timeout=0.2)
        return False
    except TimeoutError:
        return True


@pytest.mark.parametrize("export", ["dlpack", "buffer"])
def test_an_export_holds_the_message_after_release(ring_name, export):
    tx = gpuring.Producer(ring_name, 64, memory="host", capacity=2, spares=0)
    rx = gpuring.Consumer(ring_name, start="next")
    tx.send(b"0" * 64)
    slot = rx.recv(timeout=5)
    view = np.from_dlpack(slot) if export == "dlpack" else memoryview(slot)
    slot.release()
    tx.send(b"1" * 64)  # the second slot is free
    rx.recv(timeout=5).release()
    # Slot 0 comes round again: still held by `view`, so the producer waits.
    assert held_stalls_producer(tx)
    assert bytes(view) == b"0" * 64  # and the bytes are still message 0's
    del view
    gc.collect()
    assert not held_stalls_producer(tx)


def test_a_tensor_freed_on_another_thread_releases_at_the_next_call(ring_name):
    tx = gpuring.Producer(ring_name, 64, memory="host", capacity=2, spares=0)
    rx = gpuring.Consumer(ring_name, start="next")
    tx.send(b"a" * 64)
    slot = rx.recv(timeout=5)
    box = [np.from_dlpack(slot)]
    slot.release()
    tx.send(b"b" * 64)
    rx.recv(timeout=5).release()
    t = threading.Thread(target=box.clear)  # the array's deleter runs on that thread
    t.start()
    t.join()
    # Queued there, released by the next gpuring call on the consumer's thread (here the
    # producer's send): not leaked.
    assert not held_stalls_producer(tx)


@pytest.mark.parametrize("what", ["slot", "buffer"])
def test_a_slot_or_buffer_freed_on_another_thread_releases_at_the_next_call(ring_name, what):
    tx = gpuring.Producer(ring_name, 64, memory="host", capacity=2, spares=0)
    rx = gpuring.Consumer(ring_name, start="next")
    tx.send(b"a" * 64)
    slot = rx.recv(timeout=5)
    box = [slot] if what == "slot" else [memoryview(slot)]
    if what == "buffer":
        slot.release()
    del slot
    tx.send(b"b" * 64)
    rx.recv(timeout=5).release()
    t = threading.Thread(target=box.clear)
    t.start()
    t.join()
    assert not held_stalls_producer(tx)  # released at this thread's next gpuring call


def test_objects_are_used_on_their_own_thread(ring_name):
    tx = gpuring.Producer(ring_name, 64, memory="host")
    rx = gpuring.Consumer(ring_name, start="next")
    tx.send(b"x" * 8)
    slot = rx.recv(timeout=5)
    errors = []

    def use_elsewhere():
        for use in (lambda: np.from_dlpack(slot), lambda: rx.try_recv(), lambda: tx.send(b"y")):
            try:
                use()
            except RuntimeError as e:
                errors.append(str(e))
        slot.release()  # releasing from anywhere is allowed; done on the owner's next call
    t = threading.Thread(target=use_elsewhere)
    t.start()
    t.join()
    assert len(errors) == 3 and "thread" in errors[0]
    assert slot.released
    rx.try_recv()


def test_layout_arguments(ring_name):
    tx = gpuring.Producer(ring_name, 64, memory="host", header_size=16)
    rx = gpuring.Consumer(ring_name, start="next", dtype=np.float32, shape=(2, -1))
    tx.send(np.arange(4, dtype=np.float32), header=b"GRTN\x09garbage")  # broken tensor header
    with rx.recv(timeout=5) as slot:
        assert (slot.dtype, slot.shape) == ("float32", (2, 2))  # explicit: header not needed
        assert np.from_dlpack(slot).tolist() == [[0, 1], [2, 3]]
        with pytest.raises(ValueError):
            slot.view(shape=(4,)).view(None, None)  # relying on the broken header fails


def test_wait_outlasts_a_dead_ring(ring_name):
    # A producer process that dies without cleaning up leaves a ring behind; `wait` waits
    # for a live producer instead of failing at once.
    code = f"import gpuring, os; p = gpuring.Producer({ring_name!r}, 64, memory='host'); os._exit(0)"
    subprocess.run([sys.executable, "-c", code], check=True)
    with pytest.raises(gpuring.Disconnected):
        gpuring.Consumer(ring_name)
    opened = threading.Event()

    def produce_late():  # on its own thread, which closes it too
        time.sleep(0.3)
        tx = gpuring.Producer(ring_name, 64, memory="host")
        opened.wait(10)
        tx.close()
    late = threading.Thread(target=produce_late)
    late.start()
    rx = gpuring.Consumer(ring_name, wait=10)
    opened.set()
    late.join()
    assert rx.capacity == 8


def test_create_errors_name_the_ring_and_its_producer(ring_name):
    with gpuring.Producer(ring_name, 64):
        with pytest.raises(gpuring.Error) as e:
            gpuring.Producer(ring_name, 64)
    pid = os.getpid()
    assert str(e.value) == f'ring "{ring_name}": the ring exists and its producer (pid {pid}) is alive'


def test_a_killed_producer_is_told_from_a_closed_one(ring_name):
    code = (f"import gpuring, os, signal; p = gpuring.Producer({ring_name!r}, 64, memory='host');"
            "p.wait_for_consumers(1, timeout=20); p.send(b'only'); os.kill(os.getpid(), signal.SIGKILL)")
    child = subprocess.Popen([sys.executable, "-c", code])
    rx = gpuring.Consumer(ring_name, wait=20, start="oldest")
    assert [bytes(s)[:4] for s in rx] == [b"only"]  # what it published, then the end
    child.wait()
    assert rx.ended == "died"  # cut, not complete
    with pytest.raises(gpuring.Disconnected) as e:
        rx.recv(timeout=1)
    assert e.value.reason == "died" and "died" in str(e.value)
    os.remove(f"/dev/shm/gpuring.{ring_name}")  # a killed producer leaves its segment


@pytest.mark.parametrize("opt_out", [False, True])
def test_sigterm_leaves_no_ring_behind(ring_name, opt_out):
    code = (f"import gpuring, sys, time; p = gpuring.Producer({ring_name!r}, 64, memory='host');"
            "print('ready', flush=True); time.sleep(30)")
    env = dict(os.environ, GPURING_SIGTERM="0" if opt_out else "1")
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env)
    assert child.stdout.readline().strip() == "ready"
    path = f"/dev/shm/gpuring.{ring_name}"
    assert os.path.exists(path)
    rx = gpuring.Consumer(ring_name)
    child.send_signal(signal.SIGTERM)
    # Handled: the process unwinds and exits with 128 + SIGTERM; opted out: killed by it.
    assert child.wait(timeout=20) == (-signal.SIGTERM if opt_out else 128 + signal.SIGTERM)
    assert os.path.exists(path) == opt_out  # removed, unless opted out
    with pytest.raises(gpuring.Disconnected):
        rx.recv(timeout=5)
    assert rx.ended == "died"  # the stream was cut, either way
    if opt_out:
        os.remove(path)


def test_sigterm_removes_a_ring_of_another_directory(ring_name, tmp_path):
    # A relative `dir`, and a change of working directory after the create: the handler still
    # removes the ring from the directory it was created in.
    (tmp_path / "rings").mkdir()
    code = (f"import gpuring, os, time; p = gpuring.Producer({ring_name!r}, 64, memory='host', dir='rings');"
            "os.chdir('/'); print(p.dir, flush=True); time.sleep(30)")
    env = dict(os.environ, GPURING_SIGTERM="1")
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env,
                             cwd=tmp_path)
    assert child.stdout.readline().strip() == str(tmp_path / "rings")  # made absolute
    path = tmp_path / "rings" / f"gpuring.{ring_name}"
    assert path.exists()
    child.send_signal(signal.SIGTERM)
    assert child.wait(timeout=20) == 128 + signal.SIGTERM
    assert not path.exists()


# A consumer blocked in recv() (or awaiting recv_async()) in its main thread; `with` and
# `finally` must run on SIGTERM.
BLOCKED_CONSUMER = r"""
import asyncio, sys, gpuring
with gpuring.Consumer(sys.argv[1], start="next") as rx:
    print("ready", flush=True)
    try:
        if sys.argv[2] == "recv":
            rx.recv()
        else:
            asyncio.run(rx.recv_async())
    finally:
        print("finally", flush=True)
"""


@pytest.mark.parametrize("how,opt_out", [("recv", False), ("recv", True), ("recv_async", False)])
def test_sigterm_stops_a_consumer_blocked_in_recv(ring_name, how, opt_out):
    tx = gpuring.Producer(ring_name, 64, memory="host")
    env = dict(os.environ, GPURING_SIGTERM="0" if opt_out else "1")
    child = subprocess.Popen([sys.executable, "-c", BLOCKED_CONSUMER, ring_name, how],
                             stdout=subprocess.PIPE, text=True, env=env)
    assert child.stdout.readline().strip() == "ready"
    assert tx.consumer_count == 1
    time.sleep(0.3)  # well into recv's wait
    sent = time.monotonic()
    child.send_signal(signal.SIGTERM)
    status = child.wait(timeout=10)
    took = time.monotonic() - sent
    rest = child.stdout.read()
    if opt_out:
        assert status == -signal.SIGTERM and rest == ""  # killed where it stood
    else:
        assert status == 128 + signal.SIGTERM  # SystemExit(143): it unwound
        assert rest == "finally\n"
        assert took < 5, f"SIGTERM took {took:.2f} s to stop a blocked recv"
        assert tx.consumer_count == 0  # it left the ring itself: nothing to reclaim
    tx.send(b"on")  # the producer goes on
    tx.close()


def test_what_is_left_open_at_exit_is_closed(ring_name):
    """A producer that nothing frees before the process ends (in a cycle the garbage collector
    never visits) is closed at exit: its consumers see the stream complete and the name goes.
    Without gpuring's exit hook (cleared: the control), the same process leaves the stream cut
    and the name behind."""
    code = r"""
import atexit, gc, sys, gpuring
tx = gpuring.Producer(sys.argv[1], 64, memory="host")
tx.wait_for_consumers(1, timeout=20)
tx.send(b"only")
keep = [tx]
keep.append(keep)
gc.freeze()  # never collected, so never freed
del tx, keep
if sys.argv[2] == "control":
    atexit._clear()
"""
    for case, ended in (("hook", "closed"), ("control", "died")):
        name = f"{ring_name}-{case}"
        child = subprocess.Popen([sys.executable, "-c", code, name, case])
        rx = gpuring.Consumer(name, wait=20, start="oldest")
        assert [bytes(s)[:4] for s in rx] == [b"only"]
        assert child.wait(timeout=20) == 0
        assert rx.ended == ended, case
        path = f"/dev/shm/gpuring.{name}"
        assert os.path.exists(path) == (case == "control")
        if case == "control":
            os.remove(path)


def test_sigterm_in_forked_children(ring_name):
    """A child forked after the handler was installed inherits it: one that made no gpuring
    object of its own is ended by SIGTERM as by default (a multiprocessing worker), one that
    opened a consumer unwinds and exits with 143."""
    code = r"""
import os, signal, sys, time, gpuring
tx = gpuring.Producer(sys.argv[1], 64, memory="host")

def child_status(make_consumer):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        if make_consumer:
            rx = gpuring.Consumer(sys.argv[1])
        os.write(w, b"x")
        time.sleep(30)
        os._exit(0)
    os.close(w)
    os.read(r, 1)
    os.kill(pid, signal.SIGTERM)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])

print(child_status(False), child_status(True), tx.consumer_count, flush=True)
"""
    r = subprocess.run([sys.executable, "-c", code, ring_name], capture_output=True, text=True,
                       timeout=60, env=dict(os.environ, GPURING_SIGTERM="1"))
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [str(-signal.SIGTERM), str(128 + signal.SIGTERM), "0"]


def test_an_application_sigterm_handler_is_kept(ring_name):
    code = (f"import gpuring, signal, sys, time\n"
            "signal.signal(signal.SIGTERM, lambda *a: sys.exit(7))\n"
            f"p = gpuring.Producer({ring_name!r}, 64, memory='host')\n"
            f"rx = gpuring.Consumer({ring_name!r})\n"
            "print('ready', flush=True)\n"
            "rx.recv()\n")
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                             env=dict(os.environ, GPURING_SIGTERM="1"))
    assert child.stdout.readline().strip() == "ready"
    child.send_signal(signal.SIGTERM)
    assert child.wait(timeout=20) == 7  # theirs ran (within a blocked recv), not ours
    assert not os.path.exists(f"/dev/shm/gpuring.{ring_name}")  # closed at exit


def test_an_exception_in_a_with_block_cuts_the_stream(ring_name):
    rx = None
    with pytest.raises(RuntimeError):
        with gpuring.Producer(ring_name, 64, memory="host") as tx:
            rx = gpuring.Consumer(ring_name)
            tx.send(b"part")
            raise RuntimeError("the job failed")
    assert [bytes(s)[:4] for s in rx] == [b"part"]
    assert rx.ended == "died"  # cut: not to be taken for complete


def test_waiting_empty_and_disconnect(ring_name):
    tx = gpuring.Producer(ring_name, 64, memory="host")
    rx = gpuring.Consumer(ring_name, start="next")
    assert rx.try_recv() is None
    with pytest.raises(TimeoutError):
        rx.recv(timeout=0.05)
    for i in range(3):
        tx.send(bytes([i]) * 8)
    tx.close()
    assert [bytes(s)[:1] for s in rx] == [b"\x00", b"\x01", b"\x02"]  # iteration ends
    assert rx.ended == "closed"  # complete, not cut
    with pytest.raises(gpuring.Disconnected) as e:
        rx.recv(timeout=1)
    assert e.value.reason == "closed" and "closed the ring" in str(e.value)
    assert issubclass(gpuring.Disconnected, gpuring.Error)


def test_open_errors(ring_name):
    absent = ring_name + "-absent"
    with pytest.raises(FileNotFoundError) as e:
        gpuring.Consumer(absent)
    assert str(e.value) == f'no ring named "{absent}" in /dev/shm'  # the Rust and CLI wording
    with pytest.raises(FileNotFoundError):
        gpuring.Consumer(absent, wait=0.05)
    with pytest.raises(ValueError):
        gpuring.Consumer(ring_name, start="later")
    with pytest.raises(ValueError):
        gpuring.Producer(ring_name, 64, memory="disk")


def test_cuda_only_arguments_are_refused_on_a_host_ring(ring_name):
    """`fence` and `sharing` are checked like the other names; a CUDA-only value on a host ring
    is refused before anything is made, and the default fence is accepted."""
    with pytest.raises(ValueError, match='fence="ipc": use "auto", "events" or "memory"'):
        gpuring.Producer(ring_name, 64, memory="host", fence="ipc")
    with pytest.raises(ValueError, match='fence="memory" orders CUDA work'):
        gpuring.Producer(ring_name, 64, memory="host", fence="memory")
    with pytest.raises(ValueError, match='sharing="vmm" shares CUDA memory'):
        gpuring.Producer(ring_name, 64, memory="host", sharing="vmm")
    assert not pathlib.Path(f"/dev/shm/gpuring.{ring_name}").exists()
    with gpuring.Producer(ring_name, 64, memory="host", fence="events") as tx:
        rx = gpuring.Consumer(ring_name, start="next")
        tx.send(b"events")
        with rx.recv(timeout=5) as slot:
            assert bytes(slot) == b"events"


def test_a_ring_in_another_directory(ring_name, tmp_path):
    """`dir=`: the ring's file goes in that directory (one a container shares, say); consumers
    that look elsewhere do not find it."""
    with gpuring.Producer(ring_name, 64, memory="host", dir=tmp_path) as tx:
        assert tx.dir == tmp_path
        assert (tmp_path / f"gpuring.{ring_name}").exists()
        assert not pathlib.Path(f"/dev/shm/gpuring.{ring_name}").exists()
        with gpuring.Consumer(ring_name, start="next", dir=str(tmp_path)) as rx:  # str or PathLike
            assert rx.dir == tmp_path
            tx.send(b"first")
            tx.send(b"second")
            assert bytes(rx.recv(timeout=5))[:5] == b"first"
            assert bytes(rx.recv(timeout=5))[:6] == b"second"
        with pytest.raises(FileNotFoundError) as e:
            gpuring.Consumer(ring_name)  # the default directory has no such ring
        assert str(e.value) == f'no ring named "{ring_name}" in /dev/shm'
        with pytest.raises(FileNotFoundError) as e:
            gpuring.Consumer(ring_name, dir=tmp_path / "elsewhere", wait=0.05)
    assert not (tmp_path / f"gpuring.{ring_name}").exists()  # removed on close


def test_a_producer_waits_for_its_consumers(ring_name):
    with gpuring.Producer(ring_name, 64, memory="host") as tx:
        with pytest.raises(TimeoutError):
            tx.wait_for_consumers(1, timeout=0.05)
        with gpuring.Consumer(ring_name) as rx:
            assert tx.wait_for_consumers(1, timeout=10) == 1
            tx.send(b"first")
            assert bytes(rx.recv(timeout=5)) == b"first"


def test_send_checks_sizes(ring_name):
    tx = gpuring.Producer(ring_name, 16, memory="host", header_size=8)
    with pytest.raises(ValueError):
        tx.send(b"x" * 17)
    with pytest.raises(ValueError):
        tx.send(b"x", header=b"h" * 9)
    with pytest.raises(ValueError):
        tx.send(np.arange(8, dtype=np.uint8)[::2])  # not contiguous
    rx = gpuring.Consumer(ring_name, start="oldest")
    tx.send(np.arange(16, dtype=np.uint8).reshape(4, 4))  # header too small for its shape: none
    with rx.recv(timeout=5) as s:
        assert s.header == bytes(8) and s.shape == (16,)


def consumer_process(name, frames_out):
    """Run in a child process: read every frame, check every byte against the pattern."""
    code = f"""
import sys, numpy as np, gpuring
sys.path.insert(0, {str(ROOT / 'python/tests')!r})
from conftest import pattern_bytes
frames = bad = 0
with gpuring.Consumer({name!r}, wait=20, start="next") as rx:
    for slot in rx:
        with slot:
            a = np.from_dlpack(slot)
            assert a.shape[2] == 4 and a.dtype == np.uint8, (a.shape, a.dtype)
            bad += int((a.reshape(-1) != pattern_bytes(slot.seq, a.size)).sum())
            frames += 1
print(frames, bad)
"""
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)


def test_a_rust_producer_feeds_two_python_consumers_every_byte_checked(ring_name):
    producer = start_pipeline(ring_name, "host", external=2, seconds=1.5, fps=200)
    consumers = [consumer_process(ring_name, None) for _ in range(2)]
    out, _ = producer.communicate(timeout=120)
    assert producer.returncode == 0, out
    published = int(out.split("published ")[1].split()[0])
    for c in consumers:
        stdout, _ = c.communicate(timeout=60)
        assert c.returncode == 0
        frames, bad = map(int, stdout.split())
        assert bad == 0
        assert frames == published, (frames, published)  # block policy: none lost


def test_a_forked_child_neither_uses_nor_releases_the_parents_objects(ring_name):
    import os
    tx = gpuring.Producer(ring_name, 64, memory="host", capacity=2, spares=0)
    rx = gpuring.Consumer(ring_name, start="next")
    tx.send(b"A" * 64)
    slot = rx.recv(timeout=5)
    held = np.asarray(slot)
    pid = os.fork()
    if pid == 0:  # the child: every use refuses, and freeing everything releases nothing
        code = 0
        try:
            rx.try_recv()
            code = 1
        except RuntimeError as e:
            code = 0 if "fork" in str(e) else 2
        del held, slot
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    tx.send(b"B" * 64)
    rx.recv(timeout=5).release()
    assert held_stalls_producer(tx)  # the parent's hold survived the child
    assert bytes(held) == b"A" * 64
    assert tx.consumer_count == 1


def fork_and_wait(child, timeout=5.0):
    """Runs `child()` in a forked child, which exits with what it returns (70 if it raises).

    Returns the exit code, or None if the child was not done within `timeout` seconds (it is
    then killed)."""
    pid = os.fork()
    if pid == 0:
        code = 70
        try:
            code = child()
        except BaseException:
            import traceback
            traceback.print_exc()
        finally:
            os._exit(code)  # never back into pytest
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return None
        time.sleep(0.001)


def send_in_own_ring(name):
    """A child's first gpuring call: `send` runs the queue drain, which takes the state lock."""
    with gpuring.Producer(name, 64, memory="host", capacity=1) as tx:
        tx.send(b"x")
    return 0


# Python 3.12+ warns (DeprecationWarning) that fork() with other threads running may deadlock
# in the child. For gpuring's own locks that is what this test checks does not happen.
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_a_fork_while_other_threads_hold_gpurings_locks_leaves_the_child_usable(ring_name):
    """fork() copies a lock that another thread holds as held, into a child that has no thread
    to release it. A thread that ends does gpuring's exit work without the GIL, under its
    locks (not while holding the GIL, which fork() holds). Here threads that made a producer
    end nonstop while this thread forks, and every child must finish one gpuring call.

    To widen the race, 100,000 values freed on another thread wait for this one (which makes
    no gpuring call meanwhile), and each ending thread goes through them under the state
    lock. Before the fork handlers, about one child in five hung."""
    tx = gpuring.Producer(ring_name, 64, memory="host", capacity=2)
    rx = gpuring.Consumer(ring_name, start="next")
    tx.send(b"x" * 64)
    slot = rx.recv(timeout=5)
    arrays = [np.from_dlpack(slot) for _ in range(100_000)]
    freer = threading.Thread(target=arrays.clear)  # queued for this thread, not dropped
    freer.start()
    freer.join()
    stop = threading.Event()
    ended = []

    def end_threads():
        while not stop.is_set():
            name = f"{ring_name}-t{len(ended)}"
            t = threading.Thread(target=lambda: gpuring.Producer(name, 64, memory="host").close())
            t.start()
            t.join()
            ended.append(name)
    ender = threading.Thread(target=end_threads)
    ender.start()
    codes = []
    try:
        budget = time.monotonic() + 10
        while len(codes) < 100 and time.monotonic() < budget:
            name = f"{ring_name}-c{len(codes)}"
            codes.append(fork_and_wait(lambda: send_in_own_ring(name)))
            if codes[-1] != 0:
                break
    finally:
        stop.set()
        ender.join()
        for i in range(len(codes)):  # what a killed child left behind
            pathlib.Path(f"/dev/shm/gpuring.{ring_name}-c{i}").unlink(missing_ok=True)
    what = "hung (killed after 5 s)" if codes[-1] is None else f"exited with {codes[-1]}"
    assert codes[-1] == 0, f"the child of fork {len(codes)} {what}"
    assert len(codes) >= 20 and len(ended) >= 20, (len(codes), len(ended))  # the race was run
    assert rx.try_recv() is None  # drops the queued values here
    slot.release()


class ProducerThread:
    """A host producer on a thread of its own: its calls drain that thread's queue only."""

    def __init__(self, name, **kwargs):
        self.calls, self.results = queue.Queue(), queue.Queue()
        self.thread = threading.Thread(target=self._serve, args=(name, kwargs))
        self.thread.start()
        ok, value = self.results.get(timeout=10)
        if not ok:
            raise value

    def _serve(self, name, kwargs):
        try:
            tx = gpuring.Producer(name, 64, memory="host", **kwargs)
        except BaseException as e:
            self.results.put((False, e))
            return
        self.results.put((True, None))
        with tx:
            for call in iter(self.calls.get, None):
                try:
                    self.results.put((True, call(tx)))
                except BaseException as e:
                    self.results.put((False, e))

    def __call__(self, call):
        self.calls.put(call)
        ok, value = self.results.get(timeout=30)
        if not ok:
            raise value
        return value

    def close(self):
        self.calls.put(None)
        self.thread.join()


# The producer's thread runs during the fork: silence Python 3.12+'s warning, as above.
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_a_forked_child_does_not_drop_what_the_parents_threads_queued(ring_name):
    """An array freed on another thread is queued for the consumer's thread. A child forked
    before that thread's next gpuring call has the queue too, and its copy of the thread the
    same thread id: at its first gpuring call it would drop the array, releasing the
    parent's message in the shared ring."""
    tx = ProducerThread(ring_name, capacity=2, spares=0)
    try:
        rx = gpuring.Consumer(ring_name, start="next")
        tx(lambda p: p.send(b"A" * 64))
        slot = rx.recv(timeout=5)
        box = [np.from_dlpack(slot)]
        slot.release()  # the array alone holds message A
        tx(lambda p: p.send(b"B" * 64))  # the second slot
        rx.recv(timeout=5).release()
        freer = threading.Thread(target=box.clear)  # queued for this thread
        freer.start()
        freer.join()
        assert fork_and_wait(lambda: send_in_own_ring(ring_name + "-child")) == 0
        # Slot 0 comes round: still held (by the queued array), so the producer waits.
        assert tx(held_stalls_producer)
        assert rx.try_recv() is None  # this thread's call drops the array: released
        assert not tx(held_stalls_producer)
    finally:
        tx.close()


def test_objects_of_an_ended_thread_are_still_dropped(ring_name):
    made = {}

    def open_in_thread():
        made["rx"] = gpuring.Consumer(ring_name, start="next")
    tx = gpuring.Producer(ring_name, 64, memory="host", capacity=2)
    t = threading.Thread(target=open_in_thread)
    t.start()
    t.join()  # the consumer's thread has ended
    assert tx.consumer_count == 1
    del made["rx"]  # freed here: dropped here if its thread is gone, or by that thread as it ends
    # Python's join can return before the thread's native exit (and its TLS destructors), so
    # the drop may still be the ending thread's: give it a moment.
    deadline = time.monotonic() + 5
    while tx.consumer_count != 0 and time.monotonic() < deadline:
        time.sleep(0.001)
    assert tx.consumer_count == 0


def test_small_things(ring_name):
    import math
    tx = gpuring.Producer(ring_name, 64, memory="host", header_size=64)
    rx = gpuring.Consumer(ring_name, start="next")
    tx.send(b"")
    slot = rx.recv(timeout=math.inf)  # an infinite timeout waits as None does
    assert len(slot) == 0 and bool(slot)  # an empty message is still a slot
    with pytest.raises(ValueError):
        rx.recv(timeout=math.nan)
    slot.release()
    # A hostile tensor header whose strides overflow is refused, not exported.
    huge = (b"GRTN\x01\x01\x08\x03" + (0).to_bytes(8, "little") + (1 << 63).to_bytes(8, "little")
            + (4).to_bytes(8, "little"))
    tx.send(b"", header=huge)
    with rx.recv(timeout=5) as s, pytest.raises(ValueError):
        np.from_dlpack(s)
    # Type strings and torch's aliases name dtypes too.
    tx.send(np.arange(4, dtype=np.float32), header=b"")
    with rx.recv(timeout=5) as s:
        for name in ("<f4", "f4", np.float32, np.dtype("float32"), "float32"):
            assert s.view(name).dtype == "float32"
        assert s.view("half").dtype == "float16"


def test_the_buffer_protocol_is_c_contiguous_only(ring_name):
    import ctypes
    tx = gpuring.Producer(ring_name, 64, memory="host")
    rx = gpuring.Consumer(ring_name, start="next", dtype="uint8", shape=(2, 4))
    tx.send(b"x" * 8)
    with rx.recv(timeout=5) as slot:
        assert np.asarray(slot).flags["C_CONTIGUOUS"]
        buf = (ctypes.c_char * 80)()  # a Py_buffer
        get = ctypes.pythonapi.PyObject_GetBuffer
        get.argtypes = [ctypes.py_object, ctypes.c_void_p, ctypes.c_int]
        PyBUF_F_CONTIGUOUS_FORMAT = 0x0040 | 0x0010 | 0x0008 | 0x0004  # typed, Fortran order
        with pytest.raises(BufferError):
            get(slot, ctypes.addressof(buf), PyBUF_F_CONTIGUOUS_FORMAT)


def test_delivery_modes_and_spare_buffers(ring_name):
    """A held frame never stops an overwrite producer; Latest skips to the newest message;
    a lossless consumer on the same ring still gets every one."""
    tx = gpuring.Producer(ring_name, 64, memory="host", capacity=2, spares=1, policy="overwrite")
    latest = gpuring.Consumer(ring_name, start="next", mode="latest")
    queue_rx = gpuring.Consumer(ring_name, start="next")
    assert (latest.mode, queue_rx.mode) == ("latest", "queue")
    tx.send(np.full(8, 0, np.uint8))
    held = latest.recv(timeout=5)
    for i in range(1, 10):
        tx.send(np.full(8, i, np.uint8))    # laps the held buffer: never waits for it
    assert (held.seq, bytes(held)) == (0, bytes(8))
    newest = queue_rx.recv(timeout=5)       # queue: the oldest still in the ring, loss counted
    assert (newest.seq, newest.lag) == (8, 8)
    newest.release()
    held.release()
    with latest.recv(timeout=5) as slot:    # latest: the newest, skipped ones counted
        assert (slot.seq, slot.lag, bytes(slot)) == (9, 8, bytes([9] * 8))
    with pytest.raises(ValueError, match="mode"):
        gpuring.Consumer(ring_name, mode="newest")
    del tx
    lossless_name = ring_name + "-lossless"
    tx = gpuring.Producer(lossless_name, 64, memory="host", capacity=2, policy="overwrite")
    rec = gpuring.Consumer(lossless_name, start="next", mode="lossless")
    for i in range(2):
        tx.send(np.full(8, i, np.uint8))
    with pytest.raises(TimeoutError):
        tx.send(np.full(8, 2, np.uint8), timeout=0.05)   # the recorder gates the producer
    assert [rec.recv(timeout=5).seq for _ in range(2)] == [0, 1]


# ---- asyncio (issue 22, item 9) ----------------------------------------------------------

def _threads():
    return len(os.listdir("/proc/self/task"))


def _watching(loop, rx):
    """How many readers the loop has on the consumer's doorbell socket (duplicates of it)."""
    bell = os.fstat(rx._doorbell()).st_ino
    keys = loop._selector.get_map().values()
    return sum(1 for k in keys if os.fstat(k.fd).st_ino == bell)


def test_recv_async_awaits_on_the_event_loop_without_a_thread(ring_name):
    async def main():
        loop = asyncio.get_running_loop()
        with gpuring.Producer(ring_name, 64, memory="host") as tx, \
                gpuring.Consumer(ring_name, start="next") as rx:
            threads = _threads()
            waiting = asyncio.create_task(rx.recv_async(timeout=20))
            await asyncio.sleep(0.05)
            assert not waiting.done()
            # The loop itself watches the consumer's doorbell; no thread was started for it.
            assert _watching(loop, rx) == 1
            assert _threads() == threads
            tx.send(b"hello")
            slot = await waiting
            assert bytes(slot)[:5] == b"hello"
            assert _watching(loop, rx) == 0  # the wait ended: the reader is gone
            # Two tasks of one consumer wait at once, each on its own reader; each gets one.
            both = [asyncio.create_task(rx.recv_async(timeout=20)) for _ in range(2)]
            await asyncio.sleep(0.05)
            assert _watching(loop, rx) == 2
            tx.send(b"one")
            tx.send(b"two")
            got = sorted(bytes(s)[:3] for s in await asyncio.gather(*both))
            assert got == [b"one", b"two"]
    asyncio.run(main())


def test_async_for_gets_every_message_from_another_process(ring_name):
    n = 2000
    code = (f"import gpuring; p = gpuring.Producer({ring_name!r}, 4096, memory='host', capacity=8);"
            "p.wait_for_consumers(1, timeout=20);"
            f"[p.send(bytes([i % 251]) * (1 + i % 4000)) for i in range({n})]; p.close()")
    child = subprocess.Popen([sys.executable, "-c", code])

    async def main():
        rx = gpuring.Consumer(ring_name, wait=20, start="oldest", mode="lossless")
        got = 0
        async for slot in rx:
            body = bytes(slot)
            assert body == bytes([got % 251]) * (1 + got % 4000), f"message {got}"
            assert slot.seq == got
            got += 1
        assert rx.ended == "closed"
        return got

    assert asyncio.run(main()) == n
    assert child.wait(timeout=20) == 0


def test_async_for_ends_when_the_producer_is_killed(ring_name):
    code = (f"import gpuring, os, signal; p = gpuring.Producer({ring_name!r}, 64, memory='host');"
            "p.wait_for_consumers(1, timeout=20); p.send(b'only'); os.kill(os.getpid(), signal.SIGKILL)")
    child = subprocess.Popen([sys.executable, "-c", code])

    async def main():
        rx = gpuring.Consumer(ring_name, wait=20, start="oldest")
        got = [bytes(s)[:4] async for s in rx]
        return got, rx.ended

    assert asyncio.run(main()) == ([b"only"], "died")
    child.wait()
    os.remove(f"/dev/shm/gpuring.{ring_name}")  # a killed producer leaves its segment


def test_recv_async_times_out_and_a_cancelled_one_loses_nothing(ring_name):
    async def main():
        loop = asyncio.get_running_loop()
        with gpuring.Producer(ring_name, 64, memory="host") as tx, \
                gpuring.Consumer(ring_name, start="next") as rx:
            with pytest.raises(TimeoutError, match="within 0.05 s"):
                await rx.recv_async(timeout=0.05)
            waiting = asyncio.create_task(rx.recv_async())
            await asyncio.sleep(0.02)
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiting
            assert _watching(loop, rx) == 0  # cancelled: no reader left behind
            tx.send(b"kept")
            assert bytes(await rx.recv_async(timeout=5))[:4] == b"kept"
            with pytest.raises(ValueError):  # checked at the call, as recv checks it
                rx.recv_async(timeout=float("nan"))
    asyncio.run(main())


def test_batch_tables_read_as_dicts():
    # A batch's user header as `gpuring batch` writes it (docs/batching.md): the tensor header
    # [K, frame...] at byte 0, the table at 128.
    k = 2
    h = bytearray(128 + 32 + 40 * k)
    t = gpuring.tensor_header("uint8", (k, 4, 4, 3))
    h[: len(t)] = t
    struct.pack_into("<4sB3xI4xQQ", h, 128, b"GRBT", 1, k, 7, 1234)
    struct.pack_into("<QQQQI", h, 160, 41, 999, 2, 5, 1)  # camera 0: present
    struct.pack_into("<QQQQI", h, 200, 0, 0, 0, 0, 0)  # camera 1: absent
    table = gpuring.batch_table(bytes(h))
    assert (table["batch"], table["closed_ns"]) == (7, 1234)
    assert table["cameras"][0] == \
        {"seq": 41, "timestamp_ns": 999, "skipped": 2, "epoch": 5, "state": "present"}
    assert table["cameras"][1]["state"] == "absent"
    assert gpuring.batch_table(bytes(64)) is None  # not a batch
    struct.pack_into("<I", h, 200 + 32, 9)  # a state no batcher writes
    with pytest.raises(ValueError):
        gpuring.batch_table(bytes(h))


def test_a_batcher_makes_batch_tensors_of_two_cameras(ring_name):
    cams = [f"{ring_name}-cam{i}" for i in range(2)]
    out = f"{ring_name}-batch"
    txs = [gpuring.Producer(c, 48, memory="host", capacity=4) for c in cams]
    b = gpuring.Batcher(out, cams, max_wait=0.02, dtype="uint8", shape=(4, 4, 3))
    try:
        rx = gpuring.Consumer(out, wait=10, start="next")
        assert b.running
        seen, seq = 0, 0
        deadline = time.monotonic() + 20
        while seen < 20:
            assert time.monotonic() < deadline, f"{seen} batches"
            for i, tx in enumerate(txs):
                tx.send(np.full((4, 4, 3), (i * 100 + seq) % 256, dtype=np.uint8))
            seq += 1
            try:
                slot = rx.recv(timeout=0.05)
            except TimeoutError:
                continue
            with slot:
                assert slot.shape == (2, 4, 4, 3)  # [K, frame...], from the tensor header
                batch = np.from_dlpack(slot)
                table = gpuring.batch_table(slot.header)
                for i, cam in enumerate(table["cameras"]):
                    if cam["timestamp_ns"]:
                        assert (batch[i] == (i * 100 + cam["seq"]) % 256).all()
                    else:
                        assert (batch[i] == 0).all()
                seen += 1
        rx.close()
    finally:
        totals = b.stop()
    assert totals["batches"] >= 20 and len(totals["cameras"]) == 2
    assert totals["cameras"][0]["present"] > 0
    assert not b.running and b.stop() is None
    for tx in txs:
        tx.close()
    with pytest.raises(ValueError):
        gpuring.Batcher(out, cams, spares=1)
    with pytest.raises(ValueError):
        gpuring.Batcher(out, cams, dtype="uint8")  # a dtype without a shape
