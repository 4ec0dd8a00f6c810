//! Counters kept in the segment, read without disturbing the hot path.

use std::sync::atomic::Ordering;

use crate::ring::{lease, stamp};
use crate::ring::{Mode, Ring};
use crate::shm::ns::Namespaces;
use crate::shm::{presence, Segment};

/// One joined consumer, as its table entry says now.
///
/// [`Producer::consumers`](crate::Producer::consumers) lists them:
///
/// ```
/// # let mut tx = gpuring::Producer::builder("doc-stats-consumer-info").create()?;
/// let _rx = gpuring::Consumer::open("doc-stats-consumer-info")?;
/// tx.send(b"hello", b"")?;
/// let info = tx.consumers()[0];
/// assert_eq!((info.pid, info.lag, info.received), (std::process::id(), 1, 0));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConsumerInfo {
    /// Consumer table index.
    pub index: usize,
    /// Its pid, as its own pid namespace numbers it (for display: in another container it
    /// names another process here, or none).
    pub pid: u32,
    /// Whether that process still runs: it holds its entry's liveness lock, in whatever pid
    /// namespace it runs.
    pub alive: bool,
    /// Its namespaces, as it recorded them (all 0 if it could not tell): compare with
    /// [`Namespaces::current`] to tell a consumer in another container.
    pub namespaces: Namespaces,
    /// Sequence number of the next message it will receive.
    pub cursor: u64,
    /// Messages published that it has not received yet.
    pub lag: u64,
    /// Messages received.
    pub received: u64,
    /// Its delivery mode (`None`: the entry holds a value no correct consumer writes).
    pub mode: Option<Mode>,
    /// Messages lost: overwritten before it got to them (`Queue`), or skipped (`Latest`).
    pub lost: u64,
    /// Messages it holds now.
    pub holding: u64,
    /// The oldest message it holds now, from its hold records: what a producer waiting for a
    /// buffer waits on.
    pub oldest_held: Option<u64>,
    /// Whether it is parked: an async receive waiting on its doorbell.
    pub parked: bool,
    /// Whether the producer evicted it (see `gpuring stat`): it gates and holds nothing, and
    /// its process gets an error at its next call.
    pub evicted: bool,
}

/// Number of active consumers.
pub(crate) fn consumer_count(ring: &Ring<'_>) -> usize {
    ring.consumers
        .iter()
        // Relaxed: a snapshot for display or polling; nothing is read through it.
        .filter(|e| lease::state(e.lease.load(Ordering::Relaxed)) == lease::ACTIVE)
        .count()
}

/// A snapshot of every active or evicted consumer of `ring`, mapped from `seg`.
pub(crate) fn consumers(seg: &Segment, ring: &Ring<'_>) -> Vec<ConsumerInfo> {
    // Relaxed throughout: statistics, each value read once and only displayed.
    let head = ring.producer.head.load(Ordering::Relaxed);
    ring.consumers
        .iter()
        .enumerate()
        .map(|(index, e)| (index, e, e.lease.load(Ordering::Relaxed)))
        .filter(|(_, _, l)| matches!(lease::state(*l), lease::ACTIVE | lease::EVICTED))
        .map(|(index, e, l)| {
            let cursor = e.cursor.load(Ordering::Relaxed);
            let words = std::array::from_fn(|i| e.namespaces[i].load(Ordering::Relaxed));
            ConsumerInfo {
                index,
                pid: lease::pid(l),
                alive: seg.held(presence::consumer(index)),
                namespaces: Namespaces::from_words(words),
                cursor,
                lag: head.saturating_sub(cursor),
                received: e.received.load(Ordering::Relaxed),
                mode: Mode::from_raw(e.mode.load(Ordering::Relaxed)),
                lost: e.lost.load(Ordering::Relaxed),
                holding: e.holding.load(Ordering::Relaxed),
                oldest_held: oldest_held(ring, index),
                parked: e.parked.load(Ordering::Relaxed) != 0,
                evicted: lease::state(l) == lease::EVICTED,
            }
        })
        .collect()
}

/// Buffers whose stamp counts at least one holder.
pub(crate) fn held_buffers(ring: &Ring<'_>) -> usize {
    ring.buffers
        .iter()
        // Relaxed: a snapshot for display and leak checks.
        .filter(|l| stamp::held(l.stamp.load(Ordering::Relaxed)) > 0)
        .count()
}

/// The oldest message consumer entry `index` holds, by its hold records (HELD, and the buffer
/// still carries that message).
fn oldest_held(ring: &Ring<'_>, index: usize) -> Option<u64> {
    (0..ring.buffers.len()).filter_map(|b| ring.held_by(index, b)).min()
}
