//! A segment whose header has been checked, with typed views of its regions.

use std::sync::atomic::AtomicU64;

use crate::format::{Header, Layout, Params};
use crate::ring::{ConsumerEntry, Policy, ProducerLine, Ring, SlotLine, WakeLine};
use crate::shm::Segment;

/// Views of a CUDA ring's tables (see [`crate::format::gpu`]).
#[cfg(feature = "cuda")]
pub(crate) struct GpuTables<'a> {
    pub header: &'a crate::format::gpu::GpuHeader,
    pub pools: &'a [crate::format::gpu::PoolEntry],
    pub slots: &'a [crate::format::gpu::GpuSlotLine],
    /// `capacity` lines per consumer table entry.
    pub releases: &'a [crate::format::gpu::ConsumerSlot],
    pub capacity: usize,
}

#[cfg(feature = "cuda")]
impl<'a> GpuTables<'a> {
    /// Consumer table entry `entry`'s release lines, one per slot.
    pub fn releases_of(&self, entry: usize) -> &'a [crate::format::gpu::ConsumerSlot] {
        &self.releases[entry * self.capacity..(entry + 1) * self.capacity]
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
        let consumers = self.params.max_consumers as usize;
        // SAFETY: for each `region` call, `Layout::of` places each region at a 128-aligned
        // offset with room for its count of 128-byte structures inside `layout.total`, and
        // every one of these types is all atomics.
        let (producer, consumer_wake, producer_wake, consumers, slots, holds) = unsafe {
            (
                &self.region::<ProducerLine>(l.producer, 1)[0],
                &self.region::<WakeLine>(l.consumer_wake, 1)[0],
                &self.region::<WakeLine>(l.producer_wake, 1)[0],
                self.region::<ConsumerEntry>(l.consumers, consumers),
                self.region::<SlotLine>(l.slots, cap),
                self.region::<AtomicU64>(l.holds, consumers * crate::ring::hold::stride(cap)),
            )
        };
        let policy = self.policy;
        Ring { producer, consumer_wake, producer_wake, consumers, slots, holds, policy }
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
        let cap = self.params.capacity as usize;
        let releases = cap * self.params.max_consumers as usize;
        // SAFETY: for a CUDA ring, `Layout::of` places each of these 128-aligned regions, sized
        // for its count of 128-byte structures, inside `layout.total`; all are atomics.
        unsafe {
            GpuTables {
                header: &self.region::<GpuHeader>(l.gpu, 1)[0],
                pools: self.region::<PoolEntry>(l.pools, MAX_POOLS),
                slots: self.region::<GpuSlotLine>(l.gpu_slots, cap),
                releases: self.region::<ConsumerSlot>(l.release_slots, releases),
                capacity: cap,
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

    /// Start of slot `slot`'s payload (host memory), `slot_size` bytes.
    ///
    /// # Panics
    /// If `slot` is not below the capacity.
    pub fn payload(&self, slot: usize) -> *mut u8 {
        assert!(slot < self.params.capacity as usize);
        // SAFETY: slot < capacity, so the offset lies in the payload region, inside the mapping.
        unsafe { self.seg.base().add(self.layout.payload + slot * self.layout.payload_stride) }
    }

    /// Start of slot `slot`'s user header, `user_header_size` bytes.
    ///
    /// # Panics
    /// If `slot` is not below the capacity.
    pub fn user_header(&self, slot: usize) -> *mut u8 {
        assert!(slot < self.params.capacity as usize);
        let off = self.layout.user_headers + slot * self.layout.user_header_stride;
        // SAFETY: slot < capacity, so the offset lies in the user header region.
        unsafe { self.seg.base().add(off) }
    }
}
