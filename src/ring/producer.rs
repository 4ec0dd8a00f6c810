//! The producer's side of the protocol: claim a buffer for the next message, publish it.

use super::atomic::{fence, Ordering};
use super::layout::WakeLine;
use super::lease;
use super::{position, stamp};
use super::{Mode, Ring, RingCorrupt};

/// Why the producer cannot claim the next message's buffer yet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Blocked {
    /// An active `Lossless` consumer has not yet received the message that would be
    /// overwritten.
    Consumers,
    /// Consumers hold the position's buffer and every spare.
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

/// A claimed buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Claimed {
    /// The buffer's index.
    pub buffer: usize,
    /// The message the buffer carried before, if it ever carried one: its readers must be done
    /// (on their GPUs) before it is written again.
    pub prev: Option<u64>,
}

/// The producer's private state.
///
/// Invariants: `at` names `capacity` distinct buffers and `spares` the others, so each buffer
/// is in exactly one of them; `at[p]` is the buffer position `p`'s word names once the claim in
/// progress (if any) is published; `last[b]` is the message buffer `b`'s stamp carries (or the
/// initial tag, see [`stamp::initial`]).
#[derive(Debug)]
pub struct ProducerCore {
    /// Sequence number of the next message (equal to the shared `head`).
    next: u64,
    /// The buffer claimed for `next` (its stamp is `WRITING(next)`), if any, and the message it
    /// carried before.
    claimed: Option<Claimed>,
    /// The buffer each position names.
    at: Vec<u32>,
    /// The buffers no position names: free, or still held by readers of a lapped message.
    spares: Vec<u32>,
    /// The message each buffer carries (its stamp's tag).
    last: Vec<u64>,
    /// Where the next scan of `spares` starts: just after the last one taken, where the held
    /// buffer it replaced now sits, so long-held buffers are not tried first every time.
    scan: usize,
    /// Whether the last claim found every candidate held (`Blocked::Held`): then, and only
    /// then, the candidates are audited (see `candidates`).
    held_wait: bool,
    /// A lower bound of every active `Lossless` consumer's cursor, or `u64::MAX` if there was
    /// none. Cursors never decrease and a joining consumer starts at or after the head it reads
    /// after becoming active, so a bound once true stays true -- except for a consumer that
    /// joins behind it, which bumps `ProducerLine::joins`. Refreshed when it would block or
    /// when `joins` moved.
    min_cursor: u64,
    /// The last `joins` value seen.
    joins_seen: u64,
    /// Messages declared lost upstream so far ([`declare_lost`](Self::declare_lost)), written
    /// into each published buffer's line.
    upstream_lost: u64,
    /// `upstream_lost` when the last message was published (`BufferLine::upstream_before` of
    /// the next).
    upstream_published: u64,
}

impl ProducerCore {
    /// The producer of `ring`, which is in its initial state.
    pub fn new(ring: &Ring<'_>) -> ProducerCore {
        let (cap, buffers) = (ring.positions.len() as u32, ring.buffers.len() as u32);
        ProducerCore {
            next: 0,
            claimed: None,
            at: (0..cap).collect(),
            spares: (cap..buffers).collect(),
            last: (0..buffers).map(|b| (b as u64).wrapping_sub(buffers as u64)).collect(),
            scan: 0,
            held_wait: false,
            min_cursor: 0,
            joins_seen: 0,
            upstream_lost: 0,
            upstream_published: 0,
        }
    }

    /// Declares `n` messages lost before the next one this producer publishes (upstream of it:
    /// a bridge that saw a gap in what it relays). Consumers count them in that message's lag
    /// (in the lag of their next message, if they skip it).
    pub fn declare_lost(&mut self, n: u64) {
        self.upstream_lost = self.upstream_lost.saturating_add(n);
    }

    /// Sequence number of the next message to publish.
    pub fn next_seq(&self) -> u64 {
        self.next
    }

