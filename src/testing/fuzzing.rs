//! Entry points for the fuzz targets in `fuzz/` (not part of the supported API).
//!
//! [`segment`] treats arbitrary bytes as a ring segment and does what the readers of a segment
//! do with it: check the header, join as a consumer, receive and release messages (reading
//! every payload and user-header byte), reclaim consumer entries as a producer would, claim and
//! publish, and check every CUDA descriptor. Whatever the bytes, this must return normally:
//! errors are fine; a panic, an out-of-bounds access or UB is a bug.
//!
//! [`bridge_message`] and [`vmm_offer`] do the same for what arrives over a network or a unix
//! socket: a bridge message's attachment, and a VMM producer's offer of its pools' fds.

use std::sync::atomic::Ordering;

use crate::format::{Header, Layout, MemoryKind, Params, MAGIC};
use crate::ring::{evict, reap, ConsumerCore, Leave, Mode, ProducerCore, Recount, StartAt};
use crate::shm::view::MappedRing;
use crate::shm::Segment;

/// Runs an importer's checks of a received bridge message over `data` (feature `zenoh`):
/// bytes 0..4 are the payload's length, the rest its attachment (the wire header), also read
/// as an acknowledgement; a header that decodes must encode to the same bytes, and its
/// geometry's allocation must be computed without overflow.
#[cfg(feature = "zenoh")]
pub fn bridge_message(data: &[u8]) {
    crate::bridge::fuzz_message(data);
}

/// Decodes a VMM offer (`format::offer`) as a consumer does over `data`: byte 0 is the number
/// of fds that came with it, bytes 1..9 the ring's epoch (little-endian), the rest the payload.
/// An accepted offer has one entry per fd, each pool inside the table and named once, and
/// encodes back to the payload's bytes; the same payload with one fd more or less, or for
/// another epoch, is refused. (VMM sharing is CUDA's: without the `cuda` feature there is no
/// offer to decode.)
#[cfg(feature = "cuda")]
pub fn vmm_offer(data: &[u8]) {
    use crate::format::{offer, GPU_POOLS};
    let Some((&fds, rest)) = data.split_first() else { return };
    let Some((epoch, payload)) = rest.split_first_chunk::<8>() else { return };
    let (fds, epoch) = (fds as usize, u64::from_le_bytes(*epoch));
    let Ok(pools) = offer::decode(payload, fds, epoch) else { return };
    assert_eq!(pools.len(), fds, "one entry per fd");
    let mut seen = [false; GPU_POOLS];
    for p in &pools {
        let index = p.pool as usize;
        assert!(index < GPU_POOLS && !seen[index], "each pool inside the table, once");
        seen[index] = true;
    }
    assert_eq!(offer::encode(epoch, &pools), payload, "an accepted offer encodes to its bytes");
    assert!(offer::decode(payload, fds + 1, epoch).is_err(), "one fd more is refused");
    assert!(fds == 0 || offer::decode(payload, fds - 1, epoch).is_err(), "one fd less too");
    assert!(offer::decode(payload, fds, epoch ^ 1).is_err(), "another epoch is refused");
}

