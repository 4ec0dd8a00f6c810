//! The ring protocol: one producer, many consumers, broadcast.
//!
//! This module is pure protocol. It makes no OS or CUDA calls, so it runs unchanged under loom
//! (with heap-backed state, `RUSTFLAGS="--cfg loom"`) and in plain unit tests. The layers above
//! place its structures in shared memory ([`crate::shm`]), wait on its futex words
//! (`wait`) and move the payload.
//!
//! # State
//!
//! * [`ProducerLine::head`]: the number of messages published so far, which is also the sequence
//!   number of the next message. Only the producer writes it.
//! * One [`SlotLine`] per slot. The message with sequence number `s` lives in slot `s % capacity`.
//!   Its `stamp` is one `u64` that packs three fields (see [`stamp`]):
//!
//!   ```text
//!    63                                 17   16    15          0
//!   +-------------------------------------+-------+-------------+
//!   |  tag: sequence number mod 2^47      |WRITING|    held     |
//!   +-------------------------------------+-------+-------------+
//!   ```
//!
//!   `held` counts the consumers that currently hold (pin) the slot. `WRITING` is set while the
//!   producer fills the slot with the message named by `tag`.
//! * One [`ConsumerEntry`] per consumer: its `state` (free, joining, active) and its `cursor`, the
//!   sequence number of the next message it will receive. Only its owner writes it.
//! * Two [`WakeLine`]s: futex words that sleepers wait on, with a count of sleepers so that the
//!   other side makes a wake system call only when someone sleeps.
//!
//! # Transitions of a slot's stamp
//!
//! Slot `i` starts as `READY(tag = i - capacity, held 0)`: as if a message had been published
//! there one lap ago and read by everybody. So there is no separate "empty" state.
//!
//! 1. **Claim** (producer, for sequence `s`): `READY(s - cap, held 0) -> WRITING(s)` by CAS.
//!    It fails while `held > 0`; the producer waits. In `Block` policy the producer first waits
//!    until every active consumer's cursor is past `s - cap` (the slowest consumer gates it).
//!    In `Overwrite` it does not look at cursors: unread messages are overwritten, held ones never.
//! 2. **Publish** (producer): write `len` and `timestamp`, then `WRITING(s) -> READY(s, held 0)`
//!    with a Release store, then `head = s + 1`.
//! 3. **Pin** (consumer at cursor `c`): if the stamp reads `READY(c, held k)`, CAS it to
//!    `READY(c, held k + 1)`, then advance the cursor to `c + 1`. If the tag is older than `c`, or
//!    it is `c` but still `WRITING`, nothing is there yet (empty). If the tag is newer than `c`,
//!    message `c` was overwritten: the consumer lagged, jumps to the oldest message still in the
//!    ring and counts the ones it lost.
//! 4. **Release** (consumer): `held - 1` with a Release RMW.
//!
//! Around each pin and release CAS a consumer also writes its hold record for the slot
//! ([`hold`]), so that the producer can give back what a killed consumer held ([`reclaim`](mod@reclaim)).
//!
//! Because a pinned slot has `held > 0`, the producer's claim CAS cannot succeed while anyone
//! reads it, and because a consumer pins with a CAS that expects `READY(c)` exactly, it never pins
//! a slot that the producer has claimed. These two CASes on one word are the whole exclusion.
//!
//! # Sequence numbers
//!
//! `head` and cursors are full `u64`s. Stamps carry only the low 47 bits; comparisons are made
//! on the wrapping 47-bit difference, sign-extended ([`stamp::tag_diff`]), which is exact as long
//! as no consumer is more than 2^46 messages away from the slot it looks at.
//!
//! # Sleeping without lost wake-ups
//!
//! A side that runs out of spinning registers itself in a [`WakeLine`] (`sleepers += 1`), issues
//! a SeqCst fence, re-checks its condition, and only then sleeps on the line's futex word, with the
//! value it read before the re-check. The other side makes its change, issues a SeqCst fence, and
//! reads `sleepers`; if it is non-zero it bumps the word and wakes. The two fences are ordered one
//! way or the other in the single SeqCst order: either the sleeper's re-check sees the change, or
//! the waker sees the sleeper (and the bumped word makes the futex wait return at once).
//!
//! The side that waits on the other is:
//! * a consumer, for a new message: on [`Ring::consumer_wake`]; the producer checks it after
//!   each publish and on close;
//! * the producer, for a slot to come free: on [`Ring::producer_wake`]; consumers check it after
//!   advancing their cursor, after a release and when they leave (so a producer blocked on a
//!   consumer that leaves wakes up: the iceoryx2 #314 deadlock cannot happen here).
//!
//! An async task cannot sleep on a futex. It *parks* instead ([`park`]): the same registration
//! and fence, plus a mark that tells the waker to ring its doorbell (a datagram socket)
//! rather than, or as well as, the futex.

pub mod consumer;
pub mod hold;
pub mod layout;
pub mod lease;
pub mod park;
pub mod producer;
pub mod reclaim;
pub mod stamp;

pub use consumer::{ConsumerCore, JoinError, Joining, Leave, Left, Pinned, StartAt};
pub use layout::{ConsumerEntry, ProducerLine, SlotLine, WakeLine};
pub use producer::{Blocked, ProducerCore};
pub use reclaim::{audit, evict, reap, thaw, Reaped, Recount};

