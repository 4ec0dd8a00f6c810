//! An owned CUDA stream.

use std::sync::Arc;

use super::driver::{self, CUstream, DriverError};
use super::Context;

/// A non-blocking stream of a context, destroyed on drop.
///
/// Invariant: `raw` is a live stream of `ctx`.
pub struct Stream {
    ctx: Arc<Context>,
    raw: CUstream,
}

// SAFETY: a stream handle may be used from any thread with its context bound.
unsafe impl Send for Stream {}

impl Stream {
    /// Creates a stream in `ctx`.
    pub fn new(ctx: &Arc<Context>) -> Result<Stream, DriverError> {
        ctx.bind()?;
        // SAFETY: `ctx` is current.
        let raw = unsafe { driver::stream_create() }?;
        Ok(Stream { ctx: ctx.clone(), raw })
    }

    /// The raw handle, for passing to other CUDA code. It stays valid while `self` lives.
    pub fn raw(&self) -> CUstream {
        self.raw
    }

    /// The context.
    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    /// Blocks the calling thread until the stream's work is done. For setup, teardown and tests:
    /// gpuring's steady-state path never calls it.
    pub fn synchronize(&self) -> Result<(), DriverError> {
        self.ctx.bind()?;
        // SAFETY: `raw` is live by the invariant.
        unsafe { driver::stream_synchronize(self.raw) }
    }
}

/// The boxed closure behind [`Stream::on_complete`].
type HostFn = Box<dyn FnOnce() + Send + 'static>;

extern "C" fn run_host_fn(data: *mut std::ffi::c_void) {
    // SAFETY: `data` is the `Box<HostFn>` leaked by `on_complete`, passed to exactly one call.
    let f = unsafe { Box::from_raw(data as *mut HostFn) };
    // A panic must not unwind into the driver.
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
}

impl Stream {
    /// Enqueues `f`: a driver thread runs it once the work queued before it has finished. It
    /// must not make CUDA calls. Useful for timestamps ("when did my stream get the frame?")
    /// without making this thread wait.
    pub fn on_complete(&self, f: impl FnOnce() + Send + 'static) -> Result<(), DriverError> {
        self.ctx.bind()?;
        let boxed: Box<HostFn> = Box::new(Box::new(f));
        let data = Box::into_raw(boxed);
        // SAFETY: `raw` is live; `run_host_fn` takes back ownership of `data` exactly once.
        let r = unsafe { driver::launch_host_fn(self.raw, run_host_fn, data.cast()) };
        if r.is_err() {
            // SAFETY: the launch failed, so the driver will not call `run_host_fn`.
            drop(unsafe { Box::from_raw(data) });
        }
        r
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        if self.ctx.bind().is_ok() {
            // SAFETY: live by the invariant, and never used after drop.
            let _ = unsafe { driver::stream_destroy(self.raw) };
        }
    }
}
