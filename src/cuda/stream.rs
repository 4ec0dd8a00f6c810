//! An owned CUDA stream.

use std::sync::Arc;

use super::driver::{self, CUstream, DriverError};
use super::Context;

/// A non-blocking stream of a context, destroyed on drop.
///
/// ```no_run
/// use gpuring::cuda::{Context, Stream};
///
/// let stream = Stream::new(&Context::new(0)?)?;
/// // ... enqueue work on stream.raw() ...
/// stream.synchronize()?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// Invariant: `raw` is a live stream of `ctx`.
pub struct Stream {
    ctx: Arc<Context>,
    raw: CUstream,
    /// Whether dropping this destroys the stream (false for [`Stream::from_raw`]).
    owned: bool,
}

// SAFETY: a stream handle may be used from any thread with its context bound.
unsafe impl Send for Stream {}
// SAFETY: the driver API is thread-safe: threads may enqueue on one stream at once, and every
// method binds the stream's context on the calling thread first; the struct itself is never
// mutated through `&self`.
unsafe impl Sync for Stream {}

impl Stream {
    /// Creates a stream in `ctx`.
    ///
    /// ```no_run
    /// let ctx = gpuring::cuda::Context::new(0)?;
    /// let stream = gpuring::cuda::Stream::new(&ctx)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn new(ctx: &Arc<Context>) -> Result<Stream, DriverError> {
        let _bound = ctx.bind()?;
        // SAFETY: `ctx` is current.
        let raw = unsafe { driver::stream_create() }?;
        Ok(Stream { ctx: ctx.clone(), raw, owned: true })
    }

    /// Wraps a stream created elsewhere (by cudarc, PyTorch, a decoder library) so it can be
    /// passed to `acquire_on` / `recv_on`. Dropping the wrapper does not destroy the stream.
    ///
    /// ```no_run
    /// use gpuring::cuda::Stream;
    /// # let rx = gpuring::Consumer::open_gpu("cam0")?;
    /// # let theirs = Stream::new(rx.context())?;
    /// let raw = theirs.raw(); // a stream of another library, on the ring's GPU
    /// // SAFETY: `raw` is a live stream of that GPU's primary context and outlives `stream`.
    /// let stream = unsafe { Stream::from_raw(rx.context(), raw) };
    /// let msg = rx.recv_on(&stream)?; // `stream` waits for the frame on the GPU
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Safety
    /// 1. `raw` must be a live stream of `ctx`'s device's primary context (the one the CUDA
    ///    runtime uses), and stay live while the wrapper and anything enqueued through it are.
    /// 2. `raw` must not be the per-thread default stream (`CU_STREAM_PER_THREAD`, 0x2) if the
    ///    wrapper is used on more than one thread: that handle names a different stream on each
    ///    thread, so a message received on it and released (dropped) on another thread would
    ///    record its release on the wrong stream, before the reads it must follow.
    pub unsafe fn from_raw(ctx: &Arc<Context>, raw: CUstream) -> Stream {
        Stream { ctx: ctx.clone(), raw, owned: false }
    }

    /// The raw handle, for passing to other CUDA code. It stays valid while `self` lives.
    ///
    /// ```no_run
    /// # let ctx = gpuring::cuda::Context::new(0)?;
    /// let stream = gpuring::cuda::Stream::new(&ctx)?;
    /// let raw = stream.raw(); // a `CUstream`, for kernel launches and other libraries
    /// assert!(!raw.is_null());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn raw(&self) -> CUstream {
        self.raw
    }

    /// The context.
    ///
    /// ```no_run
    /// # let ctx = gpuring::cuda::Context::new(0)?;
    /// let stream = gpuring::cuda::Stream::new(&ctx)?;
    /// assert_eq!(stream.context().ordinal(), 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    /// Whether everything queued on the stream has completed (`cuStreamQuery`); never blocks.
    ///
    /// ```no_run
    /// # let ctx = gpuring::cuda::Context::new(0)?;
    /// let stream = gpuring::cuda::Stream::new(&ctx)?;
    /// assert!(stream.is_idle()?); // nothing queued yet
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn is_idle(&self) -> Result<bool, DriverError> {
        let _bound = self.ctx.bind()?;
        // SAFETY: `raw` is live by the invariant.
        unsafe { driver::stream_query(self.raw) }
    }

    /// Blocks the calling thread until the stream's work is done. For setup, teardown and tests:
    /// gpuring's steady-state path never calls it.
    ///
    /// ```no_run
    /// # let ctx = gpuring::cuda::Context::new(0)?;
    /// let stream = gpuring::cuda::Stream::new(&ctx)?;
    /// // ... enqueue work on stream.raw() ...
    /// stream.synchronize()?; // the work is done now
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn synchronize(&self) -> Result<(), DriverError> {
        let _bound = self.ctx.bind()?;
        // SAFETY: `raw` is live by the invariant.
        unsafe { driver::stream_synchronize(self.raw) }
    }
}

