//! What the batcher does differently per memory kind: how a camera's ring is opened and read,
//! how a frame is copied into its place, how the places of cameras with nothing new are
//! filled, and how the batch's publish is ordered after the copies. Everything else is written
//! once, in the other files of this module.

use std::time::Duration;

use super::RunError;
use crate::{
    Consumer, ConsumerBuilder, CreateError, Host, Memory, OpenError, Producer, ProducerBuilder,
    ReadSlot, RecvTimeoutError,
};

/// A memory kind a batcher batches: [`Host`], or [`Cuda`](crate::Cuda) (feature `cuda`).
/// Sealed: gpuring implements it for its memory kinds.
///
/// ```no_run
/// use std::sync::atomic::AtomicBool;
/// use gpuring::batch::{BatchMemory, Batcher, RunError, Totals};
///
/// // One function for both memory kinds.
/// fn batch<M: BatchMemory>(inputs: &[&str], stop: &AtomicBool) -> Result<Totals, RunError> {
///     Batcher::builder("cams", inputs).build().expect("settings").run_in::<M>(stop)
/// }
/// batch::<gpuring::Host>(&["cam0", "cam1"], &AtomicBool::new(false))?;
/// # Ok::<(), RunError>(())
/// ```
pub trait BatchMemory: Memory + sealed::Sealed {
    /// What copies one camera's frames: nothing in host memory (the camera's thread copies),
    /// the camera's own stream in CUDA memory.
    #[doc(hidden)]
    type Lane: Send + Sync;

    /// The batch ring's work up to a point, for lanes to wait for: nothing in host memory (the
    /// batcher's thread does it all before it opens a batch), an event of the batch ring's
    /// stream in CUDA memory.
    #[doc(hidden)]
    type Gate: Send + Sync;

    /// Makes the output ring.
    #[doc(hidden)]
    fn create(b: ProducerBuilder, device: i32) -> Result<Producer<Self>, CreateError>;

    /// Opens a camera's ring (an instance other than `not_epoch`), waiting up to `timeout`.
    #[doc(hidden)]
    fn open(
        b: ConsumerBuilder,
        device: i32,
        not_epoch: Option<u64>,
        timeout: Duration,
    ) -> Result<Consumer<Self>, OpenError>;

    /// A lane for the camera read by `rx`.
    #[doc(hidden)]
    fn lane(rx: &Consumer<Self>) -> Result<Self::Lane, RunError>;

    /// Receives the camera's next frame, waiting up to `timeout`: readable on `lane`.
    #[doc(hidden)]
    fn recv<'a>(
        rx: &'a Consumer<Self>,
        lane: &'a Self::Lane,
        timeout: Duration,
    ) -> Result<ReadSlot<'a, Self>, RecvTimeoutError>;

    /// Copies the first `len` bytes of `frame` to `dst`, on `lane`; the frame may be released
    /// once this returns (its release is ordered after the copy).
    ///
    /// # Safety
    /// `dst` must be `len` bytes of a loan of the output producer that nothing else writes or
    /// reads until the batch is joined ([`join`](Self::join)) and published; `frame` must hold
    /// `len` bytes.
    #[doc(hidden)]
    unsafe fn copy(
        lane: &Self::Lane,
        dst: u64,
        frame: &ReadSlot<'_, Self>,
        len: usize,
    ) -> Result<(), RunError>;

    /// Orders what `out` publishes next after the copies made on `lane` so far.
    #[doc(hidden)]
    fn join(out: &Producer<Self>, lane: &Self::Lane) -> Result<(), RunError>;

    /// The work `out` was given so far, for [`pass`](Self::pass).
    #[doc(hidden)]
    fn gate(out: &Producer<Self>) -> Result<Self::Gate, RunError>;

    /// Orders the copies made on `lane` from now on after `gate`'s work.
    #[doc(hidden)]
    fn pass(lane: &Self::Lane, gate: &Self::Gate) -> Result<(), RunError>;

    /// Waits up to `within` for `out`'s work to be done (when the batcher stops: a copy still
    /// to run must not outlive the buffers it writes). Whether it is.
    #[doc(hidden)]
    fn quiesce(out: &Producer<Self>, within: Duration) -> bool;

    /// Fills `len` bytes at `dst` with a copy of `src`, or zeros, in `out`'s order (before what
    /// it publishes next).
    ///
    /// # Safety
    /// `dst` must be `len` bytes of a loan of `out` that only this call writes; `src`, if any,
    /// `len` bytes of another loan of `out` that nobody writes (published and kept).
    #[doc(hidden)]
    unsafe fn fill(
        out: &Producer<Self>,
        dst: u64,
        src: Option<u64>,
        len: usize,
    ) -> Result<(), RunError>;
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for crate::Host {}
    #[cfg(feature = "cuda")]
    impl Sealed for crate::Cuda {}
}

