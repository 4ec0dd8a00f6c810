//! What travels with each message on the Zenoh key: the payload is the message's bytes, and
//! the attachment is this header, little-endian:
//!
//! | off | size | field |
//! |---|---|---|
//! | 0 | 4 | magic `GRZ1` |
//! | 4 | 2 | version (2) |
//! | 6 | 1 | the source ring's memory kind (0 host, 1 CUDA) |
//! | 7 | 1 | its policy (0 block, 1 overwrite) |
//! | 8 | 8 | its epoch (a new one when it restarts) |
//! | 16 | 8 | the message's sequence number in the source ring |
//! | 24 | 8 | its timestamp there (CLOCK_MONOTONIC of the source host, ns) |
//! | 32 | 4 | the ring's capacity |
//! | 36 | 4 | its user header size |
//! | 40 | 8 | its slot size |
//! | 48 | 8 | the exporter's id (random, per exporter process: acknowledgements name it) |
//! | 56 | 8 | the message's index among the exporter's messages (1, 2, ...: acknowledgements give the highest handled) |
//! | 64 | user header size | the message's user header |
//!
//! The geometry rides on every message (40 bytes), so an importer that starts mid-stream
//! builds a ring like the source at once. An importer trusts nothing here: [`decode`] checks
//! every field against the ring format's limits and the payload against the slot size.

use crate::format::Params;
use crate::{MemoryKind, Policy};

const MAGIC: [u8; 4] = *b"GRZ1";
const VERSION: u16 = 2;
/// Bytes before the user header.
pub(crate) const FIXED: usize = 64;
/// The longest attachment: the fixed part and the largest user header.
pub(crate) const MAX_LEN: usize = FIXED + Params::MAX_USER_HEADER as usize;

/// The source ring's shape, which an importer's ring copies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Geometry {
    pub(crate) memory: MemoryKind,
    pub(crate) policy: Policy,
    pub(crate) capacity: u32,
    pub(crate) user_header_size: u32,
    pub(crate) slot_size: u64,
}

/// One message's header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Header {
    pub(crate) geometry: Geometry,
    pub(crate) exporter: u64,
    /// Its index among the exporter's messages (1 for the first).
    pub(crate) index: u64,
    pub(crate) epoch: u64,
    pub(crate) seq: u64,
    pub(crate) timestamp_ns: u64,
    pub(crate) user_header: Vec<u8>,
}

/// Why an attachment was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum WireError {
    /// Shorter than its fixed part, or than its user header.
    Short(usize),
    /// Not a gpuring bridge message.
    Magic([u8; 4]),
    /// Another version of this format.
    Version(u16),
    /// A field out of the ring format's range.
    Field(&'static str, u64),
    /// The payload does not fit the slot size it claims.
    Payload { len: usize, slot_size: u64 },
}

impl std::fmt::Display for WireError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WireError::Short(n) => write!(f, "attachment of {n} bytes is too short"),
            WireError::Magic(m) => write!(f, "not a gpuring bridge message (magic {m:02x?})"),
            WireError::Version(v) => {
                write!(f, "bridge format version {v}, this library reads {VERSION}")
            }
            WireError::Field(name, v) => write!(f, "{name} {v} is out of range"),
            WireError::Payload { len, slot_size } => {
                write!(f, "payload of {len} bytes exceeds the slot size {slot_size}")
            }
        }
    }
}

impl std::error::Error for WireError {}

/// The attachment of message `h`.
pub(crate) fn encode(h: &Header) -> Vec<u8> {
    let g = &h.geometry;
    let mut out = Vec::with_capacity(FIXED + h.user_header.len());
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.push(match g.memory {
        MemoryKind::Host => 0,
        MemoryKind::Cuda => 1,
    });
    out.push(match g.policy {
        Policy::Block => 0,
        Policy::Overwrite => 1,
    });
    for v in [h.epoch, h.seq, h.timestamp_ns] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    out.extend_from_slice(&g.capacity.to_le_bytes());
    out.extend_from_slice(&g.user_header_size.to_le_bytes());
    out.extend_from_slice(&g.slot_size.to_le_bytes());
    out.extend_from_slice(&h.exporter.to_le_bytes());
    out.extend_from_slice(&h.index.to_le_bytes());
    out.extend_from_slice(&h.user_header);
    out
}

