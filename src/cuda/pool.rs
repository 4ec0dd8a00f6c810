//! Dedicated device allocations that may be shared with legacy IPC.

use std::sync::Arc;

use super::driver::{self, CUdeviceptr, CUipcMemHandle, DriverError};
use super::Context;

/// Pools are rounded up to this (2 MiB). Legacy IPC maps the whole underlying allocation, so
/// gpuring shares only allocations it made for the purpose, sized so that nothing else can
/// share their pages.
///
/// ```
/// use gpuring::cuda::POOL_ALIGN;
///
/// let bytes: usize = 3 << 20; // what a pool of 3 MiB really takes
/// assert_eq!(bytes.div_ceil(POOL_ALIGN) * POOL_ALIGN, 4 << 20);
/// ```
pub const POOL_ALIGN: usize = 2 << 20;

/// A dedicated `cuMemAlloc_v2` allocation, freed on drop. Never memory from a stream-ordered
/// pool: `cuIpcGetMemHandle` refuses that (cudarc's safe `alloc` uses one).
///
/// A producer can publish regions of its own pools; see `Producer::register` (CUDA rings):
///
/// ```no_run
/// let mut tx = gpuring::Producer::builder("doc-cuda-pool").create_gpu(0)?;
/// let pool = gpuring::cuda::DevicePool::new(tx.context(), 64 << 20)?;
/// let id = tx.register(pool)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
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
    ///
    /// ```no_run
    /// use gpuring::cuda::{Context, DevicePool};
    ///
    /// let pool = DevicePool::new(&Context::new(0)?, 1000)?;
    /// assert_eq!(pool.size(), 2 << 20);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn new(ctx: &Arc<Context>, bytes: usize) -> Result<DevicePool, DriverError> {
        let size = bytes.max(1).div_ceil(POOL_ALIGN) * POOL_ALIGN;
        let _bound = ctx.bind()?;
        // SAFETY: `ctx` is current.
        let ptr = unsafe { driver::mem_alloc(size) }?;
        Ok(DevicePool { ctx: ctx.clone(), ptr, size })
    }

    /// Device address of the first byte.
    ///
    /// ```no_run
    /// # let ctx = gpuring::cuda::Context::new(0)?;
    /// let pool = gpuring::cuda::DevicePool::new(&ctx, 8 << 20)?;
    /// let (start, end) = (pool.ptr(), pool.ptr() + pool.size() as u64);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn ptr(&self) -> CUdeviceptr {
        self.ptr
    }

    /// Size in bytes.
    ///
    /// ```no_run
    /// # let ctx = gpuring::cuda::Context::new(0)?;
    /// let pool = gpuring::cuda::DevicePool::new(&ctx, 5 << 20)?;
    /// assert_eq!(pool.size(), 6 << 20); // rounded up to POOL_ALIGN
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn size(&self) -> usize {
        self.size
    }

    /// The legacy IPC handle of this allocation: 64 bytes that let any process that can reach
    /// the GPU map it.
    ///
    /// ```no_run
    /// # let ctx = gpuring::cuda::Context::new(0)?;
    /// let pool = gpuring::cuda::DevicePool::new(&ctx, 8 << 20)?;
    /// let handle = pool.ipc_handle()?;
    /// let bytes = handle.reserved; // send these 64 bytes to the other process
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
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
