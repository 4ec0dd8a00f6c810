//! The producer's side of the protocol: claim a buffer for the next message, publish it.

use super::atomic::{fence, Ordering};
use super::layout::{ConsumerEntry, WakeLine};
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

/// What a claim takes a buffer for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Want {
    /// The next message ([`ProducerCore::try_claim`]).
    Next,
    /// A loan ([`ProducerCore::try_lend`]).
    Loan,
    /// The next message's place, for lent buffer `b` ([`ProducerCore::try_adopt`]).
    Adopt(usize),
}

/// A buffer's loan state (`ProducerCore::loans`).
const NOT_LENT: u8 = 0;
/// Out on loan: its borrower writes it; no position names it and it is not a spare.
const LENT: u8 = 1;
/// Published from a loan whose borrower has not ended it (it may still read the buffer): the
/// buffer is a position's or a spare, but it is not taken again until the loan ends.
const KEPT: u8 = 2;

/// The producer's private state.
///
/// Invariants: `at` names `capacity` distinct buffers, `spares` others, and the buffers out on
/// loan (`loans[b] == LENT`) are the rest, so each buffer is in exactly one of the three;
/// `at[p]` is the buffer position `p`'s word names once the claim in progress (if any) is
/// published; `last[b]` is the message buffer `b`'s stamp carries (or the initial tag, see
/// [`stamp::initial`]); a lent buffer's stamp is `WRITING(last[b])`, with `last[b]` above
/// every message it carried before.
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
    /// The entries that gated the producer (active, and `Lossless` or of no valid mode) at the
    /// last scan of the whole table; `None` when the next refresh must scan the whole table
    /// again. Between peers that follow the protocol, an entry starts to gate only by joining,
    /// which bumps `joins` (after its CAS to ACTIVE) and so empties this; a joiner whose bump
    /// a claim has not seen yet is covered by the join's fence, as it was before there was
    /// this list (see `ConsumerCore::join`). One that left since is skipped by the lease check
    /// of the next refresh. So a refresh with `joins` unchanged reads these entries alone.
    /// Emptied at every look after the table too ([`rescan_table`](Self::rescan_table)), so
    /// that an entry a damaged segment hid from one scan is not left out for long.
    gating: Option<Vec<u32>>,
    /// Each buffer's loan state: `NOT_LENT`, `LENT` or `KEPT`.
    loans: Vec<u8>,
    /// How many buffers are `LENT` or `KEPT` (so that rings without loans skip the checks).
    loaned: usize,
    /// For each lent buffer, the tag it carried before it was lent (`last[b]` then): a loan
    /// given back unwritten gets it back, so that its readers are still waited for.
    lent_from: Vec<u64>,
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
            loans: vec![NOT_LENT; buffers as usize],
            loaned: 0,
            lent_from: vec![0; buffers as usize],
            scan: 0,
            held_wait: false,
            min_cursor: 0,
            joins_seen: 0,
            gating: None,
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
        self.gate(ring)?;
        let p = ring.position_of(self.next);
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

    /// The `Lossless` gate of the next message (step 1 of a claim): every active `Lossless`
    /// consumer must be past the message one lap before it, which the next message's position
    /// now names.
    fn gate(&mut self, ring: &Ring<'_>) -> Result<(), ClaimError> {
        let s = self.next;
        let cap = ring.capacity();
        if s >= cap {
            let prev = s - cap;
            // Acquire: pairs with the joiner's Release bump, so the rescan sees it ACTIVE. This
            // load follows the SeqCst fence of our previous publish; see `ConsumerCore::join`.
            let joins = ring.producer.joins.load(Ordering::Acquire);
            if joins != self.joins_seen || self.min_cursor <= prev {
                if joins != self.joins_seen {
                    self.gating = None;
                }
                self.joins_seen = joins;
                let gating = self.gating.get_or_insert_with(|| gating_entries(ring));
                self.min_cursor = min_cursor_of(ring, s, gating.iter().map(|&e| e as usize));
                if self.min_cursor <= prev {
                    return Err(ClaimError::Blocked(Blocked::Consumers));
                }
            }
        }
        Ok(())
    }

    /// [`try_claim`](Self::try_claim), [`try_lend`](Self::try_lend) or
    /// [`try_adopt`](Self::try_adopt), as `want` says.
    pub fn try_take(&mut self, ring: &Ring<'_>, want: Want) -> Result<Claimed, ClaimError> {
        match want {
            Want::Next => self.try_claim(ring),
            Want::Loan => self.try_lend(ring),
            Want::Adopt(buffer) => {
                self.try_adopt(ring, buffer).map(|()| Claimed { buffer, prev: None })
            }
        }
    }

    /// Lends out a free spare: its borrower writes it, and [`try_adopt`](Self::try_adopt) then
    /// [`publish`](Self::publish) make it the next message (whatever that is by then), or
    /// [`give_back`](Self::give_back) returns it. Several loans can be out at once, beside a
    /// claim. The stamp goes `READY(t, held 0) -> WRITING(next)`; `next` is above every
    /// message the buffer carried, so a consumer that tries to pin one of them sees that the
    /// buffer was taken for a newer message. Only spares are lent: no position names them,
    /// except, while a claim is in progress, the buffer that claim swapped out, whose message
    /// the claim's gate has already let go of. `prev` is what the buffer carried, whose readers
    /// must be done before it is written (as for a claim).
    pub fn try_lend(&mut self, ring: &Ring<'_>) -> Result<Claimed, ClaimError> {
        let n = self.spares.len();
        for k in 0..n {
            let i = (self.scan + k) % n;
            let spare = self.spares[i] as usize;
            if self.take(ring, spare)? {
                self.spares.swap_remove(i);
                self.scan = i;
                self.loans[spare] = LENT;
                self.loaned += 1;
                let before = std::mem::replace(&mut self.last[spare], self.next);
                self.lent_from[spare] = before;
                return Ok(Claimed { buffer: spare, prev: (before < self.next).then_some(before) });
            }
        }
        // `held_wait` is the claim's: a lend polled while the stream runs must not set off
        // audits, which freeze buffers consumers are reading.
        Err(ClaimError::Blocked(Blocked::Held))
    }

    /// Makes lent buffer `buffer` the next message's: after the `Lossless` gate, it takes the
    /// place of the buffer the next position names, which becomes a spare (keeping its message
    /// for its holders), and it is claimed: [`publish`](Self::publish) publishes it. It stays
    /// `KEPT` (never taken again) until [`end_kept`](Self::end_kept).
    ///
    /// # Panics
    /// If `buffer` is not lent, or a claim is in progress (the next message is taken).
    pub fn try_adopt(&mut self, ring: &Ring<'_>, buffer: usize) -> Result<(), ClaimError> {
        assert_eq!(self.loans[buffer], LENT, "adopting buffer {buffer}, which is not lent");
        assert!(self.claimed.is_none(), "adopting a loan while a claim is in progress");
        self.gate(ring)?;
        let p = ring.position_of(self.next);
        self.spares.push(std::mem::replace(&mut self.at[p], buffer as u32));
        self.loans[buffer] = KEPT;
        // Its stamp says WRITING(t), t <= next; publish makes it READY(next).
        self.last[buffer] = self.next;
        self.held_wait = false;
        self.claimed = Some(Claimed { buffer, prev: None });
        Ok(())
    }

    /// Takes back lent buffer `buffer`, unpublished, as a spare. `written`: whether its borrower
    /// may have written it; if not, it gets back the message it carried (so that the readers of
    /// that message are still waited for before it is written); if so, it keeps the loan's tag,
    /// which no position names (see [`try_lend`](Self::try_lend)).
    ///
    /// # Panics
    /// If `buffer` is not lent.
    pub fn give_back(&mut self, ring: &Ring<'_>, buffer: usize, written: bool) {
        assert_eq!(self.loans[buffer], LENT, "giving back buffer {buffer}, which is not lent");
        if !written {
            self.last[buffer] = self.lent_from[buffer];
        }
        self.loans[buffer] = NOT_LENT;
        self.loaned -= 1;
        self.spares.push(buffer as u32);
        // Release: the borrower's writes happen before the next claim's Acquire CAS of this
        // stamp (no consumer pins it: no position names it with this tag).
        ring.buffers[buffer].stamp.store(stamp::ready(self.last[buffer], 0), Ordering::Release);
    }

    /// Ends the loan of published buffer `buffer` (`KEPT`): its borrower no longer reads it,
    /// so it may be taken again once its readers let go.
    ///
    /// # Panics
    /// If `buffer` is not kept.
    pub fn end_kept(&mut self, buffer: usize) {
        assert_eq!(self.loans[buffer], KEPT, "ending buffer {buffer}'s loan, which is not kept");
        self.loans[buffer] = NOT_LENT;
        self.loaned -= 1;
    }

    /// Whether some spare is neither lent nor kept, so that a lend may succeed once consumers
    /// release it; if not, only ending a loan frees one.
    pub fn may_lend(&self) -> bool {
        self.loaned == 0 || self.spares.iter().any(|&b| self.loans[b as usize] == NOT_LENT)
    }

    /// Whether buffer `buffer` is lent out and not yet published.
    pub fn is_lent(&self, buffer: usize) -> bool {
        self.loans.get(buffer) == Some(&LENT)
    }

    /// Whether buffer `buffer` was published from a loan not yet ended.
    pub fn is_kept(&self, buffer: usize) -> bool {
        self.loans.get(buffer) == Some(&KEPT)
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

    /// Takes buffer `buffer` for the next message (or a loan) if nobody holds it: CAS
    /// `READY(last, held 0) -> WRITING(next)`. `Ok(false)`: it is held, or kept by a loan.
    fn take(&self, ring: &Ring<'_>, buffer: usize) -> Result<bool, ClaimError> {
        if self.loaned > 0 && self.loans[buffer] != NOT_LENT {
            // Kept: its borrower may still read it. (Lent buffers are in no candidate list.)
            return Ok(false);
        }
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

    /// Makes the gate's next refresh scan the whole consumer table (see `gating`).
    pub fn rescan_table(&mut self) {
        self.gating = None;
    }

    /// Sets `min_cursor` so that the next claim rescans the consumer table (used after a
    /// consumer was removed by someone other than itself).
    pub fn forget_min_cursor(&mut self) {
        self.min_cursor = 0;
        self.gating = None;
    }
}

/// The smallest cursor of the active `Lossless` consumers, or `u64::MAX` if there are none
/// (nothing gates the producer until one joins, which bumps `joins`). A cursor above `head`
/// (a damaged entry) counts as `head`; an entry whose mode is not valid counts as `Lossless`,
/// the safe reading.
pub fn min_lossless_cursor(ring: &Ring<'_>, head: u64) -> u64 {
    min_cursor_of(ring, head, 0..ring.consumers.len())
}

/// The entries of the table that gate the producer now (see [`min_cursor_of`]).
fn gating_entries(ring: &Ring<'_>) -> Vec<u32> {
    (0..ring.consumers.len()).filter(|&e| gates(&ring.consumers[e])).map(|e| e as u32).collect()
}

/// Whether `entry` gates the producer: active, and `Lossless` (or of no valid mode).
fn gates(entry: &ConsumerEntry) -> bool {
    // Acquire: pairs with the consumer's Release CAS to ACTIVE, so its initial cursor and its
    // mode are seen.
    if lease::state(entry.lease.load(Ordering::Acquire)) != lease::ACTIVE {
        return false;
    }
    // Relaxed: written before the Release CAS to ACTIVE we acquired, and never after.
    let mode = Mode::from_raw(entry.mode.load(Ordering::Relaxed));
    !matches!(mode, Some(Mode::Queue | Mode::Latest))
}

/// [`min_lossless_cursor`] over the table entries `entries` alone.
fn min_cursor_of(ring: &Ring<'_>, head: u64, entries: impl Iterator<Item = usize>) -> u64 {
    let mut min = u64::MAX;
    for e in entries {
        let entry = &ring.consumers[e];
        if !gates(entry) {
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

#[cfg(test)]
impl ProducerCore {
    /// Checks the invariants on the fields (tests): every buffer is in exactly one of `at`,
    /// `spares` and the lent ones, `loaned` counts the loans, and a lent buffer's stamp is
    /// `WRITING(last)`.
    pub fn check_invariants(&self, ring: &Ring<'_>) {
        let mut seen = vec![0u32; self.last.len()];
        for &b in self.at.iter().chain(&self.spares) {
            seen[b as usize] += 1;
        }
        for (b, &state) in self.loans.iter().enumerate() {
            if state == LENT {
                seen[b] += 1;
                let st = ring.buffers[b].stamp.load(Ordering::Relaxed);
                assert_eq!(st, stamp::writing(self.last[b]), "lent buffer {b}'s stamp");
            }
        }
        assert!(seen.iter().all(|&n| n == 1), "buffers in at/spares/lent: {seen:?}");
        assert_eq!(self.loaned, self.loans.iter().filter(|&&s| s != NOT_LENT).count());
    }
}
