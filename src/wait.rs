//! Waiting: spin, then yield, then sleep on a futex word in shared memory.
//!
//! The futex is rustix's *without* `FUTEX_PRIVATE_FLAG`: a private futex is keyed by the
//! process's address space, so a wake from another process would never reach it.
//! The sleep protocol (register, fence, re-check, sleep on the value read before the
//! re-check) is described in [`crate::ring`].

use std::sync::atomic::{fence, Ordering};
use std::time::{Duration, Instant};

use crossbeam_utils::Backoff;
use rustix::thread::futex;

use crate::ring::WakeLine;

/// How a waiter behaves before sleeping, and how often it wakes to look around.
#[derive(Clone, Copy, Debug)]
pub(crate) struct WaitConfig {
    /// How long to spin and yield before the first futex sleep.
    pub spin: Duration,
    /// Longest single sleep: after it the waiter runs its idle check (liveness).
    pub tick: Duration,
}

/// Waits until `poll` returns `Some`, or `deadline` passes (then `None`). After each sleep,
/// `idle` runs; if it returns `Some`, that is the result.
pub(crate) fn wait_until<T>(
    line: &WakeLine,
    cfg: WaitConfig,
    deadline: Option<Instant>,
    mut poll: impl FnMut() -> Option<T>,
    mut idle: impl FnMut() -> Option<T>,
) -> Option<T> {
    if let Some(v) = poll() {
        return Some(v);
    }
    let backoff = Backoff::new();
    let start = Instant::now();
    let spin_until = start + cfg.spin;
    loop {
        // Spin, then yield, for up to `cfg.spin`.
        loop {
            if let Some(v) = poll() {
                return Some(v);
            }
            backoff.snooze();
            if backoff.is_completed() {
                let now = Instant::now();
                if now >= spin_until || deadline.is_some_and(|d| now >= d) {
                    break;
                }
                std::thread::yield_now();
            }
        }
        let now = Instant::now();
        let mut nap = cfg.tick;
        if let Some(d) = deadline {
            if now >= d {
                return None;
            }
            nap = nap.min(d - now);
        }
        // Register as a sleeper, fence, read the word, re-check, then sleep.
        // Relaxed RMW: the SeqCst fence below orders it before the re-check.
        line.sleepers.fetch_add(1, Ordering::Relaxed);
        // SeqCst fence: pairs with the waker's fence in `ring::producer::wants_wake`.
        fence(Ordering::SeqCst);
        // Acquire: pairs with the waker's Release bump.
        let word = line.word.load(Ordering::Acquire);
        let ready = poll();
        if ready.is_none() {
            sleep(line, word, nap);
        }
        // Relaxed: only a hint for wakers, who re-check with their own fence.
        line.sleepers.fetch_sub(1, Ordering::Relaxed);
        if let Some(v) = ready {
            return Some(v);
        }
        if let Some(v) = idle() {
            return Some(v);
        }
        if let Some(v) = poll() {
            return Some(v);
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return None;
        }
    }
}

/// How long [`poll_until`] yields the CPU between looks, after its spin, before it naps: an OS
/// sleep of even 10 µs lasts ~60 µs, which a GPU handoff of ~10 µs cannot afford, while a yield
/// on an idle core returns in about a microsecond.
const YIELD_PHASE: Duration = Duration::from_micros(200);

/// Waits until `poll` returns `Some`, or `deadline` passes (then `None`), for a condition
/// nobody wakes us for (a GPU event's completion, a peer's store we only poll): spin for
/// `cfg.spin`, yield for [`YIELD_PHASE`] more, then nap, from 10 µs doubling up to 1 ms.
/// `poll`'s argument is true once per `cfg.tick`: the time for its slower checks (liveness).
pub(crate) fn poll_until<T>(
    cfg: WaitConfig,
    deadline: Option<Instant>,
    mut poll: impl FnMut(bool) -> Option<T>,
) -> Option<T> {
    let start = Instant::now();
    let mut last_tick = start;
    let mut nap = Duration::from_micros(10);
    loop {
        let tick = last_tick.elapsed() >= cfg.tick;
        if tick {
            last_tick = Instant::now();
        }
        if let Some(v) = poll(tick) {
            return Some(v);
        }
        let now = Instant::now();
        if deadline.is_some_and(|d| now >= d) {
            return None;
        }
        let waited = now - start;
        if waited < cfg.spin {
            std::hint::spin_loop();
        } else if waited < cfg.spin + YIELD_PHASE {
            std::thread::yield_now();
        } else {
            let left = deadline.map_or(nap, |d| d.saturating_duration_since(now));
            std::thread::sleep(nap.min(left));
            nap = (nap * 2).min(Duration::from_millis(1));
        }
    }
}

/// `FUTEX_WAIT` on `line.word` while it holds `word`, for at most `nap`.
fn sleep(line: &WakeLine, word: u32, nap: Duration) {
    let ts =
        rustix::time::Timespec { tv_sec: nap.as_secs() as _, tv_nsec: nap.subsec_nanos() as _ };
    // EAGAIN (the word moved), EINTR and ETIMEDOUT all mean: look again.
    let _ = futex::wait(&line.word, futex::Flags::empty(), word, Some(&ts));
}

/// Wakes every sleeper on `line` (its word was already bumped by `ring::producer::wants_wake`).
pub(crate) fn wake_all(line: &WakeLine) {
    let _ = futex::wake(&line.word, futex::Flags::empty(), i32::MAX as u32);
}
