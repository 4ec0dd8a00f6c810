"""A lost GPU context, as Python sees it: `gpuring.ContextLostError` from every call, and
`ended == "context lost"` for the consumers of a producer that lost its own.

The loss is made by the ring crate's test hook (`gpuring._lose_context_after`, or
`GPURING_TEST_LOSE_CONTEXT` in the environment), which wheels built with the `test-support`
feature have (scripts/python-tests.sh builds one); so these run on machines without a GPU. A
loss is for good in its process: each test loses the context of a child process.
"""
import json
import os
import subprocess
import sys

import pytest

import gpuring

pytestmark = pytest.mark.skipif(
    not hasattr(gpuring, "_lose_context_after"),
    reason="needs a wheel built with --features test-support (scripts/python-tests.sh)")

LOST = "the GPU context of this process is lost (test hook failed"


def run(code, *args, env=None):
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          timeout=60, env=env)


# Producer and consumer in one process: every call after the loss raises ContextLostError, an
# instance of gpuring.Error, with the Rust message; closing raises nothing; the process ends
# as the docs say a service should, with gpuring.EXIT_CONTEXT_LOST.
EVERY_CALL = r"""
import asyncio, json, sys, gpuring
name = sys.argv[1]
tx = gpuring.Producer(name, 64, memory="host")
rx = gpuring.Consumer(name, start="next")
tx.send(b"before")
rx.recv(timeout=5).release()
assert gpuring.context_lost() is None
gpuring._lose_context_after(0)

async def recv_async():
    return await rx.recv_async(timeout=1)

calls = {
    "send": lambda: tx.send(b"after"),
    "recv": lambda: rx.recv(timeout=1),
    "try_recv": rx.try_recv,
    "iteration": lambda: next(iter(rx)),
    "recv_async": lambda: asyncio.run(recv_async()),
    "wait_for_consumers": lambda: tx.wait_for_consumers(2, timeout=5),
    "Consumer": lambda: gpuring.Consumer(name),
    "Producer": lambda: gpuring.Producer(name + "-2", 64, memory="host"),
    "finish_gpu_work": gpuring.finish_gpu_work,
}
out = {}
for what, call in calls.items():
    try:
        call()
        out[what] = "no error"
    except gpuring.ContextLostError as e:
        out[what] = [isinstance(e, gpuring.Error), str(e)]
    except BaseException as e:
        out[what] = f"{type(e).__name__}: {e}"
out["context_lost"] = gpuring.context_lost()
rx.close()
tx.close()
print(json.dumps(out))
sys.exit(gpuring.EXIT_CONTEXT_LOST)
"""


def test_every_call_raises_context_lost_error(ring_name):
    r = run(EVERY_CALL, ring_name)
    assert r.returncode == gpuring.EXIT_CONTEXT_LOST == 75, r.stderr
    out = json.loads(r.stdout)
    message = out.pop("context_lost")
    assert message.startswith(LOST) and "exit (status 75)" in message
    for what, got in out.items():
        assert got == [True, message], what  # a gpuring.Error, with the Rust message
    # A ring closed by a lost context keeps its name, for a restarted producer to replace.
    os.remove(f"/dev/shm/gpuring.{ring_name}")


def test_the_hook_counts_operations(ring_name):
    code = ("import gpuring, sys; tx = gpuring.Producer(sys.argv[1], 64, memory='host');"
            "gpuring._lose_context_after(4); sent = 0\n"
            "try:\n"
            "    while True: tx.send(b'x'); sent += 1\n"
            "except gpuring.ContextLostError: print(sent)")
    r = run(code, ring_name)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["2"]  # a send is an acquire and a publish
    os.remove(f"/dev/shm/gpuring.{ring_name}")


def test_an_uncaught_loss_names_itself_and_the_exit_status(ring_name):
    # From the first call, by the environment; the exception propagates out of the script.
    env = dict(os.environ, GPURING_TEST_LOSE_CONTEXT="0")
    r = run("import gpuring, sys; gpuring.Producer(sys.argv[1], 64, memory='host')", ring_name,
            env=env)
    assert r.returncode == 1
    assert f"gpuring.ContextLostError: {LOST}" in r.stderr
    assert "it must exit (status 75) and be restarted" in r.stderr
    assert not os.path.exists(f"/dev/shm/gpuring.{ring_name}")


def test_consumers_see_that_the_producer_lost_its_context(ring_name):
    code = ("import gpuring, sys\n"
            "tx = gpuring.Producer(sys.argv[1], 64, memory='host')\n"
            "tx.wait_for_consumers(1, timeout=20)\n"
            "for i in range(3): tx.send(b'%d' % i)\n"
            "gpuring._lose_context_after(0)\n"
            "try:\n"
            "    tx.send(b'lost')\n"
            "except gpuring.ContextLostError:\n"
            "    sys.exit(gpuring.EXIT_CONTEXT_LOST)\n")
    child = subprocess.Popen([sys.executable, "-c", code, ring_name])
    rx = gpuring.Consumer(ring_name, wait=20, start="oldest")
    assert [bytes(s)[:1] for s in rx] == [b"0", b"1", b"2"]
    assert child.wait(timeout=20) == gpuring.EXIT_CONTEXT_LOST
    assert rx.ended == "context lost"  # cut, and why
    with pytest.raises(gpuring.Disconnected) as e:
        rx.recv(timeout=1)
    assert e.value.reason == "context lost"
    assert not isinstance(e.value, gpuring.ContextLostError)  # ours is fine
    assert gpuring.context_lost() is None
    rx.close()
    os.remove(f"/dev/shm/gpuring.{ring_name}")  # kept for the restarted producer to replace
