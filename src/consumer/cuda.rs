//! What only CUDA consumers and their messages have: opening a ring on a device and its
//! settings, the context and stream, `recv_on`, and releasing a message with its result. The
//! memory kind's side behind them is `crate::memory::cuda`.

use std::sync::Arc;
use std::time::Duration;

use super::{Consumer, ConsumerBuilder, ReadSlot};
use crate::cuda::{Context, Stream};
use crate::error::{Fault, OpenError, RecvError, RecvTimeoutError, ReleaseError, TryRecvError};
use crate::memory::cuda::same_device;
use crate::memory::Cuda;
use crate::shm::wait::Deadline;

/// A consumer of a CUDA-memory ring: [`Consumer<Cuda>`].
///
/// ```no_run
/// let rx: gpuring::GpuConsumer = gpuring::Consumer::open_gpu("cam0")?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub type GpuConsumer = Consumer<Cuda>;

/// A received message of a CUDA-memory ring: [`ReadSlot<'a, Cuda>`].
///
/// ```no_run
/// # let rx = gpuring::Consumer::open_gpu("cam0")?;
/// let frame: gpuring::GpuReadSlot<'_> = rx.recv()?;
/// println!("{} bytes at {:#x}", frame.len(), frame.ptr());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub type GpuReadSlot<'a> = ReadSlot<'a, Cuda>;

impl ConsumerBuilder {
    /// Opens a CUDA-memory ring and joins it, on the device the producer uses (or on the
    /// device [`device`](ConsumerBuilder::device) names, which may be another GPU with peer
    /// access to the ring's).
    /// Maps the producer's pools (legacy: from their IPC handles; VMM: from the fds the
    /// producer's server sends, if its peer policy admits this process, else
    /// [`OpenErrorKind::PeerRefused`](crate::OpenErrorKind::PeerRefused)) and opens the buffers' fences once, here.
    ///
    /// ```no_run
    /// # fn infer(_src: u64, _len: usize, _stream: &gpuring::cuda::Stream) {}
    /// let rx = gpuring::Consumer::builder("cam0").open_gpu()?;
    /// let frame = rx.recv()?; // frame.stream() already waits for the producer's writes
    /// infer(frame.ptr(), frame.len(), frame.stream());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn open_gpu(self) -> Result<Consumer<Cuda>, OpenError> {
        self.open_in()
    }

    /// Opens a CUDA ring, waiting up to `timeout` for an instance other than `not_epoch` to
    /// appear and be ready, and ends the builder: [`open_when_ready`](Self::open_when_ready),
    /// then [`open_gpu`](Self::open_gpu). (`open_in_timeout::<Cuda>(timeout)` is the plain wait.)
    ///
    /// ```no_run
    /// use std::time::Duration;
    ///
    /// // The producer may start after us: wait up to 10 s for it to create the ring.
    /// let builder = gpuring::Consumer::builder("cam0");
    /// let rx = builder.open_gpu_when_ready(None, Duration::from_secs(10))?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn open_gpu_when_ready(
        self,
        not_epoch: Option<u64>,
        timeout: Duration,
    ) -> Result<Consumer<Cuda>, OpenError> {
        self.open_in_when_ready(not_epoch, timeout)
    }

    /// The device to read on (CUDA rings). Default: the ring's device, found by UUID.
    ///
    /// Another GPU than the ring's reads its memory across the link between them (NVLink or
    /// PCIe), with no copy; it needs peer access to the ring's GPU, or the open fails with
    /// [`OpenErrorKind::NoPeerAccess`](crate::OpenErrorKind::NoPeerAccess), naming both.
    /// Both sharing modes and both fences work so; docs/scaling.md says when copying each
    /// message once to the other GPU is the better plan.
    ///
    /// ```no_run
    /// // The ring's memory is on GPU 0; this consumer's kernels run on GPU 1.
    /// let rx = gpuring::Consumer::builder("cam0").device(1).open_gpu()?;
    /// assert_eq!(rx.context().ordinal(), 1);
    /// let frame = rx.recv()?; // frame.stream() is a GPU 1 stream; frame.ptr() maps GPU 0's memory
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// Where several consumers on GPU 1 would each read every frame across the link, copy each
    /// frame once into a ring on GPU 1 instead, and let them read that one (docs/scaling.md).
    /// This relay never syncs on the CPU: the copy runs on the new slot's stream, which waits
    /// for the frame first, and the frame's release is queued after the copy.
    ///
    /// ```no_run
    /// use gpuring::{Consumer, Producer, RecvError};
    ///
    /// let rx = Consumer::builder("cam0").device(1).open_gpu()?; // memory on GPU 0
    /// let mut tx = Producer::builder("cam0-gpu1")
    ///     .slot_size(rx.slot_size())
    ///     .user_header_size(rx.user_header_size() as u32)
    ///     .create_gpu(1)?;
    /// loop {
    ///     let slot = tx.acquire()?;
    ///     let frame = match rx.recv_on(slot.stream()) {
    ///         Ok(frame) => frame,
    ///         Err(RecvError::Disconnected) => break, // the upstream producer closed or died
    ///         Err(e) => return Err(e.into()),
    ///     };
    ///     // SAFETY: the frame's bytes stay readable on the slot's stream, which waits for
    ///     // them, until its release, queued on that stream after the copy when `frame` drops.
    ///     unsafe { slot.copy_from(frame.ptr(), frame.len()) }?;
    ///     let (len, header) = (frame.len(), frame.header().to_vec());
    ///     drop(frame);
    ///     slot.publish(len, &header)?;
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn device(mut self, ordinal: i32) -> Self {
        self.kind.device = Some(ordinal);
        self
    }

    /// CUDA rings: how long `recv` polls a frame's ready fence on the CPU (a load of its ready
    /// word, or `cuEventQuery`) before it makes the stream wait for it on the GPU instead. A
    /// frame that completes within the window is read with no GPU-side wait at all. Default
    /// [`DEFAULT_GPU_POLL`](crate::DEFAULT_GPU_POLL).
    ///
    /// ```no_run
    /// use std::time::Duration;
    ///
    /// // Hand every pending wait to the GPU at once: lowest latency for a mostly idle ring.
    /// let rx = gpuring::Consumer::builder("cam0").gpu_poll(Duration::ZERO).open_gpu()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn gpu_poll(mut self, window: Duration) -> Self {
        self.kind.gpu_poll = window;
        self
    }
}

