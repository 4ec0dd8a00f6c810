//! The memory fence words of a ring (`Fence::Memory`, and always with VMM): sequence words in the segment itself
//! (`GpuSlotLine::ready_done`, `ConsumerSlot::release_done`), which each process page-locks
//! and maps for its device, so that its GPU writes and waits on them and its CPU reads them.
//! No IPC event handle is involved.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use memmap2::MmapRaw;

use crate::cuda::driver::CUdeviceptr;
use crate::cuda::{Context, CudaError, HostRegistration};
use crate::shm::view::MappedRing;

/// The segment, page-locked for one device through a mapping of its own.
///
/// The registration is on a second mapping of the file, owned here, not on the ring's: when
/// GPU work that may still write the words keeps us from unregistering, both are leaked
/// together (`std::mem::forget`), while the ring's own mapping is unmapped as usual. (Leaking
/// the registration alone would leave the driver holding a range that a later `mmap` reuses:
/// every later registration there fails.) The CPU reads and writes the words through the
/// ring's mapping; both map the same pages.
///
/// Invariants: `reg` covers all of `map`, which maps the same file as the ring's mapping at
/// `ring_base`, `len` bytes long. Field order is drop order: unregistered before unmapped.
pub(super) struct SegmentWords {
    reg: HostRegistration,
    map: MmapRaw,
    ring_base: usize,
    len: usize,
}

impl SegmentWords {
    /// Maps `map`'s segment again and page-locks that mapping for `ctx`'s device.
    pub(super) fn register(ctx: &Arc<Context>, map: &MappedRing) -> Result<Self, CudaError> {
        let seg = map.segment();
        let own = seg
            .map_again()
            .map_err(|e| CudaError::Unavailable(format!("mapping the segment for the GPU: {e}")))?;
        // SAFETY: `own` is a fresh, page-aligned shared mapping that this process registers
        // nowhere else; it stays mapped until `reg` is dropped (field order), or for good when
        // both are forgotten.
        let reg = unsafe { HostRegistration::new(ctx, own.as_mut_ptr(), own.len()) }?;
        Ok(SegmentWords { reg, map: own, ring_base: seg.base() as usize, len: seg.len() })
    }

    /// The device address of `word`, a word of the ring's mapping of the segment.
    ///
    /// # Panics
    /// If `word` lies outside that mapping.
    pub(super) fn device(&self, word: &AtomicU64) -> CUdeviceptr {
        let at = word as *const AtomicU64 as usize;
        let inside = at >= self.ring_base && at + 8 <= self.ring_base + self.len;
        assert!(inside && self.len <= self.map.len(), "a word of another mapping");
        self.reg.device_ptr(at - self.ring_base)
    }
}
