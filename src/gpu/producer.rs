//! The producer of a CUDA-memory ring.

use std::sync::atomic::{fence, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::error::{GpuAcquireError, GpuPublishError, RegisterError};
use super::Fence;
use crate::cuda::driver::{self, CUdeviceptr, DriverError};
use crate::cuda::{Context, CudaError, DevicePool, IpcEvent, Stream};
use crate::error::{AcquireTimeoutError, CreateError, PublishError, TryAcquireError};
use crate::format::gpu::{fence_bytes, fence_kind, pool_state, ready_word, store_uuid, MAX_POOLS};
use crate::format::view::MappedRing;
use crate::format::MemoryKind;
use crate::ring::lease::{self, evict_reason};
use crate::ring::Ring;
use crate::shm::process::ProcessId;
use crate::wait::{self, WaitConfig};
use crate::{Policy, Producer, ProducerBuilder};

/// Slots start at multiples of this in the producer's pool, so kernels can use wide loads.
///
/// ```no_run
/// # let mut tx = gpuring::Producer::builder("cam0").create_gpu(0)?;
/// let slot = tx.acquire()?;
/// assert_eq!(slot.ptr() % gpuring::gpu::SLOT_ALIGN as u64, 0);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub const SLOT_ALIGN: usize = 256;

/// How long a dropped producer waits, by default, for its consumers to leave before it frees
/// the device memory they map.
///
/// ```no_run
/// # let mut tx = gpuring::Producer::builder("cam0").create_gpu(0)?;
/// // Give slow consumers twice the default time to leave when `tx` drops.
/// tx.set_linger(gpuring::gpu::DEFAULT_LINGER * 2);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub const DEFAULT_LINGER: Duration = Duration::from_secs(5);

impl ProducerBuilder {
    /// Creates a CUDA-memory ring on device `ordinal`: one dedicated device allocation holds
    /// every slot, and each slot has an interprocess ready event. Fails with
    /// [`CreateError::MemoryUnavailable`] where there is no usable CUDA driver or device.
    ///
    /// ```no_run
    /// use gpuring::{CreateError, Producer};
    ///
    /// let frame = 1920 * 1080 * 4; // one 1080p RGBA frame per slot
    /// match Producer::builder("cam0").capacity(8).slot_size(frame).create_gpu(0) {
    ///     Ok(tx) => println!("ring {} is on GPU 0", tx.name()),
    ///     Err(CreateError::MemoryUnavailable { reason }) => eprintln!("no GPU: {reason}"),
    ///     Err(e) => return Err(e.into()),
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn create_gpu(self, ordinal: i32) -> Result<GpuProducer, CreateError> {
        self.create_gpu_inner(ordinal)
    }

    /// CUDA rings: how long `acquire` spins on a pending release event of a slot's previous
    /// readers (`cuEventQuery`, ~50 ns a look) before it starts yielding the CPU and napping.
    /// Default [`crate::DEFAULT_GPU_POLL`]. (The producer waits for its readers on the CPU,
    /// never on the GPU: see docs/gpu.md, "Reusing a slot".)
    ///
    /// ```no_run
    /// use std::time::Duration;
    ///
    /// // Yield at once: for a producer thread that shares its core with other work.
    /// let tx = gpuring::Producer::builder("cam0").gpu_poll(Duration::ZERO).create_gpu(0)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn gpu_poll(mut self, window: Duration) -> Self {
        self.gpu_poll = window;
        self
    }

    /// CUDA rings: how GPU work is ordered across processes. Default [`Fence::Events`]; see
    /// [`Fence`] and docs/performance.md for how the two compare.
    ///
    /// ```no_run
    /// use gpuring::{Fence, Producer};
    ///
    /// let tx = Producer::builder("cam0").fence(Fence::Memory).create_gpu(0)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn fence(mut self, fence: Fence) -> Self {
        self.memory_fence = fence == Fence::Memory;
        self
    }

    fn create_gpu_inner(self, ordinal: i32) -> Result<GpuProducer, CreateError> {
        let unavailable = |e: CudaError| CreateError::MemoryUnavailable { reason: e.to_string() };
        let ctx = Context::new(ordinal).map_err(unavailable)?;
        let (unfenced, poll, memory_fence) = (self.unfenced, self.gpu_poll, self.memory_fence);
        let slot_size = self.slot_size;
        let capacity = self.capacity as usize;
        let (inner, (gpu, stream)) = self.build(MemoryKind::Cuda, |map| {
            let gpu = GpuSide::build(&ctx, map, slot_size, capacity, memory_fence)
                .map_err(unavailable)?;
            let stream = Stream::new(&ctx).map_err(|e| unavailable(e.into()))?;
            Ok((gpu, stream))
        })?;
        Ok(GpuProducer { inner, gpu, stream, unfenced, linger: DEFAULT_LINGER, poll })
    }
}

/// How long an acquire may wait.
#[derive(Clone, Copy)]
enum Patience {
    /// Not at all (`try_acquire`).
    Now,
    /// Until a deadline (`acquire_timeout`).
    Until(Instant),
    /// As long as it takes.
    Forever,
}

/// A pool table entry of a [`GpuProducer`]: the slots' own allocation (0) or one registered
/// with [`GpuProducer::register`].
///
/// ```no_run
/// use gpuring::cuda::DevicePool;
/// use gpuring::gpu::PoolId;
/// # let mut tx = gpuring::Producer::builder("cam0").create_gpu(0)?;
/// let pool = DevicePool::new(tx.context(), 64 << 20)?;
/// let id: PoolId = tx.register(pool)?;
/// let (base, size) = tx.pool(id).expect("registered above");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PoolId(pub(crate) u32);