/// The boxed closure behind [`Stream::on_complete`].
impl Stream {
    /// Makes work queued on this stream from now on wait for the work queued on `other` so
    /// far, on the GPU (an event recorded on `other`, waited on here); the CPU does not wait.
    /// Both streams must be of this stream's context.
    ///
    /// This is how work on one stream (a message's) is handed to another (a library's):
    ///
    /// ```no_run
    /// use gpuring::cuda::Stream;
    /// # let rx = gpuring::Consumer::open_gpu("cam0")?;
    /// let frame = rx.recv()?;
    /// let mine = Stream::new(rx.context())?;
    /// mine.wait_for(frame.stream())?; // `mine` now sees the frame's bytes
    /// // ... kernels on `mine` read frame.ptr() ...
    /// frame.stream().wait_for(&mine)?; // and the release waits for them
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn wait_for(&self, other: &Stream) -> Result<(), DriverError> {
        if other.raw == self.raw {
            return Ok(());
        }
        let _bound = self.ctx.bind()?;
        // SAFETY: `ctx` is current.
        let ev = unsafe { driver::event_create() }?;
        // SAFETY: `ev` was just created in the current context; both streams are live by the
        // invariant (the caller's `other` is a `Stream` of this context).
        let waited = unsafe { driver::event_record(ev, other.raw) }
            // SAFETY: as above.
            .and_then(|()| unsafe { driver::stream_wait_event(self.raw, ev) });
        // SAFETY: `ev` is ours and not used again; destroying an event that a stream still
        // waits on is allowed (the driver frees it once the wait is done).
        let _ = unsafe { driver::event_destroy(ev) };
        waited
    }
}

type HostFn = Box<dyn FnOnce() + Send + 'static>;

extern "C" fn run_host_fn(data: *mut std::ffi::c_void) {
    // SAFETY: `data` is the `Box<HostFn>` leaked by `on_complete`, passed to exactly one call.
    let f = unsafe { Box::from_raw(data as *mut HostFn) };
    // A panic must not unwind into the driver.
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
}

impl Stream {
    /// Enqueues `f`: a driver thread runs it once the work queued before it has finished.
    /// Useful for timestamps ("when did my stream get the frame?") without making this thread
    /// wait.
    ///
    /// ```no_run
    /// # let ctx = gpuring::cuda::Context::new(0)?;
    /// # let stream = gpuring::cuda::Stream::new(&ctx)?;
    /// let (tx, rx) = std::sync::mpsc::channel();
    /// // SAFETY: the closure makes no CUDA call, and a channel sender is all it owns.
    /// unsafe { stream.on_complete(move || tx.send(gpuring::monotonic_ns()).unwrap())? };
    /// println!("work done at {} ns", rx.recv()?);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Safety
    /// 1. `f` must make no CUDA call, and neither may dropping what it captures (so it must not
    ///    own a [`Stream`], an event, a pool or the last `Arc` of a [`Context`]).
    pub unsafe fn on_complete(&self, f: impl FnOnce() + Send + 'static) -> Result<(), DriverError> {
        let _bound = self.ctx.bind()?;
        let boxed: Box<HostFn> = Box::new(Box::new(f));
        let data = Box::into_raw(boxed);
        // SAFETY: `raw` is live; `run_host_fn` takes back ownership of `data` exactly once, and
        // `f` makes no CUDA call by this function's precondition (1).
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
        if !self.owned {
            return;
        }
        if let Ok(_bound) = self.ctx.bind() {
            // SAFETY: live by the invariant, and never used after drop.
            let _ = unsafe { driver::stream_destroy(self.raw) };
        }
    }
}
