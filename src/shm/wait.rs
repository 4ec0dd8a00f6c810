//! Waiting: the crate's one blocking wait, [`wait_until`] (its async twin is
//! `shm::wait_async`). Every blocking wait of a producer or consumer goes through it: for a
//! free slot, for a message, for a GPU event, for peers to leave.
//!
//! A waiter polls, spins, then yields, then sleeps: on a futex word in shared memory when it
//! waits for something a peer wakes it for (a release, a publish), or in short naps when
//! nobody does (a GPU event's completion, a peer's store it only polls).
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
    /// How long to spin (and, for a futex wait, yield) before the first sleep.
    pub spin: Duration,
    /// Longest time between two of the waiter's slower checks (liveness of its peers): each
    /// futex sleep lasts at most this long.
    pub tick: Duration,
}

/// How long a wait nobody wakes yields the CPU between looks, after its spin, before it naps:
/// an OS sleep of even 10 µs lasts ~60 µs, which a GPU handoff of ~10 µs cannot afford, while
/// a yield on an idle core returns in about a microsecond.
pub(crate) const YIELD_PHASE: Duration = Duration::from_micros(200);

/// The first nap of a wait nobody wakes; each next one doubles, up to [`MAX_NAP`].
const FIRST_NAP: Duration = Duration::from_micros(10);

/// The longest nap of a wait nobody wakes.
const MAX_NAP: Duration = Duration::from_millis(1);

/// When a wait gives up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Deadline {
    /// After the first look (a `try_` operation): the wait reads no clock.
    Now,
    /// Once this instant has passed.
    At(Instant),
    /// Never.
    Never,
}

impl Deadline {
    /// `timeout` from now (`Never` if that is past the clock's range).
    pub(crate) fn after(timeout: Duration) -> Deadline {
        Instant::now().checked_add(timeout).map_or(Deadline::Never, Deadline::At)
    }
}

/// Waits until `step` returns `Some`, or `deadline` passes (then `None`; a deadline already
/// past when the first step finds nothing returns at once, as [`Deadline::Now`] does).
///
/// The first step runs before the wait reads a clock: most waits end there, and a clock read
/// costs a sixth of a whole host message. `step`'s argument is true once per `cfg.tick`, never
/// on the first step: the time for its slower checks (liveness), which may end the wait too.
/// With a wake `line`, the waiter sleeps on its futex word after the spin, and whoever makes
/// the condition true bumps and wakes it; without one, it yields for [`YIELD_PHASE`] more,
/// then naps, from [`FIRST_NAP`] doubling up to [`MAX_NAP`].
pub(crate) fn wait_until<T>(
    line: Option<&WakeLine>,
    cfg: WaitConfig,
    deadline: Deadline,
    mut step: impl FnMut(bool) -> Option<T>,
) -> Option<T> {
    if let Some(v) = step(false) {
        return Some(v);
    }
    if deadline == Deadline::Now {
        return None;
    }
    let start = Instant::now();
    let mut last_tick = start;
    let backoff = Backoff::new();
    let mut nap = FIRST_NAP;
    loop {
        let now = Instant::now();
        let left = match deadline {
            Deadline::At(d) if now >= d => return None,
            Deadline::At(d) => d - now,
            Deadline::Now => return None,
            Deadline::Never => Duration::MAX,
        };
        let waited = now - start;
        let spinning = waited < cfg.spin;
        if spinning {
            match line {
                // Spins a little longer each time, then yields (crossbeam's backoff).
                Some(_) => backoff.snooze(),
                // A poll of a GPU event already costs ~50 ns: spin on it.
                None => std::hint::spin_loop(),
            }
        } else {
            match line {
                Some(line) => {
                    let until_tick = cfg.tick.saturating_sub(last_tick.elapsed());
                    if let Some(v) = sleep_on(line, until_tick.min(left), || step(false)) {
                        return Some(v);
                    }
                }
                None if waited < cfg.spin.saturating_add(YIELD_PHASE) => std::thread::yield_now(),
                None => {
                    std::thread::sleep(nap.min(left));
                    nap = (nap * 2).min(MAX_NAP);
                }
            }
        }
        // A spin is short: the clock read before it serves (one read per turn, not two).
        let now = if spinning { now } else { Instant::now() };
        let tick = now - last_tick >= cfg.tick;
        if tick {
            last_tick = now;
        }
        if let Some(v) = step(tick) {
            return Some(v);
        }
    }
}

/// Sleeps on `line`'s futex word for at most `nap`, unless `check` (run after registering as a
/// sleeper) finds the condition true: then its value.
fn sleep_on<T>(line: &WakeLine, nap: Duration, check: impl FnOnce() -> Option<T>) -> Option<T> {
    // Register as a sleeper, fence, read the word, re-check, then sleep.
    // Relaxed RMW: the SeqCst fence below orders it before the re-check.
    line.sleepers.fetch_add(1, Ordering::Relaxed);
    // SeqCst fence: pairs with the waker's fence in `ring::producer::wants_wake`.
    fence(Ordering::SeqCst);
    // Acquire: pairs with the waker's Release bump.
    let word = line.word.load(Ordering::Acquire);
    let ready = check();
    if ready.is_none() && !nap.is_zero() {
        // At most a day: a longer timeout (a huge liveness interval) would not fit a timespec.
        let nap = nap.min(Duration::from_secs(86_400));
        let ts =
            rustix::time::Timespec { tv_sec: nap.as_secs() as _, tv_nsec: nap.subsec_nanos() as _ };
        // EAGAIN (the word moved), EINTR and ETIMEDOUT all mean: look again.
        let _ = futex::wait(&line.word, futex::Flags::empty(), word, Some(&ts));
    }
    // Relaxed: only a hint for wakers, who re-check with their own fence.
    line.sleepers.fetch_sub(1, Ordering::Relaxed);
    ready
}

/// Wakes every sleeper on `line` (its word was already bumped by `ring::producer::wants_wake`).
pub(crate) fn wake_all(line: &WakeLine) {
    let _ = futex::wake(&line.word, futex::Flags::empty(), i32::MAX as u32);
}
