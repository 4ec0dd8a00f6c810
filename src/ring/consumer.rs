//! A consumer's side of the protocol: join, pin the next message, release it, leave.

use std::cell::Cell;

use super::atomic::{fence, Ordering};
use super::lease::{self, evict_reason};
use super::producer::wants_wake;
use super::{hold, position, stamp};
use super::{Mode, Ring, RingCorrupt};

/// Where a new consumer starts reading.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum StartAt {
    /// The newest message already published (if it is still in the ring), then everything after.
    #[default]
    Newest,
    /// Only messages published after joining.
    Next,
    /// The oldest message still in the ring. For a `Lossless` consumer, the oldest one that cannot
    /// be overwritten while joining: with `capacity` positions, the last `capacity - 1` messages.
    Oldest,
}

/// Why a consumer cannot join.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JoinError {
    /// Every consumer table entry is taken.
    Full,
    /// The claimed entry was taken from the joiner before it became active: its lease changed
    /// (only a damaged segment, or a producer that took the joiner for dead, does that).
    Lost,
}

/// A message pinned by a consumer: its buffer cannot be overwritten until it is released.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pinned {
    /// The buffer that carries it.
    pub buffer: usize,
    /// Sequence number of the message.
    pub seq: u64,
    /// Length as published. Not yet checked against the buffer size: that is the caller's job.
    pub len: u64,
    /// Publish timestamp.
    pub timestamp_ns: u64,
    /// Messages this consumer lost (overwritten before it got to them, or skipped in `Latest`)
    /// since its previous message.
    pub lag: u64,
}

/// How a consumer lets go of its entry (see [`ConsumerCore::leave`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Leave {
    /// Free the entry at once: the producer keeps nothing of ours (host memory).
    Free,
    /// Hand the entry to the producer (RETIRING), which drops what it opened of it (our
    /// release events) before freeing it; we wait for that before destroying them.
    Retire,
}

/// What [`ConsumerCore::leave`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Left {
    /// Messages we still held (leaked read slots) and gave back.
    pub released: u32,
    /// The lease the entry now has if we retired it (wait with [`retire_done`] until it
    /// changes); `None` if we freed it, or it was no longer ours.
    pub retiring: Option<u64>,
    /// Whether the producer sleeps and must be woken.
    pub wake: bool,
}

/// A consumer's private state. `Cell`s, because a consumer may hold several messages at once
/// (`&self` receive); it is `!Sync`.
#[derive(Debug)]
pub struct ConsumerCore {
    /// Its consumer table entry.
    index: usize,
    /// The entry's lease while we own it and are active. Everything we write to shared buffer
    /// state we write only after checking that the entry still has it.
    lease: u64,
    /// How it receives; also in the entry.
    mode: Mode,
    /// Copy of the entry's cursor; the entry's is the shared one.
    cursor: Cell<u64>,
    /// Losses not yet reported with a message.
    lag: Cell<u64>,
    /// Statistics mirrored into the entry.
    received: Cell<u64>,
    lost: Cell<u64>,
    holding: Cell<u64>,
    /// Set once the lease is found no longer ours: from then on every pin and release fails
    /// with it at once, without touching shared buffer state.
    lost_lease: Cell<Option<RingCorrupt>>,
    /// The producer's count of upstream losses at our last message (`BufferLine::upstream_lost`);
    /// `None` before the first, whose count is where we start.
    upstream_seen: Cell<Option<u64>>,
    /// Whether the producer slept when this consumer joined and must be woken by the caller.
    join_wake: bool,
}

/// A claimed consumer table entry that is not active yet. Activate it, or give it back with
/// [`Joining::abandon`]; dropping it leaves the entry claimed (a reaper frees it once our
/// process is gone).
#[derive(Debug)]
#[must_use = "activate or abandon the claimed entry"]
pub struct Joining {
    index: usize,
    /// The JOINING lease our claim wrote.
    lease: u64,
}

impl Joining {
    /// The claimed entry's index.
    pub fn index(&self) -> usize {
        self.index
    }

    /// The entry's generation under this claim.
    pub fn generation(&self) -> u32 {
        lease::generation(self.lease)
    }

