//! The shared structures a CUDA-memory segment adds to the host layout, and the checks a
//! consumer makes on them before it forms a device pointer.
//!
//! * a [`GpuHeader`]: the producer's device, how GPU work is fenced and how memory is shared;
//! * a pool table: which device allocations carry payload (legacy sharing: by IPC handle; VMM:
//!   the handles stay zero and the fds come from the producer's server);
//! * per buffer, a [`GpuSlotLine`]: the message's descriptor (pool, offset), and its ready
//!   fence (events: the 64-byte handle of its ready event; memory words: its ready word);
//! * per consumer and buffer, a [`ConsumerSlot`]: that consumer's release fence (event handle
//!   or release words) and the sequence number it last released there, so the producer waits
//!   only for the consumers that read a buffer's previous message.
//!
//! Like every shared structure, all fields are atomics; handles are stored as eight `u64`s.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use crate::error::Corruption;

/// Entries in the pool table.
pub const MAX_POOLS: usize = crate::format::GPU_POOLS;

/// A 64-byte IPC handle as eight atomics.
#[repr(C)]
pub struct Handle64 {
    words: [AtomicU64; 8],
}

impl Handle64 {
    /// Stores `bytes` (Relaxed: published by the Release store that makes the owner visible).
    pub fn store(&self, bytes: &[u8; 64]) {
        for (w, chunk) in self.words.iter().zip(bytes.chunks_exact(8)) {
            w.store(u64::from_le_bytes(chunk.try_into().expect("8 bytes")), Ordering::Relaxed);
        }
    }

    /// Loads the bytes (Relaxed: the caller acquired the owner's publication first).
    pub fn load(&self) -> [u8; 64] {
        let mut out = [0u8; 64];
        for (w, chunk) in self.words.iter().zip(out.chunks_exact_mut(8)) {
            chunk.copy_from_slice(&w.load(Ordering::Relaxed).to_le_bytes());
        }
        out
    }
}

/// Ring-wide CUDA state, one line after the user headers.
#[repr(C, align(128))]
pub struct GpuHeader {
    /// UUID of the producer's device (two little-endian halves). Written before `magic`.
    pub device_uuid: [AtomicU64; 2],
    /// How GPU work is ordered across processes: a [`fence_kind`]. Written before `magic`.
    pub fence: AtomicU32,
    /// Zero. (Before layout 10, the pool that held device-memory fence words.)
    pub reserved: AtomicU32,
    /// How the pools and fences reach consumers: a [`sharing_kind`]. Written before `magic`.
    pub sharing: AtomicU32,
}

/// Values of [`GpuHeader::sharing`].
pub mod sharing_kind {
    /// Legacy CUDA IPC: pool handles in the pool table; fences of either kind.
    pub const LEGACY: u32 = 1;
    /// VMM: `cuMemCreate` pools handed out as file descriptors by the producer's fd server
    /// (`crate::shm::fdpass`); fences always [`super::fence_kind::MEMORY`]. No IPC handle
    /// anywhere: the `Handle64` fields stay zero.
    pub const VMM: u32 = 2;
}

/// Values of [`GpuHeader::fence`].
pub mod fence_kind {
    /// Interprocess events (legacy sharing only): the handles in [`super::GpuSlotLine`] and
    /// [`super::ConsumerSlot`].
    pub const EVENTS: u32 = 1;
    /// Sequence words in this segment ([`super::GpuSlotLine::ready_done`],
    /// [`super::ConsumerSlot::release_done`]), which every process page-locks for its device:
    /// `cuStreamWriteValue64` after the work, `cuStreamWaitValue64` before the dependent work,
    /// plain loads on the CPU. No event handle is made. Since layout 10 for both sharing kinds.
    pub const MEMORY: u32 = 2;
}

/// Loads a UUID kept as two little-endian halves.
pub fn load_uuid(words: &[AtomicU64; 2]) -> [u8; 16] {
    let mut out = [0u8; 16];
    for (i, w) in words.iter().enumerate() {
        // Relaxed: written before a Release store (`magic`, a pool's `state`) the reader
        // acquired.
        out[8 * i..8 * i + 8].copy_from_slice(&w.load(Ordering::Relaxed).to_le_bytes());
    }
    out
}

/// Stores a UUID as two little-endian halves.
pub fn store_uuid(words: &[AtomicU64; 2], uuid: [u8; 16]) {
    for (i, w) in words.iter().enumerate() {
        let half = u64::from_le_bytes(uuid[8 * i..8 * i + 8].try_into().expect("8 bytes"));
        // Relaxed: published by a later Release store (`magic`, the pool's `state`).
        w.store(half, Ordering::Relaxed);
    }
}