use atomic::AtomicU64;

/// Atomics used by the ring: loom's under `--cfg loom`, core's otherwise.
pub(crate) mod atomic {
    #[cfg(loom)]
    pub use loom::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
    #[cfg(not(loom))]
    pub use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
}

/// What the producer does when the slowest consumer is a full ring behind.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum Policy {
    /// Lossless: the producer waits for the slowest active consumer.
    Block = 1,
    /// Live: unread messages are overwritten; a consumer learns how many it lost. A slot that a
    /// consumer holds is never overwritten.
    Overwrite = 2,
}

impl Policy {
    /// The policy stored as `raw` in a segment header, if it is a valid one.
    pub fn from_raw(raw: u32) -> Option<Policy> {
        match raw {
            1 => Some(Policy::Block),
            2 => Some(Policy::Overwrite),
            _ => None,
        }
    }
}

/// A value in the ring that no correct peer can have written.
///
/// Shared memory is untrusted: a crashed, buggy or hostile process can write anything. The ring
/// checks what it reads and reports this instead of acting on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RingCorrupt {
    /// A slot's held count exceeds the number of consumers.
    HeldCount {
        /// The slot.
        slot: u32,
        /// The count found.
        held: u32,
    },
    /// A slot's stamp names a message the producer never claimed there.
    SlotTag {
        /// The slot.
        slot: u32,
    },
    /// A consumer released a slot that nobody holds.
    ReleaseUnderflow {
        /// The slot.
        slot: u32,
    },
    /// This consumer's table entry is no longer its own: the producer evicted it, or something
    /// overwrote its lease. The consumer must reconnect.
    Evicted {
        /// The entry.
        entry: u32,
        /// Why (a [`lease::evict_reason`]).
        reason: u32,
    },
}

impl std::fmt::Display for RingCorrupt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RingCorrupt::HeldCount { slot, held } => {
                write!(f, "slot {slot} has held count {held}, more than the consumers")
            }
            RingCorrupt::SlotTag { slot } => {
                write!(f, "slot {slot} has a stamp the producer never wrote")
            }
            RingCorrupt::ReleaseUnderflow { slot } => {
                write!(f, "slot {slot} was released but no one held it")
            }
            RingCorrupt::Evicted { entry, reason } => write!(
                f,
                "this consumer (entry {entry}) was evicted from the ring: {}",
                lease::evict_reason::describe(*reason)
            ),
        }
    }
}

impl std::error::Error for RingCorrupt {}

/// A view of one ring's shared state: where it lives is the caller's business (a shm segment, or
/// the heap in loom tests and unit tests).
#[derive(Clone, Copy)]
pub struct Ring<'a> {
    /// Producer cursor.
    pub producer: &'a ProducerLine,
    /// Consumers sleep here waiting for a message.
    pub consumer_wake: &'a WakeLine,
    /// The producer sleeps here waiting for a free slot.
    pub producer_wake: &'a WakeLine,
    /// The consumer table; its length is the maximum number of consumers.
    pub consumers: &'a [ConsumerEntry],
    /// The slots; its length is the capacity (never zero).
    pub slots: &'a [SlotLine],
    /// Hold records (see [`hold`]): `consumers.len() * hold::stride(capacity)` words.
    pub holds: &'a [AtomicU64],
    /// The slow-consumer policy.
    pub policy: Policy,
}

impl<'a> Ring<'a> {
    /// Number of slots.
    #[inline]
    pub fn capacity(&self) -> u64 {
        self.slots.len() as u64
    }

    /// Slot index of sequence number `seq`.
    #[inline]
    pub fn slot_of(&self, seq: u64) -> usize {
        (seq % self.capacity()) as usize
    }

    /// Consumer `entry`'s hold record for slot `slot`.
    #[inline]
    pub fn hold(&self, entry: usize, slot: usize) -> &'a AtomicU64 {
        &self.holds[entry * hold::stride(self.slots.len()) + slot]
    }
}

/// Heap-backed ring state for tests and loom models.
pub struct HeapRing {
    producer: ProducerLine,
    consumer_wake: WakeLine,
    producer_wake: WakeLine,
    consumers: Vec<ConsumerEntry>,
    slots: Vec<SlotLine>,
    holds: Vec<AtomicU64>,
    policy: Policy,
}

impl HeapRing {
    /// A fresh ring in its initial state.
    pub fn new(capacity: u32, max_consumers: u32, policy: Policy) -> HeapRing {
        assert!(capacity > 0 && max_consumers > 0);
        HeapRing {
            producer: ProducerLine::new(),
            consumer_wake: WakeLine::new(),
            producer_wake: WakeLine::new(),
            consumers: (0..max_consumers).map(|_| ConsumerEntry::new()).collect(),
            slots: (0..capacity).map(|i| SlotLine::new(stamp::initial(i, capacity))).collect(),
            holds: (0..max_consumers as usize * hold::stride(capacity as usize))
                .map(|_| AtomicU64::new(0))
                .collect(),
            policy,
        }
    }

    /// A view of it.
    pub fn ring(&self) -> Ring<'_> {
        Ring {
            producer: &self.producer,
            consumer_wake: &self.consumer_wake,
            producer_wake: &self.producer_wake,
            consumers: &self.consumers,
            slots: &self.slots,
            holds: &self.holds,
            policy: self.policy,
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests;