    /// Whether the next message's buffer is claimed.
    pub fn is_claimed(&self) -> bool {
        self.claimed.is_some()
    }

    /// The buffer that carries the message one lap before the next (the one the next position
    /// names), once there is one and no buffer is claimed yet: the producer bounds its
    /// run-ahead by that message's write. (Once claimed, the position may already name the
    /// spare that was taken, and the claim's own buffer is what to wait for.)
    pub fn lapped_buffer(&self, ring: &Ring<'_>) -> Option<usize> {
        let lapped = self.next >= ring.capacity() && self.claimed.is_none();
        lapped.then(|| self.at[ring.position_of(self.next)] as usize)
    }

    /// The buffers a claim of the next message would take: the one its position names, then
    /// the spares. The producer audits them when it has waited a while (`reclaim::audit`).
    pub fn candidates(&self, ring: &Ring<'_>) -> impl Iterator<Item = usize> + '_ {
        let p = ring.position_of(self.next);
        std::iter::once(self.at[p] as usize).chain(self.spares.iter().map(|&b| b as usize))
    }

    /// Whether the last claim failed because consumers hold every candidate buffer.
    pub fn waits_on_held(&self) -> bool {
        self.held_wait
    }

    /// Claims a buffer for the next message, if one is free. Claiming again while a buffer is
    /// claimed (an acquire whose slot was dropped unpublished) returns it again.
    pub fn try_claim(&mut self, ring: &Ring<'_>) -> Result<Claimed, ClaimError> {
        if let Some(claimed) = self.claimed {
            return Ok(claimed);
        }
        let s = self.next;
        let cap = ring.capacity();
        if s >= cap {
            let prev = s - cap;
            // Acquire: pairs with the joiner's Release bump, so the rescan sees it ACTIVE. This
            // load follows the SeqCst fence of our previous publish; see `ConsumerCore::join`.
            let joins = ring.producer.joins.load(Ordering::Acquire);
            if joins != self.joins_seen || self.min_cursor <= prev {
                self.joins_seen = joins;
                self.min_cursor = min_lossless_cursor(ring, s);
                if self.min_cursor <= prev {
                    return Err(ClaimError::Blocked(Blocked::Consumers));
                }
            }
        }
        let p = ring.position_of(s);
        let own = self.at[p] as usize;
        if self.take(ring, own)? {
            return Ok(self.claimed(own));
        }
        let n = self.spares.len();
        for k in 0..n {
            let i = (self.scan + k) % n;
            let spare = self.spares[i] as usize;
            if self.take(ring, spare)? {
                // The held buffer leaves the ring with its message; the spare takes its place.
                self.spares[i] = own as u32;
                self.at[p] = spare as u32;
                self.scan = i + 1;
                return Ok(self.claimed(spare));
            }
        }
        self.held_wait = true;
        Err(ClaimError::Blocked(Blocked::Held))
    }

    /// Records buffer `buffer` as claimed for the next message.
    fn claimed(&mut self, buffer: usize) -> Claimed {
        self.held_wait = false;
        let before = std::mem::replace(&mut self.last[buffer], self.next);
        // Initial tags are below zero (wrapped), so they are never below `next`.
        let claimed = Claimed { buffer, prev: (before < self.next).then_some(before) };
        self.claimed = Some(claimed);
        claimed
    }

    /// Takes buffer `buffer` for the next message if nobody holds it: CAS
    /// `READY(last, held 0) -> WRITING(next)`. `Ok(false)`: it is held.
    fn take(&self, ring: &Ring<'_>, buffer: usize) -> Result<bool, ClaimError> {
        let line = &ring.buffers[buffer];
        let corrupt = |c| Err(ClaimError::Corrupt(c));
        // Relaxed: this load only decides whether to try; the CAS below acquires.
        let mut st = line.stamp.load(Ordering::Relaxed);
        loop {
            if stamp::is_writing(st) || stamp::tag_diff(stamp::tag(st), self.last[buffer]) != 0 {
                return corrupt(RingCorrupt::BufferTag { buffer: buffer as u32 });
            }
            let held = stamp::held(st);
            if held > ring.consumers.len() as u64 {
                return corrupt(RingCorrupt::HeldCount {
                    buffer: buffer as u32,
                    held: held as u32,
                });
            }
            if held > 0 {
                return Ok(false);
            }
            // Acquire on success: the value we replace was written by the last consumer's
            // Release decrement (or the publish), so every read of the old message happens
            // before our writes of the new one.
            match line.stamp.compare_exchange_weak(
                st,
                stamp::writing(self.next),
                Ordering::Acquire,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Ok(true),
                Err(actual) => st = actual,
            }
        }
    }

    /// Publishes the claimed buffer with message length `len` and timestamp `timestamp_ns`.
    /// Returns the message's sequence number and whether consumers sleep and must be woken
    /// (see [`WakeLine`]; the caller makes the system call).
    ///
    /// # Panics
    /// If no buffer is claimed.
    pub fn publish(&mut self, ring: &Ring<'_>, len: u64, timestamp_ns: u64) -> (u64, bool) {
        let claimed = self.claimed.take().expect("publish without a claimed buffer");
        let s = self.next;
        let line = &ring.buffers[claimed.buffer];
        line.len.store(len, Ordering::Relaxed);
        line.timestamp_ns.store(timestamp_ns, Ordering::Relaxed);
        line.upstream_lost.store(self.upstream_lost, Ordering::Relaxed);
        line.upstream_before.store(self.upstream_published, Ordering::Relaxed);
        self.upstream_published = self.upstream_lost;
        // Release: makes the payload, len, timestamp and upstream counts visible to a consumer
        // whose pin CAS (Acquire) reads this stamp.
        line.stamp.store(stamp::ready(s, 0), Ordering::Release);
        // Release: a consumer that Acquire-loads this word finds the stamp above (or a later
        // one) when it loads the buffer's stamp next.
        ring.positions[ring.position_of(s)]
            .store(position::word(s, claimed.buffer), Ordering::Release);
        // Release: a consumer that reads the head (lag path, join, Latest) sees the words
        // before it.
        ring.producer.head.store(s + 1, Ordering::Release);
        self.next = s + 1;
        (s, wants_wake(ring.consumer_wake))
    }

    /// Sets `min_cursor` so that the next claim rescans the consumer table (used after a
    /// consumer was removed by someone other than itself).
    pub fn forget_min_cursor(&mut self) {
        self.min_cursor = 0;
    }
}

/// The smallest cursor of the active `Lossless` consumers, or `u64::MAX` if there are none
/// (nothing gates the producer until one joins, which bumps `joins`). A cursor above `head`
/// (a damaged entry) counts as `head`; an entry whose mode is not valid counts as `Lossless`,
/// the safe reading.
pub fn min_lossless_cursor(ring: &Ring<'_>, head: u64) -> u64 {
    let mut min = u64::MAX;
    for entry in ring.consumers {
        // Acquire: pairs with the consumer's Release CAS to ACTIVE, so its initial cursor and
        // its mode are seen.
        if lease::state(entry.lease.load(Ordering::Acquire)) != lease::ACTIVE {
            continue;
        }
        // Relaxed: written before the Release CAS to ACTIVE we acquired, and never after.
        let mode = Mode::from_raw(entry.mode.load(Ordering::Relaxed));
        if matches!(mode, Some(Mode::Queue | Mode::Latest)) {
            continue;
        }
        // Acquire: pairs with the consumer's Release cursor store, which follows its pin
        // CAS; so a claim CAS after this load sees the pin and cannot take a held buffer.
        let c = entry.cursor.load(Ordering::Acquire);
        min = min.min(c.min(head));
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