/// Pool table entry states.
pub mod pool_state {
    /// Unused.
    pub const EMPTY: u32 = 0;
    /// Holds a live allocation.
    pub const LIVE: u32 = 1;
}

/// One device allocation that messages may point into.
#[repr(C, align(128))]
pub struct PoolEntry {
    /// [`pool_state`]; set LIVE with Release after the other fields.
    pub state: AtomicU32,
    /// Bumped each time the entry is reused, so a consumer's cache (keyed by index and
    /// generation) never maps a new allocation through an old handle.
    pub generation: AtomicU32,
    /// Bytes in the allocation.
    pub size: AtomicU64,
    /// UUID of the device that owns it (two little-endian halves).
    pub device_uuid: [AtomicU64; 2],
    /// Its `cuIpcGetMemHandle` handle (legacy sharing; zero with VMM).
    pub handle: Handle64,
}

/// A slot's descriptor and ready event.
#[repr(C, align(128))]
pub struct GpuSlotLine {
    /// Pool table index of the message's memory. Written before the publish (Release) store of
    /// the slot's stamp; read after the pin (Acquire).
    pub pool: AtomicU32,
    /// Generation of that pool entry when the message was published.
    pub pool_generation: AtomicU32,
    /// Byte offset of the message in the pool.
    pub offset: AtomicU64,
    /// The slot's ready event: recorded by the producer on its stream at publish. Written once
    /// when the segment is built. Event fences only (zero with memory fences).
    pub ready_event: Handle64,
    /// Memory fences: `seq + 1` of the last message in this buffer whose writes are complete,
    /// written by the producer's GPU (`cuStreamWriteValue64`, after the writes, with a
    /// system-wide memory barrier) and polled by the CPU of both sides, or waited on by a
    /// consumer's GPU (`cuStreamWaitValue64`, greater or equal, cyclically: see
    /// `driver::stream_wait_value64`). Only grows while one producer owns the segment.
    pub ready_done: AtomicU64,
}

/// One consumer's state for one slot.
#[repr(C, align(128))]
pub struct ConsumerSlot {
    /// `seq + 1` of the message this consumer last released in this slot (0: none). Stored with
    /// Release after the release event was recorded.
    pub released: AtomicU64,
    /// The consumer table entry's generation (see `ring::lease`) when its occupant wrote
    /// `release_event`, while JOINING. Stored with Release after the handle; the producer opens
    /// the handle only for an ACTIVE entry of that generation, and keys its import by it.
    pub generation: AtomicU32,
    /// The consumer's release event for this slot, recorded on its stream at release. Written
    /// when the consumer joins. Event fences only (zero with memory fences).
    pub release_event: Handle64,
    /// Memory fences: what this consumer's GPU writes (`cuStreamWriteValue64`) after its reads
    /// of a message in this buffer: [`release_value`]`(generation, seq)`, its entry's
    /// generation as a tag over `seq + 1`. The producer polls it on the CPU and counts it only
    /// with the tag of the lease it saw ([`released_by`]). Two banks: an occupant of generation
    /// `g` uses bank [`release_bank`]`(g)` only, and zeroes it while JOINING. A write that a dead
    /// former occupant queued and its GPU runs late (after the reap: an MPS server may tear a
    /// dead client down after the kernel reports it gone) carries the old tag, so it never
    /// counts as the new occupant's release (no buffer is reused early); in the other bank it
    /// cannot even hide one. (Only an occupant of the same parity shares the bank; its write
    /// would have to survive two reaps, and could then delay the producer, never hurry it.)
    pub release_done: [AtomicU64; 2],
}

/// Bits of a release word that carry `seq + 1`; the tag is above them.
const RELEASE_SEQ_BITS: u32 = 48;
const RELEASE_SEQ_MASK: u64 = (1 << RELEASE_SEQ_BITS) - 1;

/// The release word a consumer of generation `generation` writes after reading message `seq`:
/// the generation's low 16 bits over `seq + 1` (modulo 2^48, some 9 years at a million
/// messages a second).
pub fn release_value(generation: u32, seq: u64) -> u64 {
    (u64::from(generation & 0xFFFF) << RELEASE_SEQ_BITS) | ((seq + 1) & RELEASE_SEQ_MASK)
}

/// Whether release word `word` says that the consumer of generation `generation` finished
/// reading message `seq` (or a later one in the same buffer): its tag, and `seq + 1` at least.
pub fn released_by(word: u64, generation: u32, seq: u64) -> bool {
    word >> RELEASE_SEQ_BITS == u64::from(generation & 0xFFFF)
        && word & RELEASE_SEQ_MASK >= (seq + 1) & RELEASE_SEQ_MASK
}

/// The bank of [`ConsumerSlot::release_done`] an occupant of generation `generation` uses.
pub fn release_bank(generation: u32) -> usize {
    (generation & 1) as usize
}

