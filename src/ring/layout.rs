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
    /// Nanoseconds the producer spent waiting for a free buffer (statistics; producer-only).
    pub blocked_ns: AtomicU64,
    /// Bumped by every consumer that joins, so a `Block` producer knows its cached lower bound
    /// of the cursors may be stale. Written by consumers, rarely.
    pub joins: AtomicU64,
    /// Bumped by every consumer that moves its entry to RETIRING, so the producer looks at the
    /// table at its next acquire. Written by consumers, rarely.
    pub retires: AtomicU64,
    /// Consumers the producer evicted (statistics; producer-only).
    pub evictions: AtomicU64,
    /// Entries of dead consumers the producer took back (statistics; producer-only).
    pub reclaims: AtomicU64,
    /// While the producer waits for a free buffer: when the wait began (CLOCK_MONOTONIC
    /// nanoseconds, which every process reads alike); 0 when it is not waiting. Lets
    /// `gpuring stat` show a stall while it happens (statistics; producer-only).
    pub blocked_since: AtomicU64,
    /// What the current wait is for: [`BLOCKED_ON_CONSUMERS`] (a lossless consumer is
    /// behind) or [`BLOCKED_ON_HELD`] (consumers hold every buffer it could take); 0 when not
    /// waiting (statistics; producer-only).
    pub blocked_on: AtomicU64,
    /// When a waiting producer last accounted its wait (CLOCK_MONOTONIC ns): a stall whose
    /// marks are older than a second is not shown (its waiter gave up) (statistics;
    /// producer-only).
    pub blocked_seen: AtomicU64,
}

/// `ProducerLine::blocked_on`: waiting for a lossless consumer to read.
pub const BLOCKED_ON_CONSUMERS: u64 = 1;
/// `ProducerLine::blocked_on`: waiting for consumers to release buffers they hold.
pub const BLOCKED_ON_HELD: u64 = 2;

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

/// One consumer's entry in the consumer table. Written by its owner, except the lease, which
/// the producer moves on too (see [`super::lease`]).
#[repr(C, align(128))]
pub struct ConsumerEntry {
    /// State, generation and owner pid in one word: see [`super::lease`]. Every change is a CAS.
    pub lease: AtomicU64,
    /// How many of the owner's waits are parked on its doorbell ([`super::park`]); usually 0
    /// or 1, more when one consumer is awaited from several tasks. The producer rings the
    /// doorbell of each entry where it is non-zero.
    pub parked: AtomicU32,
    /// Why the producer evicted the owner: a [`super::lease::evict_reason`]. Written by the
    /// producer before its CAS to EVICTED; reset by the next claim.
    pub evicted_for: AtomicU32,
    /// The owner's delivery [`super::Mode`] as u32. Written by the owner before its Release CAS
    /// to ACTIVE, never after; read by the producer (only `Lossless` gates it) and by tools.
    pub mode: AtomicU32,
    /// The owner's process start time (clock ticks since boot, /proc/PID/stat field 22), shown
    /// with its pid by tools (both as its own pid namespace sees them: display only; the
    /// owner's liveness is a lock, `shm::presence`). 0 while not yet known: a new owner stores
    /// it right after its claim, and whoever frees the entry zeroes it first.
    pub start_time: AtomicU64,
    /// Sequence number of the next message this consumer will receive. Never decreases while
    /// the entry is active; never exceeds the producer's head.
    pub cursor: AtomicU64,
    /// Messages received (statistics; owner-only, plain stores).
    pub received: AtomicU64,
    /// Messages lost: overwritten before it got to them, or skipped in `Latest` (statistics;
    /// owner-only).
    pub lost: AtomicU64,
    /// Messages currently held (statistics; owner-only).
    pub holding: AtomicU64,
    /// The random token naming the owner's doorbell socket (see `shm::doorbell`), 0 until its
    /// first async wait. Written by the owner before it first parks.
    pub bell: AtomicU64,
    /// The owner's namespace identities (`shm::ns::Namespaces` as words), for display: tools
    /// say "in another pid namespace" from them. Written by the owner after its claim.
    pub namespaces: [AtomicU64; 5],
}

/// One buffer's stamp and the metadata of the message it carries.
#[repr(C, align(128))]
pub struct BufferLine {
    /// See [`super::stamp`].
    pub stamp: AtomicU64,
    /// Length in bytes of the message; valid while the stamp is `READY` and pinned. Consumers
    /// check it against the slot size (every buffer's size) before use.
    pub len: AtomicU64,
    /// CLOCK_MONOTONIC nanoseconds at publish.
    pub timestamp_ns: AtomicU64,
    /// Messages the producer declared lost upstream before this one, in all since it started
    /// (`ProducerCore::declare_lost`: a bridge's network losses). A consumer adds the increase
    /// between two of its messages to its lag. 0 from a producer that never declares any.
    pub upstream_lost: AtomicU64,
    /// The same total at the message published before this one: a consumer's first message
    /// counts `upstream_lost - upstream_before` (the losses declared just before it), so a
    /// consumer that joins late still sees a gap declared before its first message.
    pub upstream_before: AtomicU64,
}

impl ProducerLine {
    /// Initial state: nothing published.
    pub fn new() -> ProducerLine {
        ProducerLine {
            head: AtomicU64::new(0),
            blocked_ns: AtomicU64::new(0),
            blocked_since: AtomicU64::new(0),
            blocked_on: AtomicU64::new(0),
            blocked_seen: AtomicU64::new(0),
            joins: AtomicU64::new(0),
            retires: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
            reclaims: AtomicU64::new(0),
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
            lease: AtomicU64::new(super::lease::pack(super::lease::FREE, 0, 0)),
            parked: AtomicU32::new(0),
            evicted_for: AtomicU32::new(0),
            mode: AtomicU32::new(0),
            start_time: AtomicU64::new(0),
            cursor: AtomicU64::new(0),
            received: AtomicU64::new(0),
            lost: AtomicU64::new(0),
            holding: AtomicU64::new(0),
            bell: AtomicU64::new(0),
            namespaces: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

impl Default for ConsumerEntry {
    fn default() -> Self {
        Self::new()
    }
}

impl BufferLine {
    /// A buffer with stamp `stamp`.
    pub fn new(stamp: u64) -> BufferLine {
        BufferLine {
            stamp: AtomicU64::new(stamp),
            len: AtomicU64::new(0),
            timestamp_ns: AtomicU64::new(0),
            upstream_lost: AtomicU64::new(0),
            upstream_before: AtomicU64::new(0),
        }
    }
}

#[cfg(not(loom))]
const _: () = {
    // The shm layer lays these out with these strides; they must hold.
    assert!(std::mem::size_of::<ProducerLine>() == 128);
    assert!(std::mem::size_of::<WakeLine>() == 128);
    assert!(std::mem::size_of::<ConsumerEntry>() == 128);
    assert!(std::mem::size_of::<BufferLine>() == 128);
    assert!(std::mem::align_of::<BufferLine>() == 128);
};
