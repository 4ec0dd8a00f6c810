"""The asyncio side of gpuring.Consumer (built into the extension; see aio.rs).

A wait parks the consumer on its doorbell, a datagram socket the producer knocks on after a
publish or a close, and lets the running event loop watch that descriptor (loop.add_reader):
no thread waits for any consumer. The steps are those of Consumer.doorbell_fd in the Rust
crate: look, arm, look again, wait for a knock (at most one liveness interval, after which the
next look checks that the producer still runs), disarm.
"""

import asyncio
import os


def _wake(done):
    if not done.done():
        done.set_result(None)


async def recv(rx, timeout=None):
    loop = asyncio.get_running_loop()
    deadline = None if timeout is None else loop.time() + timeout
    fd = rx._doorbell()
    # Without a doorbell, look every millisecond.
    tick = rx._liveness() if fd >= 0 else 0.001
    while True:
        slot = rx.try_recv()
        if slot is not None:
            return slot
        rx._arm()
        try:
            # A message published before the arm knocked on nobody's door.
            slot = rx.try_recv()
            if slot is not None:
                return slot
            wait = tick
            if deadline is not None:
                wait = min(wait, deadline - loop.time())
                if wait <= 0:
                    raise rx._timeout(timeout)
            done = loop.create_future()
            timer = loop.call_later(wait, _wake, done)
            # The loop watches a duplicate: tasks sharing the consumer wait at once, and a
            # loop keeps one reader per descriptor. A knock wakes every duplicate.
            watched = os.dup(fd) if fd >= 0 else -1
            try:
                if watched >= 0:
                    loop.add_reader(watched, _wake, done)
                await done
            finally:
                timer.cancel()
                if watched >= 0:
                    loop.remove_reader(watched)
                    os.close(watched)
        finally:
            rx._disarm()


async def anext(rx, disconnected):
    try:
        return await recv(rx)
    except disconnected:
        raise StopAsyncIteration from None
