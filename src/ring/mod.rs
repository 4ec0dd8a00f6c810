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
//! * `capacity` **positions** and `capacity + spares` **buffers**. Message `s` sits at position
//!   `s % capacity`, whose [`position`] word names the buffer it was written to. The ring holds
//!   the last `capacity` messages; the spare buffers are there so that a message a consumer
//!   still holds can stay where it is while the producer laps it (see "Spare buffers").
//! * One [`BufferLine`] per buffer. Its `stamp` is one `u64` that packs three fields (see
//!   [`stamp`]):
//!
//!   ```text
//!    63                                 17   16    15          0
//!   +-------------------------------------+-------+-------------+
//!   |  tag: sequence number mod 2^47      |WRITING|    held     |
//!   +-------------------------------------+-------+-------------+
//!   ```
//!
//!   `held` counts the consumers that currently hold (pin) the buffer. `WRITING` is set while the
//!   producer fills the buffer with the message named by `tag`.
//! * One [`ConsumerEntry`] per consumer: its `state` (free, joining, active), its delivery
//!   [`Mode`] and its `cursor`, the sequence number of the next message it will receive. Only
//!   its owner writes them.
//! * Two [`WakeLine`]s: futex words that sleepers wait on, with a count of sleepers so that the
//!   other side makes a wake system call only when someone sleeps.
//!
//! # Transitions of a buffer's stamp
//!
//! Buffer `b` starts as `READY(tag = b - buffers, held 0)`, and position `p` names buffer `p`
//! with that tag: as if a message from before the first had been published there and read by
//! everybody. So there is no separate "empty" state.
//!
//! 1. **Claim** (producer, for sequence `s` at position `p`): first the `Lossless` gate: the
//!    producer waits until every active `Lossless` consumer's cursor is past `s - capacity` (the
//!    slowest lossless consumer gates it; `Queue` and `Latest` consumers never do). Then it takes
//!    a buffer: the one position `p` names, if nobody holds it, else a free spare. Taking is a
//!    CAS `READY(t, held 0) -> WRITING(s)`, where `t` is the message the buffer carried. It fails
//!    while `held > 0`. If every candidate is held, the producer waits.
//! 2. **Publish** (producer): write `len` and `timestamp`, then `WRITING(s) -> READY(s, held 0)`
//!    with a Release store, then position `p`'s word = `(s, b)` with a Release store, then
//!    `head = s + 1`.
//! 3. **Pin** (consumer at cursor `c`): load position `c % capacity`. If it names an older
//!    message than `c`, nothing is there yet (empty); if a newer one, message `c` was
//!    overwritten: the consumer lagged, jumps to the oldest message still in the ring and counts
//!    the ones it lost. If it names `c` in buffer `b`, CAS `b`'s stamp from `READY(c, held k)` to
//!    `READY(c, held k + 1)`, then advance the cursor to `c + 1`. A stamp with a newer tag means
//!    the buffer was taken again since: lagged, as above.
//! 4. **Release** (consumer): `held - 1` with a Release RMW.
//!
//! Around each pin and release CAS a consumer also writes its hold record for the buffer
//! ([`hold`]), so that the producer can give back what a killed consumer held
//! ([`reclaim`](mod@reclaim)).
//!
//! Because a pinned buffer has `held > 0`, the producer's claim CAS cannot succeed while anyone
//! reads it, and because a consumer pins with a CAS that expects `READY(c)` exactly, it never pins
//! a buffer that the producer has claimed. These two CASes on one word are the whole exclusion;
//! the position word only tells a consumer which word to try.
//!
//! # Spare buffers
//!
//! The producer keeps, privately, which buffer each position names and which buffers no position
//! names (the spares). When it reaches a position whose buffer is held, it swaps: the held buffer
//! leaves the ring, keeping its message for its holders until they release it, and a free spare
//! takes its place. So a consumer that holds messages slows nobody down as long as the spares
//! cover what all consumers hold at once. Only when every candidate is held does the producer
//! wait (and then a release wakes it). A single try can still see a buffer whose release it has not
//! yet synchronised with as held (its loads are Relaxed until the CAS); a waiting producer
//! re-checks after the sleep protocol's fence, so it only ever waits for a release that comes.
//!
//! # Delivery modes
//!
//! Each consumer picks a [`Mode`] when it joins; the ring's [`Policy`] is the default.
//! * `Lossless`: its cursor gates the producer (claim step 1), so it receives every message.
//! * `Queue`: every message while it keeps up; when lapped it loses the oldest and learns how many.
//! * `Latest`: before each pin it moves its cursor to the newest published message (`head - 1`),
//!   counting the ones it skipped as lost.
//!
//! For every consumer, received + lost = the distance its cursor moved: each pin moves it by one,
//! each jump by the count it adds to `lost`.
//!
//! # Sequence numbers
//!
//! `head` and cursors are full `u64`s. Stamps carry only the low 47 bits; comparisons are made
//! on the wrapping 47-bit difference, sign-extended ([`stamp::tag_diff`]), which is exact as long
//! as no consumer is more than 2^46 messages away from the position it looks at.
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
//! * the producer, for a buffer to come free: on [`Ring::producer_wake`]; consumers check it after
//!   a release, when they leave, and (`Lossless` ones) after advancing their cursor (so a producer blocked on a
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
pub mod position;
pub mod producer;
pub mod reclaim;
pub mod stamp;

