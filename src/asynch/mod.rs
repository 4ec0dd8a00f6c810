//! Async waiting (feature `tokio`): [`Consumer::recv_async`](crate::Consumer::recv_async),
//! [`Consumer::stream`](crate::Consumer::stream) and
//! [`Producer::acquire_async`](crate::Producer::acquire_async).
//!
//! An async waiter never spins and never blocks its thread. It parks ([`crate::ring::park`])
//! and awaits a doorbell ([`crate::shm::doorbell`]) through tokio's reactor: a consumer its own
//! eventfd, which it registered with the producer; the producer its inbox socket, on which
//! consumers knock. Each wait is bounded by the liveness interval, after which the waiter checks
//! its peers the way a blocking wait does. Where no doorbell can be had (no inbox reachable),
//! it waits on a 1 ms timer instead.
//!
//! Futures and streams borrow the consumer or producer. A `Consumer` is `!Sync`, so futures that
//! borrow one are `!Send`: drive them on the task that owns the consumer (`tokio::spawn` of an
//! `async move` block that owns it does not work; use a `LocalSet`, a current-thread runtime,
//! or `tokio::task::spawn_blocking`-free designs such as the one in `examples/channel.rs`).

mod consumer;
mod producer;

use std::sync::atomic::AtomicU32;
use std::time::Duration;

use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

use crate::ring::{park, WakeLine};

pub(crate) use consumer::BellCell;
pub use consumer::Messages;
pub(crate) use producer::InboxCell;

/// How long a waiter with no doorbell sleeps between looks.
const FALLBACK_NAP: Duration = Duration::from_millis(1);

/// A parked registration on a wake line, undone on drop (so a cancelled wait unparks too).
struct Parked<'a> {
    line: &'a WakeLine,
    flag: Option<&'a AtomicU32>,
}

impl<'a> Parked<'a> {
    fn new(line: &'a WakeLine, flag: Option<&'a AtomicU32>) -> Parked<'a> {
        park::park(line, flag);
        Parked { line, flag }
    }
}

impl Drop for Parked<'_> {
    fn drop(&mut self) {
        park::unpark(self.line, self.flag);
    }
}

/// Registers `fd` with the current runtime's reactor, for readability. `None` if it refuses.
/// Panics outside a tokio runtime, as tokio's IO types do.
fn watch<T: std::os::fd::AsRawFd>(fd: T) -> Option<AsyncFd<T>> {
    // SAFETY: callers pass owning types (`OwnedFd`, or `Bell` around one) that keep their
    // descriptor open and return it from every `as_raw_fd`; the `AsyncFd` owns `fd` till drop.
    unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) }.ok()
}

/// Awaits `fd` becoming readable, for at most `nap`; without a doorbell, sleeps `nap`. Returns
/// whether the doorbell rang. `drain` empties the doorbell once it has.
async fn ring_or_nap<T: std::os::fd::AsRawFd>(
    fd: Option<&AsyncFd<T>>,
    nap: Duration,
    drain: impl FnOnce(&T),
) -> bool {
    let Some(fd) = fd else {
        tokio::time::sleep(nap.min(FALLBACK_NAP)).await;
        return false;
    };
    match tokio::time::timeout(nap, fd.readable()).await {
        Ok(Ok(mut ready)) => {
            // Clearing before draining is safe: a ring after the clear raises readiness again.
            ready.clear_ready();
            drain(fd.get_ref());
            true
        }
        // The reactor failed this fd, or the nap ended: look again either way.
        Ok(Err(_)) | Err(_) => false,
    }
}
