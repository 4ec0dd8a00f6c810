//! Opened IPC memory handles and interprocess events.

use std::sync::{Arc, Mutex};

use super::driver::{self, CUdeviceptr, CUevent, CUipcEventHandle, CUipcMemHandle, DriverError};
use super::stream::Stream;
use super::Context;

/// Another process's allocation, mapped with `cuIpcOpenMemHandle_v2` and closed with
/// `cuIpcCloseMemHandle` on drop.
///
/// Invariant: `ptr` is an open mapping of `size` bytes in `ctx`.
pub struct IpcMapping {
    ctx: Arc<Context>,
    ptr: CUdeviceptr,
    size: usize,
}

// SAFETY: device pointers are plain addresses; driver calls bind the context first.
unsafe impl Send for IpcMapping {}
// SAFETY: as above.
unsafe impl Sync for IpcMapping {}

impl IpcMapping {
    /// Opens `handle` in `ctx` with `CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS` (the only flag the
    /// driver accepts; it also lets a consumer on another device map it). The caller says how
    /// large the allocation is (from the pool table). Several consumers of one ring in one
    /// process each open it: the driver counts the opens and returns the same address.
    pub fn open(
        ctx: &Arc<Context>,
        handle: CUipcMemHandle,
        size: usize,
    ) -> Result<IpcMapping, DriverError> {
        let _bound = ctx.bind()?;
        let _one_at_a_time = ipc_lock();
        // SAFETY: `ctx` is current; the lock keeps other opens and closes out.
        let ptr = unsafe { driver::ipc_open_mem_handle(handle) }?;
        Ok(IpcMapping { ctx: ctx.clone(), ptr, size })
    }

    /// Device address of the first byte.
    pub fn ptr(&self) -> CUdeviceptr {
        self.ptr
    }

    /// Size in bytes, as the producer declared it.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Size of the allocation the driver actually mapped, to check the declared size against.
    pub fn mapped_size(&self) -> Result<usize, DriverError> {
        let _bound = self.ctx.bind()?;
        // SAFETY: the context is current.
        let (base, size) = unsafe { driver::mem_address_range(self.ptr) }?;
        Ok(if base == self.ptr { size } else { 0 })
    }
}

impl Drop for IpcMapping {
    fn drop(&mut self) {
        if let Ok(_bound) = self.ctx.bind() {
            let _one_at_a_time = ipc_lock();
            // SAFETY: open by the invariant (one close for our one open); owners synchronise
            // before dropping a mapping that pending work reads; the lock keeps other opens
            // and closes out.
            let _ = unsafe { driver::ipc_close_mem_handle(self.ptr) };
        }
    }
}

/// The lock every IPC memory open and close of this process takes: the driver's count of the
/// opens of one handle races when two threads open it at once (see
/// `driver::ipc_open_mem_handle`). A poisoned lock still serialises.
fn ipc_lock() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// An interprocess event (`CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING`): created here, or
/// opened from another process's handle. Destroyed on drop.
///
/// Invariant: `raw` is a live event usable in `ctx`.
pub struct IpcEvent {
    ctx: Arc<Context>,
    raw: CUevent,
}

// SAFETY: event handles may be used from any thread with the context bound.
unsafe impl Send for IpcEvent {}
// SAFETY: as above; record and wait are thread-safe driver calls.
unsafe impl Sync for IpcEvent {}

impl IpcEvent {
    /// Creates an interprocess event in `ctx`.
    pub fn new(ctx: &Arc<Context>) -> Result<IpcEvent, DriverError> {
        let _bound = ctx.bind()?;
        // SAFETY: `ctx` is current.
        let raw = unsafe { driver::event_create_interprocess() }?;
        Ok(IpcEvent { ctx: ctx.clone(), raw })
    }

    /// Opens another process's event.
    pub fn open(ctx: &Arc<Context>, handle: CUipcEventHandle) -> Result<IpcEvent, DriverError> {
        let _bound = ctx.bind()?;
        // SAFETY: `ctx` is current.
        let raw = unsafe { driver::ipc_open_event_handle(handle) }?;
        Ok(IpcEvent { ctx: ctx.clone(), raw })
    }

    /// The handle to give other processes.
    pub fn ipc_handle(&self) -> Result<CUipcEventHandle, DriverError> {
        let _bound = self.ctx.bind()?;
        // SAFETY: live interprocess event by the invariant.
        unsafe { driver::ipc_get_event_handle(self.raw) }
    }

    /// Records the event on `stream`: it completes when the work submitted so far does.
    pub fn record(&self, stream: &Stream) -> Result<(), DriverError> {
        let _bound = self.ctx.bind()?;
        // SAFETY: both live by their invariants.
        unsafe { driver::event_record(self.raw, stream.raw()) }
    }

    /// Blocks until the event's last record completed. Teardown only: gpuring's steady state
    /// never makes the CPU wait for the GPU.
    pub fn synchronize(&self) -> Result<(), DriverError> {
        let _bound = self.ctx.bind()?;
        // SAFETY: live by the invariant.
        unsafe { driver::event_synchronize(self.raw) }
    }

    /// Whether the event's last record has completed, without waiting.
    pub fn is_complete(&self) -> Result<bool, DriverError> {
        let _bound = self.ctx.bind()?;
        // SAFETY: live by the invariant.
        unsafe { driver::event_query(self.raw) }
    }

    /// Makes `stream` wait for this event's last record, unless that record has already
    /// completed (then there is nothing to order after, and the wait, the costlier driver call,
    /// is skipped). Returns whether it enqueued a wait. In a ring that keeps up, the readers of
    /// a slot's previous lap and the writer of a frame a consumer is behind on are finished, so
    /// the steady state makes no waits at all.
    pub fn wait_if_pending(&self, stream: &Stream) -> Result<bool, DriverError> {
        let _bound = self.ctx.bind()?;
        // SAFETY: live by the invariant.
        if unsafe { driver::event_query(self.raw) }? {
            return Ok(false);
        }
        // SAFETY: both live by their invariants.
        unsafe { driver::stream_wait_event(stream.raw(), self.raw) }?;
        Ok(true)
    }

    /// Makes work submitted to `stream` from now on wait for this event's last record.
    pub fn wait_on(&self, stream: &Stream) -> Result<(), DriverError> {
        let _bound = self.ctx.bind()?;
        // SAFETY: both live by their invariants.
        unsafe { driver::stream_wait_event(stream.raw(), self.raw) }
    }
}

impl Drop for IpcEvent {
    fn drop(&mut self) {
        if let Ok(_bound) = self.ctx.bind() {
            // SAFETY: live by the invariant, never used after drop.
            let _ = unsafe { driver::event_destroy(self.raw) };
        }
    }
}