/// Memory named in the pool table, kept alive as long as the producer.
enum PoolMemory {
    Owned(DevicePool),
    /// Registered by `register_raw`; its owner keeps it alive (the caller's promise).
    Borrowed {
        ptr: CUdeviceptr,
        size: usize,
    },
}

impl PoolMemory {
    fn ptr(&self) -> CUdeviceptr {
        match self {
            PoolMemory::Owned(p) => p.ptr(),
            PoolMemory::Borrowed { ptr, .. } => *ptr,
        }
    }

    fn size(&self) -> usize {
        match self {
            PoolMemory::Owned(p) => p.size(),
            PoolMemory::Borrowed { size, .. } => *size,
        }
    }
}

/// A consumer's release event for one slot, opened in our context.
struct ReaderEvent {
    /// The consumer table entry's generation when it was opened: which occupant exported it.
    generation: u32,
    event: IpcEvent,
}

/// The producer's CUDA state.
///
/// Invariants: `pools[i]` is what pool table entry `i` names (LIVE, generation 1);
/// `ready[i]` is slot `i`'s ready event, whose handle is in the slot's line.
struct GpuSide {
    /// The ring's name, for lifecycle events.
    name: String,
    ctx: Arc<Context>,
    uuid: [u8; 16],
    pools: Vec<PoolMemory>,
    /// Distance between slots in pool 0.
    stride: usize,
    ready: Vec<IpcEvent>,
    /// Per consumer table entry and slot, the release event we opened (`capacity` per entry).
    /// Dropped before the entry is freed (`forget_reader`): a consumer destroys the events it
    /// exported only once its entry is freed, or never (see docs/gpu.md, "Leaving").
    readers: Vec<Option<ReaderEvent>>,
    capacity: usize,
    /// With `Fence::Memory`: the device address of the slots' ready words (in
    /// `pools[fence_pool]`, zeroed at creation; `format::gpu::fence_bytes` long).
    words: Option<CUdeviceptr>,
}

impl GpuSide {
    /// Allocates the slots and their events and writes the pool table and slot lines of a
    /// segment nobody sees yet.
    fn build(
        ctx: &Arc<Context>,
        map: &MappedRing,
        slot_size: usize,
        capacity: usize,
        memory_fence: bool,
    ) -> Result<GpuSide, CudaError> {
        let stride = slot_size.div_ceil(SLOT_ALIGN) * SLOT_ALIGN;
        let pool = DevicePool::new(ctx, stride * capacity)?;
        let uuid = ctx.uuid()?;
        let tables = map.gpu();
        store_uuid(&tables.header.device_uuid, uuid);
        let mut side = GpuSide {
            name: map.segment().name().ring().to_owned(),
            ctx: ctx.clone(),
            uuid,
            pools: Vec::new(),
            stride,
            ready: Vec::with_capacity(capacity),
            readers: (0..map.params().max_consumers as usize * capacity).map(|_| None).collect(),
            capacity,
            words: None,
        };
        let registered = |e| match e {
            RegisterError::Cuda(e) => e,
            other => CudaError::Unavailable(format!("registering a pool: {other}")),
        };
        side.add_pool(map, PoolMemory::Owned(pool)).map_err(registered)?;
        let header = &tables.header;
        // Relaxed (both): published by the Release store of `magic`.
        header.fence.store(fence_kind::EVENTS, Ordering::Relaxed);
        if memory_fence {
            let dev = driver::device(ctx.ordinal())?;
            if !driver::can_use_64_bit_stream_mem_ops(dev)? {
                return Err(CudaError::Unavailable(
                    "Fence::Memory needs 64-bit stream memory operations, which this device \
                     does not support"
                        .into(),
                ));
            }
            let bytes = fence_bytes(capacity);
            let words = DevicePool::new(ctx, bytes)?;
            {
                let _bound = ctx.bind()?;
                let setup = Stream::new(ctx)?;
                // SAFETY: `words` is a live allocation of at least `bytes`; the stream is live
                // and synchronized before anyone can see the ring.
                unsafe { driver::memset_async(words.ptr(), 0, bytes, setup.raw()) }?;
                setup.synchronize()?;
            }
            side.words = Some(words.ptr());
            let id = side.add_pool(map, PoolMemory::Owned(words)).map_err(registered)?;
            header.fence_pool.store(id.0, Ordering::Relaxed);
            header.fence.store(fence_kind::MEMORY, Ordering::Relaxed);
        }
        for line in tables.slots {
            let ev = IpcEvent::new(ctx)?;
            line.ready_event.store(&driver::event_handle_bytes(&ev.ipc_handle()?));
            // Relaxed: published by the Release store of `magic`.
            line.pool.store(0, Ordering::Relaxed);
            side.ready.push(ev);
        }
        Ok(side)
    }

