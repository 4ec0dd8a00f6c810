//! Legacy sharing on the producer's side: dedicated `cuMemAlloc` pools, each shared by its
//! `cuIpcGetMemHandle` handle in its pool table entry.

use std::sync::Arc;

use super::share::PoolMemory;
use crate::cuda::driver::{self, DriverError};
use crate::cuda::{Context, DevicePool};
use crate::error::RegisterError;
use crate::format::gpu::{sharing_kind, PoolEntry};

/// Legacy CUDA IPC sharing: nothing to keep, each pool's handle is in its pool table entry.
pub(super) struct LegacyTx;

impl LegacyTx {
    /// The segment's `sharing`.
    pub(super) fn kind(&self) -> u32 {
        sharing_kind::LEGACY
    }

    pub(super) fn name(&self) -> &'static str {
        "legacy"
    }

    /// A dedicated allocation of `bytes` (`cuMemAlloc`).
    pub(super) fn alloc(
        &self,
        ctx: &Arc<Context>,
        bytes: usize,
    ) -> Result<PoolMemory, DriverError> {
        Ok(PoolMemory::Owned(DevicePool::new(ctx, bytes)?))
    }

    /// Refuses our own VMM pools: they have no IPC handle.
    pub(super) fn accepts(&self, mem: &PoolMemory) -> Result<(), RegisterError> {
        if let PoolMemory::OwnedVmm(_) = mem {
            return Err(RegisterError::WrongSharing { ring: "legacy" });
        }
        Ok(())
    }

    /// Any size: an IPC handle maps the whole allocation.
    pub(super) fn fits(&self, _: &Context, _: &PoolMemory) -> Result<(), RegisterError> {
        Ok(())
    }

    /// Writes `mem`'s IPC handle into its pool table `entry`.
    ///
    /// # Safety
    /// 1. A context is current, and `mem.ptr()` is the base of a live allocation in it
    ///    (the driver said so).
    pub(super) unsafe fn share(
        &mut self,
        mem: &PoolMemory,
        entry: &PoolEntry,
        _: (usize, u32),
        _: &Context,
    ) -> Result<(), RegisterError> {
        let cuda = |e: DriverError| RegisterError::from(e);
        // SAFETY: `mem.ptr()` is the base of a live allocation in the current context
        // (checked by the driver before, (1)).
        let handle = unsafe { driver::ipc_get_mem_handle(mem.ptr()) }.map_err(cuda)?;
        entry.handle.store(&driver::mem_handle_bytes(&handle));
        Ok(())
    }

    /// Nothing to stop: the handles are in the segment. False: a consumer's import is not
    /// counted on to keep the memory alive, so it is freed only once every consumer left.
    pub(super) fn close(&mut self) -> bool {
        false
    }
}