/// Reads and checks an attachment, for a payload of `payload_len` bytes.
pub(crate) fn decode(a: &[u8], payload_len: usize) -> Result<Header, WireError> {
    if a.len() < FIXED {
        return Err(WireError::Short(a.len()));
    }
    let u16_at = |o: usize| u16::from_le_bytes([a[o], a[o + 1]]);
    let u32_at = |o: usize| u32::from_le_bytes(a[o..o + 4].try_into().expect("4 bytes"));
    let u64_at = |o: usize| u64::from_le_bytes(a[o..o + 8].try_into().expect("8 bytes"));
    let magic: [u8; 4] = a[0..4].try_into().expect("4 bytes");
    if magic != MAGIC {
        return Err(WireError::Magic(magic));
    }
    if u16_at(4) != VERSION {
        return Err(WireError::Version(u16_at(4)));
    }
    let memory = match a[6] {
        0 => MemoryKind::Host,
        1 => MemoryKind::Cuda,
        m => return Err(WireError::Field("memory kind", m as u64)),
    };
    let policy = match a[7] {
        0 => Policy::Block,
        1 => Policy::Overwrite,
        p => return Err(WireError::Field("policy", p as u64)),
    };
    let (capacity, user_header_size, slot_size) = (u32_at(32), u32_at(36), u64_at(40));
    if capacity == 0 || capacity > Params::MAX_CAPACITY {
        return Err(WireError::Field("capacity", capacity as u64));
    }
    if user_header_size > Params::MAX_USER_HEADER {
        return Err(WireError::Field("user header size", user_header_size as u64));
    }
    if slot_size == 0 || slot_size > Params::MAX_SLOT_SIZE {
        return Err(WireError::Field("slot size", slot_size));
    }
    if a.len() != FIXED + user_header_size as usize {
        return Err(WireError::Short(a.len()));
    }
    if payload_len as u64 > slot_size {
        return Err(WireError::Payload { len: payload_len, slot_size });
    }
    // The importer expects `seq + 1` next.
    if u64_at(16) == u64::MAX {
        return Err(WireError::Field("sequence number", u64::MAX));
    }
    let geometry = Geometry { memory, policy, capacity, user_header_size, slot_size };
    Ok(Header {
        geometry,
        exporter: u64_at(48),
        index: u64_at(56),
        epoch: u64_at(8),
        seq: u64_at(16),
        timestamp_ns: u64_at(24),
        user_header: a[FIXED..].to_vec(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header() -> Header {
        let geometry = Geometry {
            memory: MemoryKind::Cuda,
            policy: Policy::Overwrite,
            capacity: 8,
            user_header_size: 3,
            slot_size: 1 << 20,
        };
        let user_header = vec![1, 2, 3];
        Header { geometry, exporter: 5, index: 3, epoch: 7, seq: 42, timestamp_ns: 99, user_header }
    }

    #[test]
    fn a_header_survives_the_trip() {
        let h = header();
        assert_eq!(decode(&encode(&h), 1 << 20), Ok(h));
    }

    #[test]
    fn hostile_attachments_are_refused() {
        let good = encode(&header());
        assert_eq!(decode(&good[..10], 0), Err(WireError::Short(10)));
        assert_eq!(decode(&good[..good.len() - 1], 0), Err(WireError::Short(good.len() - 1)));
        let mut bad = good.clone();
        bad[0] = b'X';
        assert!(matches!(decode(&bad, 0), Err(WireError::Magic(_))));
        let mut bad = good.clone();
        bad[4] = 9;
        assert_eq!(decode(&bad, 0), Err(WireError::Version(9)));
        let mut bad = good.clone();
        bad[6] = 5;
        assert_eq!(decode(&bad, 0), Err(WireError::Field("memory kind", 5)));
        let mut bad = good.clone();
        bad[32..36].copy_from_slice(&0u32.to_le_bytes());
        assert_eq!(decode(&bad, 0), Err(WireError::Field("capacity", 0)));
        let mut bad = good.clone();
        bad[40..48].copy_from_slice(&u64::MAX.to_le_bytes());
        assert_eq!(decode(&bad, 0), Err(WireError::Field("slot size", u64::MAX)));
        let mut bad = good.clone();
        bad[36..40].copy_from_slice(&(u32::MAX).to_le_bytes());
        assert!(matches!(decode(&bad, 0), Err(WireError::Field("user header size", _))));
        let mut bad = good.clone();
        bad[16..24].copy_from_slice(&u64::MAX.to_le_bytes());
        assert_eq!(decode(&bad, 0), Err(WireError::Field("sequence number", u64::MAX)));
        assert_eq!(
            decode(&good, (1 << 20) + 1),
            Err(WireError::Payload { len: (1 << 20) + 1, slot_size: 1 << 20 })
        );
    }
}
