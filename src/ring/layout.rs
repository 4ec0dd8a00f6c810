//! The ring's shared structures. Each is `#[repr(C, align(128))]`: one per pair of cache lines,
//! so that what one process writes never shares a line with what another writes (adjacent-line
//! prefetch pulls lines in pairs on x86).
//!
//! Every field is an atomic, even those written once: shared memory may be written by a peer at
//! any time, and an atomic load of a racy value is defined where a plain read is not.

use super::atomic::{AtomicU32, AtomicU64};

/// The producer's cursor.
#[repr(C, align(128))]
pub struct ProducerLine {
    /// Messages published so far = sequence number of the next one. Written only by the
    /// producer; never decreases.
    pub head: AtomicU64,
    /// Nanoseconds the producer spent waiting for a free slot (statistics; producer-only).
    pub blocked_ns: AtomicU64,
    /// Bumped by every consumer that joins, so a `Block` producer knows its cached lower bound
    /// of the cursors may be stale. Written by consumers, rarely.
    pub joins: AtomicU64,
}

/// A futex word and the number of processes sleeping on it.
#[repr(C, align(128))]
pub struct WakeLine {
    /// Bumped (wrapping) by a waker before `FUTEX_WAKE`, so a sleeper that read the old value
    /// returns from `FUTEX_WAIT` at once.
    pub word: AtomicU32,
    /// Sleepers registered on `word`. Incremented before the sleeper's re-check, decremented
    /// after it wakes; a waker reads it to skip the system call when nobody sleeps. Counts the
    /// `parked` waiters too, so one check tells a waker whether anyone waits at all.
    pub sleepers: AtomicU32,
    /// Of the sleepers, those waiting on a doorbell (an async task) rather than the futex; see
    /// [`super::park`]. Never more than `sleepers`.
    pub parked: AtomicU32,
}

/// Consumer table entry states.
pub mod entry_state {
    /// Nobody owns the entry.
    pub const FREE: u32 = 0;
    /// A consumer claimed it and is filling it in; the producer ignores it.
    pub const JOINING: u32 = 1;
    /// The consumer takes part: in `Block` its cursor gates the producer.
    pub const ACTIVE: u32 = 2;
    /// Its process died; the producer is giving back what it held (`ring::reclaim`). It no
    /// longer gates the producer.
    pub const RECLAIMING: u32 = 3;
}

/// One consumer's entry in the consumer table. Written only by its owner.
#[repr(C, align(128))]
pub struct ConsumerEntry {
    /// One of [`entry_state`].
    pub state: AtomicU32,
    /// Bumped each time the entry is claimed, so a stale reference to an old occupant can be
    /// told apart from the new one.
    pub generation: AtomicU32,
    /// The owner's pid.
    pub pid: AtomicU32,
    /// How many of the owner's waits are parked on its doorbell ([`super::park`]); usually 0
    /// or 1, more when one consumer is awaited from several tasks. The producer rings the
    /// doorbell of each entry where it is non-zero.
    pub parked: AtomicU32,
    /// The owner's process start time (clock ticks since boot, /proc/PID/stat field 22), so that a
    /// reused pid is not taken for the owner.
    pub start_time: AtomicU64,
    /// Sequence number of the next message this consumer will receive. Never decreases while
    /// the entry is active; never exceeds the producer's head.
    pub cursor: AtomicU64,
    /// Messages received (statistics; owner-only, plain stores).
    pub received: AtomicU64,
    /// Messages lost by lagging in `Overwrite` (statistics; owner-only).
    pub lost: AtomicU64,
    /// Slots currently held (statistics; owner-only).
    pub holding: AtomicU64,
    /// The random token naming the owner's doorbell socket (see `shm::doorbell`), 0 until its
    /// first async wait. Written by the owner before it first parks.
    pub bell: AtomicU64,
}

/// One slot's stamp and message metadata.
#[repr(C, align(128))]
pub struct SlotLine {
    /// See [`super::stamp`].
    pub stamp: AtomicU64,
    /// Length in bytes of the message; valid while the stamp is `READY` and pinned. Consumers
    /// check it against the slot size before use.
    pub len: AtomicU64,
    /// CLOCK_MONOTONIC nanoseconds at publish.
    pub timestamp_ns: AtomicU64,
}

impl ProducerLine {
    /// Initial state: nothing published.
    pub fn new() -> ProducerLine {
        ProducerLine {
            head: AtomicU64::new(0),
            blocked_ns: AtomicU64::new(0),
            joins: AtomicU64::new(0),
        }
    }
}

impl Default for ProducerLine {
    fn default() -> Self {
        Self::new()
    }
}

impl WakeLine {
    /// Initial state: no sleepers.
    pub fn new() -> WakeLine {
        WakeLine { word: AtomicU32::new(0), sleepers: AtomicU32::new(0), parked: AtomicU32::new(0) }
    }
}

impl Default for WakeLine {
    fn default() -> Self {
        Self::new()
    }
}

impl ConsumerEntry {
    /// Initial state: free.
    pub fn new() -> ConsumerEntry {
        ConsumerEntry {
            state: AtomicU32::new(entry_state::FREE),
            generation: AtomicU32::new(0),
            pid: AtomicU32::new(0),
            parked: AtomicU32::new(0),
            start_time: AtomicU64::new(0),
            cursor: AtomicU64::new(0),
            received: AtomicU64::new(0),
            lost: AtomicU64::new(0),
            holding: AtomicU64::new(0),
            bell: AtomicU64::new(0),
        }
    }
}

impl Default for ConsumerEntry {
    fn default() -> Self {
        Self::new()
    }
}

impl SlotLine {
    /// A slot with stamp `stamp`.
    pub fn new(stamp: u64) -> SlotLine {
        SlotLine {
            stamp: AtomicU64::new(stamp),
            len: AtomicU64::new(0),
            timestamp_ns: AtomicU64::new(0),
        }
    }
}

#[cfg(not(loom))]
const _: () = {
    // The shm layer lays these out with these strides; they must hold.
    assert!(std::mem::size_of::<ProducerLine>() == 128);
    assert!(std::mem::size_of::<WakeLine>() == 128);
    assert!(std::mem::size_of::<ConsumerEntry>() == 128);
    assert!(std::mem::size_of::<SlotLine>() == 128);
    assert!(std::mem::align_of::<SlotLine>() == 128);
};
