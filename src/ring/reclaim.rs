//! Taking a dead consumer out of the ring: it stops gating the producer, the holds it had are
//! given back, its records are cleared and its table entry is freed.
//!
//! A dead consumer's hold records cannot say whether its last CAS happened (see [`super::hold`]).
//! So the reclaimer never subtracts the dead consumer's holds; it recounts each affected slot's
//! holders from the records of the consumers that are not being reclaimed, and CASes the stamp's
//! held count to that number:
//!
//! 0. freeze the slot: CAS `READY(t, h)` to the same value with WRITING set, so no consumer can
//!    pin it (a pin needs READY); releases still lower `h`;
//! 1. load the stamp (Acquire): tag `t`, held `h`;
//! 2. for every other entry that is not FREE or RECLAIMING, load its record for the slot
//!    (Acquire): `HELD(t)` counts one; `PINNING(t)` or `RELEASING(t)` means that consumer is
//!    between its record and its CAS, so unfreeze and try this slot again later;
//! 3. CAS the stamp from what step 1 read to `READY(t)` with held = that count (AcqRel), which
//!    also unfreezes it; if a release changed the stamp meanwhile, go back to 1.
//!
//! Why the count is right: a live consumer writes its record before its CAS on the stamp, and
//! its pin CAS is AcqRel and its release CAS Release, so a stamp value read in step 1 makes every
//! record written before the CAS that produced it visible to step 2. While frozen the stamp only
//! goes down, so it cannot change and come back between steps 1 and 3 (no ABA): a release whose
//! CAS falls between them makes step 3 fail. A live consumer between record and CAS shows a
//! transitional record. The producer is the only reclaimer, and reclaims only entries whose
//! process is dead, which therefore make no more changes. Consumers that found the slot frozen
//! may have gone to sleep: the caller wakes them afterwards.

use super::atomic::Ordering;
use super::layout::entry_state;
use super::{hold, stamp, Ring, RingCorrupt};

/// What [`reclaim()`] achieved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reclaim {
    /// The entry is free; `slots` holds of the dead consumer were given back.
    Done {
        /// Slots whose held count went down.
        slots: u32,
    },
    /// A live consumer was mid-pin or mid-release on a slot the dead one had a record for. The
    /// entry stays RECLAIMING (it no longer gates the producer); call again later.
    Incomplete,
}

/// Takes consumer table entry `dead`, whose process is known to be dead, out of the ring. Only
/// the producer may call it, one call at a time.
pub fn reclaim(ring: &Ring<'_>, dead: usize) -> Result<Reclaim, RingCorrupt> {
    let entry = &ring.consumers[dead];
    // Acquire: pairs with the owner's Release state stores (join, leave).
    match entry.state.load(Ordering::Acquire) {
        entry_state::FREE => return Ok(Reclaim::Done { slots: 0 }),
        // Release: the stats readers see the state with the entry's last values.
        _ => entry.state.store(entry_state::RECLAIMING, Ordering::Release),
    }
    let mut given_back = 0;
    let mut incomplete = false;
    for slot in 0..ring.slots.len() {
        let record = ring.hold(dead, slot);
        // Relaxed: the owner is dead; its last stores are what there is.
        if record.load(Ordering::Relaxed) == 0 {
            continue;
        }
        match recount(ring, slot)? {
            Some(lowered) => {
                given_back += lowered as u32;
                // Relaxed: nobody else reads a RECLAIMING entry's records.
                record.store(0, Ordering::Relaxed);
            }
            None => incomplete = true,
        }
    }
    if incomplete {
        return Ok(Reclaim::Incomplete);
    }
    super::park::clear_dead(ring.consumer_wake, &entry.parked);
    // Release: our clearing of the records happens before a new owner's writes.
    entry.state.store(entry_state::FREE, Ordering::Release);
    Ok(Reclaim::Done { slots: given_back })
}

/// Sets slot `slot`'s held count to the number of its holders among the entries that are not
/// being reclaimed. `Some(true)`: it went down; `Some(false)`: it was right; `None`: a live
/// consumer is mid-pin or mid-release, try later.
fn recount(ring: &Ring<'_>, slot: usize) -> Result<Option<bool>, RingCorrupt> {
    let line = &ring.slots[slot];
    // Freeze: set WRITING so that no consumer pins the slot while we count (a pin needs READY).
    // Releases still happen, but they only lower the count, so no stamp value repeats while we
    // look (no ABA between our load and our CAS).
    // Acquire: see the module docs, step 1.
    let mut st = line.stamp.load(Ordering::Acquire);
    loop {
        if stamp::is_writing(st) || stamp::held(st) == 0 {
            return Ok(Some(false));
        }
        if stamp::held(st) > ring.consumers.len() as u64 {
            let held = stamp::held(st) as u32;
            return Err(RingCorrupt::HeldCount { slot: slot as u32, held });
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
        match count_live(ring, slot, tag) {
            None => break None,
            Some(live) if live > held => {
                let held = held as u32;
                return Err(RingCorrupt::HeldCount { slot: slot as u32, held });
            }
            Some(live) => {
                let target = (st & !stamp::HELD_MASK & !stamp::WRITING) | live;
                // AcqRel: on success only our count stands, and the slot is READY again.
                if line
                    .stamp
                    .compare_exchange(st, target, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
                {
                    break Some(live < held);
                }
            }
        }
    };
    if result.is_none() {
        // AcqRel: unfreeze; releases may have lowered the count meanwhile, so clear the bit.
        line.stamp.fetch_and(!stamp::WRITING, Ordering::AcqRel);
    }
    Ok(result)
}

/// Holders of message `tag` in `slot` among the entries not FREE or RECLAIMING, or `None` if
/// one of them is between its record and its CAS.
fn count_live(ring: &Ring<'_>, slot: usize, tag: u64) -> Option<u64> {
    let mut live = 0u64;
    for (e, entry) in ring.consumers.iter().enumerate() {
        // Acquire: pairs with the owner's Release state stores.
        let state = entry.state.load(Ordering::Acquire);
        if state == entry_state::FREE || state == entry_state::RECLAIMING {
            continue;
        }
        // Acquire: see the module docs, step 2.
        let r = ring.hold(e, slot).load(Ordering::Acquire);
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