    /// Frees the entry again (the caller's setup failed).
    pub fn abandon(self, ring: &Ring<'_>) {
        free_own(ring, self.index, self.lease);
    }

    /// Sets the cursor from `start` and the delivery mode, and makes the consumer active (see
    /// the module docs and docs/protocol.md, "Joining and leaving"). Fails with `Lost` if the
    /// entry was taken from us meanwhile.
    pub fn activate(
        self,
        ring: &Ring<'_>,
        start: StartAt,
        mode: Mode,
    ) -> Result<ConsumerCore, JoinError> {
        let index = self.index;
        let entry = &ring.consumers[index];
        let cursor_at = |head: u64| {
            let c = match start {
                StartAt::Newest => head.saturating_sub(1),
                StartAt::Next => head,
                StartAt::Oldest => head.saturating_sub(ring.capacity()),
            };
            // Lossless: never behind the oldest message that cannot be overwritten while we
            // join (see below); with capacity 1 that makes Newest act as Next.
            if mode == Mode::Lossless {
                c.max(head.saturating_add(1).saturating_sub(ring.capacity()))
            } else {
                c
            }
        };
        // Acquire: pairs with the producer's Release head store.
        let head = ring.producer.head.load(Ordering::Acquire);
        entry.cursor.store(cursor_at(head), Ordering::Relaxed);
        // Relaxed: published by the Release CAS below, and never written again while active.
        entry.mode.store(mode as u32, Ordering::Relaxed);
        let active = lease::with_state(self.lease, lease::ACTIVE);
        // Release: the producer's Acquire lease load then sees the fields above. A CAS, not a
        // store: the entry is ours only while it has the lease our claim wrote.
        if entry
            .lease
            .compare_exchange(self.lease, active, Ordering::Release, Ordering::Relaxed)
            .is_err()
        {
            return Err(JoinError::Lost);
        }
        // Release: pairs with the producer's Acquire load; tells it to rescan cursors.
        ring.producer.joins.fetch_add(1, Ordering::Release);
        // SeqCst fence, against the one in each publish: a producer claim whose `joins`
        // load (after the previous publish's fence) missed our bump had its fence before
        // ours, so the head we load next is at least that claim's sequence number `s`.
        // Every later claim sees the bump and rescans. So only message `head2 - cap` can
        // be overwritten behind our back; Lossless, we start after it and lose nothing.
        fence(Ordering::SeqCst);
        let head2 = ring.producer.head.load(Ordering::Acquire);
        let cursor = cursor_at(head2).max(cursor_at(head));
        // Release: pairs with the producer's Acquire cursor load.
        entry.cursor.store(cursor, Ordering::Release);
        // The producer may have gone to sleep on our first, lower cursor: wake it.
        let join_wake = wants_wake(ring.producer_wake);
        Ok(ConsumerCore {
            index,
            lease: active,
            mode,
            cursor: Cell::new(cursor),
            lag: Cell::new(0),
            received: Cell::new(0),
            lost: Cell::new(0),
            holding: Cell::new(0),
            lost_lease: Cell::new(None),
            upstream_seen: Cell::new(None),
            join_wake,
        })
    }
}

/// Frees entry `index`, which we own under lease `owned` and in which we hold nothing: zero the
/// start time (see `ConsumerEntry::start_time`), then CAS the lease to FREE. Returns whether the
/// CAS succeeded (it fails if the entry was taken from us; it is then its taker's).
fn free_own(ring: &Ring<'_>, index: usize, owned: u64) -> bool {
    let entry = &ring.consumers[index];
    // Relaxed: published by the Release CAS below.
    entry.start_time.store(0, Ordering::Relaxed);
    // Release: our writes to the entry happen before a new owner's (its claim CAS acquires).
    entry
        .lease
        .compare_exchange(owned, lease::freed(owned), Ordering::Release, Ordering::Relaxed)
        .is_ok()
}

/// After [`ConsumerCore::leave`] retired an entry as `retiring`: whether the producer has let
/// go of it (the entry was freed, or is another generation's), so its owner may destroy what
/// the producer had opened.
pub fn retire_done(ring: &Ring<'_>, index: usize, retiring: u64) -> bool {
    // Acquire: pairs with the producer's Release CAS to FREE, made after it dropped what it
    // opened of the entry.
    let now = ring.consumers[index].lease.load(Ordering::Acquire);
    lease::state(now) == lease::FREE || lease::generation(now) != lease::generation(retiring)
}

