//! The segment header and the placement of every region after it.
//!
//! The header is written by the producer before anyone can use the segment, `magic` last with
//! Release. A reader loads `magic` with Acquire, then copies every field once into [`Params`]
//! and checks it; it never reads the header's sizes again, so a peer that changes them later
//! cannot make it index out of bounds.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use crate::error::{Corruption, OpenErrorKind};

/// `b"GPURING1"` as a little-endian u64.
pub const MAGIC: u64 = u64::from_le_bytes(*b"GPURING1");

/// Bumped on any change to the header or region layout (2: hold records, CUDA tables; 3: memory
/// fence words; 4: doorbell parking marks in the wake lines and consumer entries; 5: the
/// consumer entry's lease word, eviction reason and table counters, no done words nor
/// `producer_busy`; 6: spare buffers, position words, the consumer entry's delivery mode; 7: the
/// CUDA sharing kind and the VMM fence words; 8: liveness by OFD locks instead of `flock` and
/// pids, the participants' namespace identities; 9: the buffer line's `upstream_before`; 10: memory
/// fences are the segment's words in both CUDA sharing kinds, no device fence pool).
pub const LAYOUT_VERSION: u32 = 10;

/// Where a ring's payload lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum MemoryKind {
    /// Payload in the shm segment itself.
    Host = 1,
    /// Payload in device memory shared with legacy CUDA IPC handles; the segment holds the pool
    /// table, descriptors and event handles (see `docs/gpu.md`).
    Cuda = 2,
}

impl MemoryKind {
    /// The kind stored as `raw` in a header.
    pub fn from_raw(raw: u32) -> Option<MemoryKind> {
        match raw {
            1 => Some(MemoryKind::Host),
            2 => Some(MemoryKind::Cuda),
            _ => None,
        }
    }

    /// Its name, as printed by tools.
    pub fn name(self) -> &'static str {
        match self {
            MemoryKind::Host => "host",
            MemoryKind::Cuda => "cuda",
        }
    }
}

/// The segment header, at offset 0. Every field is atomic because the memory is shared; all
/// but `magic` and `closed` are written once, before `magic`.
#[repr(C, align(128))]
pub struct Header {
    /// [`MAGIC`]; zero until the segment is fully built. Written last, with Release.
    pub magic: AtomicU64,
    /// [`LAYOUT_VERSION`].
    pub version: AtomicU32,
    /// `size_of::<Header>()`.
    pub header_size: AtomicU32,
    /// Bytes of the whole segment, as laid out by [`Layout`].
    pub total_size: AtomicU64,
    /// Number of positions (messages the ring holds), 1..=[`Params::MAX_CAPACITY`].
    pub capacity: AtomicU32,
    /// Spare buffers beyond one per position; `capacity + spares` is at most
    /// [`Params::MAX_BUFFERS`].
    pub spares: AtomicU32,
    /// Consumer table entries, 1..=[`Params::MAX_CONSUMERS`].
    pub max_consumers: AtomicU32,
    /// Payload bytes per buffer.
    pub slot_size: AtomicU64,
    /// User header bytes per message.
    pub user_header_size: AtomicU32,
    /// [`crate::ring::Policy`] as u32.
    pub policy: AtomicU32,
    /// [`MemoryKind`] as u32.
    pub memory_kind: AtomicU32,
    /// Producer pid, as its own pid namespace numbers it: for display only (liveness is the
    /// producer's lock, `shm::presence`). Written first of all, so a half-built segment still
    /// names its builder.
    pub producer_pid: AtomicU32,
    /// Producer start time (see [`crate::shm::process::ProcessId`]), for display with the pid.
    pub producer_start_time: AtomicU64,
    /// Identifies this instance of the ring among all that had its name.
    pub epoch: AtomicU64,
    /// Set (Release) by the producer when it closes, after its last publish:
    /// [`CLOSED_DONE`], or [`CLOSED_CUT`] when the stream was cut (`Producer::abort`, a panic),
    /// or [`CLOSED_LOST`] when the producer's GPU context was lost.
    pub closed: AtomicU32,
    /// The producer's namespace identities ([`crate::shm::ns::Namespaces`] as words), for
    /// display: tools and errors say "in another pid namespace" from them.
    pub producer_ns: [AtomicU64; 5],
}

