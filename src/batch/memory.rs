//! What the batcher does differently per memory kind: how a camera's ring is opened and read,
//! how a frame is copied into its place, how the places of cameras with nothing new are
//! filled, and how the batch's publish is ordered after the copies. Everything else is written
//! once, in the other files of this module.

use std::time::Duration;

use super::RunError;
use crate::frame::Plane;
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

    /// Copies `planes` of `frame` to `dst`, packed (one after another, rows without padding),
    /// on `lane`; the frame may be released once this returns (its release is ordered after
    /// the copy).
    ///
    /// # Safety
    /// `dst` must be the planes' packed bytes (the sum of `row_bytes * rows`) of a loan of the
    /// output producer that nothing else writes or reads until the batch is joined
    /// ([`join`](Self::join)) and published; `frame` must hold every plane (each `rows` rows
    /// `stride` apart, the last ending by its length), and each plane's `stride` be at least its
    /// `row_bytes`.
    #[doc(hidden)]
    unsafe fn copy(
        lane: &Self::Lane,
        dst: u64,
        frame: &ReadSlot<'_, Self>,
        planes: &[Plane],
    ) -> Result<(), RunError>;

    /// Orders what `lane` does from now on after the copies made on `earlier` so far (the
    /// camera's lane before it joined its ring again, which copied into the same place).
    #[doc(hidden)]
    fn follow(lane: &Self::Lane, earlier: &Self::Lane) -> Result<(), RunError>;

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

    unsafe fn copy(
        _lane: &(),
        dst: u64,
        frame: &ReadSlot<'_>,
        planes: &[Plane],
    ) -> Result<(), RunError> {
        let mut to = dst as *mut u8;
        for p in planes {
            // A plane without padding is one run of bytes: copied as one row.
            let (row_bytes, rows) = if p.stride == p.row_bytes {
                (p.row_bytes * p.rows, 1)
            } else {
                (p.row_bytes, p.rows)
            };
            for row in 0..rows {
                // SAFETY: the caller's contract: the row is inside the frame, and `to` inside
                // the packed bytes at `dst`, writable and touched by nobody else; a loan and a
                // received message are different buffers.
                unsafe {
                    let from = frame.as_ptr().add(p.offset + row * p.stride);
                    std::ptr::copy_nonoverlapping(from, to, row_bytes);
                    to = to.add(row_bytes);
                }
            }
        }
        Ok(())
    }

    fn follow(_lane: &(), _earlier: &()) -> Result<(), RunError> {
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
    use std::sync::atomic::AtomicBool;
    use std::sync::atomic::Ordering::Relaxed;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use super::{BatchMemory, RunError};
    use crate::cuda::driver::{self, Rows};
    use crate::cuda::{Context, Stream};
    use crate::frame::Plane;
    use crate::{
        Consumer, ConsumerBuilder, CreateError, Cuda, OpenError, Producer, ProducerBuilder,
        ReadSlot, RecvTimeoutError,
    };

    /// An event of the batch's context. Invariant: `ev` was created in `ctx` and is destroyed
    /// only by `drop`.
    pub struct Event {
        ctx: Arc<Context>,
        ev: driver::CUevent,
    }

    // SAFETY: an event handle may be used from any thread with its context bound, which every
    // use here does; the driver API is thread-safe.
    unsafe impl Send for Event {}
    // SAFETY: as above; `&Event` records it or records waits on it, one driver call each.
    unsafe impl Sync for Event {}

    impl Event {
        /// A new event in `ctx`.
        fn new(ctx: &Arc<Context>) -> Result<Event, RunError> {
            let _bound = ctx.bind().map_err(cuda)?;
            // SAFETY: the context is current.
            let ev = unsafe { driver::event_create() }.map_err(cuda)?;
            Ok(Event { ctx: ctx.clone(), ev })
        }

        /// Records the event on `stream`, a stream of its context, which the caller made
        /// current.
        fn record(&self, stream: &Stream) -> Result<(), RunError> {
            // SAFETY: `ev` is live (the invariant); `stream` is live in the event's context,
            // which is current (the caller's contract).
            unsafe { driver::event_record(self.ev, stream.raw()) }.map_err(cuda)
        }

        /// Makes `stream` (of the event's context, current) wait for the event's last record.
        /// A later record does not change what this wait waits for.
        fn wait_on(&self, stream: &Stream) -> Result<(), RunError> {
            // SAFETY: as in `record`.
            unsafe { driver::stream_wait_event(stream.raw(), self.ev) }.map_err(cuda)
        }
    }

    impl Drop for Event {
        fn drop(&mut self) {
            if let Ok(_bound) = self.ctx.bind() {
                // SAFETY: `ev` is ours (the invariant) and not used again; destroying an event
                // that streams still wait on is allowed (the driver frees it after the waits).
                let _ = unsafe { driver::event_destroy(self.ev) };
            }
        }
    }

    /// A camera's lane: its stream, and an event recorded after each of its copies, which the
    /// batch's stream joins. Recorded right after the copy, not when the batch is joined: by
    /// then the lane may already wait for the fence of the camera's next frame, and the batch
    /// must not wait for a frame it does not hold.
    pub struct Lane {
        stream: Stream,
        copied: Event,
        /// Whether `copied` was recorded after the lane's last copy; false after a copy whose
        /// record failed (then a join records it anew). Relaxed: the camera's thread writes it
        /// and the batcher's reads it with the batch's lock taken in between (`Gather`'s
        /// `copying` count), which orders the two.
        recorded: AtomicBool,
    }

    fn cuda(e: driver::DriverError) -> RunError {
        RunError::Cuda(e.into())
    }

    impl BatchMemory for Cuda {
        type Lane = Lane;
        type Gate = Event;

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

        fn lane(rx: &Consumer<Cuda>) -> Result<Lane, RunError> {
            let stream = Stream::new(rx.context()).map_err(cuda)?;
            let copied = Event::new(rx.context())?;
            Ok(Lane { stream, copied, recorded: AtomicBool::new(false) })
        }

        fn recv<'a>(
            rx: &'a Consumer<Cuda>,
            lane: &'a Lane,
            timeout: Duration,
        ) -> Result<ReadSlot<'a, Cuda>, RecvTimeoutError> {
            rx.recv_on_timeout(&lane.stream, timeout)
        }

        unsafe fn copy(
            lane: &Lane,
            dst: u64,
            frame: &ReadSlot<'_, Cuda>,
            planes: &[Plane],
        ) -> Result<(), RunError> {
            let _bound = lane.stream.context().bind().map_err(cuda)?;
            lane.recorded.store(false, Relaxed);
            // SAFETY: the caller's contract, passed on; the lane's context is current.
            let copied = unsafe { copy_planes(&lane.stream, dst, frame, planes) };
            // Recorded after a failed copy too: the join must follow whatever was enqueued.
            lane.copied.record(&lane.stream)?;
            lane.recorded.store(true, Relaxed);
            copied
        }

        fn follow(lane: &Lane, earlier: &Lane) -> Result<(), RunError> {
            let _bound = lane.stream.context().bind().map_err(cuda)?;
            // `earlier` is the same camera thread's old lane: its `recorded` is this thread's.
            if !earlier.recorded.load(Relaxed) {
                earlier.copied.record(&earlier.stream)?;
            }
            earlier.copied.wait_on(&lane.stream)
        }

        fn join(out: &Producer<Cuda>, lane: &Lane) -> Result<(), RunError> {
            let _bound = out.stream().context().bind().map_err(cuda)?;
            if !lane.recorded.load(Relaxed) {
                lane.copied.record(&lane.stream)?;
            }
            lane.copied.wait_on(out.stream())
        }

        fn gate(out: &Producer<Cuda>) -> Result<Event, RunError> {
            let s = out.stream();
            let gate = Event::new(s.context())?;
            let _bound = s.context().bind().map_err(cuda)?;
            gate.record(s)?;
            Ok(gate)
        }

        fn pass(lane: &Lane, gate: &Event) -> Result<(), RunError> {
            let _bound = lane.stream.context().bind().map_err(cuda)?;
            gate.wait_on(&lane.stream)
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
            let _bound = s.context().bind().map_err(cuda)?;
            // SAFETY: the caller's contract: device memory of `out`'s context, `dst` written
            // only by this enqueue, `src` (if any) a kept loan nobody writes; both stay mapped
            // while the producer lives, past the copy on its own stream.
            let r = unsafe {
                match src {
                    Some(src) => driver::memcpy_dtod_async(dst, src, len, s.raw()),
                    None => driver::memset_async(dst, 0, len, s.raw()),
                }
            };
            r.map_err(cuda)
        }
    }

    /// Enqueues on `stream` the copies of `planes` of `frame` to `dst`, packed: one copy per
    /// plane, a 2-D one where its rows are padded.
    ///
    /// # Safety
    /// As [`BatchMemory::copy`]; `stream`'s context must be current.
    unsafe fn copy_planes(
        stream: &Stream,
        dst: u64,
        frame: &ReadSlot<'_, Cuda>,
        planes: &[Plane],
    ) -> Result<(), RunError> {
        let ctx = stream.context().raw();
        let mut to = dst;
        for p in planes {
            let from = frame.ptr() + p.offset as u64;
            let bytes = p.row_bytes * p.rows;
            // Both copies rely on the caller's contract: the plane is inside the frame, device
            // memory of this context mapped while `frame` lives, which is past this enqueue
            // (its release is recorded on the lane after the copy); `to` is inside the packed
            // bytes at `dst`, device memory of this context that nobody else touches.
            let r = if p.stride == p.row_bytes {
                // SAFETY: as above, the plane's `bytes` contiguous; `stream` live and current.
                unsafe { driver::memcpy_dtod_async(to, from, bytes, stream.raw()) }
            } else {
                let src = Rows::Device { ptr: from, pitch: p.stride, ctx };
                let dst = Rows::Device { ptr: to, pitch: p.row_bytes, ctx };
                // SAFETY: as above, `rows` rows at each pitch; `stream` live and current.
                unsafe { driver::memcpy_2d_peer_async(dst, src, p.row_bytes, p.rows, stream.raw()) }
            };
            r.map_err(cuda)?;
            to += bytes as u64;
        }
        Ok(())
    }
}