const _: () = {
    assert!(std::mem::size_of::<GpuHeader>() == 128);
    assert!(std::mem::size_of::<PoolEntry>() == 128);
    assert!(std::mem::size_of::<GpuSlotLine>() == 128);
    assert!(std::mem::size_of::<ConsumerSlot>() == 128);
};

/// A message's location, as read from a [`GpuSlotLine`] and checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Descriptor {
    /// Pool table index.
    pub pool: usize,
    /// Pool generation.
    pub generation: u32,
    /// Offset in the pool.
    pub offset: u64,
    /// Length.
    pub len: u64,
}

/// What a consumer knows about one pool it mapped: its generation and size when mapped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KnownPool {
    /// Generation at mapping time.
    pub generation: u32,
    /// Size at mapping time.
    pub size: u64,
}

/// Checks a descriptor read from shared memory against what this consumer mapped: the pool
/// index is in the table and mapped by us in the same generation, and `offset + len` lies
/// inside it (without overflow). Only then may a device pointer be formed.
pub fn check_descriptor(
    pool: u32,
    generation: u32,
    offset: u64,
    len: u64,
    known: &[Option<KnownPool>],
) -> Result<Descriptor, Corruption> {
    let bad = |field, value| Err(Corruption::Field { field, value });
    let index = pool as usize;
    if index >= MAX_POOLS || index >= known.len() {
        return bad("descriptor.pool", pool as u64);
    }
    let Some(k) = known[index] else { return bad("descriptor.pool", pool as u64) };
    if k.generation != generation {
        return bad("descriptor.pool_generation", generation as u64);
    }
    match offset.checked_add(len) {
        Some(end) if end <= k.size => {}
        _ => return bad("descriptor.offset", offset),
    }
    Ok(Descriptor { pool: index, generation, offset, len })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn release_words_count_only_for_their_occupant() {
        let w = release_value(7, 41);
        assert!(released_by(w, 7, 41));
        assert!(released_by(w, 7, 40), "a later message's release covers an earlier one");
        assert!(!released_by(w, 7, 42), "not yet read");
        assert!(!released_by(w, 8, 41), "another occupant's word");
        assert!(!released_by(w, 5, 41), "an earlier occupant's word");
        assert!(!released_by(0, 7, 0), "a zeroed word");
        assert!(released_by(release_value(0x1_0007, 3), 0x2_0007, 3), "16-bit tags");
    }

    #[test]
    fn handles_round_trip() {
        let h = Handle64 { words: Default::default() };
        let mut b = [0u8; 64];
        b.iter_mut().enumerate().for_each(|(i, x)| *x = i as u8 * 3);
        h.store(&b);
        assert_eq!(h.load(), b);
    }

    fn known() -> Vec<Option<KnownPool>> {
        let mut k = vec![None; MAX_POOLS];
        k[0] = Some(KnownPool { generation: 1, size: 1 << 21 });
        k[3] = Some(KnownPool { generation: 7, size: 4096 });
        k
    }

    #[test]
    fn descriptor_cases() {
        let k = known();
        assert!(check_descriptor(0, 1, 0, 1 << 21, &k).is_ok());
        assert!(check_descriptor(3, 7, 4000, 96, &k).is_ok());
        assert!(check_descriptor(3, 7, 4000, 97, &k).is_err()); // past the end
        assert!(check_descriptor(3, 6, 0, 1, &k).is_err()); // stale generation
        assert!(check_descriptor(1, 0, 0, 1, &k).is_err()); // not mapped
        assert!(check_descriptor(99, 1, 0, 1, &k).is_err()); // outside the table
        assert!(check_descriptor(0, 1, u64::MAX, 2, &k).is_err()); // overflow
    }

    proptest! {
        /// Whatever the shared memory says, an accepted descriptor lies inside a pool we mapped
        /// in the same generation.
        #[test]
        fn accepted_descriptors_are_in_bounds(
            pool in 0u32..40, generation in 0u32..10, offset in any::<u64>(), len in any::<u64>(),
        ) {
            let k = known();
            if let Ok(d) = check_descriptor(pool, generation, offset, len, &k) {
                let kp = k[d.pool].unwrap();
                prop_assert_eq!(kp.generation, generation);
                prop_assert!(d.offset.checked_add(d.len).is_some_and(|end| end <= kp.size));
            }
        }

        #[test]
        fn small_in_range_descriptors_are_accepted(offset in 0u64..4096, len in 0u64..4096) {
            let k = known();
            let ok = check_descriptor(3, 7, offset, len, &k).is_ok();
            prop_assert_eq!(ok, offset + len <= 4096);
        }
    }
}