pub use consumer::{ConsumerCore, JoinError, Joining, Leave, Left, Pinned, StartAt};
pub use layout::{BufferLine, ConsumerEntry, ProducerLine, WakeLine};
pub use producer::{Blocked, ProducerCore};
pub use reclaim::{audit, evict, reap, thaw, Reaped, Recount};

use atomic::{AtomicU64, Ordering};

/// Atomics used by the ring: loom's under `--cfg loom`, core's otherwise.
pub(crate) mod atomic {
    #[cfg(loom)]
    pub use loom::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
    #[cfg(not(loom))]
    pub use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
}

/// The ring's default delivery: the [`Mode`] of consumers that do not choose one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum Policy {
    /// Consumers are [`Mode::Lossless`] unless they choose: the producer waits for the slowest.
    Block = 1,
    /// Consumers are [`Mode::Queue`] unless they choose: unread messages are overwritten and a
    /// consumer learns how many it lost. A message a consumer holds is never overwritten; its
    /// buffer is swapped for a spare.
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

    /// Its name, as tools print it and as the CLI and Python take it.
    pub fn name(self) -> &'static str {
        match self {
            Policy::Block => "block",
            Policy::Overwrite => "overwrite",
        }
    }

    /// The policy named `name` (see [`Policy::name`]).
    pub fn from_name(name: &str) -> Option<Policy> {
        [Policy::Block, Policy::Overwrite].into_iter().find(|p| p.name() == name)
    }

    /// The mode of consumers that do not choose one.
    pub fn default_mode(self) -> Mode {
        match self {
            Policy::Block => Mode::Lossless,
            Policy::Overwrite => Mode::Queue,
        }
    }
}

/// How one consumer receives: chosen when it joins (see the module docs, "Delivery modes").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum Mode {
    /// Every message: the producer waits for this consumer.
    Lossless = 1,
    /// Every message while it keeps up; when lapped it loses the oldest and learns how many.
    /// It never makes the producer wait, except through the buffers it holds.
    Queue = 2,
    /// Each receive returns the newest published message, skipping older unread ones (counted as
    /// lost). It never makes the producer wait, except through the buffers it holds.
    Latest = 3,
}

impl Mode {
    /// The mode stored as `raw` in a consumer entry, if it is a valid one.
    pub fn from_raw(raw: u32) -> Option<Mode> {
        match raw {
            1 => Some(Mode::Lossless),
            2 => Some(Mode::Queue),
            3 => Some(Mode::Latest),
            _ => None,
        }
    }

    /// Its name, as tools print it and as the CLI and Python take it.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Lossless => "lossless",
            Mode::Queue => "queue",
            Mode::Latest => "latest",
        }
    }

    /// The mode named `name` (see [`Mode::name`]).
    pub fn from_name(name: &str) -> Option<Mode> {
        [Mode::Lossless, Mode::Queue, Mode::Latest].into_iter().find(|m| m.name() == name)
    }
}