/// `closed`: the producer closed the ring; the stream is complete.
pub const CLOSED_DONE: u32 = 1;
/// `closed`: the producer closed the ring as cut (`Producer::abort`, a panic unwinding).
pub const CLOSED_CUT: u32 = 2;
/// `closed`: the producer closed the ring because its GPU context was lost (`ContextLost`);
/// the stream was cut, and the segment keeps its name so that `gpuring stat` shows why, until
/// a restarted producer replaces it. Older readers take it for cut.
pub const CLOSED_LOST: u32 = 3;

const _: () = assert!(std::mem::size_of::<Header>() == 128);

/// The header's values, copied out and checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Params {
    /// Positions.
    pub capacity: u32,
    /// Spare buffers.
    pub spares: u32,
    /// Consumer table entries.
    pub max_consumers: u32,
    /// Payload bytes per buffer.
    pub slot_size: u64,
    /// User header bytes per message.
    pub user_header_size: u32,
    /// Raw policy; checked to be valid.
    pub policy: u32,
    /// Memory kind.
    pub memory_kind: MemoryKind,
    /// Producer pid.
    pub producer_pid: u32,
    /// Producer start time.
    pub producer_start_time: u64,
    /// Instance epoch.
    pub epoch: u64,
    /// The producer's namespace identities, for display.
    pub producer_ns: [u64; 5],
}

impl Params {
    /// Largest capacity.
    pub const MAX_CAPACITY: u32 = 1 << 16;
    /// Most buffers (capacity plus spares).
    pub const MAX_BUFFERS: u32 = crate::ring::position::MAX_BUFFERS;
    /// Largest consumer table (the stamp's held count must not overflow).
    pub const MAX_CONSUMERS: u32 = crate::ring::stamp::MAX_CONSUMERS;
    /// Largest slot: 1 TiB.
    pub const MAX_SLOT_SIZE: u64 = 1 << 40;
    /// Largest user header.
    pub const MAX_USER_HEADER: u32 = 1 << 16;
    /// Largest `buffers * max_consumers`: each pair has an 8-byte hold record (and, in a CUDA
    /// ring, a 128-byte release-event line), so this caps those tables at 8 and 128 MiB.
    pub const MAX_SLOT_RECORDS: u64 = 1 << 20;

    /// Buffers: capacity plus spares.
    pub fn buffers(&self) -> u32 {
        self.capacity + self.spares
    }

    /// Checks every value's range. Returns the failing field.
    pub fn check(&self) -> Result<(), Corruption> {
        let bad = |field, value: u64| Err(Corruption::Field { field, value });
        if self.capacity == 0 || self.capacity > Self::MAX_CAPACITY {
            return bad("capacity", self.capacity as u64);
        }
        if self.spares > Self::MAX_BUFFERS - self.capacity {
            return bad("spares", self.spares as u64);
        }
        if self.max_consumers == 0 || self.max_consumers > Self::MAX_CONSUMERS {
            return bad("max_consumers", self.max_consumers as u64);
        }
        if self.slot_size == 0 || self.slot_size > Self::MAX_SLOT_SIZE {
            return bad("slot_size", self.slot_size);
        }
        if self.user_header_size > Self::MAX_USER_HEADER {
            return bad("user_header_size", self.user_header_size as u64);
        }
        if crate::ring::Policy::from_raw(self.policy).is_none() {
            return bad("policy", self.policy as u64);
        }
        let records = self.buffers() as u64 * self.max_consumers as u64;
        if records > Self::MAX_SLOT_RECORDS {
            return bad("(capacity + spares) x max_consumers", records);
        }
        Ok(())
    }

