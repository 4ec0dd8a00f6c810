//! Taking consumers out of the ring from the producer's side: reaping the dead, finishing the
//! retired and evicting the damaged. Only the producer calls these, one call at a time.
//!
//! # Reaping
//!
//! [`reap`] looks at every entry's lease (see [`super::lease`]). For an owned entry it asks the
//! caller whether the entry's owner lives (the caller probes the liveness lock the owner holds
//! for that entry from before its claim until after it let go: `shm::presence`), and if it
//! does not, CASes the lease it observed to FINISHING. The CAS is what makes the probe safe:
//! if the owner left and someone else claimed the entry while the probe ran, the lease has
//! another generation and the CAS fails. (A joiner that holds the entry's lock while its claim
//! fails makes a dead owner look alive for one reap: a delay, never a wrong reclaim.) RETIRING
//! entries are CASed to FINISHING too. A FINISHING entry is then finished: holds given back,
//! the transport told ([`reap`]'s `on_free`), start time zeroed, lease freed.
//!
//! # Giving back holds
//!
//! A finished owner's hold records cannot say whether its last CAS happened (see
//! [`super::hold`]). So the reclaimer never subtracts them; it recounts each buffer the records
//! name from the records of the consumers that still hold (ACTIVE or EVICTED), and CASes the
//! stamp's held count to that:
//!
//! 0. freeze the buffer: CAS `READY(t, h)` to the same value with WRITING set, so no consumer can
//!    pin it (a pin needs READY); releases still lower `h`;
//! 1. load the stamp (Acquire): tag `t`, held `h`;
//! 2. for every ACTIVE or EVICTED entry, load its record for the buffer (Acquire): `HELD(t)`
//!    counts one; `PINNING(t)` or `RELEASING(t)` means that consumer is between its record and
//!    its CAS, so unfreeze and try this buffer again later;
//! 3. CAS the stamp from what step 1 read to `READY(t)` with held = that count (AcqRel), which
//!    also unfreezes it; if a release changed the stamp meanwhile, go back to 1.
//!
//! Why the count is right: a live consumer writes its record before its CAS on the stamp, and
//! its pin CAS is AcqRel and its release CAS Release, so a stamp value read in step 1 makes every
//! record written before the CAS that produced it visible to step 2. While frozen the stamp only
//! goes down, so it cannot change and come back between steps 1 and 3 (no ABA): a release whose
//! CAS falls between them makes step 3 fail. A live consumer between record and CAS shows a
//! transitional record. Consumers that found the buffer frozen may have gone to sleep: [`reap`]
//! says when they must be woken. A frozen buffer keeps its message's tag with WRITING set, and
//! that message is published (the head is past it), which a producer's claim never is: a
//! consumer that finds the ring closed tells the two apart
//! ([`super::consumer::ConsumerCore::next_is_there`]) and thaws it ([`thaw`]).
//!
//! An EVICTED owner still counts as a holder: it may be releasing right now (its release CAS
//! can land after any recount), so its holds come back through its own releases, or through
//! the recount once it retires or dies. Eviction only stops it gating the producer.
//!
//! [`audit`] runs the same recount on the buffers a producer has waited on for a while: a count
//! that only a damaged segment can have left too high comes down (nothing else can lower it).
//!
//! A closing producer reaps without recounting ([`Recount::No`]): nothing is published any
//! more, and a freeze would make a draining consumer take a published message for none.

use super::atomic::Ordering;
use super::lease;
use super::producer::wants_wake;
use super::{hold, stamp, Ring, RingCorrupt};

/// What one [`reap`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Reaped {
    /// Entries whose owner was found dead (now FREE, or RETIRING until a recount completes).
    pub dead: u32,
    /// Entries freed (dead or retired ones that are finished).
    pub freed: u32,
    /// Holds given back.
    pub holds: u32,
    /// Whether consumers sleep and must be woken (a recount froze a buffer they may have found
    /// empty).
    pub wake_consumers: bool,
}

/// Whether [`reap`] recounts the holds of the entries it finishes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Recount {
    /// Yes: the producer goes on publishing.
    Yes,
    /// No: the producer has closed the ring; records are cleared without touching the stamps.
    No,
}