impl BatchMemory for Host {
    type Lane = ();
    type Gate = ();

    fn create(b: ProducerBuilder, _device: i32) -> Result<Producer, CreateError> {
        b.create()
    }

    fn open(
        b: ConsumerBuilder,
        _device: i32,
        not_epoch: Option<u64>,
        timeout: Duration,
    ) -> Result<Consumer, OpenError> {
        b.open_when_ready(not_epoch, timeout)
    }

    fn lane(_rx: &Consumer) -> Result<(), RunError> {
        Ok(())
    }

    fn recv<'a>(
        rx: &'a Consumer,
        _lane: &'a (),
        timeout: Duration,
    ) -> Result<ReadSlot<'a>, RecvTimeoutError> {
        rx.recv_timeout(timeout)
    }

    unsafe fn copy(_lane: &(), dst: u64, frame: &ReadSlot<'_>, len: usize) -> Result<(), RunError> {
        // SAFETY: the caller's contract: `dst` is `len` writable bytes nobody else touches, and
        // the frame holds `len` bytes; a loan and a received message are different buffers.
        unsafe { std::ptr::copy_nonoverlapping(frame.as_ptr(), dst as *mut u8, len) };
        Ok(())
    }

    fn join(_out: &Producer, _lane: &()) -> Result<(), RunError> {
        Ok(())
    }

    fn gate(_out: &Producer) -> Result<(), RunError> {
        Ok(())
    }

    fn pass(_lane: &(), _gate: &()) -> Result<(), RunError> {
        Ok(())
    }

    fn quiesce(_out: &Producer, _within: Duration) -> bool {
        true
    }

    unsafe fn fill(
        _out: &Producer,
        dst: u64,
        src: Option<u64>,
        len: usize,
    ) -> Result<(), RunError> {
        // SAFETY: the caller's contract: `dst` is `len` bytes only we write, `src` (if any)
        // `len` bytes of another buffer nobody writes.
        unsafe {
            match src {
                Some(src) => std::ptr::copy_nonoverlapping(src as *const u8, dst as *mut u8, len),
                None => std::ptr::write_bytes(dst as *mut u8, 0, len),
            }
        }
        Ok(())
    }
}

#[cfg(feature = "cuda")]
mod cuda {
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use super::{BatchMemory, RunError};
    use crate::cuda::{driver, Context, Stream};
    use crate::{
        Consumer, ConsumerBuilder, CreateError, Cuda, OpenError, Producer, ProducerBuilder,
        ReadSlot, RecvTimeoutError,
    };

    /// An event recorded on the batch ring's stream. Invariant: `ev` was created in `ctx` and
    /// is destroyed only by `drop`.
    pub struct Gate {
        ctx: Arc<Context>,
        ev: driver::CUevent,
    }

    // SAFETY: an event handle may be used from any thread with its context bound, which every
    // use here does; the driver API is thread-safe.
    unsafe impl Send for Gate {}
    // SAFETY: as above; `&Gate` only records waits on it.
    unsafe impl Sync for Gate {}

    impl Drop for Gate {
        fn drop(&mut self) {
            if let Ok(_bound) = self.ctx.bind() {
                // SAFETY: `ev` is ours (the invariant) and not used again; destroying an event
                // that streams still wait on is allowed (the driver frees it after the waits).
                let _ = unsafe { driver::event_destroy(self.ev) };
            }
        }
    }