    /// Writes these values into a header that nobody else can see yet. `magic` is left alone.
    pub fn write(&self, h: &Header, total_size: u64) {
        // Relaxed throughout: the Release store of `magic` (by the caller, last) publishes them.
        h.producer_pid.store(self.producer_pid, Ordering::Relaxed);
        h.producer_start_time.store(self.producer_start_time, Ordering::Relaxed);
        h.version.store(LAYOUT_VERSION, Ordering::Relaxed);
        h.header_size.store(std::mem::size_of::<Header>() as u32, Ordering::Relaxed);
        h.total_size.store(total_size, Ordering::Relaxed);
        h.capacity.store(self.capacity, Ordering::Relaxed);
        h.spares.store(self.spares, Ordering::Relaxed);
        h.max_consumers.store(self.max_consumers, Ordering::Relaxed);
        h.slot_size.store(self.slot_size, Ordering::Relaxed);
        h.user_header_size.store(self.user_header_size, Ordering::Relaxed);
        h.policy.store(self.policy, Ordering::Relaxed);
        h.memory_kind.store(self.memory_kind as u32, Ordering::Relaxed);
        h.epoch.store(self.epoch, Ordering::Relaxed);
        h.closed.store(0, Ordering::Relaxed);
        for (word, value) in h.producer_ns.iter().zip(self.producer_ns) {
            word.store(value, Ordering::Relaxed);
        }
    }

    /// Reads and checks a header in a file of `file_size` bytes: magic, version, every field's
    /// range, and the laid-out size against the file.
    pub fn read(h: &Header, file_size: u64) -> Result<(Params, Layout), OpenErrorKind> {
        // Acquire: pairs with the producer's Release store of `magic`, after all other fields.
        let magic = h.magic.load(Ordering::Acquire);
        if magic == 0 {
            return Err(OpenErrorKind::NotInitialized);
        }
        if magic != MAGIC {
            return Err(OpenErrorKind::BadMagic { found: magic });
        }
        let version = h.version.load(Ordering::Relaxed);
        if version != LAYOUT_VERSION {
            return Err(OpenErrorKind::VersionMismatch {
                found: version,
                expected: LAYOUT_VERSION,
            });
        }
        let header_size = h.header_size.load(Ordering::Relaxed);
        if header_size as usize != std::mem::size_of::<Header>() {
            let value = header_size as u64;
            return Err(OpenErrorKind::Corrupt(Corruption::Field { field: "header_size", value }));
        }
        let raw_kind = h.memory_kind.load(Ordering::Relaxed);
        let Some(memory_kind) = MemoryKind::from_raw(raw_kind) else {
            let value = raw_kind as u64;
            return Err(OpenErrorKind::Corrupt(Corruption::Field { field: "memory_kind", value }));
        };
        let p = Params {
            capacity: h.capacity.load(Ordering::Relaxed),
            spares: h.spares.load(Ordering::Relaxed),
            max_consumers: h.max_consumers.load(Ordering::Relaxed),
            slot_size: h.slot_size.load(Ordering::Relaxed),
            user_header_size: h.user_header_size.load(Ordering::Relaxed),
            policy: h.policy.load(Ordering::Relaxed),
            memory_kind,
            producer_pid: h.producer_pid.load(Ordering::Relaxed),
            producer_start_time: h.producer_start_time.load(Ordering::Relaxed),
            epoch: h.epoch.load(Ordering::Relaxed),
            producer_ns: std::array::from_fn(|i| h.producer_ns[i].load(Ordering::Relaxed)),
        };
        p.check().map_err(OpenErrorKind::Corrupt)?;
        let layout = Layout::of(&p);
        let total = h.total_size.load(Ordering::Relaxed);
        if total != layout.total as u64 {
            let value = total;
            return Err(OpenErrorKind::Corrupt(Corruption::Field { field: "total_size", value }));
        }
        if file_size < total {
            return Err(OpenErrorKind::Truncated { needed: total, actual: file_size });
        }
        Ok((p, layout))
    }
}