/// Reaps the consumer table: entries whose owner is dead are taken out, RETIRING entries are
/// finished and freed.
///
/// `alive(entry, pid)` says whether the owner of entry `entry` lives (`pid` is the one its lease
/// names, for display). `on_free(entry, generation)` runs before an entry is freed: the caller
/// drops what it opened of that entry then.
pub fn reap(
    ring: &Ring<'_>,
    alive: impl Fn(usize, u32) -> bool,
    mut on_free: impl FnMut(usize, u32),
    recount: Recount,
) -> Result<Reaped, RingCorrupt> {
    let mut out = Reaped::default();
    let mut froze = false;
    for (index, entry) in ring.consumers.iter().enumerate() {
        // Acquire: pairs with the owner's Release CASes (activate, leave), so its last writes
        // to the entry and its records are seen.
        let seen = entry.lease.load(Ordering::Acquire);
        let owner_alive = || alive(index, lease::pid(seen));
        // The producer finishes under a lease of its own: FINISHING with no pid. Any other
        // FINISHING belongs to a retiring owner that gave up (see `super::lease`).
        let finishing = lease::pack(lease::FINISHING, lease::generation(seen), 0);
        let dead = match lease::state(seen) {
            lease::FREE => continue,
            // Ours, left by a reap that returned an error half-way: finish it now.
            lease::FINISHING if lease::pid(seen) == 0 => false,
            // A retiring owner that gave up is freeing it; finish for it only if it died.
            lease::FINISHING => {
                if owner_alive() {
                    continue;
                }
                true
            }
            lease::RETIRING => false,
            lease::JOINING | lease::ACTIVE | lease::EVICTED => {
                if owner_alive() {
                    continue;
                }
                true
            }
            // A state no peer writes: the lease was overwritten. Finish the entry so that what
            // its records name is given back; an owner still running finds its lease changed
            // at its next call and stops.
            _ => false,
        };
        // AcqRel: Acquire as the load above; Release keeps the transition in the lease's
        // release sequence. From the observed value only: if the owner left and the entry was
        // claimed again meanwhile (the /proc read above may even have judged the new owner's
        // start time), this fails and the new owner is untouched; a retiring owner that gave
        // up first keeps the entry.
        if seen != finishing
            && entry
                .lease
                .compare_exchange(seen, finishing, Ordering::AcqRel, Ordering::Relaxed)
                .is_err()
        {
            continue;
        }
        if dead {
            // Relaxed: a producer-only statistic.
            let n = ring.producer.reclaims.load(Ordering::Relaxed);
            ring.producer.reclaims.store(n + 1, Ordering::Relaxed);
            out.dead += 1;
        }
        // The entry is ours (FINISHING, no pid) until we free it or hand it back.
        let given = match recount {
            Recount::Yes => give_back(ring, index),
            Recount::No => Ok((0, clear_records(ring, index), false)),
        };
        let retiring = lease::with_state(finishing, lease::RETIRING);
        let hand_back = || {
            // Release: nothing of ours to publish but the records we cleared. A RETIRING entry
            // with no pid is finished at the next reap (it has no owner to wait for).
            let _ = entry.lease.compare_exchange(
                finishing,
                retiring,
                Ordering::Release,
                Ordering::Relaxed,
            );
        };
        let (given, done, f) = match given {
            Ok(g) => g,
            Err(e) => {
                hand_back();
                return Err(e);
            }
        };
        out.holds += given;
        froze |= f;
        if !done {
            // A live consumer was mid-pin on a buffer: hand the entry back for the next reap.
            hand_back();
            continue;
        }
        super::park::clear_dead(ring.consumer_wake, &entry.parked);
        on_free(index, lease::generation(seen));
        free_finishing(ring, index, finishing);
        out.freed += 1;
    }
    out.wake_consumers = froze && wants_wake(ring.consumer_wake);
    Ok(out)
}

