//! The producer's side of a CUDA ring ([`CudaTx`]), and what only CUDA producers and their
//! slots have: the context and stream, registered pools, device pointers, `acquire_on`.

use std::sync::atomic::{fence, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::{same_device, Cuda};
use crate::cuda::driver::{self, CUdeviceptr};
use crate::cuda::{Context, CudaError, DevicePool, DriverError, IpcEvent, Stream};
use crate::error::{AcquireError, AcquireTimeoutError, CreateError, PublishError, RegisterError};
use crate::format::gpu::{fence_bytes, fence_kind, pool_state, ready_word, store_uuid, MAX_POOLS};
use crate::format::view::MappedRing;
use crate::memory::{Fault, ProducerSide, TxSettings};
use crate::producer::{Producer, ProducerRing, WriteSlot};
use crate::ring::lease::{self, evict_reason};
use crate::ring::Ring;
use crate::shm::process::ProcessId;
use crate::wait::{self, Deadline, WaitConfig};

/// Slots start at multiples of this in the producer's pool, so kernels can use wide loads.
///
/// ```no_run
/// # let mut tx = gpuring::Producer::builder("cam0").create_gpu(0)?;
/// let slot = tx.acquire()?;
/// assert_eq!(slot.ptr() % gpuring::memory::SLOT_ALIGN as u64, 0);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub const SLOT_ALIGN: usize = 256;

/// How long a dropped producer waits, by default, for its consumers to leave before it frees
/// the device memory they map.
///
/// ```no_run
/// # let mut tx = gpuring::Producer::builder("cam0").create_gpu(0)?;
/// // Give slow consumers twice the default time to leave when `tx` drops.
/// tx.set_linger(gpuring::memory::DEFAULT_LINGER * 2);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub const DEFAULT_LINGER: Duration = Duration::from_secs(5);

/// How long a closing producer waits for its own last writes before it frees its memory:
/// polled, not synchronised, so that a wedged GPU cannot hang the process in `drop`.
const WRITES_PATIENCE: Duration = Duration::from_secs(1);

/// A CUDA failure while creating a ring: the memory kind cannot be had.
fn unavailable(e: CudaError) -> CreateError {
    CreateError::MemoryUnavailable { reason: e.to_string() }
}

/// A pool table entry of a CUDA producer: the slots' own allocation (0) or one registered
/// with [`Producer::register`].
///
/// ```no_run
/// use gpuring::cuda::DevicePool;
/// use gpuring::memory::PoolId;
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

/// The producer's CUDA side.
///
/// Invariants: `pools[i]` is what pool table entry `i` names (LIVE, generation 1);
/// `ready[i]` is slot `i`'s ready event, whose handle is in the slot's line.
pub struct CudaTx {
    /// The ring's name, for lifecycle events.
    name: String,
    ctx: Arc<Context>,
    uuid: [u8; 16],
    pools: Vec<PoolMemory>,
    /// Distance between slots in pool 0.
    stride: usize,
    ready: Vec<IpcEvent>,
    /// Per consumer table entry and buffer, the release event we opened (`buffers` per entry).
    /// Dropped before the entry is freed (`forget_reader`): a consumer destroys the events it
    /// exported only once its entry is freed, or never (see docs/gpu.md, "Leaving").
    readers: Vec<Option<ReaderEvent>>,
    /// Buffers: the ring's capacity plus its spares.
    buffers: usize,
    /// With `Fence::Memory`: the device address of the buffers' ready words (in
    /// `pools[fence_pool]`, zeroed at creation; `format::gpu::fence_bytes` long).
    words: Option<CUdeviceptr>,
    /// The producer's own stream, for `acquire`.
    stream: Stream,
    /// Test support: skip the wait for readers (`unfenced_for_tests`).
    unfenced: bool,
    /// How long a closing producer waits for its consumers to leave.
    linger: Duration,
    /// How long `acquire` spins on a pending event before it yields and naps.
    poll: Duration,
}

impl CudaTx {
    /// Allocates the buffers and their events and writes the pool table and buffer lines of a
    /// segment nobody sees yet.
    fn build(
        ctx: &Arc<Context>,
        map: &MappedRing,
        slot_size: usize,
        buffers: usize,
        settings: &TxSettings,
    ) -> Result<CudaTx, CudaError> {
        let stride = slot_size.div_ceil(SLOT_ALIGN) * SLOT_ALIGN;
        let pool = DevicePool::new(ctx, stride * buffers)?;
        let uuid = ctx.uuid()?;
        let tables = map.gpu();
        store_uuid(&tables.header.device_uuid, uuid);
        let mut side = CudaTx {
            name: map.segment().name().ring().to_owned(),
            ctx: ctx.clone(),
            uuid,
            pools: Vec::new(),
            stride,
            ready: Vec::with_capacity(buffers),
            readers: (0..map.params().max_consumers as usize * buffers).map(|_| None).collect(),
            buffers,
            words: None,
            stream: Stream::new(ctx)?,
            unfenced: settings.unfenced,
            linger: DEFAULT_LINGER,
            poll: settings.gpu_poll,
        };
        let registered = |e| match e {
            RegisterError::Cuda(e) => e,
            other => CudaError::Unavailable(format!("registering a pool: {other}")),
        };
        side.add_pool(map, PoolMemory::Owned(pool)).map_err(registered)?;
        let header = &tables.header;
        // Relaxed (both): published by the Release store of `magic`.
        header.fence.store(fence_kind::EVENTS, Ordering::Relaxed);
        if settings.memory_fence {
            let dev = driver::device(ctx.ordinal())?;
            if !driver::can_use_64_bit_stream_mem_ops(dev)? {
                return Err(CudaError::Unavailable(
                    "Fence::Memory needs 64-bit stream memory operations, which this device \
                     does not support"
                        .into(),
                ));
            }
            let bytes = fence_bytes(buffers);
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
        for line in tables.buffers {
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
        let n = self.buffers;
        let mine = &mut self.readers[entry * n..(entry + 1) * n];
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
        let cached = &mut self.readers[entry * self.buffers + slot];
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

impl ProducerSide for CudaTx {
    type Stream = Stream;

    /// The device's context.
    type Prepared = Arc<Context>;

    fn prepare(settings: &TxSettings) -> Result<Arc<Context>, CreateError> {
        Context::new(settings.device).map_err(unavailable)
    }

    fn create(
        ctx: Arc<Context>,
        settings: &TxSettings,
        map: &MappedRing,
    ) -> Result<Self, CreateError> {
        let params = map.params();
        let (slot_size, buffers) = (params.slot_size as usize, params.buffers() as usize);
        CudaTx::build(&ctx, map, slot_size, buffers, settings).map_err(unavailable)
    }

    fn spin(&self) -> Duration {
        self.poll
    }

    /// Whether slot `slot`'s ready event, recorded when its previous message was published,
    /// has completed on the GPU. Waiting for it bounds how far the CPU runs ahead of the GPU
    /// to one lap of the ring; without it, a producer faster than the GPU fills the driver's
    /// launch queue and latency grows to tens of milliseconds.
    fn written(&mut self, slot: usize) -> Result<bool, Fault> {
        Ok(self.ready[slot].is_complete()?)
    }

    /// Whether every active consumer that read message `prev` in slot `slot` (its release line
    /// says so) has finished reading it on its GPU: its release event for the slot completed.
    /// A consumer whose event cannot be opened or queried is evicted (the failure is its entry's
    /// alone) and no longer waited for.
    fn readers_done(
        &mut self,
        ring: &mut ProducerRing,
        slot: usize,
        prev: u64,
    ) -> Result<bool, Fault> {
        if self.unfenced {
            return Ok(true);
        }
        let mut busy = false;
        for e in 0..ring.map().ring().consumers.len() {
            let map = ring.map();
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
            let looked = match self.reader_event(map, e, seen, slot) {
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
                Err(EventFault::Failed(why)) if self.ready[slot].is_complete().is_err() => {
                    return Err(Fault::Cuda(why));
                }
                Err(EventFault::Failed(why)) => {
                    let generation = lease::generation(seen);
                    tracing::warn!(entry = e, generation, %why, "a consumer's release event failed");
                    self.forget_reader(e, generation);
                    ring.evict(e, seen, evict_reason::RELEASE_EVENT);
                }
            }
        }
        Ok(!busy)
    }

    fn forget(&mut self, entry: usize, generation: u32) {
        self.forget_reader(entry, generation);
    }

    fn publish(
        &mut self,
        ring: &ProducerRing,
        slot: usize,
        (pool, offset): (u32, u64),
        stream: Option<&Stream>,
    ) -> Result<(), PublishError> {
        let stream = stream.unwrap_or(&self.stream);
        if let Some(words) = self.words {
            let _bound = self.ctx.bind()?;
            let seq = ring.published();
            // SAFETY: the slot's ready word lies in our fence words, alive as long as the
            // producer; the stream is live.
            unsafe {
                driver::stream_write_value64(stream.raw(), words + ready_word(slot), seq + 1)
            }?;
        }
        self.ready[slot].record(stream)?;
        let tables = ring.map().gpu();
        // Relaxed: only this producer writes pool entries.
        let generation = tables.pools[pool as usize].generation.load(Ordering::Relaxed);
        let line = &tables.buffers[slot];
        // Relaxed: published by the Release stamp store in `publish_claimed`.
        line.pool.store(pool, Ordering::Relaxed);
        line.pool_generation.store(generation, Ordering::Relaxed);
        line.offset.store(offset, Ordering::Relaxed);
        Ok(())
    }

    fn slot_region(&self, slot: usize) -> (u32, u64) {
        (0, (slot * self.stride) as u64)
    }

    fn slot_addr(&self, _: &ProducerRing, slot: usize) -> u64 {
        self.pools[0].ptr() + (slot * self.stride) as u64
    }

    /// Closes the ring, waits up to the linger time for consumers to leave, and frees the
    /// device memory, unless someone may still use it: then it is left to process exit.
    fn close(&mut self, ring: &mut ProducerRing) {
        ring.close();
        // SeqCst, against the fence a joining consumer makes between claiming its entry and
        // loading `closed`: either it sees `closed` (and gives up) or `consumers_gone` below
        // sees its entry taken (and waits for it).
        fence(Ordering::SeqCst);
        // Consumers still map our memory while they drain: give them the linger time to leave.
        // Meanwhile reap every tick: retiring consumers are let go (our imports of their
        // events dropped first), dead ones reclaimed.
        let config = WaitConfig { tick: Duration::from_millis(10), ..ring.wait_config() };
        let deadline = Deadline::after(self.linger);
        let all_left = wait::wait_until(None, config, deadline, |tick| {
            if tick {
                let _ = ring.reap_with(&mut |e, g| self.forget_reader(e, g));
            }
            consumers_gone(&ring.map().ring()).then_some(())
        })
        .is_some();
        // Our own writes must end before the memory is freed. Poll rather than synchronize: a
        // wedged GPU must not hang the process here.
        let ready = &self.ready;
        let written = wait::wait_until(None, config, Deadline::after(WRITES_PATIENCE), |_| {
            ready.iter().all(|ev| ev.is_complete().unwrap_or(true)).then_some(())
        })
        .is_some();
        // Whoever is still there may destroy its events once we are gone: close our imports
        // of them first, always; then let go of every retiring entry.
        let entries = self.readers.len() / self.buffers.max(1);
        for e in 0..entries {
            self.forget_reader(e, 0);
        }
        let _ = ring.reap_with(&mut |_, _| {});
        if !all_left || !written {
            tracing::warn!(
                ring = %ring.name(), all_left, written,
                "consumers still map the ring's device memory: leaving it to process exit"
            );
            // Someone may still map the memory or wait on our events, or our GPU work may still
            // write it: freeing it now could corrupt a reader. Leave it to process exit.
            std::mem::forget(std::mem::take(&mut self.pools));
            std::mem::forget(std::mem::take(&mut self.ready));
            return;
        }
        drop(std::mem::take(&mut self.pools));
        tracing::debug!(target: "gpuring::lifecycle", ring = %ring.name(), "producer pools freed");
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
        &self.mem().ctx
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
        &self.mem().stream
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
        self.parts().1.linger = linger;
    }

    /// Adds `pool` to the ring's pool table, so that messages can be published from it with
    /// [`WriteSlot::publish_region`]. The producer keeps it until it drops.
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
        let (ring, mem) = self.parts();
        mem.add_pool(ring.map(), PoolMemory::Owned(pool))
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
        let (ring, mem) = self.parts();
        mem.add_pool(ring.map(), PoolMemory::Borrowed { ptr, size })
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
        let p = self.mem().pools.get(id.0 as usize)?;
        Some((p.ptr(), p.size()))
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
    ) -> Result<WriteSlot<'a, Cuda>, AcquireError> {
        same_device(stream, &self.mem().ctx)?;
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
        same_device(stream, &self.mem().ctx)?;
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
        stream.unwrap_or(&producer.mem().stream)
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
    ) -> Result<u64, PublishError> {
        let producer = self.parts().0;
        let Some(pool_mem) = producer.mem().pools.get(pool.0 as usize) else {
            return Err(PublishError::UnknownPool);
        };
        let size = pool_mem.size() as u64;
        if offset.checked_add(len).is_none_or(|end| end > size) {
            return Err(PublishError::OutsidePool { offset, len, size });
        }
        let slot_size = producer.slot_size();
        if len > slot_size as u64 {
            let len = usize::try_from(len).unwrap_or(usize::MAX);
            return Err(PublishError::TooLong { len, slot_size });
        }
        self.publish_at((pool.0, offset), len, header)
    }
}
