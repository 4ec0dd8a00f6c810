//! What only CUDA producers and their slots have: creating a ring on a device and its
//! settings (fence, sharing, polling), the context and stream, registered pools, device
//! pointers, `acquire_on`, copies and publishing a region of a pool. The memory kind's side
//! behind them is `crate::memory::cuda`.

use std::sync::Arc;
use std::time::Duration;

use super::{Producer, ProducerBuilder, WriteSlot};
use crate::cuda::driver::{self, CUdeviceptr};
use crate::cuda::{Context, CudaError, DevicePool, Stream};
use crate::error::{AcquireError, AcquireTimeoutError, CreateError, PublishError, RegisterError};
use crate::memory::cuda::same_device;
use crate::memory::{Cuda, Fence, PoolId, Sharing};
use crate::shm::wait::Deadline;

/// The producer of a CUDA-memory ring: [`Producer<Cuda>`], under the name it had before the
/// producer became generic.
///
/// ```no_run
/// let tx: gpuring::GpuProducer = gpuring::Producer::builder("cam0").create_gpu(0)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub type GpuProducer = Producer<Cuda>;

/// A claimed slot of a CUDA-memory ring: [`WriteSlot<'a, Cuda>`].
///
/// ```no_run
/// # let mut tx = gpuring::Producer::builder("cam0").create_gpu(0)?;
/// let slot: gpuring::GpuWriteSlot<'_> = tx.acquire()?;
/// slot.publish(0, b"")?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub type GpuWriteSlot<'a> = WriteSlot<'a, Cuda>;

impl ProducerBuilder {
    /// Creates a CUDA-memory ring on device `ordinal`: one device allocation holds every
    /// buffer, each with a ready fence (legacy sharing: an interprocess event; VMM: a word in
    /// the segment). Fails with [`CreateErrorKind::MemoryUnavailable`](crate::CreateErrorKind::MemoryUnavailable) where there is no usable CUDA
    /// driver or device, or the device cannot do what [`sharing`](Self::sharing) asks.
    ///
    /// ```no_run
    /// use gpuring::{CreateErrorKind, Producer};
    ///
    /// let frame = 1920 * 1080 * 4; // one 1080p RGBA frame per slot
    /// match Producer::builder("cam0").capacity(8).slot_size(frame).create_gpu(0) {
    ///     Ok(tx) => println!("ring {} is on GPU 0", tx.name()),
    ///     Err(e) if matches!(e.kind(), CreateErrorKind::MemoryUnavailable { .. }) => {
    ///         eprintln!("no GPU: {e}")
    ///     }
    ///     Err(e) => return Err(e.into()),
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn create_gpu(mut self, ordinal: i32) -> Result<Producer<Cuda>, CreateError> {
        self.kind.device = ordinal;
        self.create_in()
    }

