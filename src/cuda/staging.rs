//! Page-locked host buffers that copies between the host and the GPU go through
//! asynchronously, each with an event that says when its last copy has run (the Zenoh bridge
//! stages CUDA messages through them).

use std::sync::Arc;

use memmap2::MmapMut;

use super::driver::{self, CUdeviceptr, CUevent, DriverError};
use super::{Context, CudaError, HostRegistration, Stream};

/// A page-locked host buffer, mapped for the device, and an event.
///
/// ```no_run
/// use gpuring::cuda::{Context, StagingBuffer, Stream};
///
/// let ctx = Context::new(0)?;
/// let stream = Stream::new(&ctx)?;
/// let mut buf = StagingBuffer::new(&ctx, 1 << 20)?;
/// // ... queue a copy into buf.device_ptr() on `stream`, then:
/// buf.record(&stream)?;
/// buf.wait()?; // the copy has run: the bytes can be read
/// let bytes: &[u8] = &buf.host()[..16];
/// # let _ = bytes;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// Invariants: `reg` registers all of `map` for `ctx`'s device (declared before `map`, so it
/// unregisters before the unmap); `event` is a live event of `ctx`.
pub struct StagingBuffer {
    reg: HostRegistration,
    map: MmapMut,
    event: CUevent,
    ctx: Arc<Context>,
}

// SAFETY: the event handle and the registration may be used from any thread with the context
// bound (every method binds it); the mapping is owned memory.
unsafe impl Send for StagingBuffer {}

