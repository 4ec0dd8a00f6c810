//! Dedicated device allocations that may be shared with legacy IPC.

use std::sync::Arc;

use super::driver::{self, CUdeviceptr, CUipcMemHandle, DriverError};
use super::Context;

/// Pools are rounded up to this (2 MiB). Legacy IPC maps the whole underlying allocation, so
/// gpuring shares only allocations it made for the purpose, sized so that nothing else can
/// share their pages.
pub const POOL_ALIGN: usize = 2 << 20;

/// A dedicated `cuMemAlloc_v2` allocation, freed on drop. Never memory from a stream-ordered
/// pool: `cuIpcGetMemHandle` refuses that (cudarc's safe `alloc` uses one).
///
/// Invariant: `ptr` is a live allocation of `size` bytes (a multiple of [`POOL_ALIGN`]) in `ctx`.
pub struct DevicePool {
    ctx: Arc<Context>,
    ptr: CUdeviceptr,
    size: usize,
}

// SAFETY: device pointers are plain addresses; the driver calls bind the context first.
unsafe impl Send for DevicePool {}
// SAFETY: as above; &self methods make only thread-safe driver calls.
unsafe impl Sync for DevicePool {}

impl DevicePool {
    /// Allocates at least `bytes` (rounded up to 2 MiB) in `ctx`.
    pub fn new(ctx: &Arc<Context>, bytes: usize) -> Result<DevicePool, DriverError> {
        let size = bytes.max(1).div_ceil(POOL_ALIGN) * POOL_ALIGN;
        let _bound = ctx.bind()?;
        // SAFETY: `ctx` is current.
        let ptr = unsafe { driver::mem_alloc(size) }?;
        Ok(DevicePool { ctx: ctx.clone(), ptr, size })
    }

    /// Device address of the first byte.
    pub fn ptr(&self) -> CUdeviceptr {
        self.ptr
    }

    /// Size in bytes.
    pub fn size(&self) -> usize {
        self.size
    }

    /// The legacy IPC handle of this allocation: 64 bytes that let any process that can reach
    /// the GPU map it.
    pub fn ipc_handle(&self) -> Result<CUipcMemHandle, DriverError> {
        let _bound = self.ctx.bind()?;
        // SAFETY: `ptr` is the base of a live allocation in the now-current context.
        unsafe { driver::ipc_get_mem_handle(self.ptr) }
    }
}

impl Drop for DevicePool {
    fn drop(&mut self) {
        if let Ok(_bound) = self.ctx.bind() {
            // SAFETY: live by the invariant; owners synchronise their streams before dropping
            // a pool that pending work uses.
            let _ = unsafe { driver::mem_free(self.ptr) };
        }
    }
}
