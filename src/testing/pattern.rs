//! The deterministic test pattern that tests, examples and benches write and check.
//!
//! Byte `i` of message `seq` is byte `i % 8` (little-endian) of the word
//! `seq * 0x9E3779B97F4A7C15 + (i / 8)`. Every byte depends on the sequence number, so a torn,
//! stale or misplaced message is caught; the CUDA kernels compute the same function.

const MUL: u64 = 0x9E37_79B9_7F4A_7C15;

#[inline]
fn word(seq: u64, j: u64) -> u64 {
    seq.wrapping_mul(MUL).wrapping_add(j)
}

/// Fills `buf` with message `seq`'s pattern.
///
/// ```
/// let mut buf = vec![0u8; 100];
/// gpuring::testing::pattern::fill(&mut buf, 7);
/// assert_eq!(gpuring::testing::pattern::mismatches(&buf, 7), 0);
/// ```
pub fn fill(buf: &mut [u8], seq: u64) {
    let j = (buf.len() / 8) as u64;
    let mut chunks = buf.chunks_exact_mut(8);
    for (j, c) in (&mut chunks).enumerate() {
        c.copy_from_slice(&word(seq, j as u64).to_le_bytes());
    }
    let rem = chunks.into_remainder();
    let n = rem.len();
    rem.copy_from_slice(&word(seq, j).to_le_bytes()[..n]);
}

/// Counts the bytes of `buf` that differ from message `seq`'s pattern.
///
/// ```
/// use gpuring::testing::pattern::{fill, mismatches};
///
/// let mut buf = vec![0u8; 64];
/// fill(&mut buf, 7);
/// buf[10] ^= 1; // damage one byte
/// assert_eq!(mismatches(&buf, 7), 1);
/// assert!(mismatches(&buf, 8) > 0); // another message's pattern
/// ```
pub fn mismatches(buf: &[u8], seq: u64) -> u64 {
    let mut bad = 0u64;
    let mut chunks = buf.chunks_exact(8);
    for (j, c) in (&mut chunks).enumerate() {
        let want = word(seq, j as u64).to_le_bytes();
        if c != want {
            bad += c.iter().zip(want).filter(|(a, b)| **a != *b).count() as u64;
        }
    }
    let j = (buf.len() / 8) as u64;
    let rem = chunks.remainder();
    let want = word(seq, j).to_le_bytes();
    bad + rem.iter().zip(want).filter(|(a, b)| **a != *b).count() as u64
}

/// A message length between `min` and `max` (inclusive) derived from `seq`, for tests that
/// vary lengths.
///
/// ```
/// for seq in 0..100 {
///     let len = gpuring::testing::pattern::len_for(seq, 16, 64);
///     assert!((16..=64).contains(&len));
/// }
/// ```
pub fn len_for(seq: u64, min: usize, max: usize) -> usize {
    let span = (max - min + 1) as u64;
    min + (seq.wrapping_mul(MUL) >> 33) as usize % span as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fill_then_check() {
        for len in [0, 1, 7, 8, 9, 100, 4096] {
            let mut b = vec![0u8; len];
            fill(&mut b, 42);
            assert_eq!(mismatches(&b, 42), 0);
            if len > 0 {
                assert!(mismatches(&b, 43) > 0);
                b[len - 1] ^= 1;
                assert_eq!(mismatches(&b, 42), 1);
            }
        }
    }
}
