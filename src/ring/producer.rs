//! The producer's side of the protocol: claim a slot, publish it.

use super::atomic::{fence, Ordering};
use super::layout::WakeLine;
use super::lease;
use super::stamp;
use super::{Policy, Ring, RingCorrupt};

/// Why the producer cannot claim the next slot yet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Blocked {
    /// `Block` policy: an active consumer has not yet received the message that would be
    /// overwritten.
    Consumers,
    /// A consumer holds the slot.
    Held,
}

/// Why a claim failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClaimError {
    /// Try again after waiting.
    Blocked(Blocked),
    /// The shared state is damaged.
    Corrupt(RingCorrupt),
}

/// The producer's private state.
#[derive(Debug)]
pub struct ProducerCore {
    /// Sequence number of the next message (equal to the shared `head`).
    next: u64,
    /// Whether the slot of `next` is claimed (its stamp is `WRITING(next)`).
    claimed: bool,
    /// A lower bound of every active consumer's cursor. Cursors never decrease and a joining
    /// consumer starts at or after the head it reads after becoming active, so a bound once
    /// true stays true -- except for a consumer that joins behind it, which bumps
    /// `ProducerLine::joins`. Refreshed when it would block or when `joins` moved.
    min_cursor: u64,
    /// The last `joins` value seen.
    joins_seen: u64,
}

impl ProducerCore {
    /// The producer of a fresh ring.
    pub fn new() -> ProducerCore {
        ProducerCore { next: 0, claimed: false, min_cursor: 0, joins_seen: 0 }
    }

    /// Sequence number of the next message to publish.
    pub fn next_seq(&self) -> u64 {
        self.next
    }

    /// Whether the next slot is claimed.
    pub fn is_claimed(&self) -> bool {
        self.claimed
    }

    /// Claims the slot for the next message, if it is free. Returns its index. Claiming an
    /// already claimed slot (an acquire whose slot was dropped unpublished) returns it again.
    pub fn try_claim(&mut self, ring: &Ring<'_>) -> Result<usize, ClaimError> {
        let s = self.next;
        let index = ring.slot_of(s);
        if self.claimed {
            return Ok(index);
        }
        let cap = ring.capacity();
        let prev = s.wrapping_sub(cap);
        if ring.policy == Policy::Block && s >= cap {
            // Acquire: pairs with the joiner's Release bump, so the rescan sees it ACTIVE. This
            // load follows the SeqCst fence of our previous publish; see `ConsumerCore::join`.
            let joins = ring.producer.joins.load(Ordering::Acquire);
            if joins != self.joins_seen || self.min_cursor <= prev {
                self.joins_seen = joins;
                self.min_cursor = min_active_cursor(ring, s);
                if self.min_cursor <= prev {
                    return Err(ClaimError::Blocked(Blocked::Consumers));
                }
            }
        }
        let line = &ring.slots[index];
        // Relaxed: this load only decides whether to try; the CAS below acquires.
        let mut st = line.stamp.load(Ordering::Relaxed);
        loop {
            if stamp::is_writing(st) || stamp::tag_diff(stamp::tag(st), prev) != 0 {
                return Err(ClaimError::Corrupt(RingCorrupt::SlotTag { slot: index as u32 }));
            }
            let held = stamp::held(st);
            if held > ring.consumers.len() as u64 {
                let held = held as u32;
                return Err(ClaimError::Corrupt(RingCorrupt::HeldCount {
                    slot: index as u32,
                    held,
                }));
            }
            if held > 0 {
                return Err(ClaimError::Blocked(Blocked::Held));
            }
            // Acquire on success: the value we replace was written by the last consumer's
            // Release decrement (or the publish), so every read of the old message happens
            // before our writes of the new one.
            match line.stamp.compare_exchange_weak(
                st,
                stamp::writing(s),
                Ordering::Acquire,
                Ordering::Relaxed,
            ) {
                Ok(_) => {
                    self.claimed = true;
                    return Ok(index);
                }
                Err(actual) => st = actual,
            }
        }
    }

    /// Publishes the claimed slot with message length `len` and timestamp `timestamp_ns`.
    /// Returns the message's sequence number and whether consumers sleep and must be woken
    /// (see [`WakeLine`]; the caller makes the system call).
    ///
    /// # Panics
    /// If no slot is claimed.
    pub fn publish(&mut self, ring: &Ring<'_>, len: u64, timestamp_ns: u64) -> (u64, bool) {
        assert!(self.claimed, "publish without a claimed slot");
        let s = self.next;
        let line = &ring.slots[ring.slot_of(s)];
        line.len.store(len, Ordering::Relaxed);
        line.timestamp_ns.store(timestamp_ns, Ordering::Relaxed);
        // Release: makes the payload, len and timestamp visible to a consumer whose pin CAS
        // (Acquire) reads this stamp.
        line.stamp.store(stamp::ready(s, 0), Ordering::Release);
        // Release: a consumer that reads the head (lag path, join) sees the stamps before it.
        ring.producer.head.store(s + 1, Ordering::Release);
        self.next = s + 1;
        self.claimed = false;
        (s, wants_wake(ring.consumer_wake))
    }

    /// Sets `min_cursor` so that the next claim rescans the consumer table (used after a
    /// consumer was removed by someone other than itself).
    pub fn forget_min_cursor(&mut self) {
        self.min_cursor = 0;
    }
}

impl Default for ProducerCore {
    fn default() -> Self {
        Self::new()
    }
}

/// The smallest cursor of the active consumers, or `head` if there are none (cursors never
/// exceed the head; a larger value from a damaged entry is ignored the same way).
pub fn min_active_cursor(ring: &Ring<'_>, head: u64) -> u64 {
    let mut min = head;
    for entry in ring.consumers {
        // Acquire: pairs with the consumer's Release CAS to ACTIVE, so its initial cursor is
        // seen.
        if lease::state(entry.lease.load(Ordering::Acquire)) == lease::ACTIVE {
            // Acquire: pairs with the consumer's Release cursor store, which follows its pin
            // CAS; so a claim CAS after this load sees the pin and cannot take a held slot.
            let c = entry.cursor.load(Ordering::Acquire);
            min = min.min(c);
        }
    }
    min
}

/// The waker's half of the sleep protocol (see the module docs): after the caller's change, a
/// SeqCst fence, then a look at the sleepers. If there are any, bumps the word and returns true:
/// the caller must then `FUTEX_WAKE` it.
#[inline]
pub fn wants_wake(line: &WakeLine) -> bool {
    // SeqCst fence: orders the caller's change before the sleepers load in the single total
    // order, against the sleeper's fence between its registration and its re-check.
    fence(Ordering::SeqCst);
    if line.sleepers.load(Ordering::Relaxed) == 0 {
        return false;
    }
    // Release: pairs with the sleeper's Acquire load of the word, so that a sleeper that sees
    // the bump also sees the change.
    line.word.fetch_add(1, Ordering::Release);
    true
}