/// After waiting for [`retire_done`] in vain (the producer is not looking): frees the entry
/// ourselves, through FINISHING so that a producer that starts finishing it at the same time
/// cannot also write it. The caller must then keep alive whatever the producer may still have
/// opened. Returns whether we freed it (false: the producer is finishing it, or did).
pub fn give_up_retiring(ring: &Ring<'_>, index: usize, retiring: u64) -> bool {
    let finishing = lease::with_state(retiring, lease::FINISHING);
    // Acquire: the entry is ours from here; nothing of the producer's to see but its absence.
    if ring.consumers[index]
        .lease
        .compare_exchange(retiring, finishing, Ordering::Acquire, Ordering::Relaxed)
        .is_err()
    {
        return false;
    }
    for buffer in 0..ring.buffers.len() {
        // Relaxed: our own records (all 0 already: we released before retiring); published
        // by the Release free below.
        ring.hold(index, buffer).store(0, Ordering::Relaxed);
    }
    super::reclaim::free_finishing(ring, index, finishing);
    true
}

impl ConsumerCore {
    /// Claims a free consumer table entry and starts at `start`: [`Self::claim`] then
    /// [`Joining::activate`].
    pub fn join(
        ring: &Ring<'_>,
        start: StartAt,
        mode: Mode,
        pid: u32,
        start_time: u64,
    ) -> Result<ConsumerCore, JoinError> {
        Self::claim(ring, pid, start_time)?.activate(ring, start, mode)
    }

    /// [`Self::claim_held`] for a caller whose liveness the producer needs no lock to see (the
    /// protocol's own tests and models).
    pub fn claim(ring: &Ring<'_>, pid: u32, start_time: u64) -> Result<Joining, JoinError> {
        Self::claim_held(ring, pid, start_time, |_| true, |_| {})
    }

    /// Claims a free consumer table entry (state `JOINING`: the producer ignores it but for
    /// reaping). The caller may fill in transport state for the entry (the CUDA layer writes its
    /// release-event handles) before [`Joining::activate`].
    ///
    /// Before it tries an entry, `hold(entry)` takes that entry's liveness lock (false: someone
    /// holds it, skip the entry); if the claim CAS then fails, `let_go(entry)` releases it. So
    /// the owner of every claimed entry holds its lock from before the claim, and a reaper that
    /// probes the lock never takes a joiner for a dead owner.
    pub fn claim_held(
        ring: &Ring<'_>,
        pid: u32,
        start_time: u64,
        mut hold: impl FnMut(usize) -> bool,
        mut let_go: impl FnMut(usize),
    ) -> Result<Joining, JoinError> {
        for (index, entry) in ring.consumers.iter().enumerate() {
            // Relaxed: only decides whether to try; the CAS below acquires.
            let free = entry.lease.load(Ordering::Relaxed);
            if lease::state(free) != lease::FREE || !hold(index) {
                continue;
            }
            // Our pid goes in with the claim: a reaper never sees the entry taken by nobody.
            let claimed = lease::claimed(free, pid);
            // Acquire: a previous owner's last writes to the entry (and its zeroed start time)
            // happen before ours.
            if entry
                .lease
                .compare_exchange(free, claimed, Ordering::Acquire, Ordering::Relaxed)
                .is_err()
            {
                let_go(index);
                continue;
            }
            // Relaxed: a reaper loads the start time after an Acquire load of the lease that
            // reads our claim, which is in the release sequence of the last free: it sees 0
            // ("not yet known") or ours, never a previous owner's.
            entry.start_time.store(start_time, Ordering::Relaxed);
            entry.evicted_for.store(evict_reason::NONE, Ordering::Relaxed);
            entry.received.store(0, Ordering::Relaxed);
            entry.lost.store(0, Ordering::Relaxed);
            entry.holding.store(0, Ordering::Relaxed);
            // A previous occupant's doorbell is not ours (its parked count was cleared when it
            // unparked, or by the reclaimer).
            entry.parked.store(0, Ordering::Relaxed);
            entry.bell.store(0, Ordering::Relaxed);
            for buffer in 0..ring.buffers.len() {
                // Relaxed: published by the Release CAS to ACTIVE; normally already 0.
                ring.hold(index, buffer).store(0, Ordering::Relaxed);
            }
            return Ok(Joining { index, lease: claimed });
        }
        Err(JoinError::Full)
    }