    /// CUDA rings: the device the ring's memory is on, for
    /// [`create_in::<Cuda>`](ProducerBuilder::create_in). Default 0. (`create_gpu` takes it as
    /// its argument.)
    ///
    /// ```no_run
    /// use gpuring::{Cuda, Producer};
    ///
    /// let tx = Producer::builder("cam1").device(1).create_in::<Cuda>()?;
    /// assert_eq!(tx.context().ordinal(), 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn device(mut self, ordinal: i32) -> Self {
        self.kind.device = ordinal;
        self
    }

    /// CUDA rings: how long `acquire` spins on a pending release event of a slot's previous
    /// readers (`cuEventQuery`, ~50 ns a look) before it starts yielding the CPU and napping.
    /// Default [`DEFAULT_GPU_POLL`](crate::DEFAULT_GPU_POLL). (The producer waits for its
    /// readers on the CPU, never on the GPU: see docs/gpu.md, "Reusing a buffer".)
    ///
    /// ```no_run
    /// use std::time::Duration;
    ///
    /// // Yield at once: for a producer thread that shares its core with other work.
    /// let tx = gpuring::Producer::builder("cam0").gpu_poll(Duration::ZERO).create_gpu(0)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn gpu_poll(mut self, window: Duration) -> Self {
        self.kind.gpu_poll = window;
        self
    }

    /// CUDA rings: how GPU work is ordered across processes. Default [`Fence::Auto`]: memory
    /// words where the device can use 64-bit stream memory operations, else events; see
    /// [`Fence`], and docs/containers.md for which works where.
    ///
    /// ```no_run
    /// use gpuring::{Fence, Producer};
    ///
    /// // Interprocess events, for consumers on a device without 64-bit stream memory ops.
    /// let tx = Producer::builder("cam0").fence(Fence::Events).create_gpu(0)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn fence(mut self, fence: Fence) -> Self {
        self.kind.memory_fence = match fence {
            Fence::Auto => None,
            Fence::Events => Some(false),
            Fence::Memory => Some(true),
        };
        self
    }

    /// CUDA rings: how the memory and fences reach consumers. Default [`Sharing::Legacy`].
    /// [`Sharing::Vmm`] always fences with memory words, whatever [`fence`](Self::fence)
    /// says.
    ///
    /// ```no_run
    /// use gpuring::{PeerPolicy, Producer, Sharing};
    ///
    /// let tx = Producer::builder("cam0").sharing(Sharing::Vmm(PeerPolicy::SameUid)).create_gpu(0)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn sharing(mut self, sharing: Sharing) -> Self {
        self.kind.vmm = match sharing {
            Sharing::Legacy => None,
            Sharing::Vmm(policy) => Some(policy),
        };
        self
    }
}

