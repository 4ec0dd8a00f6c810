//! The async wait (feature `tokio`), under [`Consumer::recv_async`](crate::Consumer::recv_async),
//! [`Consumer::messages`](crate::Consumer::messages) and
//! [`Producer::acquire_async`](crate::Producer::acquire_async) (their code is beside the
//! blocking forms', in `consumer/asynch.rs` and `producer/asynch.rs`).
//!
//! An async waiter never spins and never blocks its thread. It parks ([`crate::ring::park`])
//! and awaits its doorbell ([`crate::shm::doorbell`]) through the reactor of the runtime it is
//! polled on: a consumer its own socket, named by a token in its consumer table entry, which
//! the producer knocks on after a publish; the producer its socket, which consumers knock on
//! after a release. The doorbell is registered with the reactor for each wait and deregistered
//! after it, so a consumer or producer may move between runtimes. Each wait is bounded by the
//! liveness interval, after which the waiter checks its peers the way a blocking wait does.
//! Where no doorbell can be had, it waits on a 1 ms timer instead. A wait for the GPU (a CUDA
//! producer's wait for a slot's last write or its readers' release events), which nobody
//! knocks for, yields to the runtime, then sleeps 100 µs at a time. Every async wait goes
//! through [`wait_async`], the twin of the blocking `wait::wait_until`.
//!
//! Futures and streams borrow the consumer or producer, and are `Send`: a `Consumer` is `Sync`
//! (a pin or a release takes a lock held for that step only), so `tokio::spawn(async move {
//! rx.recv_async().await })` works on any runtime, and several tasks may await one consumer.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

use crate::ring::{park, WakeLine};
use crate::shm::doorbell::Doorbell;
use crate::shm::wait::{WaitConfig, YIELD_PHASE};

/// Waits that a doorbell's knock ended with something to return (statistics, for tests: see
/// `testing::async_wakes`). Relaxed (both counters): counts nothing else depends on.
pub(crate) static DOORBELL_WAKES: std::sync::atomic::AtomicU64 =
    std::sync::atomic::AtomicU64::new(0);
/// Waits with a doorbell that their timer ended with something to return: a knock that never
/// came (a peer that cannot reach the doorbell), or a liveness tick's finding.
pub(crate) static TIMER_WAKES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How long a waiter with no doorbell sleeps between looks.
const FALLBACK_NAP: Duration = Duration::from_millis(1);

/// How long a wait nobody wakes (a GPU event) sleeps between looks once it has yielded for a
/// while: tokio's timer rounds it up to a millisecond.
const POLL_NAP: Duration = Duration::from_micros(100);

/// What an async waiter parks on: the wake line its peer bumps, its own park flag (a
/// consumer's, in its table entry; the producer has none), and the doorbell its peer knocks on.
pub(crate) struct Wake<'a> {
    pub line: &'a WakeLine,
    pub flag: Option<&'a AtomicU32>,
    pub bell: Option<&'a Doorbell>,
    /// Set when a wait empties knocks from `bell` (a consumer's: see `doorbells::BellCell`).
    pub emptied: Option<&'a AtomicBool>,
}

/// The async twin of `wait::wait_until`, without a deadline: awaits until `step` returns
/// `Some`. `step`'s argument is true once per `cfg.tick` (its slower checks, liveness), never
/// on the first step, before which the wait reads no clock.
///
/// With `wake`, the task parks on the line and awaits the doorbell, at most until the next
/// tick; without one (a GPU event nobody wakes us for), it yields to the runtime for the spin
/// time and `wait::YIELD_PHASE` more, as the blocking wait does, then sleeps [`POLL_NAP`] at a
/// time.
pub(crate) async fn wait_async<T>(
    wake: Option<Wake<'_>>,
    cfg: WaitConfig,
    mut step: impl FnMut(bool) -> Option<T>,
) -> T {
    if let Some(v) = step(false) {
        return v;
    }
    let start = Instant::now();
    let mut last_tick = start;
    loop {
        match &wake {
            Some(w) => {
                let _parked = Parked::new(w.line, w.flag);
                // Parked: a wake-up from here on knocks. Look once more before awaiting it.
                if let Some(v) = step(false) {
                    return v;
                }
                let rang = ring_or_nap(w.bell, cfg.tick.saturating_sub(last_tick.elapsed())).await;
                if let (true, Some(emptied)) = (rang, w.emptied) {
                    emptied.store(true, Ordering::Relaxed);
                }
                let tick = last_tick.elapsed() >= cfg.tick;
                if tick {
                    last_tick = Instant::now();
                }
                if let Some(v) = step(tick) {
                    let woke = if rang { &DOORBELL_WAKES } else { &TIMER_WAKES };
                    woke.fetch_add(1, Ordering::Relaxed);
                    return v;
                }
                continue;
            }
            None if start.elapsed() < cfg.spin.saturating_add(YIELD_PHASE) => {
                tokio::task::yield_now().await
            }
            None => tokio::time::sleep(POLL_NAP).await,
        }
        let tick = last_tick.elapsed() >= cfg.tick;
        if tick {
            last_tick = Instant::now();
        }
        if let Some(v) = step(tick) {
            return v;
        }
    }
}

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

/// Awaits `bell` becoming readable, for at most `nap`, then empties it; without a doorbell (or
/// if the reactor refuses it), sleeps `nap` capped at [`FALLBACK_NAP`]. Returns whether it
/// rang (it emptied knocks). Panics outside a tokio runtime with IO and time enabled, as tokio's own types do.
///
/// The reactor gets a duplicate of the doorbell's descriptor for this wait: tasks sharing a
/// consumer wait at once, and epoll takes each descriptor once. Every duplicate is woken by a
/// knock (each is its own registration of the one socket).
async fn ring_or_nap(bell: Option<&Doorbell>, nap: Duration) -> bool {
    let fd = bell.and_then(|b| {
        let dup = rustix::io::fcntl_dupfd_cloexec(b, 0).ok()?;
        // SAFETY: `dup` is an open descriptor that the `AsyncFd` owns: it stays open, on the
        // same socket, until the `AsyncFd` drops, and `OwnedFd` always returns it.
        unsafe { AsyncFd::register_with_interest(dup, Interest::READABLE).ok() }
    });
    let (Some(bell), Some(fd)) = (bell, fd) else {
        tokio::time::sleep(nap.min(FALLBACK_NAP)).await;
        return false;
    };
    match tokio::time::timeout(nap, fd.readable()).await {
        Ok(Ok(mut ready)) => {
            // Clearing before emptying is safe: a knock after the clear raises readiness again.
            ready.clear_ready();
            bell.quiet() > 0
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
