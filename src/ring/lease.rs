//! The consumer table entry's lease word: who owns the entry, in which state, since when.
//!
//! ```text
//!  63                      32 31                          3 2     0
//! +--------------------------+-----------------------------+-------+
//! |  owner pid               |  generation (29 bits)       | state |
//! +--------------------------+-----------------------------+-------+
//! ```
//!
//! One word, so that one CAS checks the owner and moves the entry on. Every transition is a
//! CAS from the value its maker observed (see docs/protocol.md, "Joining and leaving"):
//!
//! ```text
//! FREE(g)      -> JOINING(g+1, pid)   claim: the joiner, with its pid in the same CAS
//! JOINING      -> ACTIVE              activate: the joiner
//! JOINING      -> FREE                abandon: the joiner (its setup failed)
//! ACTIVE       -> FREE                leave: a host-memory consumer, after releasing its holds
//! ACTIVE       -> RETIRING            leave: a CUDA consumer, after releasing its holds and
//!                                     closing what it opened; it waits for the producer
//! ACTIVE       -> EVICTED             evict: the producer (a failure attributable to the entry)
//! EVICTED      -> RETIRING            leave: the evicted owner, after releasing its holds
//! RETIRING     -> FINISHING           the producer starts finishing the entry; or a retiring
//!                                     owner that gave up waiting for the producer
//! JOINING | ACTIVE | EVICTED
//!              -> FINISHING           reap: the producer, once the owner's process is dead
//! FINISHING    -> FREE                whoever moved it to FINISHING, once it gave back what
//!                                     the entry's hold records name (the producer), dropped
//!                                     what it opened of the entry (the producer), and zeroed
//!                                     the start time
//! FINISHING    -> RETIRING            the producer, when a live consumer was mid-pin on a
//!                                     slot it had to recount (it tries again later)
//! ```
//!
//! FINISHING belongs to whoever made it: nobody else touches the entry's fields meanwhile, so a
//! producer finishing an entry and a retiring owner giving up cannot both write it. The
//! producer's FINISHING lease has no pid (0); an owner that gives up keeps its pid in it. A
//! FINISHING entry with a pid that the producer finds belongs to an owner that gave up, and is
//! taken over (by CAS from the lease seen) only if that owner's process is dead.
//!
//! The generation changes with every claim, so a CAS made from a value observed before the
//! entry was left and claimed again fails: the producer can never act on an entry's new owner
//! with what it learnt about the old one. With 29 bits, the same (state, generation, pid) comes
//! back only after 2^29 claims of one entry by the same pid, which no reaper sleeps through.

/// Nobody owns the entry.
pub const FREE: u32 = 0;
/// A consumer claimed it and is setting up; it does not gate the producer yet.
pub const JOINING: u32 = 1;
/// The consumer takes part: in `Block` its cursor gates the producer.
pub const ACTIVE: u32 = 2;
/// The owner makes no more changes (it died, or left and waits): the producer gives back what
/// its hold records name, drops what it opened of the entry and frees it. It gates nothing.
pub const RETIRING: u32 = 3;
/// The producer evicted the owner after a failure attributable to the entry (see
/// [`evict_reason`]). It gates nothing and the producer no longer waits for its GPU work; its
/// holds still count (it releases them as before) until it retires or dies. The owner learns
/// it at its next receive and moves the entry to RETIRING when it lets go.
pub const EVICTED: u32 = 4;
/// The entry is being cleared by the producer or by a retiring owner that gave up waiting; see
/// the module docs.
pub const FINISHING: u32 = 5;

const STATE_BITS: u32 = 3;
const STATE_MASK: u64 = (1 << STATE_BITS) - 1;
/// Bits of the generation.
pub const GENERATION_BITS: u32 = 29;
const GENERATION_MASK: u64 = (1 << GENERATION_BITS) - 1;

/// A lease word.
#[inline]
pub fn pack(state: u32, generation: u32, pid: u32) -> u64 {
    debug_assert!(state as u64 <= STATE_MASK);
    (state as u64) | ((generation as u64 & GENERATION_MASK) << STATE_BITS) | ((pid as u64) << 32)
}

/// The lease's state (may be a value no peer writes, in a damaged segment).
#[inline]
pub fn state(lease: u64) -> u32 {
    (lease & STATE_MASK) as u32
}

/// The lease's generation.
#[inline]
pub fn generation(lease: u64) -> u32 {
    ((lease >> STATE_BITS) & GENERATION_MASK) as u32
}

/// The owner's pid (0 when free).
#[inline]
pub fn pid(lease: u64) -> u32 {
    (lease >> 32) as u32
}

/// The same lease in another state.
#[inline]
pub fn with_state(lease: u64, state: u32) -> u64 {
    (lease & !STATE_MASK) | state as u64
}

/// The lease of the entry freed from `lease`: same generation, no owner.
#[inline]
pub fn freed(lease: u64) -> u64 {
    pack(FREE, generation(lease), 0)
}

/// The lease a claim by `pid` makes of free lease `lease`: the next generation.
#[inline]
pub fn claimed(lease: u64, pid: u32) -> u64 {
    pack(JOINING, generation(lease).wrapping_add(1), pid)
}

/// Why the producer evicted a consumer, as kept in `ConsumerEntry::evicted_for`.
pub mod evict_reason {
    /// Not evicted, or the entry was overwritten by someone else.
    pub const NONE: u32 = 0;
    /// Its release event could not be opened or queried (a damaged handle).
    pub const RELEASE_EVENT: u32 = 1;

    /// A sentence for `reason`.
    pub fn describe(reason: u32) -> &'static str {
        match reason {
            RELEASE_EVENT => "its release event could not be opened or queried",
            _ => "its consumer table entry was overwritten",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_round_trip() {
        let w = pack(ACTIVE, 12345, u32::MAX);
        assert_eq!((state(w), generation(w), pid(w)), (ACTIVE, 12345, u32::MAX));
        let r = with_state(w, RETIRING);
        assert_eq!((state(r), generation(r), pid(r)), (RETIRING, 12345, u32::MAX));
        assert_eq!(freed(r), pack(FREE, 12345, 0));
        let c = claimed(freed(r), 7);
        assert_eq!((state(c), generation(c), pid(c)), (JOINING, 12346, 7));
    }

    #[test]
    fn generation_wraps_within_its_bits() {
        let last = pack(FREE, (1 << GENERATION_BITS) - 1, 0);
        let c = claimed(last, 9);
        assert_eq!((state(c), generation(c), pid(c)), (JOINING, 0, 9));
    }
}
