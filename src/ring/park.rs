//! Parking: how a waiter that sleeps on a doorbell rather than a futex (an async task) registers,
//! so that no wake-up is lost.
//!
//! It is the futex protocol of [`super`] with one more mark. The waiter:
//! 1. [`park`]: `sleepers += 1`, `parked += 1`, raises its own count (a consumer's entry
//!    `parked`, a count because one consumer may be awaited by several tasks at once), then a
//!    SeqCst fence;
//! 2. re-checks its condition; if it holds, [`unpark`] and go on;
//! 3. awaits its doorbell, then [`unpark`] and look again.
//!
//! The waker makes its change and calls [`super::producer::wants_wake`] (SeqCst fence, then
//! `sleepers`); if that says yes and [`has_parked`] does too, it rings the doorbell of every
//! waiter whose count is non-zero. As with the futex, the two fences are ordered one way or the
//! other: either the waiter's re-check sees the change, or the waker sees its count. A doorbell
//! rung while the waiter was not yet awaiting stays rung (a queued datagram), so the await
//! returns at once. Spurious rings are harmless: the waiter looks again.

use super::atomic::{fence, AtomicU32, Ordering};
use super::WakeLine;

/// Registers a doorbell waiter on `line` and adds 1 to `flag` (if any), then fences. The caller
/// must re-check its condition next, and [`unpark`] with the same arguments afterwards.
pub fn park(line: &WakeLine, flag: Option<&AtomicU32>) {
    // Relaxed RMWs: the SeqCst fence below orders them before the re-check.
    line.sleepers.fetch_add(1, Ordering::Relaxed);
    line.parked.fetch_add(1, Ordering::Relaxed);
    if let Some(flag) = flag {
        flag.fetch_add(1, Ordering::Relaxed);
    }
    // SeqCst fence: pairs with the waker's fence in `wants_wake` (see the module docs).
    fence(Ordering::SeqCst);
}

/// Undoes [`park`].
pub fn unpark(line: &WakeLine, flag: Option<&AtomicU32>) {
    // Relaxed: hints for wakers, who re-check after their own fence; a stale count costs one
    // spurious ring.
    if let Some(flag) = flag {
        flag.fetch_sub(1, Ordering::Relaxed);
    }
    line.parked.fetch_sub(1, Ordering::Relaxed);
    line.sleepers.fetch_sub(1, Ordering::Relaxed);
}

/// After `wants_wake(line)` returned true: whether any of the sleepers waits on a doorbell.
pub fn has_parked(line: &WakeLine) -> bool {
    // Relaxed: read after the waker's SeqCst fence in `wants_wake`, which orders it.
    line.parked.load(Ordering::Relaxed) != 0
}

/// After `wants_wake` and [`has_parked`]: whether the waiter owning `flag` is parked.
pub fn is_parked(flag: &AtomicU32) -> bool {
    // Relaxed: as in `has_parked`.
    flag.load(Ordering::Relaxed) != 0
}

/// Clears the parked count of a consumer that died while parked (the reclaimer calls it for a
/// dead consumer's entry), so wakers stop ringing for it.
pub fn clear_dead(line: &WakeLine, flag: &AtomicU32) {
    // Relaxed: the owner is dead and makes no more changes; the counts are hints.
    let n = flag.swap(0, Ordering::Relaxed);
    if n == 0 {
        return;
    }
    // The entry's count is read from shared memory: never take away more than the line has
    // (a damaged count must not wrap `sleepers`, which would silence every later wake).
    // Relaxed: hints, as above.
    let n = n.min(line.parked.load(Ordering::Relaxed)).min(line.sleepers.load(Ordering::Relaxed));
    line.parked.fetch_sub(n, Ordering::Relaxed);
    line.sleepers.fetch_sub(n, Ordering::Relaxed);
}