/// Byte offsets of the regions of a segment, derived from [`Params`] alone.
///
/// ```text
/// 0                 Header                      128 B
/// producer          ring::ProducerLine          128 B
/// consumer_wake     ring::WakeLine              128 B   (consumers sleep here)
/// producer_wake     ring::WakeLine              128 B   (the producer sleeps here)
/// consumers         ring::ConsumerEntry x max_consumers, 128 B each
/// positions         u64 x capacity, rounded up to 128 B (the ring's position words)
/// slots             ring::BufferLine x buffers, 128 B each (buffers = capacity + spares)
/// holds             u64 x hold::stride(buffers) per consumer (the ring's hold records)
/// user_headers      buffers x user_header_stride        (user_header_size rounded up to 64)
/// -- CUDA memory kind only (zero bytes for host memory) --
/// gpu               format::gpu::GpuHeader              128 B   (device UUID, fence, sharing)
/// pools             format::gpu::PoolEntry x GPU_POOLS, 128 B each
/// gpu_slots         format::gpu::GpuSlotLine x buffers, 128 B each
/// release_slots     format::gpu::ConsumerSlot x (max_consumers x buffers), 128 B each
/// -- host memory kind only (zero bytes for CUDA) --
/// payload           buffers x payload_stride, page-aligned (slot_size rounded up to 128)
/// total             page-rounded end
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// [`crate::ring::ProducerLine`].
    pub producer: usize,
    /// [`crate::ring::WakeLine`] consumers sleep on.
    pub consumer_wake: usize,
    /// [`crate::ring::WakeLine`] the producer sleeps on.
    pub producer_wake: usize,
    /// Consumer table.
    pub consumers: usize,
    /// Position words.
    pub positions: usize,
    /// Buffer lines.
    pub slots: usize,
    /// Hold records, `ring::hold::stride(buffers)` words per consumer.
    pub holds: usize,
    /// User headers.
    pub user_headers: usize,
    /// Distance between two user headers.
    pub user_header_stride: usize,
    /// CUDA header line (CUDA memory kind; equal to `pools` otherwise).
    pub gpu: usize,
    /// Pool table (CUDA memory kind).
    pub pools: usize,
    /// Per-buffer descriptors and ready events (CUDA memory kind).
    pub gpu_slots: usize,
    /// Per-consumer, per-buffer release events: entry `c`, buffer `b` is line `c * buffers + b`
    /// (CUDA memory kind).
    pub release_slots: usize,
    /// Payload (host memory kind).
    pub payload: usize,
    /// Distance between two payload buffers.
    pub payload_stride: usize,
    /// Segment size.
    pub total: usize,
}

/// Every shared structure is 128 bytes.
const LINE: usize = 128;
/// Entries in a CUDA ring's pool table.
pub const GPU_POOLS: usize = 32;
const PAGE: usize = 4096;

fn round_up(x: usize, to: usize) -> usize {
    x.div_ceil(to) * to
}