    /// Its delivery mode.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// Whether the caller must wake the producer after joining (it may be asleep on this
    /// consumer's first cursor).
    pub fn join_wake(&self) -> bool {
        self.join_wake
    }

    /// Its consumer table entry.
    pub fn index(&self) -> usize {
        self.index
    }

    /// The entry's generation while we own it.
    pub fn generation(&self) -> u32 {
        lease::generation(self.lease)
    }

    /// Sequence number of the next message it will receive.
    pub fn cursor(&self) -> u64 {
        self.cursor.get()
    }

    /// `Err(Evicted)` if we may not take messages any more: the producer evicted us, or
    /// something overwrote our lease. Remembered: every later pin fails the same way.
    pub fn check_lease(&self, ring: &Ring<'_>) -> Result<(), RingCorrupt> {
        if let Some(lost) = self.lost_lease.get() {
            return Err(lost);
        }
        let (now, _) = self.owned(ring);
        if now == self.lease {
            return Ok(());
        }
        let entry = &ring.consumers[self.index];
        let evicted = now == lease::with_state(self.lease, lease::EVICTED);
        // Relaxed: ordered by the Acquire lease load in `owned`, which pairs with the
        // producer's Release CAS to EVICTED made after it stored the reason.
        let reason =
            if evicted { entry.evicted_for.load(Ordering::Relaxed) } else { evict_reason::NONE };
        let lost = RingCorrupt::Evicted { entry: self.index as u32, reason };
        self.lost_lease.set(Some(lost));
        Err(lost)
    }

    /// The entry's lease now, and whether it is still ours: ACTIVE as we made it, or EVICTED
    /// by the producer (an evicted consumer still owns its holds and releases them).
    fn owned(&self, ring: &Ring<'_>) -> (u64, bool) {
        // Acquire: pairs with the producer's Release CASes (evict), see `check_lease`.
        let now = ring.consumers[self.index].lease.load(Ordering::Acquire);
        (now, now == self.lease || now == lease::with_state(self.lease, lease::EVICTED))
    }

    /// Whether our next message is in its buffer, published, though a pin just found nothing:
    /// READY (another consumer thawed it meanwhile), or frozen by a producer's recount (WRITING
    /// with its tag, and the head past it: a producer's claim is of an unpublished message). A
    /// consumer that finds the ring closed must not take it for "nothing left": it thaws it
    /// ([`super::reclaim::thaw`]) and pins again.
    pub fn next_is_there(&self, ring: &Ring<'_>) -> bool {
        let c = self.cursor.get();
        // Acquire: pairs with the producer's Release head store.
        let published = ring.producer.head.load(Ordering::Acquire) > c;
        published && ring.buffer_of(c).is_some()
    }

    /// Stores our cursor into the entry again if something overwrote it there (a lower value
    /// would hold a `Block` producer back for ever). Callers do it now and then while they
    /// wait. Returns whether the producer sleeps and must be woken.
    pub fn refresh_cursor(&self, ring: &Ring<'_>) -> bool {
        if self.check_lease(ring).is_err() {
            return false;
        }
        let entry = &ring.consumers[self.index];
        // Relaxed: only we write it, so a value that differs was written by no correct peer.
        if entry.cursor.load(Ordering::Relaxed) == self.cursor.get() {
            return false;
        }
        // Release: as the cursor store in `try_pin`.
        entry.cursor.store(self.cursor.get(), Ordering::Release);
        self.mode == Mode::Lossless && wants_wake(ring.producer_wake)
    }

    /// Sequence number of our next message (for [`super::reclaim::thaw`]).
    pub fn next_seq(&self) -> u64 {
        self.cursor.get()
    }