    /// Writes `mem` into the next pool table entry.
    fn add_pool(&mut self, map: &MappedRing, mem: PoolMemory) -> Result<PoolId, RegisterError> {
        let index = self.pools.len();
        if index >= MAX_POOLS {
            return Err(RegisterError::TableFull);
        }
        let _bound = self.ctx.bind().map_err(|e| RegisterError::Cuda(e.into()))?;
        // SAFETY: a context is current.
        let (base, size) = unsafe { driver::mem_address_range(mem.ptr()) }
            .map_err(|_| RegisterError::OtherDevice)?;
        // Legacy IPC shares whole allocations: only the base of one may be registered, and the
        // size we declare must not exceed it.
        if base != mem.ptr() || size < mem.size() {
            return Err(RegisterError::Cuda(CudaError::Unavailable(format!(
                "{:#x}+{} is not the base of an allocation of at least that size",
                mem.ptr(),
                mem.size()
            ))));
        }
        let _bound = self.ctx.bind().map_err(|e| RegisterError::Cuda(e.into()))?;
        // SAFETY: `base` is the base of a live allocation in the current context (checked just
        // above by the driver).
        let handle = unsafe { driver::ipc_get_mem_handle(base) }
            .map_err(|e| RegisterError::Cuda(e.into()))?;
        let entry = &map.gpu().pools[index];
        entry.handle.store(&driver::mem_handle_bytes(&handle));
        // Relaxed: published by the Release store of `state` below.
        entry.size.store(mem.size() as u64, Ordering::Relaxed);
        store_uuid(&entry.device_uuid, self.uuid);
        entry.generation.fetch_add(1, Ordering::Relaxed);
        // Release: a consumer that Acquire-loads LIVE sees the fields above.
        entry.state.store(pool_state::LIVE, Ordering::Release);
        self.pools.push(mem);
        Ok(PoolId(index as u32))
    }

    /// Drops our imports of entry `entry`'s release events: the producer is about to free the
    /// entry (its consumer retired, died or was evicted), after which its owner may destroy
    /// them.
    fn forget_reader(&mut self, entry: usize, generation: u32) {
        let cap = self.capacity;
        let mine = &mut self.readers[entry * cap..(entry + 1) * cap];
        if mine.iter().any(Option::is_some) {
            mine.iter_mut().for_each(|r| *r = None);
            let ring = &self.name;
            tracing::debug!(target: "gpuring::lifecycle", ring = %ring, entry, generation, "producer imports dropped");
        }
    }

    /// The release event of consumer `entry` (whose lease we saw as `seen`, ACTIVE) for
    /// `slot`, opened once per occupant.
    fn reader_event(
        &mut self,
        map: &MappedRing,
        entry: usize,
        seen: u64,
        slot: usize,
    ) -> Result<&IpcEvent, EventFault> {
        let generation = lease::generation(seen);
        let cached = &mut self.readers[entry * self.capacity + slot];
        if cached.as_ref().is_none_or(|r| r.generation != generation) {
            *cached = None; // a former occupant's import, dropped before the new open
            let line = &map.gpu().releases_of(entry)[slot];
            // Acquire: pairs with the consumer's Release store after it wrote the handle,
            // while it was JOINING. An ACTIVE entry's lines all carry its generation; another
            // value is a damaged line.
            if line.generation.load(Ordering::Acquire) != generation {
                let why = "its release line carries another generation than its lease";
                return Err(EventFault::Failed(CudaError::Unavailable(why.into())));
            }
            let handle = driver::event_handle_from_bytes(&line.release_event.load());
            // Acquire: the handle was read while the entry still had the lease we saw (it
            // cannot have been rewritten by a new occupant: that needs the entry freed, which
            // only we do, or given up by a retiring owner long after).
            if map.ring().consumers[entry].lease.load(Ordering::Acquire) != seen {
                return Err(EventFault::Moved);
            }
            let event = IpcEvent::open(&self.ctx, handle).map_err(EventFault::of)?;
            *cached = Some(ReaderEvent { generation, event });
        }
        Ok(&cached.as_ref().expect("opened above").event)
    }
}

/// Why a consumer's release event could not be looked at.
enum EventFault {
    /// The entry moved on while we read its line: skip it.
    Moved,
    /// Opening or querying it failed: the consumer's handle, or our own context (the caller
    /// tells which by probing its own context).
    Failed(CudaError),
}

impl EventFault {
    fn of(e: DriverError) -> EventFault {
        EventFault::Failed(e.into())
    }
}

/// Whether every owned entry of `ring` is gone for a closing producer: free, or owned by a
/// dead process. (A retiring entry is freed by the closing producer's reaps.)
fn consumers_gone(ring: &Ring<'_>) -> bool {
    ring.consumers.iter().all(|e| {
        // Acquire: pairs with a leaving consumer's Release CAS, made after it closed its
        // mappings of our memory.
        let l = e.lease.load(Ordering::Acquire);
        match lease::state(l) {
            lease::FREE => true,
            _ => {
                // Relaxed: identifies a process to probe; nothing is read through it.
                let start_time = e.start_time.load(Ordering::Relaxed);
                let owner = ProcessId { pid: lease::pid(l), start_time };
                if start_time == 0 {
                    !crate::shm::process::is_running(owner.pid)
                } else {
                    !owner.is_alive()
                }
            }
        }
    })
}

/// The single producer of a CUDA-memory ring. Create it with [`ProducerBuilder::create_gpu`].
///
/// Each slot is a region of device memory. [`acquire`](Self::acquire) hands one out once the
/// consumers that read the slot's previous message have finished reading it on their GPUs
/// (their release events, polled on the CPU); write the frame on the slot's stream, then
/// [`publish`](GpuWriteSlot::publish), which records the slot's ready event on it. The
/// producer's stream never waits on a consumer's fence, so a consumer killed with its work
/// queued cannot stall it (docs/gpu.md, "Reusing a slot"). Nothing here blocks in the driver;
/// `acquire` also polls the slot's previous ready event so that the CPU stays at most one lap
/// ahead of the GPU. While it waits it reaps dead consumers and evicts one whose release event
/// cannot be opened or queried.
///
/// Dropping it closes the ring, waits up to the linger time (default 5 s, see
/// [`set_linger`](Self::set_linger)) for consumers to leave, and frees the device memory. If a
/// consumer is still there (or the producer's GPU work has not finished) it leaves the memory
/// allocated until the process exits rather than free it under a reader. Work you queued on
/// your own streams into a slot you never published is not waited for: synchronize those
/// streams first.
///
/// ```no_run
/// use gpuring::Producer;
/// # fn render(_dst: u64, _len: usize, _stream: &gpuring::cuda::Stream) {}
///
/// let frame = 1920 * 1080 * 4;
/// let mut tx = Producer::builder("cam0").slot_size(frame).create_gpu(0)?;
/// for _ in 0..100 {
///     let slot = tx.acquire()?;
///     render(slot.ptr(), frame, slot.stream()); // your kernel, on the slot's stream
///     slot.publish(frame, b"rgba")?;
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct GpuProducer {
    inner: Producer,
    gpu: GpuSide,
    /// The producer's own stream, for `acquire`.
    stream: Stream,
    unfenced: bool,
    linger: Duration,
    /// How long `acquire` spins on a pending event before it yields and naps.
    poll: Duration,
}