/// Frees entry `index`, FINISHING as `finishing` and ours: zero the start time (see
/// `ConsumerEntry::start_time`), then CAS the lease to FREE.
pub(crate) fn free_finishing(ring: &Ring<'_>, index: usize, finishing: u64) {
    let entry = &ring.consumers[index];
    // Relaxed: published by the Release CAS below; nobody else writes a FINISHING entry.
    entry.start_time.store(0, Ordering::Relaxed);
    // Release: our clearing of the records and the start time happens before a new owner's
    // writes (its claim CAS acquires). It cannot fail: a FINISHING entry with our lease is only
    // ours (the producer's has no pid, a giving-up owner's its own).
    let _ = entry.lease.compare_exchange(
        finishing,
        lease::freed(finishing),
        Ordering::Release,
        Ordering::Relaxed,
    );
}

/// Clears entry `index`'s hold records without recounting (the ring is closed). Always done.
fn clear_records(ring: &Ring<'_>, index: usize) -> bool {
    for buffer in 0..ring.buffers.len() {
        // Relaxed: the owner makes no more changes; a new owner's claim is ordered after our
        // Release free of the lease.
        ring.hold(index, buffer).store(0, Ordering::Relaxed);
    }
    true
}

/// Evicts the consumer of entry `index`, whose lease the caller observed as `seen` (ACTIVE),
/// for `reason` (a [`lease::evict_reason`]): it stops gating the producer. Its holds still
/// count until it releases them, retires or dies (see the module docs). Returns whether it was
/// evicted (false: the lease had moved on).
pub fn evict(ring: &Ring<'_>, index: usize, seen: u64, reason: u32) -> bool {
    if lease::state(seen) != lease::ACTIVE {
        return false;
    }
    let entry = &ring.consumers[index];
    // Relaxed: published by the Release CAS below.
    entry.evicted_for.store(reason, Ordering::Relaxed);
    let evicted = lease::with_state(seen, lease::EVICTED);
    // Release: publishes the reason to the owner's Acquire lease load.
    if entry.lease.compare_exchange(seen, evicted, Ordering::Release, Ordering::Relaxed).is_err() {
        return false;
    }
    // Relaxed: a producer-only statistic.
    let n = ring.producer.evictions.load(Ordering::Relaxed);
    ring.producer.evictions.store(n + 1, Ordering::Relaxed);
    true
}

/// Recounts buffer `buffer`'s holders from the records of the consumers that hold (ACTIVE or
/// EVICTED): the producer does it when it has waited a liveness interval for held buffers. A
/// count left too high (a consumer whose lease was overwritten, a damaged stamp) comes down; a
/// right one stays. Returns whether the count went down and whether sleeping consumers must be
/// woken.
pub fn audit(ring: &Ring<'_>, buffer: usize) -> Result<(bool, bool), RingCorrupt> {
    let (result, froze) = recount(ring, buffer)?;
    Ok((result == Some(true), froze && wants_wake(ring.consumer_wake)))
}

/// Clears a recount's freeze of message `seq`'s buffer, which a consumer found closed (no recount
/// runs after the producer closed: it reaps without recounting) or whose producer died mid-
/// recount: the message is there, published (`head > seq`), and must be taken, not reported
/// missing. A producer's claim (of a message not yet published) is left alone.
pub fn thaw(ring: &Ring<'_>, seq: u64) {
    let Some(buffer) = ring.buffer_of(seq) else {
        return;
    };
    let line = &ring.buffers[buffer];
    // Relaxed: only decides whether to try; the CAS below decides.
    let st = line.stamp.load(Ordering::Relaxed);
    // Acquire: pairs with the producer's Release head store.
    let published = ring.producer.head.load(Ordering::Acquire) > seq;
    if published && stamp::is_writing(st) && stamp::tag_diff(stamp::tag(st), seq) == 0 {
        // AcqRel: as the recount's own unfreeze.
        let _ = line.stamp.compare_exchange(
            st,
            st & !stamp::WRITING,
            Ordering::AcqRel,
            Ordering::Relaxed,
        );
    }
}