    /// Takes our entry out of the producer's waits while we keep it (and what we hold) until
    /// our process exits: ACTIVE to EVICTED. For a consumer whose GPU work never finished and
    /// that must not close what that work reads: the producer stops gating on it and waiting
    /// for its events, and, seeing it alive, does not free memory it maps. Returns whether the
    /// entry was ours and ACTIVE.
    pub fn step_aside(&self, ring: &Ring<'_>) -> bool {
        let evicted = lease::with_state(self.lease, lease::EVICTED);
        // Release: as the producer's own CAS to EVICTED.
        ring.consumers[self.index]
            .lease
            .compare_exchange(self.lease, evicted, Ordering::Release, Ordering::Relaxed)
            .is_ok()
    }

    /// Pins the next message if one is published (for a `Latest` consumer: the newest). `Ok(None)`:
    /// nothing yet. The second value says whether the producer sleeps and must be woken (a
    /// `Lossless` cursor moved).
    ///
    /// The lease is checked once a message is pinned, before it is handed out: an evicted
    /// consumer gets `Err(Evicted)` rather than a message whose buffer may be overwritten under
    /// it (its hold no longer counts), and its record stays for the producer to recount.
    pub fn try_pin(&self, ring: &Ring<'_>) -> Result<Option<(Pinned, bool)>, RingCorrupt> {
        if let Some(lost) = self.lost_lease.get() {
            return Err(lost);
        }
        // Lag jumps allowed in one call. A producer lapping us again and again, or words from
        // a hostile segment that are all "ahead", would otherwise keep us here; the caller just
        // tries again (our cursor has moved on).
        let mut jumps = ring.capacity().saturating_add(64);
        'next: loop {
            if self.mode == Mode::Latest {
                // Acquire: pairs with the producer's Release head store, so the position word
                // of `head - 1` is at least as new as that message.
                let head = ring.producer.head.load(Ordering::Acquire);
                let c = self.cursor.get();
                // Only forwards, and only by a distance a correct head can be ahead (a
                // hostile one must not wrap the cursor).
                if head > c && head - c > 1 && head - c <= i64::MAX as u64 {
                    self.skip(head - 1 - c);
                }
            }
            let c = self.cursor.get();
            let position = ring.position_of(c);
            // Acquire: pairs with the producer's Release store of the word, made after the
            // buffer's publish, so the stamp load below sees `READY(c)` or a later value.
            let word = ring.positions[position].load(Ordering::Acquire);
            let d = stamp::tag_diff(position::tag(word), c);
            if d < 0 {
                return Ok(None);
            }
            if d > 0 {
                if !self.lagged(ring, c, &mut jumps) {
                    return Ok(None);
                }
                continue 'next;
            }
            let buffer = position::buffer(word);
            if buffer >= ring.buffers.len() {
                return Err(RingCorrupt::Position { position: position as u32 });
            }
            let line = &ring.buffers[buffer];
            let record = ring.hold(self.index, buffer);
            let mut pinning = false;
            // Relaxed: the pin CAS below acquires; this load only decides what to try.
            let mut st = line.stamp.load(Ordering::Relaxed);
            loop {
                let d = stamp::tag_diff(stamp::tag(st), c);
                let held = stamp::held(st);
                let damaged = held >= ring.consumers.len() as u64;
                if pinning && (d != 0 || stamp::is_writing(st) || damaged) {
                    // Our PINNING record of a failed CAS is void: clear it (a record left
                    // behind would stall every recount of this buffer while we live). We hold
                    // nothing else in this buffer: it was taken for `c` after every hold of its
                    // older message ended. Release: like every record store (see
                    // `super::hold`). Every path below returns or moves to another message.
                    record.store(0, Ordering::Release);
                }
                if d < 0 {
                    // The word said `c` is published here; no correct producer leaves an older
                    // message behind it.
                    return Err(RingCorrupt::BufferTag { buffer: buffer as u32 });
                }
                if d == 0 && stamp::is_writing(st) {
                    // Frozen by a recount (`super::reclaim`): try again after it.
                    return Ok(None);
                }
                if d > 0 {
                    // The buffer was taken for a newer message since: `c` is gone.
                    if !self.lagged(ring, c, &mut jumps) {
                        return Ok(None);
                    }
                    continue 'next;
                }
                if damaged {
                    let held = held as u32;
                    return Err(RingCorrupt::HeldCount { buffer: buffer as u32, held });
                }
                // Release: a reclaimer that reads the stamp our CAS writes sees this record
                // (see `super::hold`); it is written before the CAS.
                record.store(hold::record(c, hold::PINNING), Ordering::Release);
                pinning = true;
                // Acquire on success: pairs with the producer's Release publish store, so the
                // payload and metadata it wrote are visible. Release: orders the PINNING record
                // before the new stamp, for a reclaimer's Acquire load (`super::reclaim`).
                match line.stamp.compare_exchange_weak(
                    st,
                    st + 1,
                    Ordering::AcqRel,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => break,
                    Err(actual) => st = actual,
                }
            }
            // Release: a reclaimer that Acquire-loads HELD also sees our CAS on the stamp.
            record.store(hold::record(c, hold::HELD), Ordering::Release);
            // Evicted (or lease gone): the message is not handed out. An evicted owner still
            // owns its holds: it gives this one back at once; a lost lease leaves the record for
            // the producer's recount.
            if let Err(lost) = self.check_lease(ring) {
                if self.owned(ring).1 {
                    let _ = self.release_buffer(ring, buffer);
                }
                return Err(lost);
            }
            // Relaxed: written before the publish stamp store, which our pin acquired. A count
            // that went back (a damaged segment) adds nothing. Our first message counts the
            // losses declared just before it (the total at the message before it).
            let upstream = line.upstream_lost.load(Ordering::Relaxed);
            let prev = self.upstream_seen.get();
            let before = || line.upstream_before.load(Ordering::Relaxed);
            let upstream_lag = upstream.saturating_sub(prev.unwrap_or_else(before));
            // The highest total seen: one that went back must not count its losses twice.
            self.upstream_seen.set(Some(prev.map_or(upstream, |p| p.max(upstream))));
            let pinned = Pinned {
                buffer,
                seq: c,
                len: line.len.load(Ordering::Relaxed),
                timestamp_ns: line.timestamp_ns.load(Ordering::Relaxed),
                lag: self.lag.replace(0).saturating_add(upstream_lag),
            };
            let next = c.wrapping_add(1);
            self.cursor.set(next);
            self.received.set(self.received.get() + 1);
            self.holding.set(self.holding.get() + 1);
            let entry = &ring.consumers[self.index];
            // Release: orders the pin CAS before the cursor, for the producer's Acquire load.
            entry.cursor.store(next, Ordering::Release);
            // Only a Lossless cursor gates the producer; others it waits on only for releases.
            let wake = self.mode == Mode::Lossless && wants_wake(ring.producer_wake);
            return Ok(Some((pinned, wake)));
        }
    }

    /// Message `c` was overwritten: the producer published at least up to `c + capacity - 1`
    /// (it took `c`'s position or buffer for a newer message). Jumps to the oldest message left,
    /// if `jumps` (the lag jumps one pin may make) is not used up; returns whether it did.
    fn lagged(&self, ring: &Ring<'_>, c: u64, jumps: &mut u64) -> bool {
        *jumps -= 1;
        if *jumps == 0 {
            return false;
        }
        // Acquire: pairs with the producer's Release head store.
        let head = ring.producer.head.load(Ordering::Acquire);
        // Wrapping/saturating: `head` comes from shared memory and may be garbage; that must
        // not panic, only misreport the loss.
        let next = c.wrapping_add(1).max(head.saturating_sub(ring.capacity()));
        self.skip(next.wrapping_sub(c));
        true
    }

    /// Moves the cursor `n` messages on without receiving them: they count as lost.
    fn skip(&self, n: u64) {
        self.lag.set(self.lag.get().saturating_add(n));
        self.lost.set(self.lost.get().saturating_add(n));
        self.cursor.set(self.cursor.get().wrapping_add(n));
    }

    /// Releases a message pinned by this consumer. Returns whether the producer sleeps and must
    /// be woken. An evicted consumer still releases (its holds count until it does); one whose
    /// lease is gone altogether changes nothing and gets `Err(Evicted)`.
    pub fn release(&self, ring: &Ring<'_>, buffer: usize) -> Result<bool, RingCorrupt> {
        self.holding.set(self.holding.get().saturating_sub(1));
        if !self.owned(ring).1 {
            self.check_lease(ring)?;
        }
        self.release_buffer(ring, buffer)
    }

    /// The release itself (the lease was checked).
    fn release_buffer(&self, ring: &Ring<'_>, buffer: usize) -> Result<bool, RingCorrupt> {
        let line = &ring.buffers[buffer];
        let record = ring.hold(self.index, buffer);
        // Relaxed: our own record.
        let seq = hold::seq(record.load(Ordering::Relaxed));
        // Release: written before the CAS below, for a reclaimer (see `super::hold`).
        record.store(hold::record(seq, hold::RELEASING), Ordering::Release);
        // Relaxed: the CAS below orders; this load only seeds it.
        let mut st = line.stamp.load(Ordering::Relaxed);
        loop {
            if stamp::held(st) == 0 {
                // Someone else zeroed our hold: report it rather than borrow into the tag.
                // Relaxed: we hold nothing here, whatever the record says.
                record.store(0, Ordering::Relaxed);
                return Err(RingCorrupt::ReleaseUnderflow { buffer: buffer as u32 });
            }
            // Release: our reads of the buffer happen before the producer's claim (its Acquire
            // CAS reads this value or a later one in the release sequence).
            match line.stamp.compare_exchange_weak(st, st - 1, Ordering::Release, Ordering::Relaxed)
            {
                Ok(_) => break,
                Err(actual) => st = actual,
            }
        }
        // Release: a reclaimer that Acquire-loads 0 also sees our CAS on the stamp.
        record.store(0, Ordering::Release);
        Ok(wants_wake(ring.producer_wake))
    }

    /// Copies the statistics (received, lost, holding) into the consumer's table entry, where
    /// tools read them. Not part of the protocol; the caller does it after pins and releases.
    pub fn write_stats(&self, ring: &Ring<'_>) {
        let entry = &ring.consumers[self.index];
        // Relaxed: owner-only statistics, read only for display.
        entry.received.store(self.received.get(), Ordering::Relaxed);
        entry.lost.store(self.lost.get(), Ordering::Relaxed);
        entry.holding.store(self.holding.get(), Ordering::Relaxed);
    }

    /// Leaves the ring. First gives back every message it still holds (read slots that were
    /// leaked rather than dropped: their records say HELD, and the buffer still carries that
    /// message), so that nothing stays pinned for ever; the caller must be done reading them.
    /// Then frees the entry or retires it (`how`). An evicted consumer always retires; one
    /// whose lease is gone changes nothing.
    pub fn leave(&self, ring: &Ring<'_>, how: Leave) -> Left {
        let mut left = Left { released: 0, retiring: None, wake: false };
        let mut released = false;
        loop {
            let (now, ours) = self.owned(ring);
            if !ours {
                break;
            }
            if !std::mem::replace(&mut released, true) {
                for buffer in 0..ring.buffers.len() {
                    if ring.held_by(self.index, buffer).is_some() {
                        // A damaged stamp (underflow) is not ours to fix on the way out.
                        left.wake |= self.release_buffer(ring, buffer).unwrap_or(false);
                        left.released += 1;
                    }
                }
                self.holding.set(0);
            }
            let evicted = now != self.lease;
            if how == Leave::Free && !evicted {
                if free_own(ring, self.index, now) {
                    break;
                }
            } else if let Some(retiring) = self.retire(ring, now) {
                left.retiring = Some(retiring);
                break;
            }
            // Evicted meanwhile: look again.
        }
        // The producer may be blocked on us.
        left.wake |= wants_wake(ring.producer_wake);
        left
    }

    /// CAS `owned` to RETIRING and tell the producer to look. Returns the new lease, or `None`
    /// if the lease had moved on.
    fn retire(&self, ring: &Ring<'_>, owned: u64) -> Option<u64> {
        let retiring = lease::with_state(owned, lease::RETIRING);
        // Release: our last stores to the entry and its records happen before the producer
        // (Acquire load of the lease) finishes it.
        let ok = ring.consumers[self.index]
            .lease
            .compare_exchange(owned, retiring, Ordering::Release, Ordering::Relaxed)
            .is_ok();
        if ok {
            // Release: a producer whose Acquire load sees the bump also sees our lease.
            ring.producer.retires.fetch_add(1, Ordering::Release);
        }
        ok.then_some(retiring)
    }
}
