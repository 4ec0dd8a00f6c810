//! The buffer stamp: `tag (47 bits) | WRITING (1 bit) | held (16 bits)` in one `u64`.
//!
//! See the module docs of [`crate::ring`] for the transitions.

/// Bits of the held count.
pub const HELD_BITS: u32 = 16;
/// Mask of the held count.
pub const HELD_MASK: u64 = (1 << HELD_BITS) - 1;
/// Set while the producer writes the buffer.
pub const WRITING: u64 = 1 << HELD_BITS;
/// Shift of the tag.
pub const TAG_SHIFT: u32 = HELD_BITS + 1;
/// Bits of the tag.
pub const TAG_BITS: u32 = 64 - TAG_SHIFT;
/// Mask of the tag (after shifting down).
pub const TAG_MASK: u64 = (1 << TAG_BITS) - 1;
/// Held counts this large cannot occur: the consumer table is smaller.
pub const MAX_CONSUMERS: u32 = 4096;

/// The tag of sequence number `seq`.
#[inline]
pub fn tag_of(seq: u64) -> u64 {
    seq & TAG_MASK
}

/// A stamp that says "message `seq` is ready, held by `held` consumers".
#[inline]
pub fn ready(seq: u64, held: u64) -> u64 {
    debug_assert!(held <= HELD_MASK);
    (tag_of(seq) << TAG_SHIFT) | held
}

/// A stamp that says "the producer is writing message `seq`".
#[inline]
pub fn writing(seq: u64) -> u64 {
    (tag_of(seq) << TAG_SHIFT) | WRITING
}

/// Buffer `buffer`'s stamp in a new ring of `buffers` buffers: message `buffer - buffers`
/// (before the first, so no cursor ever names it), ready and held by no one.
#[inline]
pub fn initial(buffer: u32, buffers: u32) -> u64 {
    ready((buffer as u64).wrapping_sub(buffers as u64), 0)
}

/// The stamp's tag.
#[inline]
pub fn tag(stamp: u64) -> u64 {
    stamp >> TAG_SHIFT
}

/// Whether the producer is writing the buffer.
#[inline]
pub fn is_writing(stamp: u64) -> bool {
    stamp & WRITING != 0
}

/// The held count.
#[inline]
pub fn held(stamp: u64) -> u64 {
    stamp & HELD_MASK
}

/// `tag - tag_of(seq)` as a signed number, wrapping in 47 bits: negative means the buffer holds an
/// older message than `seq`, zero the same one, positive a newer one.
#[inline]
pub fn tag_diff(tag: u64, seq: u64) -> i64 {
    let d = tag.wrapping_sub(tag_of(seq)) & TAG_MASK;
    // Sign-extend the 47-bit difference.
    ((d << TAG_SHIFT) as i64) >> TAG_SHIFT
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_round_trip() {
        let s = ready(12345, 7);
        assert_eq!(tag(s), 12345);
        assert_eq!(held(s), 7);
        assert!(!is_writing(s));
        let w = writing(99);
        assert_eq!(tag(w), 99);
        assert!(is_writing(w));
        assert_eq!(held(w), 0);
    }

    #[test]
    fn diff_wraps() {
        assert_eq!(tag_diff(tag_of(10), 10), 0);
        assert_eq!(tag_diff(tag_of(10), 12), -2);
        assert_eq!(tag_diff(tag_of(12), 10), 2);
        let big = (1u64 << 47) + 5; // wraps to tag 5
        assert_eq!(tag_diff(tag_of(big), big - 7), 7);
        assert_eq!(tag_diff(tag_of(big - 7), big), -7);
    }

    #[test]
    fn initial_is_one_lap_back() {
        let cap = 8;
        for i in 0..cap {
            let s = initial(i, cap);
            assert_eq!(tag_diff(tag(s), i as u64), -(cap as i64));
            assert_eq!(held(s), 0);
        }
    }
}