/// A value in the ring that no correct peer can have written.
///
/// Shared memory is untrusted: a crashed, buggy or hostile process can write anything. The ring
/// checks what it reads and reports this instead of acting on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RingCorrupt {
    /// A buffer's held count exceeds the number of consumers.
    HeldCount {
        /// The buffer.
        buffer: u32,
        /// The count found.
        held: u32,
    },
    /// A buffer's stamp names a message the producer never claimed there.
    BufferTag {
        /// The buffer.
        buffer: u32,
    },
    /// A position word names a buffer the ring does not have.
    Position {
        /// The position.
        position: u32,
    },
    /// A consumer released a buffer that nobody holds.
    ReleaseUnderflow {
        /// The buffer.
        buffer: u32,
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
            RingCorrupt::HeldCount { buffer, held } => {
                write!(f, "buffer {buffer} has held count {held}, more than the consumers")
            }
            RingCorrupt::BufferTag { buffer } => {
                write!(f, "buffer {buffer} has a stamp the producer never wrote")
            }
            RingCorrupt::Position { position } => {
                write!(f, "position {position} names a buffer the ring does not have")
            }
            RingCorrupt::ReleaseUnderflow { buffer } => {
                write!(f, "buffer {buffer} was released but no one held it")
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
    /// The producer sleeps here waiting for a free buffer.
    pub producer_wake: &'a WakeLine,
    /// The consumer table; its length is the maximum number of consumers.
    pub consumers: &'a [ConsumerEntry],
    /// The position words (see [`position`]); its length is the capacity (never zero).
    pub positions: &'a [AtomicU64],
    /// The buffers: capacity plus spares, at most [`position::MAX_BUFFERS`].
    pub buffers: &'a [BufferLine],
    /// Hold records (see [`hold`]): `consumers.len() * hold::stride(buffers)` words.
    pub holds: &'a [AtomicU64],
    /// The default delivery mode.
    pub policy: Policy,
}

impl<'a> Ring<'a> {
    /// Number of positions: how many messages the ring holds.
    #[inline]
    pub fn capacity(&self) -> u64 {
        self.positions.len() as u64
    }

    /// Position of sequence number `seq`.
    #[inline]
    pub fn position_of(&self, seq: u64) -> usize {
        (seq % self.capacity()) as usize
    }

    /// Whether a consumer whose cursor is `next` may find something to pin: message `next` is
    /// published (or was, and a newer lap took its position). In a correct segment `false`
    /// means a pin at `next` finds nothing now, in every mode; a cursor that is behind the
    /// consumer's own (a stale copy: cursors only grow) can only say `true` for nothing. A look
    /// for a poll deciding whether to try a pin.
    #[inline]
    pub fn may_pin(&self, next: u64) -> bool {
        // Relaxed: a `true` is followed by a pin, which loads the word again with Acquire. A
        // `false` loses no wake-up: a waiter's last look before it sleeps follows its SeqCst
        // fence (`shm::wait`, `park`), against the producer's after it publishes.
        let word = self.positions[self.position_of(next)].load(Ordering::Relaxed);
        stamp::tag_diff(position::tag(word), next) >= 0
    }

    /// The buffer that carries message `seq` (published, or frozen by a recount), if it is still
    /// in the ring: its position names it in a valid buffer, and that buffer's stamp has its tag.
    pub fn buffer_of(&self, seq: u64) -> Option<usize> {
        // Acquire: pairs with the producer's Release store of the word.
        let word = self.positions[self.position_of(seq)].load(Ordering::Acquire);
        let buffer = position::buffer(word);
        if stamp::tag_diff(position::tag(word), seq) != 0 || buffer >= self.buffers.len() {
            return None;
        }
        // Relaxed: callers that act on the buffer CAS its stamp, which orders.
        let st = self.buffers[buffer].stamp.load(Ordering::Relaxed);
        (stamp::tag_diff(stamp::tag(st), seq) == 0).then_some(buffer)
    }

    /// The message consumer `entry` holds in buffer `buffer`, if its record says HELD and the
    /// buffer still carries that message. Relaxed loads: for its owner (its own record) and for
    /// display; whoever acts on the answer CASes the stamp.
    pub fn held_by(&self, entry: usize, buffer: usize) -> Option<u64> {
        let r = self.hold(entry, buffer).load(Ordering::Relaxed);
        let st = self.buffers[buffer].stamp.load(Ordering::Relaxed);
        let same = stamp::tag_diff(stamp::tag(st), hold::seq(r)) == 0;
        (hold::state(r) == hold::HELD && same).then_some(hold::seq(r))
    }

    /// Consumer `entry`'s hold record for buffer `buffer`.
    #[inline]
    pub fn hold(&self, entry: usize, buffer: usize) -> &'a AtomicU64 {
        &self.holds[entry * hold::stride(self.buffers.len()) + buffer]
    }
}

/// Puts a new ring's buffers and positions in their initial state (see the module docs), before
/// anyone else can see it.
pub fn initialize(ring: &Ring<'_>) {
    let buffers = ring.buffers.len() as u32;
    for (b, line) in ring.buffers.iter().enumerate() {
        // Relaxed: the caller publishes the ring (the segment's magic, with Release).
        line.stamp.store(stamp::initial(b as u32, buffers), Ordering::Relaxed);
    }
    for (p, word) in ring.positions.iter().enumerate() {
        // Relaxed: as above.
        word.store(position::initial(p as u32, buffers), Ordering::Relaxed);
    }
}

/// Heap-backed ring state for tests and loom models.
pub struct HeapRing {
    producer: ProducerLine,
    consumer_wake: WakeLine,
    producer_wake: WakeLine,
    consumers: Vec<ConsumerEntry>,
    positions: Vec<AtomicU64>,
    buffers: Vec<BufferLine>,
    holds: Vec<AtomicU64>,
    policy: Policy,
}

impl HeapRing {
    /// A fresh ring in its initial state, with `spares` spare buffers.
    pub fn new(capacity: u32, spares: u32, max_consumers: u32, policy: Policy) -> HeapRing {
        assert!(capacity > 0 && max_consumers > 0);
        let buffers = capacity + spares;
        assert!(buffers <= position::MAX_BUFFERS);
        HeapRing {
            producer: ProducerLine::new(),
            consumer_wake: WakeLine::new(),
            producer_wake: WakeLine::new(),
            consumers: (0..max_consumers).map(|_| ConsumerEntry::new()).collect(),
            positions: (0..capacity)
                .map(|p| AtomicU64::new(position::initial(p, buffers)))
                .collect(),
            buffers: (0..buffers).map(|b| BufferLine::new(stamp::initial(b, buffers))).collect(),
            holds: (0..max_consumers as usize * hold::stride(buffers as usize))
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
            positions: &self.positions,
            buffers: &self.buffers,
            holds: &self.holds,
            policy: self.policy,
        }
    }
}

#[cfg(all(test, not(loom)))]
mod loan_tests;
#[cfg(all(test, not(loom)))]
mod tests;