impl Consumer<Cuda> {
    /// Opens CUDA ring `name` with default settings (`Consumer::builder(name).open_gpu()`).
    ///
    /// ```no_run
    /// let rx = gpuring::Consumer::open_gpu("cam0")?;
    /// println!("{} slots of {} bytes", rx.capacity(), rx.slot_size());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn open_gpu(name: &str) -> Result<Consumer<Cuda>, OpenError> {
        Consumer::builder(name).open_gpu()
    }

    /// The device the ring's memory is on, as this process numbers devices. It differs from
    /// [`context`](Self::context)'s when this consumer reads on another GPU
    /// ([`ConsumerBuilder::device`](crate::ConsumerBuilder::device)): its kernels then read
    /// across the link between the two.
    ///
    /// ```no_run
    /// let rx = gpuring::Consumer::builder("cam0").device(1).open_gpu()?;
    /// if rx.memory_device() != rx.context().ordinal() {
    ///     println!("reading GPU {}'s memory from GPU 1", rx.memory_device());
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn memory_device(&self) -> i32 {
        self.mem().memory_device()
    }

    /// The device context this consumer reads in.
    ///
    /// ```no_run
    /// use gpuring::cuda::Stream;
    /// # let rx = gpuring::Consumer::open_gpu("cam0")?;
    /// // A stream of your own on the device this consumer reads on, for `recv_on`.
    /// let infer_stream = Stream::new(rx.context())?;
    /// let frame = rx.recv_on(&infer_stream)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn context(&self) -> &Arc<Context> {
        self.mem().context()
    }

    /// The consumer's own stream, the one [`recv`](Self::recv) makes wait.
    ///
    /// ```no_run
    /// # let rx = gpuring::Consumer::open_gpu("cam0")?;
    /// # fn my_model<S>(_stream: S) {}
    /// // Hand the raw stream to other CUDA code (cudarc, an inference runtime...).
    /// my_model(rx.stream().raw());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn stream(&self) -> &Stream {
        self.mem().stream()
    }

    /// How the ring shares its memory, as the segment says: `"legacy"` (IPC handles, event or
    /// memory fences) or `"vmm"` (fds from the producer's server, fences as memory words).
    ///
    /// ```no_run
    /// # let rx = gpuring::Consumer::open_gpu("cam0")?;
    /// println!("reading {} memory", rx.sharing_name());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn sharing_name(&self) -> &'static str {
        self.mem().sharing_name()
    }

    /// Receives the next message and makes `stream` (yours, of this consumer's device) wait
    /// for it; its release is recorded on `stream` too.
    ///
    /// ```no_run
    /// use gpuring::cuda::Stream;
    /// # let rx = gpuring::Consumer::open_gpu("cam0")?;
    /// # fn infer(_src: u64, _len: usize, _stream: &gpuring::cuda::Stream) {}
    /// let infer_stream = Stream::new(rx.context())?;
    /// let frame = rx.recv_on(&infer_stream)?; // `infer_stream` waits for the producer's writes
    /// infer(frame.ptr(), frame.len(), &infer_stream);
    /// drop(frame); // the release is recorded on `infer_stream`, after infer's kernels
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn recv_on<'a>(&'a self, stream: &'a Stream) -> Result<ReadSlot<'a, Cuda>, RecvError> {
        same_device(stream, self.mem().context())?;
        Ok(self.receive(Deadline::Never, Some(stream))?)
    }

    /// [`recv_on`](Self::recv_on), waiting at most `timeout`.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use gpuring::{cuda::Stream, RecvTimeoutError};
    /// # let rx = gpuring::Consumer::open_gpu("cam0")?;
    /// let infer_stream = Stream::new(rx.context())?;
    /// match rx.recv_on_timeout(&infer_stream, Duration::from_millis(100)) {
    ///     Ok(frame) => println!("message {} on my stream", frame.seq()),
    ///     Err(RecvTimeoutError::Timeout) => eprintln!("no frame for 100 ms"),
    ///     Err(e) => return Err(e.into()),
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn recv_on_timeout<'a>(
        &'a self,
        stream: &'a Stream,
        timeout: Duration,
    ) -> Result<ReadSlot<'a, Cuda>, RecvTimeoutError> {
        same_device(stream, self.mem().context())?;
        Ok(self.receive(Deadline::after(timeout), Some(stream))?)
    }

    /// [`recv_on`](Self::recv_on) if a message is waiting, else `Empty`.
    ///
    /// ```no_run
    /// use gpuring::{cuda::Stream, TryRecvError};
    /// # let rx = gpuring::Consumer::open_gpu("cam0")?;
    /// let infer_stream = Stream::new(rx.context())?;
    /// match rx.try_recv_on(&infer_stream) {
    ///     Ok(frame) => println!("message {} on my stream", frame.seq()),
    ///     Err(TryRecvError::Empty) => {} // nothing new
    ///     Err(e) => return Err(e.into()),
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn try_recv_on<'a>(
        &'a self,
        stream: &'a Stream,
    ) -> Result<ReadSlot<'a, Cuda>, TryRecvError> {
        same_device(stream, self.mem().context())?;
        Ok(self.receive(Deadline::Now, Some(stream))?)
    }
}