/// Runs the readers of a segment over `data`.
pub fn segment(data: &[u8]) {
    let Ok(seg) = Segment::from_bytes(data) else { return };
    let Ok((params, layout)) = Params::read(seg.header(), seg.len() as u64) else { return };
    let map = MappedRing::new(seg, params, layout);
    let ring = map.ring();
    // The header's first bytes choose the mode, so the fuzzer reaches each one's pin path.
    let mode = [Mode::Queue, Mode::Latest, Mode::Lossless]
        [data.first().copied().unwrap_or(0) as usize % 3];
    let join = |joining: crate::ring::Joining| joining.activate(&ring, StartAt::Oldest, mode);
    if let Ok(Ok(core)) = ConsumerCore::claim(&ring, 1, 1).map(join) {
        let mut held = Vec::new();
        for _ in 0..(2 * params.capacity).min(64) {
            match core.try_pin(&ring) {
                Ok(Some((m, _))) => {
                    if m.len <= params.slot_size && params.memory_kind == MemoryKind::Host {
                        // SAFETY: pinned, and len <= slot_size: inside the buffer's payload.
                        let payload = unsafe {
                            std::slice::from_raw_parts(map.payload(m.buffer), m.len as usize)
                        };
                        std::hint::black_box(crate::testing::pattern::mismatches(payload, m.seq));
                    }
                    // SAFETY: the header region is `user_header_size` bytes in the mapping.
                    let header = unsafe {
                        std::slice::from_raw_parts(
                            map.user_header(m.buffer),
                            map.user_header_size(),
                        )
                    };
                    std::hint::black_box(header.iter().map(|b| *b as u64).sum::<u64>());
                    held.push(m.buffer);
                    if held.len() > 2 {
                        let _ = core.release(&ring, held.remove(0));
                    }
                }
                Ok(None) | Err(_) => break,
            }
        }
        for buffer in held {
            let _ = core.release(&ring, buffer);
        }
        core.leave(&ring, Leave::Free);
    }
    for entry in 0..ring.consumers.len().min(8) {
        let seen = ring.consumers[entry].lease.load(Ordering::Relaxed);
        let _ = evict(&ring, entry, seen, 1);
    }
    // Every owner taken for dead, then for alive: both paths of the reaper.
    let _ = reap(&ring, |_, _| false, |_, _| {}, Recount::Yes);
    let _ = reap(&ring, |_, _| true, |_, _| {}, Recount::No);
    let mut producer = ProducerCore::new(&ring);
    for _ in 0..4 {
        if producer.try_claim(&ring).is_err() {
            break;
        }
        producer.publish(&ring, 0, 0);
    }
    #[cfg(feature = "cuda")]
    if params.memory_kind == MemoryKind::Cuda {
        cuda_descriptors(&map);
    }
}

/// Checks every buffer's descriptor against the pool table as a consumer that mapped every live
/// pool (with the sizes the table claims) would.
#[cfg(feature = "cuda")]
fn cuda_descriptors(map: &MappedRing) {
    use crate::format::gpu::{check_descriptor, pool_state, KnownPool};
    let tables = map.gpu();
    let known: Vec<Option<KnownPool>> = tables
        .pools
        .iter()
        .map(|p| {
            // Relaxed: fuzzing reads; the checks are what matters.
            (p.state.load(Ordering::Relaxed) == pool_state::LIVE).then(|| KnownPool {
                generation: p.generation.load(Ordering::Relaxed),
                size: p.size.load(Ordering::Relaxed),
            })
        })
        .collect();
    for (line, buffer) in tables.buffers.iter().zip(map.ring().buffers) {
        let pool = line.pool.load(Ordering::Relaxed);
        let generation = line.pool_generation.load(Ordering::Relaxed);
        let offset = line.offset.load(Ordering::Relaxed);
        let len = buffer.len.load(Ordering::Relaxed);
        if let Ok(d) = check_descriptor(pool, generation, offset, len, &known) {
            let size = known[d.pool].expect("accepted: mapped").size;
            assert!(d.offset + d.len <= size, "accepted descriptor out of bounds");
        }
        std::hint::black_box(line.ready_event.load());
    }
}

/// A valid, empty segment of `kind` (for the fuzz corpus): the header as a producer writes it,
/// initial stamps and position words, nothing else.
pub fn sample_segment(kind: MemoryKind, capacity: u32, max_consumers: u32, slot: u64) -> Vec<u8> {
    let p = Params {
        capacity,
        spares: 2,
        max_consumers,
        slot_size: slot,
        user_header_size: 16,
        policy: 1,
        memory_kind: kind,
        producer_pid: 1,
        producer_start_time: 1,
        epoch: 7,
        producer_ns: [0; 5],
    };
    let layout = Layout::of(&p);
    let mut bytes = vec![0u8; layout.total];
    let seg = Segment::from_bytes(&bytes).expect("memfd");
    p.write(seg.header(), layout.total as u64);
    let map = MappedRing::new(seg, p, layout);
    crate::ring::initialize(&map.ring());
    let header: &Header = map.header();
    header.magic.store(MAGIC, Ordering::Relaxed);
    // SAFETY: the mapping is `layout.total` bytes long and nothing else uses it now.
    let src = unsafe { std::slice::from_raw_parts(map.segment().base(), layout.total) };
    bytes.copy_from_slice(src);
    bytes
}