impl Producer<Cuda> {
    /// The device's context.
    ///
    /// ```no_run
    /// use gpuring::cuda::Stream;
    /// # let mut tx = gpuring::Producer::builder("cam0").create_gpu(0)?;
    /// // A stream of your own on the ring's device, for `acquire_on`.
    /// let decoder_stream = Stream::new(tx.context())?;
    /// let slot = tx.acquire_on(&decoder_stream)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn context(&self) -> &Arc<Context> {
        self.mem().context()
    }

    /// The producer's own stream (the one [`acquire`](Self::acquire) uses).
    ///
    /// ```no_run
    /// # let mut tx = gpuring::Producer::builder("cam0").create_gpu(0)?;
    /// tx.acquire()?.publish(0, b"")?;
    /// // Block until the GPU has run everything queued on the producer's stream.
    /// tx.stream().synchronize()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn stream(&self) -> &Stream {
        self.mem().stream()
    }

    /// How long dropping the producer waits for consumers to leave before freeing the memory
    /// they may still map.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// # let mut tx = gpuring::Producer::builder("cam0").create_gpu(0)?;
    /// // Consumers are batch jobs that may take a minute to finish their last frames.
    /// tx.set_linger(Duration::from_secs(60));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn set_linger(&mut self, linger: Duration) {
        self.parts().1.set_linger(linger);
    }

    /// Adds `pool` to the ring's pool table, so that messages can be published from it with
    /// [`WriteSlot::publish_region`]. The producer keeps it until it drops. Legacy sharing
    /// only: a VMM ring refuses a `cuMemAlloc` pool with [`RegisterError::WrongSharing`] (use
    /// [`alloc_pool`](Self::alloc_pool), which works for both).
    ///
    /// ```no_run
    /// use gpuring::cuda::DevicePool;
    /// # let mut tx = gpuring::Producer::builder("cam0").create_gpu(0)?;
    /// // 64 MiB of decoder output surfaces, shared with every consumer once, here.
    /// let surfaces = DevicePool::new(tx.context(), 64 << 20)?;
    /// let id = tx.register(surfaces)?;
    /// // Later: slot.publish_region(id, offset, len, header) sends one surface.
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn register(&mut self, pool: DevicePool) -> Result<PoolId, RegisterError> {
        crate::error::check_context()?;
        let (ring, mem) = self.parts();
        mem.register(ring.map(), pool)
    }

    /// Allocates a pool of at least `bytes` on the ring's device, in the ring's sharing mode
    /// (legacy: a dedicated `cuMemAlloc` rounded up to 2 MiB; VMM: a `cuMemCreate` allocation
    /// rounded up to the device's granularity), and adds it to the pool table like
    /// [`register`](Self::register). Its address is [`pool`](Self::pool)`(id)`.
    ///
    /// ```no_run
    /// use gpuring::{PeerPolicy, Producer, Sharing};
    ///
    /// let mut tx = Producer::builder("cam0").sharing(Sharing::Vmm(PeerPolicy::SameUid)).create_gpu(0)?;
    /// let id = tx.alloc_pool(64 << 20)?; // decoder surfaces, shared by fd with each consumer
    /// let (base, size) = tx.pool(id).expect("allocated above");
    /// assert!(size >= 64 << 20);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn alloc_pool(&mut self, bytes: usize) -> Result<PoolId, RegisterError> {
        crate::error::check_context()?;
        let (ring, mem) = self.parts();
        mem.alloc_pool(ring.map(), bytes)
    }

    /// How the ring shares its memory: what [`ProducerBuilder::sharing`] chose.
    ///
    /// [`ProducerBuilder::sharing`]: crate::ProducerBuilder::sharing
    ///
    /// ```no_run
    /// # let tx = gpuring::Producer::builder("cam0").create_gpu(0)?;
    /// println!("{} sharing", tx.sharing_name()); // "legacy" or "vmm"
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn sharing_name(&self) -> &'static str {
        self.mem().sharing_name()
    }

    /// The fence this ring uses: [`Fence::Events`] or [`Fence::Memory`], never
    /// [`Fence::Auto`], which the create resolved (VMM sharing always fences with memory).
    ///
    /// ```no_run
    /// # let tx = gpuring::Producer::builder("cam0").create_gpu(0)?;
    /// println!("{:?} fences", tx.fence()); // Memory on any GPU of the last years
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn fence(&self) -> Fence {
        self.mem().fence()
    }

    /// Adds an allocation the caller owns (a decoder's output surfaces, say) to the pool table.
    ///
    /// # Safety
    /// 1. Legacy sharing: `ptr` must be the base of a dedicated `cuMemAlloc` allocation of at
    ///    least `size` bytes on this producer's device, never one from a stream-ordered or
    ///    caching pool (legacy IPC shares the whole underlying block; see `docs/gpu.md`).
    ///    VMM sharing: `ptr` must be where a `cuMemCreate` allocation of at least `size` bytes,
    ///    made with the POSIX file descriptor handle type, is mapped (at its offset 0) in this
    ///    producer's context; anything else is refused with [`RegisterError::WrongSharing`].
    /// 2. It must stay allocated (and mapped) until this producer has dropped.
    ///
    /// ```no_run
    /// # struct Decoder;
    /// # impl Decoder {
    /// #     fn new() -> Decoder { Decoder }
    /// #     fn surfaces(&self) -> (u64, usize) { (0, 0) }
    /// # }
    /// let decoder = Decoder::new(); // declared before `tx`, so it is dropped after it
    /// let mut tx = gpuring::Producer::builder("cam0").create_gpu(0)?;
    /// let (ptr, size) = decoder.surfaces(); // one dedicated `cuMemAlloc` on GPU 0
    /// // SAFETY: `ptr` is the base of a plain `cuMemAlloc` of `size` bytes on the ring's
    /// // device (not from a stream-ordered pool), and `decoder` frees it only when dropped,
    /// // which is after `tx`.
    /// let id = unsafe { tx.register_raw(ptr, size) }?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub unsafe fn register_raw(
        &mut self,
        ptr: CUdeviceptr,
        size: usize,
    ) -> Result<PoolId, RegisterError> {
        crate::error::check_context()?;
        let (ring, mem) = self.parts();
        // SAFETY: the caller promises (1) and (2) above, what the memory kind's `register_raw`
        // asks of the same region.
        unsafe { mem.register_raw(ring.map(), ptr, size) }
    }

    /// Device address and size of a registered pool (`None` for an id of another producer).
    ///
    /// ```no_run
    /// use gpuring::cuda::DevicePool;
    /// # let mut tx = gpuring::Producer::builder("cam0").create_gpu(0)?;
    /// let id = tx.register(DevicePool::new(tx.context(), 8 << 20)?)?;
    /// let (base, size) = tx.pool(id).expect("registered by this producer");
    /// assert!(size >= 8 << 20); // rounded up to `POOL_ALIGN`
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn pool(&self, id: PoolId) -> Option<(CUdeviceptr, usize)> {
        self.mem().pool(id)
    }

    /// Like [`acquire`](Self::acquire), but the slot is written on `stream` (your decoder's or
    /// kernel's stream, of this producer's device): `publish` queues the ready fence there.
    ///
    /// ```no_run
    /// use gpuring::cuda::Stream;
    /// # let mut tx = gpuring::Producer::builder("cam0").create_gpu(0)?;
    /// # fn render(_dst: u64, _len: usize, _stream: &gpuring::cuda::Stream) {}
    /// let decoder_stream = Stream::new(tx.context())?;
    /// let slot = tx.acquire_on(&decoder_stream)?; // the old readers are done with the slot
    /// render(slot.ptr(), 4096, &decoder_stream);
    /// slot.publish(4096, b"")?; // the ready event is recorded on `decoder_stream`
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn acquire_on<'a>(
        &'a mut self,
        stream: &'a Stream,
    ) -> Result<WriteSlot<'a, Cuda>, AcquireError> {
        same_device(stream, self.mem().context())?;
        Ok(self.acquire_until(Deadline::Never, Some(stream))?)
    }

    /// [`acquire_on`](Self::acquire_on), waiting at most `timeout` (see
    /// [`acquire_timeout`](Self::acquire_timeout)).
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use gpuring::cuda::Stream;
    /// use gpuring::AcquireTimeoutError;
    /// # let mut tx = gpuring::Producer::builder("cam0").create_gpu(0)?;
    /// # fn render(_dst: u64, _len: usize, _stream: &gpuring::cuda::Stream) {}
    /// let decoder_stream = Stream::new(tx.context())?;
    /// match tx.acquire_on_timeout(&decoder_stream, Duration::from_millis(100)) {
    ///     Ok(slot) => { render(slot.ptr(), 4096, &decoder_stream); slot.publish(4096, b"")?; }
    ///     Err(AcquireTimeoutError::Timeout) => eprintln!("consumers are stalled: frame dropped"),
    ///     Err(e) => return Err(e.into()),
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn acquire_on_timeout<'a>(
        &'a mut self,
        stream: &'a Stream,
        timeout: Duration,
    ) -> Result<WriteSlot<'a, Cuda>, AcquireTimeoutError> {
        same_device(stream, self.mem().context())?;
        Ok(self.acquire_until(Deadline::after(timeout), Some(stream))?)
    }
}