impl ReadSlot<'_, Cuda> {
    /// The stream that waits for the message: launch kernels that read it here.
    ///
    /// ```no_run
    /// # let rx = gpuring::Consumer::open_gpu("cam0")?;
    /// # fn my_model<S>(_src: u64, _len: usize, _stream: S) {}
    /// let frame = rx.recv()?;
    /// // Hand the raw stream to other CUDA code (cudarc, an inference runtime...).
    /// my_model(frame.ptr(), frame.len(), frame.stream().raw());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn stream(&self) -> &Stream {
        let (consumer, stream) = self.parts();
        stream.unwrap_or(consumer.mem().stream())
    }

    /// Releases the message after the work queued on its stream so far, reporting a failure
    /// to record the release event (dropping does the same and ignores it).
    ///
    /// ```no_run
    /// # let rx = gpuring::Consumer::open_gpu("cam0")?;
    /// # fn infer(_src: u64, _len: usize, _stream: &gpuring::cuda::Stream) {}
    /// let frame = rx.recv()?;
    /// infer(frame.ptr(), frame.len(), frame.stream());
    /// frame.release()?; // like drop(frame), but reports a failed event record
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn release(self) -> Result<(), ReleaseError> {
        match self.finish() {
            Ok(()) => Ok(()),
            Err(Fault::Cuda(e)) => Err(ReleaseError::Cuda(e)),
            Err(Fault::ContextLost(l)) => Err(ReleaseError::ContextLost(l)),
            Err(other) => unreachable!("a CUDA release fails only in CUDA: {other:?}"),
        }
    }
}