    fn cuda(e: driver::DriverError) -> RunError {
        RunError::Cuda(e.into())
    }

    impl BatchMemory for Cuda {
        type Lane = Stream;
        type Gate = Gate;

        fn create(b: ProducerBuilder, device: i32) -> Result<Producer<Cuda>, CreateError> {
            b.create_gpu(device)
        }

        fn open(
            b: ConsumerBuilder,
            device: i32,
            not_epoch: Option<u64>,
            timeout: Duration,
        ) -> Result<Consumer<Cuda>, OpenError> {
            b.device(device).open_gpu_when_ready(not_epoch, timeout)
        }

        fn lane(rx: &Consumer<Cuda>) -> Result<Stream, RunError> {
            Stream::new(rx.context()).map_err(cuda)
        }

        fn recv<'a>(
            rx: &'a Consumer<Cuda>,
            lane: &'a Stream,
            timeout: Duration,
        ) -> Result<ReadSlot<'a, Cuda>, RecvTimeoutError> {
            rx.recv_on_timeout(lane, timeout)
        }

        unsafe fn copy(
            lane: &Stream,
            dst: u64,
            frame: &ReadSlot<'_, Cuda>,
            len: usize,
        ) -> Result<(), RunError> {
            let _bound = lane.context().bind().map_err(|e| RunError::Cuda(e.into()))?;
            // SAFETY: the caller's contract (both are `len` bytes of device memory of this
            // context, the frame mapped while `frame` lives, which is past this enqueue; its
            // release is recorded on `lane` after the copy); `lane` is live and current.
            unsafe { driver::memcpy_dtod_async(dst, frame.ptr(), len, lane.raw()) }
                .map_err(|e| RunError::Cuda(e.into()))
        }

        fn join(out: &Producer<Cuda>, lane: &Stream) -> Result<(), RunError> {
            out.stream().wait_for(lane).map_err(cuda)
        }

        fn gate(out: &Producer<Cuda>) -> Result<Gate, RunError> {
            let s = out.stream();
            let _bound = s.context().bind().map_err(cuda)?;
            // SAFETY: the context is current.
            let ev = unsafe { driver::event_create() }.map_err(cuda)?;
            let gate = Gate { ctx: s.context().clone(), ev };
            // SAFETY: `ev` was just created in this context, `s` is live in it.
            unsafe { driver::event_record(gate.ev, s.raw()) }.map_err(cuda)?;
            Ok(gate)
        }

        fn pass(lane: &Stream, gate: &Gate) -> Result<(), RunError> {
            let _bound = lane.context().bind().map_err(cuda)?;
            // SAFETY: `lane` is live; `gate.ev` is live (the invariant) and recorded.
            unsafe { driver::stream_wait_event(lane.raw(), gate.ev) }.map_err(cuda)
        }

        fn quiesce(out: &Producer<Cuda>, within: Duration) -> bool {
            let end = Instant::now() + within;
            loop {
                match out.stream().is_idle() {
                    Ok(true) => return true,
                    Err(_) => return false,
                    Ok(false) if Instant::now() >= end => return false,
                    Ok(false) => std::thread::sleep(Duration::from_millis(1)),
                }
            }
        }

        unsafe fn fill(
            out: &Producer<Cuda>,
            dst: u64,
            src: Option<u64>,
            len: usize,
        ) -> Result<(), RunError> {
            let s = out.stream();
            let _bound = s.context().bind().map_err(|e| RunError::Cuda(e.into()))?;
            // SAFETY: the caller's contract: device memory of `out`'s context, `dst` written
            // only by this enqueue, `src` (if any) a kept loan nobody writes; both stay mapped
            // while the producer lives, past the copy on its own stream.
            let r = unsafe {
                match src {
                    Some(src) => driver::memcpy_dtod_async(dst, src, len, s.raw()),
                    None => driver::memset_async(dst, 0, len, s.raw()),
                }
            };
            r.map_err(|e| RunError::Cuda(e.into()))
        }
    }
}