/// Recounts every buffer that entry `index`'s hold records name, excluding that entry (it is
/// FINISHING), and clears each record whose buffer was recounted. Returns (holds given back,
/// whether every named buffer was recounted, whether a buffer was frozen).
fn give_back(ring: &Ring<'_>, index: usize) -> Result<(u32, bool, bool), RingCorrupt> {
    let mut given = 0;
    let mut done = true;
    let mut froze = false;
    for buffer in 0..ring.buffers.len() {
        let record = ring.hold(index, buffer);
        // Acquire: a retired owner's last stores were published by its Release lease CAS,
        // which we acquired; a dead one makes no more.
        if record.load(Ordering::Acquire) == 0 {
            continue;
        }
        let (result, f) = recount(ring, buffer)?;
        froze |= f;
        match result {
            Some(lowered) => {
                given += lowered as u32;
                // Relaxed: the owner makes no more changes; a new owner's claim is ordered
                // after our Release free of the lease.
                record.store(0, Ordering::Relaxed);
            }
            None => done = false,
        }
    }
    Ok((given, done, froze))
}

/// Sets buffer `buffer`'s held count to the number of its holders among the ACTIVE and EVICTED
/// entries.
/// `Some(true)`: it went down; `Some(false)`: it was right (or could not be trusted, see
/// below); `None`: a live consumer is mid-pin or mid-release, try later. The second value says
/// whether the buffer was frozen for a while.
fn recount(ring: &Ring<'_>, buffer: usize) -> Result<(Option<bool>, bool), RingCorrupt> {
    let line = &ring.buffers[buffer];
    // Freeze: set WRITING so that no consumer pins the buffer while we count (a pin needs READY).
    // Releases still happen, but they only lower the count, so no stamp value repeats while we
    // look (no ABA between our load and our CAS).
    // Acquire: see the module docs, step 1.
    let mut st = line.stamp.load(Ordering::Acquire);
    loop {
        if stamp::is_writing(st) || stamp::held(st) == 0 {
            return Ok((Some(false), false));
        }
        if stamp::held(st) > ring.consumers.len() as u64 {
            let held = stamp::held(st) as u32;
            return Err(RingCorrupt::HeldCount { buffer: buffer as u32, held });
        }
        // AcqRel: as the load above, and orders the freeze before our record loads.
        match line.stamp.compare_exchange(
            st,
            st | stamp::WRITING,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) => break,
            Err(actual) => st = actual,
        }
    }
    let tag = stamp::tag(st);
    let result = loop {
        // Acquire: see the module docs, step 1.
        let st = line.stamp.load(Ordering::Acquire);
        let held = stamp::held(st);
        match count_live(ring, buffer, tag) {
            None => break None,
            // More records say HELD than the stamp counts: a record or the stamp was
            // overwritten. Raising the count could pin the buffer for ever on a lying record;
            // lowering it could expose a reader. Leave it as it is.
            Some(live) if live > held => break Some(false),
            Some(live) => {
                let target = (st & !stamp::HELD_MASK & !stamp::WRITING) | live;
                // AcqRel: on success only our count stands, and the buffer is READY again.
                if line
                    .stamp
                    .compare_exchange(st, target, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
                {
                    return Ok((Some(live < held), true));
                }
            }
        }
    };
    // AcqRel: unfreeze; releases may have lowered the count meanwhile, so clear the bit.
    line.stamp.fetch_and(!stamp::WRITING, Ordering::AcqRel);
    Ok((result, true))
}

/// Holders of message `tag` in `buffer` among the ACTIVE and EVICTED entries, or `None` if one
/// of them is between its record and its CAS.
fn count_live(ring: &Ring<'_>, buffer: usize, tag: u64) -> Option<u64> {
    let mut live = 0u64;
    for (e, entry) in ring.consumers.iter().enumerate() {
        // Acquire: pairs with the owner's Release lease CASes.
        let state = lease::state(entry.lease.load(Ordering::Acquire));
        if state != lease::ACTIVE && state != lease::EVICTED {
            continue;
        }
        // Acquire: see the module docs, step 2.
        let r = ring.hold(e, buffer).load(Ordering::Acquire);
        if r == 0 || stamp::tag_diff(tag, hold::seq(r)) != 0 {
            continue;
        }
        match hold::state(r) {
            hold::HELD => live += 1,
            _ => return None,
        }
    }
    Some(live)
}