impl GpuProducer {
    /// The ring's name.
    ///
    /// ```no_run
    /// let tx = gpuring::Producer::builder("cam0").create_gpu(0)?;
    /// assert_eq!(tx.name(), "cam0");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn name(&self) -> &str {
        self.inner.name()
    }

    /// Number of slots.
    ///
    /// ```no_run
    /// let tx = gpuring::Producer::builder("cam0").capacity(8).create_gpu(0)?;
    /// assert_eq!(tx.capacity(), 8);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn capacity(&self) -> u32 {
        self.inner.capacity()
    }

    /// Largest message.
    ///
    /// ```no_run
    /// let tx = gpuring::Producer::builder("cam0").slot_size(1 << 20).create_gpu(0)?;
    /// assert_eq!(tx.slot_size(), 1 << 20);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn slot_size(&self) -> usize {
        self.inner.slot_size()
    }

    /// Bytes of user header per message.
    ///
    /// ```no_run
    /// let tx = gpuring::Producer::builder("cam0").user_header_size(64).create_gpu(0)?;
    /// assert_eq!(tx.user_header_size(), 64);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn user_header_size(&self) -> usize {
        self.inner.user_header_size()
    }

    /// The policy.
    ///
    /// ```no_run
    /// use gpuring::{Policy, Producer};
    ///
    /// let tx = Producer::builder("cam0").policy(Policy::Overwrite).create_gpu(0)?;
    /// assert_eq!(tx.policy(), Policy::Overwrite);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn policy(&self) -> Policy {
        self.inner.policy()
    }

    /// Messages published so far.
    ///
    /// ```no_run
    /// # let mut tx = gpuring::Producer::builder("cam0").create_gpu(0)?;
    /// let seq = tx.acquire()?.publish(0, b"")?;
    /// assert_eq!(tx.published(), seq + 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn published(&self) -> u64 {
        self.inner.published()
    }

    /// Consumers currently joined.
    ///
    /// ```no_run
    /// # let tx = gpuring::Producer::builder("cam0").create_gpu(0)?;
    /// // Wait for a first consumer before streaming.
    /// while tx.consumer_count() == 0 {
    ///     std::thread::sleep(std::time::Duration::from_millis(10));
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn consumer_count(&self) -> usize {
        self.inner.consumer_count()
    }

    /// A snapshot of every joined consumer's counters.
    ///
    /// ```no_run
    /// # let tx = gpuring::Producer::builder("cam0").create_gpu(0)?;
    /// for c in tx.consumers() {
    ///     println!("consumer {} (pid {}): {} behind", c.index, c.pid, c.lag);
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn consumers(&self) -> Vec<crate::ConsumerInfo> {
        self.inner.consumers()
    }

    /// Slots some consumer holds now (see [`Producer::held_slots`]).
    ///
    /// ```no_run
    /// let tx = gpuring::Producer::builder("cam0").create_gpu(0)?;
    /// println!("{} of {} slots held by consumers", tx.held_slots(), tx.capacity());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn held_slots(&self) -> usize {
        self.inner.held_slots()
    }

    /// Reclaims consumers whose process died (see [`Producer::reap`]); acquire does it by
    /// itself. Our imports of their release events are dropped at the next acquire.
    ///
    /// ```no_run
    /// # let mut tx = gpuring::Producer::builder("cam0").create_gpu(0)?;
    /// let dead = tx.reap()?;
    /// if dead > 0 {
    ///     eprintln!("reclaimed the slots of {dead} dead consumers");
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn reap(&mut self) -> Result<usize, crate::Corruption> {
        let GpuProducer { inner, gpu, .. } = self;
        Ok(inner.reap_with(&mut |e, g| gpu.forget_reader(e, g))?.freed as usize)
    }

    /// The ring instance's epoch.
    ///
    /// ```no_run
    /// # let tx = gpuring::Producer::builder("cam0").create_gpu(0)?;
    /// // Consumers of this instance see the same value in `GpuConsumer::epoch`.
    /// println!("ring {}, instance {:#x}", tx.name(), tx.epoch());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn epoch(&self) -> u64 {
        self.inner.epoch()
    }

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
        &self.gpu.ctx
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
        &self.stream
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
        self.linger = linger;
    }

    /// Adds `pool` to the ring's pool table, so that messages can be published from it with
    /// [`GpuWriteSlot::publish_region`]. The producer keeps it until it drops.
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
        self.gpu.add_pool(self.inner.map(), PoolMemory::Owned(pool))
    }

    /// Adds an allocation the caller owns (a decoder's output surfaces, say) to the pool table.
    ///
    /// # Safety
    /// 1. `ptr` must be the base of a dedicated `cuMemAlloc` allocation of at least `size`
    ///    bytes on this producer's device, never one from a stream-ordered or caching pool
    ///    (legacy IPC shares the whole underlying block; see `docs/gpu.md`).
    /// 2. It must stay allocated until this producer has dropped.
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
        self.gpu.add_pool(self.inner.map(), PoolMemory::Borrowed { ptr, size })
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
        let p = self.gpu.pools.get(id.0 as usize)?;
        Some((p.ptr(), p.size()))
    }

    /// The next slot if it is free now: its previous message's readers are done with it.
    /// After `Full` the next acquire picks up where this one stopped (the slot may already be
    /// claimed, which costs a consumer of an `Overwrite` ring that message, no more).
    ///
    /// ```no_run
    /// use gpuring::gpu::GpuAcquireError;
    /// # let mut tx = gpuring::Producer::builder("cam0").create_gpu(0)?;
    /// # fn render(_dst: u64, _len: usize, _stream: &gpuring::cuda::Stream) {}
    /// match tx.try_acquire() {
    ///     Ok(slot) => { render(slot.ptr(), 4096, slot.stream()); slot.publish(4096, b"")?; }
    ///     Err(GpuAcquireError::Full) => {} // every slot is busy: skip this frame
    ///     Err(e) => return Err(e.into()),
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn try_acquire(&mut self) -> Result<GpuWriteSlot<'_>, GpuAcquireError> {
        self.acquire_with(None, Patience::Now)
    }

    /// The next slot, waiting as long as it takes (for the slowest consumer under `Block`, and
    /// for the GPU reads of the consumers of the slot's previous message).
    ///
    /// ```no_run
    /// # let mut tx = gpuring::Producer::builder("cam0").create_gpu(0)?;
    /// # fn render(_dst: u64, _len: usize, _stream: &gpuring::cuda::Stream) {}
    /// let slot = tx.acquire()?;
    /// render(slot.ptr(), 4096, slot.stream()); // the slot's last readers are done with it
    /// slot.publish(4096, b"")?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// A producer hands out one slot at a time: publish (or drop) it before you acquire the next.
    ///
    /// ```compile_fail,E0499
    /// # let mut tx = gpuring::Producer::builder("cam0").create_gpu(0)?;
    /// let a = tx.acquire()?;
    /// let b = tx.acquire()?; // error: `a` still borrows `tx` mutably
    /// a.publish(0, b"")?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn acquire(&mut self) -> Result<GpuWriteSlot<'_>, GpuAcquireError> {
        self.acquire_with(None, Patience::Forever)
    }

    /// The next slot, waiting at most `timeout`. After `Timeout` the next acquire picks up
    /// where this one stopped, as after [`try_acquire`](Self::try_acquire)'s `Full`.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use gpuring::gpu::GpuAcquireError;
    /// # let mut tx = gpuring::Producer::builder("cam0").create_gpu(0)?;
    /// # fn render(_dst: u64, _len: usize, _stream: &gpuring::cuda::Stream) {}
    /// match tx.acquire_timeout(Duration::from_millis(100)) {
    ///     Ok(slot) => { render(slot.ptr(), 4096, slot.stream()); slot.publish(4096, b"")?; }
    ///     Err(GpuAcquireError::Timeout) => eprintln!("consumers are stalled: frame dropped"),
    ///     Err(e) => return Err(e.into()),
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn acquire_timeout(
        &mut self,
        timeout: Duration,
    ) -> Result<GpuWriteSlot<'_>, GpuAcquireError> {
        self.acquire_with(None, Patience::Until(Instant::now() + timeout))
    }

    /// Like [`acquire`](Self::acquire), but the slot is written on `stream` (your decoder's or
    /// kernel's stream, of this producer's device): `publish` records the ready event there.
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
    ) -> Result<GpuWriteSlot<'a>, GpuAcquireError> {
        self.check_stream(stream)?;
        self.acquire_with(Some(stream), Patience::Forever)
    }

    /// [`acquire_on`](Self::acquire_on), waiting at most `timeout` (see
    /// [`acquire_timeout`](Self::acquire_timeout)).
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use gpuring::cuda::Stream;
    /// use gpuring::gpu::GpuAcquireError;
    /// # let mut tx = gpuring::Producer::builder("cam0").create_gpu(0)?;
    /// # fn render(_dst: u64, _len: usize, _stream: &gpuring::cuda::Stream) {}
    /// let decoder_stream = Stream::new(tx.context())?;
    /// match tx.acquire_on_timeout(&decoder_stream, Duration::from_millis(100)) {
    ///     Ok(slot) => { render(slot.ptr(), 4096, &decoder_stream); slot.publish(4096, b"")?; }
    ///     Err(GpuAcquireError::Timeout) => eprintln!("consumers are stalled: frame dropped"),
    ///     Err(e) => return Err(e.into()),
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn acquire_on_timeout<'a>(
        &'a mut self,
        stream: &'a Stream,
        timeout: Duration,
    ) -> Result<GpuWriteSlot<'a>, GpuAcquireError> {
        self.check_stream(stream)?;
        self.acquire_with(Some(stream), Patience::Until(Instant::now() + timeout))
    }

    /// Refuses a stream of another device than the ring's.
    fn check_stream(&self, stream: &Stream) -> Result<(), GpuAcquireError> {
        let (theirs, ours) = (stream.context().ordinal(), self.gpu.ctx.ordinal());
        if theirs != ours {
            return Err(GpuAcquireError::Cuda(CudaError::ForeignStream {
                stream: theirs,
                ring: ours,
            }));
        }
        Ok(())
    }

    /// Waits (as `patience` allows) for the GPU to have finished writing the next slot's
    /// previous message (see `docs/gpu.md`, "Run-ahead"), claims the slot, waits for the
    /// readers of that previous message, and hands the slot out.
    fn acquire_with<'a>(
        &'a mut self,
        stream: Option<&'a Stream>,
        patience: Patience,
    ) -> Result<GpuWriteSlot<'a>, GpuAcquireError> {
        let seq = self.inner.published();
        let cap = self.inner.capacity() as u64;
        let next_slot = (seq % cap) as usize;
        if seq >= cap {
            self.wait_until_done(patience, |p| p.written(next_slot))?;
        }
        let GpuProducer { inner, gpu, .. } = &mut *self;
        let on_free = &mut |e, g| gpu.forget_reader(e, g);
        let slot = match patience {
            Patience::Now => inner.try_claim(on_free).map_err(|e| match e {
                TryAcquireError::Full => GpuAcquireError::Full,
                TryAcquireError::Corrupt(c) => GpuAcquireError::Corrupt(c),
            })?,
            Patience::Until(d) => claim_error(inner.claim_until(Some(d), on_free))?,
            Patience::Forever => claim_error(inner.claim_until(None, on_free))?,
        };
        debug_assert_eq!(slot, next_slot);
        if seq >= cap && !self.unfenced {
            self.wait_until_done(patience, |p| p.readers_done(slot, seq - cap))?;
        }
        Ok(GpuWriteSlot { producer: self, slot, stream })
    }

    /// Polls `done` until it says yes, as `patience` allows, reaping the consumer table once
    /// per liveness interval meanwhile (dead consumers are noticed, retiring ones let go).
    /// Through the one polling wait of `crate::wait`: spin for `gpu_poll`, then yield and nap.
    fn wait_until_done(
        &mut self,
        patience: Patience,
        mut done: impl FnMut(&mut Self) -> Result<bool, GpuAcquireError>,
    ) -> Result<(), GpuAcquireError> {
        if done(self)? {
            return Ok(());
        }
        let deadline = match patience {
            Patience::Now => return Err(GpuAcquireError::Full),
            Patience::Until(d) => Some(d),
            Patience::Forever => None,
        };
        let config = WaitConfig { spin: self.poll, ..self.inner.wait_config() };
        let r = wait::poll_until(config, deadline, |tick| {
            if tick {
                if let Err(c) = self.reap_now() {
                    return Some(Err(c));
                }
            }
            match done(self) {
                Ok(false) => None,
                Ok(true) => Some(Ok(())),
                Err(e) => Some(Err(e)),
            }
        });
        r.unwrap_or(Err(GpuAcquireError::Timeout))
    }

    /// Reaps the consumer table now, dropping our imports of the entries it frees.
    fn reap_now(&mut self) -> Result<(), GpuAcquireError> {
        let GpuProducer { inner, gpu, .. } = self;
        inner.reap_with(&mut |e, g| gpu.forget_reader(e, g)).map_err(GpuAcquireError::Corrupt)?;
        Ok(())
    }

    /// Whether slot `slot`'s ready event, recorded when its previous message was published,
    /// has completed on the GPU. Waiting for it bounds how far the CPU runs ahead of the GPU
    /// to one lap of the ring; without it, a producer faster than the GPU fills the driver's
    /// launch queue and latency grows to tens of milliseconds.
    fn written(&mut self, slot: usize) -> Result<bool, GpuAcquireError> {
        Ok(self.gpu.ready[slot].is_complete()?)
    }

    /// Whether every active consumer that read message `prev` in slot `slot` (its release line
    /// says so) has finished reading it on its GPU: its release event for the slot completed.
    /// A consumer whose event cannot be opened or queried is evicted (the failure is its entry's
    /// alone) and no longer waited for.
    fn readers_done(&mut self, slot: usize, prev: u64) -> Result<bool, GpuAcquireError> {
        let mut busy = false;
        for e in 0..self.inner.map().ring().consumers.len() {
            let map = self.inner.map();
            // Acquire: pairs with the consumer's Release CAS to ACTIVE, after it wrote its
            // release lines.
            let seen = map.ring().consumers[e].lease.load(Ordering::Acquire);
            if lease::state(seen) != lease::ACTIVE {
                continue;
            }
            let line = &map.gpu().releases_of(e)[slot];
            // Acquire: pairs with the consumer's Release store made after it recorded its
            // release event for `prev`.
            if line.released.load(Ordering::Acquire) != prev + 1 {
                continue;
            }
            let looked = match self.gpu.reader_event(map, e, seen, slot) {
                Ok(event) => event.is_complete().map_err(EventFault::of),
                Err(why) => Err(why),
            };
            match looked {
                Ok(true) | Err(EventFault::Moved) => {}
                Ok(false) => busy = true,
                // Whose failure? If our own context answers a query of our own event, the
                // consumer's handle (or line) is to blame and that consumer goes; if it does
                // not (a sticky error, out of memory), the failure is ours and ends this
                // acquire rather than evict anyone.
                Err(EventFault::Failed(why)) if self.gpu.ready[slot].is_complete().is_err() => {
                    return Err(GpuAcquireError::Cuda(why));
                }
                Err(EventFault::Failed(why)) => {
                    let generation = lease::generation(seen);
                    tracing::warn!(entry = e, generation, %why, "a consumer's release event failed");
                    self.gpu.forget_reader(e, generation);
                    self.inner.evict(e, seen, evict_reason::RELEASE_EVENT);
                }
            }
        }
        Ok(!busy)
    }

    /// [`acquire`](Self::acquire), awaiting the slot without blocking the thread (feature
    /// `tokio`): the wait for consumers parks the task like
    /// [`Producer::acquire_async`](crate::Producer::acquire_async). The waits for the GPU (the
    /// slot's previous message written, its readers done) yield to the runtime while they
    /// poll, then sleep 100 µs at a time (tokio's timer rounds that up to a millisecond).
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let mut tx = gpuring::Producer::builder("cam0").slot_size(1 << 20).create_gpu(0)?;
    /// let slot = tx.acquire_async().await?;
    /// // ... write the frame at slot.ptr() on slot.stream() ...
    /// slot.publish(1 << 20, b"")?;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "tokio")]
    pub async fn acquire_async(&mut self) -> Result<GpuWriteSlot<'_>, GpuAcquireError> {
        let seq = self.inner.published();
        let cap = self.inner.capacity() as u64;
        let next_slot = (seq % cap) as usize;
        if seq >= cap {
            self.poll_async(|p| p.written(next_slot)).await?;
        }
        let GpuProducer { inner, gpu, .. } = &mut *self;
        let slot = inner
            .claim_async(&mut |e, g| gpu.forget_reader(e, g))
            .await
            .map_err(|crate::AcquireError::Corrupt(c)| GpuAcquireError::Corrupt(c))?;
        if seq >= cap && !self.unfenced {
            self.poll_async(|p| p.readers_done(slot, seq - cap)).await?;
        }
        Ok(GpuWriteSlot { producer: self, slot, stream: None })
    }

    /// [`wait_until_done`](Self::wait_until_done) for an async task: yields to the runtime
    /// for the spin time, then sleeps 100 µs at a time, reaping once per liveness interval.
    #[cfg(feature = "tokio")]
    async fn poll_async(
        &mut self,
        mut done: impl FnMut(&mut Self) -> Result<bool, GpuAcquireError>,
    ) -> Result<(), GpuAcquireError> {
        let start = Instant::now();
        let mut last_reap = start;
        let config = self.inner.wait_config();
        while !done(self)? {
            if last_reap.elapsed() >= config.tick {
                last_reap = Instant::now();
                self.reap_now()?;
            }
            if start.elapsed() < config.spin * 4 {
                tokio::task::yield_now().await;
            } else {
                tokio::time::sleep(Duration::from_micros(100)).await;
            }
        }
        Ok(())
    }
}

