//! The payload a VMM producer's fd server sends with its pools' file descriptors
//! (`crate::shm::fdpass`), and the checks a consumer makes on it. Little-endian:
//!
//! ```text
//! magic  b"GRV1"
//! epoch  u64          the ring instance the fds belong to
//! count  u32          entries, equal to the number of fds that came with the message
//! count x { pool: u32, generation: u32, size: u64 }   entry i describes fd i
//! ```
//!
//! Nothing received is trusted: [`decode`] checks the shape, and the consumer then checks each
//! entry against the segment's pool table and the driver's view of the fd before it maps
//! anything.

use crate::format::GPU_POOLS;

const MAGIC: &[u8; 4] = b"GRV1";
const HEAD: usize = 4 + 8 + 4;
const ENTRY: usize = 4 + 4 + 8;

/// One offered pool: the pool table entry its fd is for, in which generation, of what size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OfferedPool {
    /// Pool table index.
    pub pool: u32,
    /// The entry's generation when the fd was offered.
    pub generation: u32,
    /// Bytes of the allocation the consumer may map.
    pub size: u64,
}

/// The payload for `pools` of ring instance `epoch`, in fd order.
pub fn encode(epoch: u64, pools: &[OfferedPool]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEAD + ENTRY * pools.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&epoch.to_le_bytes());
    out.extend_from_slice(&(pools.len() as u32).to_le_bytes());
    for p in pools {
        out.extend_from_slice(&p.pool.to_le_bytes());
        out.extend_from_slice(&p.generation.to_le_bytes());
        out.extend_from_slice(&p.size.to_le_bytes());
    }
    out
}

/// Decodes a payload that came with `fds` descriptors, for ring instance `epoch`: the magic,
/// the epoch, a count equal to `fds` (at most one per pool table entry), the exact length, and
/// pool indices inside the table, each at most once. Returns the entries in fd order, or the
/// first thing that is wrong.
pub fn decode(bytes: &[u8], fds: usize, epoch: u64) -> Result<Vec<OfferedPool>, &'static str> {
    if bytes.len() < HEAD || &bytes[..4] != MAGIC {
        return Err("not a gpuring VMM offer");
    }
    let u32_at = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"));
    let u64_at = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
    if u64_at(4) != epoch {
        return Err("the offer is for another instance of the ring");
    }
    let count = u32_at(12) as usize;
    if count != fds || count > GPU_POOLS {
        return Err("the offer's count does not match the fds received");
    }
    if bytes.len() != HEAD + ENTRY * count {
        return Err("the offer's length does not match its count");
    }
    let mut seen = [false; GPU_POOLS];
    (0..count)
        .map(|i| {
            let at = HEAD + ENTRY * i;
            let p =
                OfferedPool { pool: u32_at(at), generation: u32_at(at + 4), size: u64_at(at + 8) };
            let index = p.pool as usize;
            if index >= GPU_POOLS || std::mem::replace(&mut seen[index], true) {
                return Err("the offer names a pool outside the table, or one twice");
            }
            Ok(p)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn pools() -> Vec<OfferedPool> {
        vec![
            OfferedPool { pool: 0, generation: 1, size: 2 << 20 },
            OfferedPool { pool: 3, generation: 2, size: 64 << 20 },
        ]
    }

    #[test]
    fn round_trips() {
        let bytes = encode(42, &pools());
        assert_eq!(decode(&bytes, 2, 42), Ok(pools()));
        assert_eq!(decode(&encode(7, &[]), 0, 7), Ok(vec![]));
    }

    #[test]
    fn each_wrong_field_is_refused() {
        let good = encode(42, &pools());
        assert!(decode(&good, 2, 43).is_err(), "another epoch");
        assert!(decode(&good, 1, 42).is_err(), "fewer fds than entries");
        assert!(decode(&good, 3, 42).is_err(), "more fds than entries");
        assert!(decode(&good[..good.len() - 1], 2, 42).is_err(), "short");
        let mut long = good.clone();
        long.push(0);
        assert!(decode(&long, 2, 42).is_err(), "long");
        let mut magic = good.clone();
        magic[0] = b'X';
        assert!(decode(&magic, 2, 42).is_err(), "magic");
        let twice = encode(42, &[pools()[0], pools()[0]]);
        assert!(decode(&twice, 2, 42).is_err(), "a pool twice");
        let outside = encode(42, &[OfferedPool { pool: GPU_POOLS as u32, ..pools()[0] }]);
        assert!(decode(&outside, 1, 42).is_err(), "outside the table");
    }

    proptest! {
        /// Whatever bytes arrive, an accepted offer has one entry per fd, in the table, each
        /// pool once.
        #[test]
        fn accepted_offers_are_well_formed(
            bytes in proptest::collection::vec(any::<u8>(), 0..200), fds in 0usize..40,
        ) {
            if let Ok(entries) = decode(&bytes, fds, u64::from_le_bytes(
                bytes.get(4..12).and_then(|b| b.try_into().ok()).unwrap_or([0; 8]))) {
                prop_assert_eq!(entries.len(), fds);
                let mut idx: Vec<u32> = entries.iter().map(|e| e.pool).collect();
                prop_assert!(idx.iter().all(|&p| (p as usize) < GPU_POOLS));
                idx.sort_unstable();
                idx.dedup();
                prop_assert_eq!(idx.len(), fds);
            }
        }

        #[test]
        fn encoded_offers_decode(entries in proptest::collection::vec(
            (0u32..GPU_POOLS as u32, any::<u32>(), any::<u64>()), 0..8), epoch in any::<u64>()) {
            let mut seen = std::collections::HashSet::new();
            let pools: Vec<OfferedPool> = entries.into_iter()
                .filter(|e| seen.insert(e.0))
                .map(|(pool, generation, size)| OfferedPool { pool, generation, size })
                .collect();
            prop_assert_eq!(decode(&encode(epoch, &pools), pools.len(), epoch), Ok(pools));
        }
    }
}
