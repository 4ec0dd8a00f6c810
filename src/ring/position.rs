//! The position word: which buffer carries the message at a ring position.
//!
//! The ring has `capacity` positions and `capacity + spares` buffers. Message `s` sits at
//! position `s % capacity`; its position word names the message's tag and the buffer it was
//! written to, in one `u64`:
//!
//! ```text
//!  63                                 17 16              0
//! +-------------------------------------+-----------------+
//! |  tag: sequence number mod 2^47      |  buffer index   |
//! +-------------------------------------+-----------------+
//! ```
//!
//! Only the producer writes position words, with Release, after the buffer's publish: a
//! consumer that Acquire-loads a word naming message `s` finds the buffer's stamp at `READY(s)`
//! or later. Position `p` starts naming buffer `p` with that buffer's initial tag
//! (`p - buffers`, before the first message), so a consumer sees "nothing yet" there until the
//! first lap is published.

use super::stamp::{tag_of, TAG_MASK};

/// Bits of the buffer index.
pub const BUFFER_BITS: u32 = 17;
/// Mask of the buffer index.
pub const BUFFER_MASK: u64 = (1 << BUFFER_BITS) - 1;
/// Most buffers a ring can have (capacity plus spares), so that an index fits.
pub const MAX_BUFFERS: u32 = 1 << 16;

/// A position word: message `seq` is in buffer `buffer`.
#[inline]
pub fn word(seq: u64, buffer: usize) -> u64 {
    debug_assert!((buffer as u64) <= BUFFER_MASK);
    (tag_of(seq) << BUFFER_BITS) | (buffer as u64 & BUFFER_MASK)
}

/// Position `position`'s word in a new ring of `buffers` buffers: buffer `position`, with the
/// tag that buffer's stamp starts with ([`super::stamp::initial`]), below every sequence number.
#[inline]
pub fn initial(position: u32, buffers: u32) -> u64 {
    word((position as u64).wrapping_sub(buffers as u64), position as usize)
}

/// The word's tag (compare with [`super::stamp::tag_diff`]).
#[inline]
pub fn tag(word: u64) -> u64 {
    (word >> BUFFER_BITS) & TAG_MASK
}

/// The word's buffer index. Not checked: it comes from shared memory, the caller compares it
/// with the buffer count.
#[inline]
pub fn buffer(word: u64) -> usize {
    (word & BUFFER_MASK) as usize
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ring::stamp::tag_diff;

    #[test]
    fn fields_round_trip() {
        let w = word(123_456_789, 70_000);
        assert_eq!(tag_diff(tag(w), 123_456_789), 0);
        assert_eq!(buffer(w), 70_000);
        let wrapped = word(u64::MAX - 3, 5);
        assert_eq!(tag_diff(tag(wrapped), 1), -5);
    }

    #[test]
    fn initial_names_its_own_buffer_before_the_first_message() {
        for p in 0..8 {
            let w = initial(p, 10);
            assert_eq!(tag_diff(tag(w), p as u64), -10);
            assert_eq!(buffer(w), p as usize);
            let st = crate::ring::stamp::initial(p, 10);
            assert_eq!(tag_diff(tag(w), crate::ring::stamp::tag(st)), 0);
        }
    }
}