/// A claim's error as the GPU producer's.
fn claim_error<T>(r: Result<T, AcquireTimeoutError>) -> Result<T, GpuAcquireError> {
    r.map_err(|e| match e {
        AcquireTimeoutError::Timeout => GpuAcquireError::Timeout,
        AcquireTimeoutError::Corrupt(c) => GpuAcquireError::Corrupt(c),
    })
}

impl Drop for GpuProducer {
    fn drop(&mut self) {
        self.inner.close();
        // SeqCst, against the fence a joining consumer makes between claiming its entry and
        // loading `closed`: either it sees `closed` (and gives up) or `consumers_gone` below
        // sees its entry taken (and waits for it).
        fence(Ordering::SeqCst);
        // Consumers still map our memory while they drain: give them the linger time to leave.
        // Meanwhile reap every tick: retiring consumers are let go (our imports of their
        // events dropped first), dead ones reclaimed.
        let config = WaitConfig { tick: Duration::from_millis(10), ..self.inner.wait_config() };
        let deadline = Some(Instant::now() + self.linger);
        let all_left = {
            let GpuProducer { inner, gpu, .. } = &mut *self;
            wait::poll_until(config, deadline, |tick| {
                if tick {
                    let _ = inner.reap_with(&mut |e, g| gpu.forget_reader(e, g));
                }
                consumers_gone(&inner.map().ring()).then_some(())
            })
            .is_some()
        };
        // Our own writes must end before the memory is freed. Poll rather than synchronize: a
        // wedged GPU must not hang the process here.
        let written_by = Instant::now() + Duration::from_secs(1);
        let written = loop {
            let done = self.gpu.ready.iter().all(|ev| ev.is_complete().unwrap_or(true));
            if done || Instant::now() >= written_by {
                break done;
            }
            std::thread::sleep(Duration::from_micros(200));
        };
        // Whoever is still there may destroy its events once we are gone: close our imports
        // of them first, always; then let go of every retiring entry.
        let entries = self.gpu.readers.len() / self.gpu.capacity.max(1);
        for e in 0..entries {
            self.gpu.forget_reader(e, 0);
        }
        let _ = self.inner.reap_with(&mut crate::producer::no_hook());
        if !all_left || !written {
            tracing::warn!(
                ring = %self.name(), all_left, written,
                "consumers still map the ring's device memory: leaving it to process exit"
            );
            // Someone may still map the memory or wait on our events, or our GPU work may still
            // write it: freeing it now could corrupt a reader. Leave it to process exit.
            std::mem::forget(std::mem::take(&mut self.gpu.pools));
            std::mem::forget(std::mem::take(&mut self.gpu.ready));
            return;
        }
        drop(std::mem::take(&mut self.gpu.pools));
        tracing::debug!(target: "gpuring::lifecycle", ring = %self.name(), "producer pools freed");
    }
}