impl WriteSlot<'_, Cuda> {
    /// Queues, on the slot's [`stream`](Self::stream), a copy of `len` bytes from device (or
    /// device-mapped) memory at `src` into the slot. For sources written by other code, such
    /// as a decoder's output buffer or a PyTorch tensor; the CPU does not wait.
    ///
    /// ```no_run
    /// # let mut tx = gpuring::Producer::builder("cam0").create_gpu(0)?;
    /// # let (decoded, len): (u64, usize) = (0, 4096);
    /// let slot = tx.acquire()?;
    /// // SAFETY: `decoded` holds `len` bytes, written by work that `slot.stream()` is ordered
    /// // after, and stays allocated until the copy has run.
    /// unsafe { slot.copy_from(decoded, len) }?;
    /// slot.publish(len, b"")?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// A copy longer than the slot is refused:
    ///
    /// ```no_run
    /// # let mut tx = gpuring::Producer::builder("cam0").create_gpu(0)?;
    /// let slot = tx.acquire()?;
    /// let too_long = slot.capacity() + 1;
    /// // SAFETY: refused before any copy is queued.
    /// assert!(unsafe { slot.copy_from(0, too_long) }.is_err());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Safety
    /// 1. `src..src + len` must be device memory readable in this producer's context (its own
    ///    GPU's, or a peer's with access enabled), not overlapping the slot.
    /// 2. It must stay allocated, and unchanged, until the copy has run: until work queued on
    ///    the slot's stream after this call completes.
    /// 3. Whatever wrote it must be ordered before the copy (done, or on the slot's stream or
    ///    one it waits for, see [`Stream::wait_for`]).
    pub unsafe fn copy_from(&self, src: CUdeviceptr, len: usize) -> Result<(), CudaError> {
        if len > self.capacity() {
            return Err(CudaError::TooLong { len, capacity: self.capacity() });
        }
        let stream = self.stream();
        let _bound = stream.context().bind()?;
        // SAFETY: the slot holds `capacity() >= len` bytes and is ours until publish; `src`
        // by (1)-(3); the stream is live and its context current.
        unsafe { driver::memcpy_dtod_async(self.ptr(), src, len, stream.raw()) }?;
        Ok(())
    }

    /// Bytes the slot holds (the ring's slot size).
    ///
    /// ```no_run
    /// # let mut tx = gpuring::Producer::builder("cam0").create_gpu(0)?;
    /// # fn render(_dst: u64, _len: usize, _stream: &gpuring::cuda::Stream) {}
    /// let slot = tx.acquire()?;
    /// let len = 1000.min(slot.capacity());
    /// render(slot.ptr(), len, slot.stream());
    /// slot.publish(len, b"")?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn capacity(&self) -> usize {
        self.parts().0.slot_size()
    }

    /// The stream to write on: it already waits for the slot's previous readers.
    ///
    /// ```no_run
    /// # let mut tx = gpuring::Producer::builder("cam0").create_gpu(0)?;
    /// # fn my_kernel<S>(_dst: u64, _stream: S) {}
    /// let slot = tx.acquire()?;
    /// // Hand the raw stream to other CUDA code (cudarc, a decoder library...).
    /// my_kernel(slot.ptr(), slot.stream().raw());
    /// slot.publish(4096, b"")?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn stream(&self) -> &Stream {
        let (producer, _, stream) = self.parts();
        stream.unwrap_or(producer.mem().stream())
    }

    /// Publishes `len` bytes at `offset` of registered pool `pool` instead of the slot's own
    /// memory. Write them on [`stream`](Self::stream) (or make it wait for your writes) first;
    /// the consumers' reads are fenced by the same ready fence. Do not rewrite the region
    /// until this slot comes round again: its next acquire is where the producer's stream
    /// waits for the region's readers.
    ///
    /// ```no_run
    /// use gpuring::cuda::DevicePool;
    /// # let mut tx = gpuring::Producer::builder("cam0").create_gpu(0)?;
    /// # fn render(_dst: u64, _len: usize, _stream: &gpuring::cuda::Stream) {}
    /// let id = tx.register(DevicePool::new(tx.context(), 64 << 20)?)?;
    /// let (base, _) = tx.pool(id).expect("registered above");
    /// let slot = tx.acquire()?;
    /// render(base + 8192, 4096, slot.stream()); // write the region on the slot's stream
    /// slot.publish_region(id, 8192, 4096, b"")?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn publish_region(
        self,
        pool: PoolId,
        offset: u64,
        len: u64,
        header: &[u8],
    ) -> Result<u64, PublishError> {
        let producer = self.parts().0;
        let Some((_, size)) = producer.mem().pool(pool) else {
            return Err(PublishError::UnknownPool);
        };
        let size = size as u64;
        if offset.checked_add(len).is_none_or(|end| end > size) {
            return Err(PublishError::OutsidePool { offset, len, size });
        }
        let slot_size = producer.slot_size();
        if len > slot_size as u64 {
            let len = usize::try_from(len).unwrap_or(usize::MAX);
            return Err(PublishError::TooLong { len, slot_size });
        }
        self.publish_at(Some((pool.0, offset)), len, header)
    }
}
