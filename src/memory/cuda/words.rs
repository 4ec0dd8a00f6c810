//! The fence words of a VMM ring: sequence words in the segment itself
//! (`GpuSlotLine::ready_done`, `ConsumerSlot::release_done`), which each process page-locks
//! and maps for its device, so that its GPU writes and waits on them and its CPU reads them.
//! No IPC event handle is involved.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use crate::cuda::driver::CUdeviceptr;
use crate::cuda::{Context, DriverError, HostRegistration};
use crate::format::view::MappedRing;

/// This process's mapping of a segment, registered with the driver.
///
/// Invariant: `reg` covers the whole mapping of the segment that `base` starts; whoever owns
/// this drops (or forgets) it before that mapping is unmapped.
pub(super) struct SegmentWords {
    reg: HostRegistration,
    base: usize,
    len: usize,
}

impl SegmentWords {
    /// Page-locks `map`'s segment for `ctx`'s device.
    ///
    /// # Safety
    /// 1. The caller drops (or forgets) the result before `map` is dropped.
    /// 2. No other registration of this process overlaps `map` (each open maps the segment
    ///    anew, so only a second registration of this very `map` could).
    pub(super) unsafe fn register(
        ctx: &Arc<Context>,
        map: &MappedRing,
    ) -> Result<Self, DriverError> {
        let seg = map.segment();
        // SAFETY: the segment's mapping is live and stays so until we are dropped (1), and no
        // other registration overlaps it (2).
        let reg = unsafe { HostRegistration::new(ctx, seg.base(), seg.len()) }?;
        Ok(SegmentWords { reg, base: seg.base() as usize, len: seg.len() })
    }

    /// The device address of `word`, a word of the registered segment.
    ///
    /// # Panics
    /// If `word` lies outside the segment.
    pub(super) fn device(&self, word: &AtomicU64) -> CUdeviceptr {
        let at = word as *const AtomicU64 as usize;
        assert!(at >= self.base && at + 8 <= self.base + self.len, "a word of another mapping");
        self.reg.device_ptr(at - self.base)
    }
}