impl Layout {
    /// The layout for `p`, whose ranges must have passed [`Params::check`] (which keeps every
    /// product below in range: at most 2^16 buffers of 2^40 bytes).
    pub fn of(p: &Params) -> Layout {
        let cap = p.capacity as usize;
        let buffers = p.buffers() as usize;
        let producer = LINE;
        let consumer_wake = producer + LINE;
        let producer_wake = consumer_wake + LINE;
        let consumers = producer_wake + LINE;
        let positions = consumers + LINE * p.max_consumers as usize;
        let slots = positions + round_up(8 * cap, LINE);
        let holds = slots + LINE * buffers;
        let hold_words = crate::ring::hold::stride(buffers) * p.max_consumers as usize;
        let user_headers = holds + 8 * hold_words;
        let user_header_stride = round_up(p.user_header_size as usize, 64);
        let gpu = round_up(user_headers + user_header_stride * buffers, LINE);
        let cuda = p.memory_kind == MemoryKind::Cuda;
        let pools = gpu + if cuda { LINE } else { 0 };
        let gpu_slots = pools + if cuda { LINE * GPU_POOLS } else { 0 };
        let release_slots = gpu_slots + if cuda { LINE * buffers } else { 0 };
        let gpu_end =
            release_slots + if cuda { LINE * buffers * p.max_consumers as usize } else { 0 };
        let payload = round_up(gpu_end, PAGE);
        let payload_stride = match p.memory_kind {
            MemoryKind::Host => round_up(p.slot_size as usize, LINE),
            MemoryKind::Cuda => 0,
        };
        let total = round_up(payload + payload_stride * buffers, PAGE);
        Layout {
            producer,
            consumer_wake,
            producer_wake,
            consumers,
            positions,
            slots,
            holds,
            user_headers,
            user_header_stride,
            gpu,
            pools,
            gpu_slots,
            release_slots,
            payload,
            payload_stride,
            total,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params() -> Params {
        Params {
            capacity: 8,
            spares: 2,
            max_consumers: 4,
            slot_size: 1000,
            user_header_size: 20,
            policy: 1,
            memory_kind: MemoryKind::Host,
            producer_pid: 1,
            producer_start_time: 2,
            epoch: 3,
            producer_ns: [4, 5, 6, 7, 8],
        }
    }

    #[test]
    fn layout_is_aligned_and_ordered() {
        let l = Layout::of(&params());
        assert_eq!(l.consumers, 512);
        assert_eq!(l.positions, 512 + 4 * 128);
        assert_eq!(l.slots, l.positions + 128);
        assert_eq!(l.holds, l.slots + 10 * 128);
        assert_eq!(l.user_headers, l.holds + 8 * 16 * 4);
        assert_eq!(l.user_header_stride, 64);
        assert_eq!(l.payload % 4096, 0);
        assert_eq!(l.payload_stride, 1024);
        assert_eq!(l.total, l.payload + 12288, "10 buffers of 1024 bytes, page-rounded");
        assert_eq!(l.gpu, l.release_slots, "host rings have no CUDA regions");
    }

    #[test]
    fn cuda_layout_has_tables_and_no_payload() {
        let p = Params { memory_kind: MemoryKind::Cuda, ..params() };
        let l = Layout::of(&p);
        assert_eq!(l.gpu % 128, 0);
        assert_eq!(l.pools, l.gpu + 128);
        assert_eq!(l.gpu_slots, l.pools + 128 * GPU_POOLS);
        assert_eq!(l.release_slots, l.gpu_slots + 128 * 10);
        assert_eq!(l.payload_stride, 0);
        assert!(l.total >= l.release_slots + 128 * 10 * 4);
        let too_many = Params { capacity: 1 << 15, max_consumers: 32, ..p };
        assert!(too_many.check().is_err());
        let too_many_spares =
            Params { capacity: 1 << 15, spares: (1 << 15) + 1, max_consumers: 1, ..p };
        assert!(too_many_spares.check().is_err());
        assert!(Params { spares: 1 << 15, ..too_many_spares }.check().is_ok());
    }

    #[test]
    fn read_checks_everything() {
        let h: Header = Header {
            magic: AtomicU64::new(0),
            version: AtomicU32::new(0),
            header_size: AtomicU32::new(0),
            total_size: AtomicU64::new(0),
            capacity: AtomicU32::new(0),
            spares: AtomicU32::new(0),
            max_consumers: AtomicU32::new(0),
            slot_size: AtomicU64::new(0),
            user_header_size: AtomicU32::new(0),
            policy: AtomicU32::new(0),
            memory_kind: AtomicU32::new(0),
            producer_pid: AtomicU32::new(0),
            producer_start_time: AtomicU64::new(0),
            epoch: AtomicU64::new(0),
            closed: AtomicU32::new(0),
            producer_ns: Default::default(),
        };
        let p = params();
        let total = Layout::of(&p).total as u64;
        p.write(&h, total);
        assert!(matches!(Params::read(&h, total), Err(OpenErrorKind::NotInitialized)));
        h.magic.store(MAGIC, Ordering::Release);
        assert_eq!(Params::read(&h, total).unwrap().0, p);
        assert!(matches!(
            Params::read(&h, total - 1),
            Err(OpenErrorKind::Truncated { needed, actual }) if needed == total && actual == total - 1
        ));
        h.version.store(LAYOUT_VERSION + 1, Ordering::Relaxed);
        assert!(matches!(
            Params::read(&h, total),
            Err(OpenErrorKind::VersionMismatch { found, expected: LAYOUT_VERSION })
                if found == LAYOUT_VERSION + 1
        ));
        h.version.store(LAYOUT_VERSION, Ordering::Relaxed);
        h.capacity.store(0, Ordering::Relaxed);
        assert!(matches!(
            Params::read(&h, total),
            Err(OpenErrorKind::Corrupt(Corruption::Field { field: "capacity", value: 0 }))
        ));
        h.capacity.store(8, Ordering::Relaxed);
        h.total_size.store(total + 4096, Ordering::Relaxed);
        assert!(matches!(
            Params::read(&h, total),
            Err(OpenErrorKind::Corrupt(Corruption::Field { field: "total_size", .. }))
        ));
        h.total_size.store(total, Ordering::Relaxed);
        h.magic.store(0xdead, Ordering::Relaxed);
        assert!(matches!(Params::read(&h, total), Err(OpenErrorKind::BadMagic { found: 0xdead })));
    }
}
