//! A segment whose header has been checked, with typed views of its regions.

use std::sync::atomic::AtomicU64;

use crate::format::{Header, Layout, Params};
use crate::ring::{BufferLine, ConsumerEntry, Policy, ProducerLine, Ring, WakeLine};
use crate::shm::Segment;

/// Views of a CUDA ring's tables (see [`crate::format::gpu`]).
#[cfg(feature = "cuda")]
pub(crate) struct GpuTables<'a> {
    pub header: &'a crate::format::gpu::GpuHeader,
    pub pools: &'a [crate::format::gpu::PoolEntry],
    /// One line per buffer.
    pub buffers: &'a [crate::format::gpu::GpuSlotLine],
    /// `buffer_count` lines per consumer table entry.
    pub releases: &'a [crate::format::gpu::ConsumerSlot],
    pub buffer_count: usize,
}

#[cfg(feature = "cuda")]
impl<'a> GpuTables<'a> {
    /// Consumer table entry `entry`'s release lines, one per buffer.
    pub fn releases_of(&self, entry: usize) -> &'a [crate::format::gpu::ConsumerSlot] {
        &self.releases[entry * self.buffer_count..(entry + 1) * self.buffer_count]
    }
}

/// A mapped ring segment.
///
/// Invariants: `layout == Layout::of(&params)`, `params` passed [`Params::check`], and
/// `layout.total <= seg.len()`; so every region below lies inside the mapping. The mapping is
/// page-aligned and every region offset is a multiple of 128, the alignment of the ring's
/// structures.
pub(crate) struct MappedRing {
    seg: Segment,
    params: Params,
    layout: Layout,
    policy: Policy,
}

impl MappedRing {
    /// Wraps a segment whose header was read into `params` (checked) and `layout`.
    pub fn new(seg: Segment, params: Params, layout: Layout) -> MappedRing {
        debug_assert_eq!(layout, Layout::of(&params));
        assert!(layout.total <= seg.len(), "layout exceeds the mapping");
        let policy = Policy::from_raw(params.policy).expect("checked policy");
        MappedRing { seg, params, layout, policy }
    }

    /// The segment.
    pub fn segment(&self) -> &Segment {
        &self.seg
    }

    /// The segment, to change what this process keeps of it (its liveness locks: only memory
    /// whose work may outlive a close, CUDA's, makes them be kept).
    pub fn segment_mut(&mut self) -> &mut Segment {
        &mut self.seg
    }

    /// The header.
    pub fn header(&self) -> &Header {
        self.seg.header()
    }

    /// The checked header values.
    pub fn params(&self) -> &Params {
        &self.params
    }

    /// The policy.
    pub fn policy(&self) -> Policy {
        self.policy
    }

    /// Pointer to the region at `offset`, typed.
    ///
    /// # Safety
    /// 1. `offset + count * size_of::<T>()` must lie within the layout's total.
    /// 2. `offset` must be a multiple of `align_of::<T>()`.
    /// 3. `T` must be valid for any bytes (all atomics).
    unsafe fn region<T>(&self, offset: usize, count: usize) -> &[T] {
        debug_assert!(offset + count * std::mem::size_of::<T>() <= self.layout.total);
        debug_assert_eq!(offset % std::mem::align_of::<T>(), 0);
        // SAFETY: in bounds and aligned by (1) and (2) with the struct invariant (the layout
        // fits the page-aligned mapping); any bytes are a valid T by (3); the mapping lives as
        // long as &self.
        unsafe { std::slice::from_raw_parts(self.seg.base().add(offset) as *const T, count) }
    }

    /// The ring view.
    pub fn ring(&self) -> Ring<'_> {
        let l = &self.layout;
        let cap = self.params.capacity as usize;
        let buffers = self.params.buffers() as usize;
        let consumers = self.params.max_consumers as usize;
        let hold_words = consumers * crate::ring::hold::stride(buffers);
        // SAFETY: for each `region` call, `Layout::of` places each region at a 128-aligned
        // offset with room for its count of structures inside `layout.total`, and every one of
        // these types is all atomics.
        let (producer, consumer_wake, producer_wake, consumers, positions, buffers, holds) = unsafe {
            (
                &self.region::<ProducerLine>(l.producer, 1)[0],
                &self.region::<WakeLine>(l.consumer_wake, 1)[0],
                &self.region::<WakeLine>(l.producer_wake, 1)[0],
                self.region::<ConsumerEntry>(l.consumers, consumers),
                self.region::<AtomicU64>(l.positions, cap),
                self.region::<BufferLine>(l.slots, buffers),
                self.region::<AtomicU64>(l.holds, hold_words),
            )
        };
        let policy = self.policy;
        Ring {
            producer,
            consumer_wake,
            producer_wake,
            consumers,
            positions,
            buffers,
            holds,
            policy,
        }
    }

    /// Buffers: capacity plus spares.
    pub fn buffer_count(&self) -> usize {
        self.params.buffers() as usize
    }

    /// The CUDA tables of a CUDA-memory ring.
    ///
    /// # Panics
    /// If the ring's memory kind is not CUDA.
    #[cfg(feature = "cuda")]
    pub fn gpu(&self) -> GpuTables<'_> {
        use crate::format::gpu::{ConsumerSlot, GpuHeader, GpuSlotLine, PoolEntry, MAX_POOLS};
        assert_eq!(self.params.memory_kind, crate::MemoryKind::Cuda);
        let l = &self.layout;
        let buffers = self.params.buffers() as usize;
        let releases = buffers * self.params.max_consumers as usize;
        // SAFETY: for a CUDA ring, `Layout::of` places each of these 128-aligned regions, sized
        // for its count of 128-byte structures, inside `layout.total`; all are atomics.
        unsafe {
            GpuTables {
                header: &self.region::<GpuHeader>(l.gpu, 1)[0],
                pools: self.region::<PoolEntry>(l.pools, MAX_POOLS),
                buffers: self.region::<GpuSlotLine>(l.gpu_slots, buffers),
                releases: self.region::<ConsumerSlot>(l.release_slots, releases),
                buffer_count: buffers,
            }
        }
    }

    /// Slot size in bytes.
    pub fn slot_size(&self) -> usize {
        self.params.slot_size as usize
    }

    /// User header size in bytes.
    pub fn user_header_size(&self) -> usize {
        self.params.user_header_size as usize
    }

    /// Start of buffer `buffer`'s payload (host memory), `slot_size` bytes.
    ///
    /// # Panics
    /// If `buffer` is not below the buffer count.
    pub fn payload(&self, buffer: usize) -> *mut u8 {
        assert!(buffer < self.buffer_count());
        let off = self.layout.payload + buffer * self.layout.payload_stride;
        // SAFETY: buffer < buffers, so the offset lies in the payload region, in the mapping.
        unsafe { self.seg.base().add(off) }
    }

    /// Start of buffer `buffer`'s user header, `user_header_size` bytes.
    ///
    /// # Panics
    /// If `buffer` is not below the buffer count.
    pub fn user_header(&self, buffer: usize) -> *mut u8 {
        assert!(buffer < self.buffer_count());
        let off = self.layout.user_headers + buffer * self.layout.user_header_stride;
        // SAFETY: buffer < buffers, so the offset lies in the user header region.
        unsafe { self.seg.base().add(off) }
    }
}
