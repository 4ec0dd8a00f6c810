//! Async waiting (feature `tokio`): [`Consumer::recv_async`](crate::Consumer::recv_async),
//! [`Consumer::stream`](crate::Consumer::stream) and
//! [`Producer::acquire_async`](crate::Producer::acquire_async).
//!
//! An async waiter never spins and never blocks its thread. It parks ([`crate::ring::park`])
//! and awaits its doorbell ([`crate::shm::doorbell`]) through the reactor of the runtime it is
//! polled on: a consumer its own socket, named by a token in its consumer table entry, which
//! the producer knocks on after a publish; the producer its socket, which consumers knock on
//! after a release. The doorbell is registered with the reactor for each wait and deregistered
//! after it, so a consumer or producer may move between runtimes. Each wait is bounded by the
//! liveness interval, after which the waiter checks its peers the way a blocking wait does.
//! Where no doorbell can be had, it waits on a 1 ms timer instead.
//!
//! Futures and streams borrow the consumer or producer. A `Consumer` is `!Sync` (its receive
//! takes `&self` so that several messages can be held at once, with no lock), so the futures
//! that borrow one are `!Send`: run them on the task that owns the consumer (a current-thread
//! runtime, a `LocalSet`, or `spawn_local`). The producer's futures are `Send`.

mod consumer;
mod producer;

use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::AtomicU32;
use std::time::Duration;

use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

use crate::ring::{park, WakeLine};
use crate::shm::doorbell::Doorbell;

pub(crate) use consumer::BellCell;
pub use consumer::Messages;

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

/// A doorbell's descriptor, lent to the reactor for one wait.
struct Lent(RawFd);

impl AsRawFd for Lent {
    fn as_raw_fd(&self) -> RawFd {
        self.0
    }
}

/// Awaits `bell` becoming readable, for at most `nap`, then empties it; without a doorbell (or
/// if the reactor refuses it), sleeps `nap` capped at [`FALLBACK_NAP`]. Returns whether it
/// rang. Panics outside a tokio runtime with IO and time enabled, as tokio's own types do.
async fn ring_or_nap(bell: Option<&Doorbell>, nap: Duration) -> bool {
    // SAFETY: the descriptor belongs to `bell`, which outlives `fd`: both live in this call,
    // and `fd` is dropped (deregistering it) before it returns. `Lent` always returns it.
    let fd = bell.and_then(|b| unsafe {
        AsyncFd::register_with_interest(Lent(b.as_raw_fd()), Interest::READABLE).ok()
    });
    let (Some(bell), Some(fd)) = (bell, fd) else {
        tokio::time::sleep(nap.min(FALLBACK_NAP)).await;
        return false;
    };
    match tokio::time::timeout(nap, fd.readable()).await {
        Ok(Ok(mut ready)) => {
            // Clearing before emptying is safe: a knock after the clear raises readiness again.
            ready.clear_ready();
            bell.quiet();
            true
        }
        // The reactor failed this fd: nap, so that the caller does not spin.
        Ok(Err(_)) => {
            tokio::time::sleep(nap.min(FALLBACK_NAP)).await;
            false
        }
        // The nap ended: the caller checks its peers and looks again.
        Err(_) => false,
    }
}