/// A claimed device slot: write `len` bytes at [`ptr`](Self::ptr) on [`stream`](Self::stream),
/// then [`publish`](Self::publish). Dropping it unpublished keeps it claimed; the next acquire
/// returns it again.
///
/// ```no_run
/// # let mut tx = gpuring::Producer::builder("cam0").create_gpu(0)?;
/// # fn render(_dst: u64, _len: usize, _stream: &gpuring::cuda::Stream) {}
/// let slot = tx.acquire()?;
/// let len = slot.capacity();
/// render(slot.ptr(), len, slot.stream());
/// slot.publish(len, b"rgba")?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct GpuWriteSlot<'a> {
    producer: &'a mut GpuProducer,
    slot: usize,
    /// The caller's stream (`acquire_on`), else the producer's.
    stream: Option<&'a Stream>,
}

impl GpuWriteSlot<'_> {
    /// Device address of the slot (aligned to [`SLOT_ALIGN`]).
    ///
    /// ```no_run
    /// # let mut tx = gpuring::Producer::builder("cam0").create_gpu(0)?;
    /// # fn render(_dst: u64, _len: usize, _stream: &gpuring::cuda::Stream) {}
    /// let slot = tx.acquire()?;
    /// // Launch your kernel on the slot's stream, writing to the slot's device memory.
    /// render(slot.ptr(), 4096, slot.stream());
    /// slot.publish(4096, b"")?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn ptr(&self) -> CUdeviceptr {
        self.producer.gpu.pools[0].ptr() + (self.slot * self.producer.gpu.stride) as u64
    }

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
        self.producer.slot_size()
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
        self.stream.unwrap_or(&self.producer.stream)
    }

    /// Sequence number this message will have.
    ///
    /// ```no_run
    /// # let mut tx = gpuring::Producer::builder("cam0").create_gpu(0)?;
    /// let slot = tx.acquire()?;
    /// let seq = slot.seq();
    /// assert_eq!(slot.publish(0, b"")?, seq);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn seq(&self) -> u64 {
        self.producer.published()
    }

    /// Slot index (for diagnostics).
    ///
    /// ```no_run
    /// # let mut tx = gpuring::Producer::builder("cam0").create_gpu(0)?;
    /// let slot = tx.acquire()?;
    /// eprintln!("writing message {} into slot {}", slot.seq(), slot.slot());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn slot(&self) -> usize {
        self.slot
    }

    /// Publishes the first `len` bytes of the slot with user header `header`: records the
    /// slot's ready event on the stream, then makes the message visible. Returns its sequence
    /// number.
    ///
    /// ```no_run
    /// # let mut tx = gpuring::Producer::builder("cam0").create_gpu(0)?;
    /// # fn render(_dst: u64, _len: usize, _stream: &gpuring::cuda::Stream) {}
    /// let slot = tx.acquire()?;
    /// render(slot.ptr(), 4096, slot.stream());
    /// let seq = slot.publish(4096, b"rgba")?; // `b"rgba"` is the user header
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// `publish` takes the slot: it cannot be written or published again afterwards.
    ///
    /// ```compile_fail,E0382
    /// # let mut tx = gpuring::Producer::builder("cam0").create_gpu(0)?;
    /// let slot = tx.acquire()?;
    /// slot.publish(4096, b"")?;
    /// let ptr = slot.ptr(); // error: `slot` was moved by `publish`
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn publish(self, len: usize, header: &[u8]) -> Result<u64, GpuPublishError> {
        let offset = (self.slot * self.producer.gpu.stride) as u64;
        self.publish_at(0, offset, len as u64, header)
    }

    /// Publishes `len` bytes at `offset` of registered pool `pool` instead of the slot's own
    /// memory. Write them on [`stream`](Self::stream) (or make it wait for your writes) first;
    /// the consumers' reads are fenced by the same ready event. Do not rewrite the region
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
    ) -> Result<u64, GpuPublishError> {
        let Some(pool_mem) = self.producer.gpu.pools.get(pool.0 as usize) else {
            return Err(GpuPublishError::UnknownPool);
        };
        let size = pool_mem.size() as u64;
        if offset.checked_add(len).is_none_or(|end| end > size) {
            return Err(GpuPublishError::OutsidePool { offset, len, size });
        }
        self.publish_at(pool.0, offset, len, header)
    }

    fn publish_at(
        self,
        pool: u32,
        offset: u64,
        len: u64,
        header: &[u8],
    ) -> Result<u64, GpuPublishError> {
        let p = &mut *self.producer;
        let slot_size = p.slot_size() as u64;
        if len > slot_size {
            return Err(GpuPublishError::TooLong { len, slot_size });
        }
        let max = p.inner.user_header_size();
        if header.len() > max {
            return Err(GpuPublishError::HeaderTooLong { len: header.len(), max });
        }
        let stream = self.stream.unwrap_or(&p.stream);
        if let Some(words) = p.gpu.words {
            let _bound = p.gpu.ctx.bind()?;
            let seq = p.inner.published();
            // SAFETY: the slot's ready word lies in our fence words, alive as long as the
            // producer; the stream is live.
            unsafe {
                driver::stream_write_value64(stream.raw(), words + ready_word(self.slot), seq + 1)
            }?;
        }
        p.gpu.ready[self.slot].record(stream)?;
        let tables = p.inner.map().gpu();
        // Relaxed: only this producer writes pool entries.
        let generation = tables.pools[pool as usize].generation.load(Ordering::Relaxed);
        let line = &tables.slots[self.slot];
        // Relaxed: published by the Release stamp store in `publish_claimed`.
        line.pool.store(pool, Ordering::Relaxed);
        line.pool_generation.store(generation, Ordering::Relaxed);
        line.offset.store(offset, Ordering::Relaxed);
        p.inner.publish_claimed(self.slot, len, header).map_err(|e| match e {
            PublishError::HeaderTooLong { len, max } => GpuPublishError::HeaderTooLong { len, max },
            PublishError::TooLong { len, slot_size } => {
                GpuPublishError::TooLong { len: len as u64, slot_size: slot_size as u64 }
            }
        })
    }
}
