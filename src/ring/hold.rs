//! Hold records: which message each consumer pins in each buffer, so that the buffers a dead
//! consumer held can be given back (see [`super::reclaim`](mod@super::reclaim)).
//!
//! Consumer `e`'s record for buffer `b` is `Ring::holds[e * hold_stride + b]`, written only by
//! consumer `e`. It is `0` (nothing) or `seq << 2 | state`:
//!
//! ```text
//! pin of seq c:     record = PINNING(c) -> CAS held + 1 (AcqRel) -> record = HELD(c)
//! release of c:     record = RELEASING(c) -> CAS held - 1 (Release) -> record = 0
//! ```
//!
//! A consumer can die between any two steps, so a dead consumer's record alone cannot say
//! whether its CAS happened. The reclaimer does not need to know: it recounts the buffer's holders
//! from the records of the consumers that are alive (see [`super::reclaim`](mod@super::reclaim)).

/// The consumer is about to pin (its CAS may or may not have happened).
pub const PINNING: u64 = 1;
/// The consumer holds the message.
pub const HELD: u64 = 2;
/// The consumer is releasing (its CAS may or may not have happened).
pub const RELEASING: u64 = 3;

/// A record for message `seq` in `state`.
#[inline]
pub fn record(seq: u64, state: u64) -> u64 {
    debug_assert!((1..=3).contains(&state));
    (seq << 2) | state
}

/// The record's state (0: nothing).
#[inline]
pub fn state(record: u64) -> u64 {
    record & 3
}

/// The record's sequence number.
#[inline]
pub fn seq(record: u64) -> u64 {
    record >> 2
}

/// Words per consumer: the buffer count rounded up to 16, so each consumer's records start on
/// their own 128-byte line.
#[inline]
pub fn stride(buffers: usize) -> usize {
    buffers.div_ceil(16) * 16
}