impl StagingBuffer {
    /// A buffer of `len` bytes (at least one page), page-locked for `ctx`'s device.
    ///
    /// ```no_run
    /// let ctx = gpuring::cuda::Context::new(0)?;
    /// let buf = gpuring::cuda::StagingBuffer::new(&ctx, 8 << 20)?;
    /// assert!(buf.len() >= 8 << 20);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn new(ctx: &Arc<Context>, len: usize) -> Result<StagingBuffer, CudaError> {
        let mut map = MmapMut::map_anon(len.max(1))
            .map_err(|e| CudaError::Unavailable(format!("{len} bytes of staging memory: {e}")))?;
        // SAFETY: an anonymous mapping is page-aligned and stays mapped while `map` lives,
        // which the field order keeps past the registration; nothing else registers it.
        let reg = unsafe { HostRegistration::new(ctx, map.as_mut_ptr(), map.len()) }?;
        let _bound = ctx.bind()?;
        // SAFETY: `ctx` is current.
        let event = unsafe { driver::event_create() }?;
        Ok(StagingBuffer { reg, map, event, ctx: ctx.clone() })
    }

    /// Its size in bytes.
    ///
    /// ```no_run
    /// # let ctx = gpuring::cuda::Context::new(0)?;
    /// let buf = gpuring::cuda::StagingBuffer::new(&ctx, 100)?;
    /// assert_eq!(buf.len(), 100);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether it is empty (never: at least one byte).
    ///
    /// ```no_run
    /// # let ctx = gpuring::cuda::Context::new(0)?;
    /// assert!(!gpuring::cuda::StagingBuffer::new(&ctx, 1)?.is_empty());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Its device address, for copies queued on a stream of its context.
    ///
    /// ```no_run
    /// # let ctx = gpuring::cuda::Context::new(0)?;
    /// let buf = gpuring::cuda::StagingBuffer::new(&ctx, 4096)?;
    /// assert_ne!(buf.device_ptr(), 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn device_ptr(&self) -> CUdeviceptr {
        self.reg.device_ptr(0)
    }

    /// Its bytes, for the CPU. Read them only after [`wait`](Self::wait) (a copy into it may
    /// still be running otherwise), and write them only when no copy out of it is queued.
    ///
    /// ```no_run
    /// # let ctx = gpuring::cuda::Context::new(0)?;
    /// let mut buf = gpuring::cuda::StagingBuffer::new(&ctx, 4096)?;
    /// buf.host_mut()[..5].copy_from_slice(b"hello");
    /// assert_eq!(&buf.host()[..5], b"hello");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn host(&self) -> &[u8] {
        &self.map
    }

    /// Its bytes, writable by the CPU (see [`host`](Self::host)).
    ///
    /// ```no_run
    /// # let ctx = gpuring::cuda::Context::new(0)?;
    /// let mut buf = gpuring::cuda::StagingBuffer::new(&ctx, 4096)?;
    /// buf.host_mut()[0] = 1;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn host_mut(&mut self) -> &mut [u8] {
        &mut self.map
    }

    /// Queues on `stream` a copy of `len` bytes of device memory at `src` into this buffer,
    /// and records its event after it: [`wait`](Self::wait) returns once the copy has run.
    ///
    /// ```no_run
    /// # let rx = gpuring::Consumer::open_gpu("cam0")?;
    /// let mut buf = gpuring::cuda::StagingBuffer::new(rx.context(), rx.slot_size())?;
    /// let msg = rx.recv()?;
    /// // SAFETY: the message's bytes are ordered before the copy on its stream and held until
    /// // the wait; nothing else uses the buffer.
    /// unsafe { buf.copy_from_device(msg.ptr(), msg.len(), msg.stream()) }?;
    /// buf.wait()?;
    /// let bytes = &buf.host()[..msg.len()];
    /// # let _ = bytes;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Safety
    /// 1. `src..src + len` must be device memory readable in this buffer's context, ordered
    ///    before the copy (written by work done or queued before on `stream`), and unchanged
    ///    until the copy has run.
    /// 2. No other copy into or out of this buffer may be running or queued.
    pub unsafe fn copy_from_device(
        &mut self,
        src: CUdeviceptr,
        len: usize,
        stream: &Stream,
    ) -> Result<(), CudaError> {
        if len > self.len() {
            return Err(CudaError::TooLong { len, capacity: self.len() });
        }
        let _bound = self.ctx.bind()?;
        // SAFETY: the buffer holds `len` bytes at its device address (checked above); `src`
        // by (1), the buffer's other users by (2); the stream is live, its context current.
        unsafe { driver::memcpy_dtod_async(self.device_ptr(), src, len, stream.raw()) }?;
        self.record_or_settle(stream)?;
        Ok(())
    }

    /// [`record`](Self::record) after a copy into or out of this buffer was queued on
    /// `stream`; if the record fails, waits for `stream` instead, so that no copy can still be
    /// running when the error makes the caller drop the buffer.
    ///
    /// ```no_run
    /// # let ctx = gpuring::cuda::Context::new(0)?;
    /// # let stream = gpuring::cuda::Stream::new(&ctx)?;
    /// let buf = gpuring::cuda::StagingBuffer::new(&ctx, 4096)?;
    /// // ... a copy out of buf.device_ptr() queued on `stream` ...
    /// buf.record_or_settle(&stream)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn record_or_settle(&self, stream: &Stream) -> Result<(), DriverError> {
        self.record(stream).inspect_err(|_| {
            let _ = stream.synchronize();
        })
    }

    /// Records its event on `stream`, after the copies queued there so far.
    ///
    /// ```no_run
    /// # let ctx = gpuring::cuda::Context::new(0)?;
    /// # let stream = gpuring::cuda::Stream::new(&ctx)?;
    /// let buf = gpuring::cuda::StagingBuffer::new(&ctx, 4096)?;
    /// buf.record(&stream)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn record(&self, stream: &Stream) -> Result<(), DriverError> {
        let _bound = self.ctx.bind()?;
        // SAFETY: the event is live (invariant) and the stream live; its context is current
        // (a stream of another context is refused by the driver).
        unsafe { driver::event_record(self.event, stream.raw()) }
    }

    /// Blocks until the work recorded by the last [`record`](Self::record) has run (at once if
    /// none was).
    ///
    /// ```no_run
    /// # let ctx = gpuring::cuda::Context::new(0)?;
    /// let buf = gpuring::cuda::StagingBuffer::new(&ctx, 4096)?;
    /// buf.wait()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn wait(&self) -> Result<(), DriverError> {
        let _bound = self.ctx.bind()?;
        // SAFETY: the event is live (invariant).
        unsafe { driver::event_synchronize(self.event) }
    }
}

impl Drop for StagingBuffer {
    fn drop(&mut self) {
        // The registration must not go while a copy still uses it.
        let _ = self.wait();
        if let Ok(_bound) = self.ctx.bind() {
            // SAFETY: created by `new`, waited for above, not used again.
            let _ = unsafe { driver::event_destroy(self.event) };
        }
    }
}
