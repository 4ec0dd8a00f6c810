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

impl Drop for Stream {
    fn drop(&mut self) {
        if self.ctx.bind().is_ok() {
            // SAFETY: live by the invariant, and never used after drop.
            let _ = unsafe { driver::stream_destroy(self.raw) };
        }
    }
}
