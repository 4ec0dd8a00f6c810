//! The producer's side of a CUDA ring ([`CudaTx`]): its device memory and pools, the ready
//! fences it records, and its answers to the producer (written, readers done, close).
//!
//! Two choices of the segment shape it, each made of two halves with the same methods:
//! how pools reach consumers (`gpu.sharing`, [`TxShare`]: `legacy` IPC handles in the pool
//! table, or `vmm` fds from the producer's server), and how buffers are fenced (`gpu.fence`,
//! [`TxFences`]: interprocess `events`, or memory `words` in the segment; VMM always uses
//! words).
//! `share` and `fences` hold the two enums, whose methods call the same method of the half
//! they hold (`legacy` or `vmm`; `events` or `words`): `CudaTx` reads as one path.

mod events;
mod fences;
mod legacy;
mod share;
mod vmm;
mod words;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use self::fences::TxFences;
use self::share::{PoolMemory, TxShare};
use super::{lacks, Leakable};
use crate::cuda::driver::{self, CUdeviceptr};
use crate::cuda::{Context, CudaError, DevicePool, DriverError, Stream};
use crate::error::{CreateErrorKind, Fault, PublishError, RegisterError};
use crate::format::gpu::{fence_kind, pool_state, store_uuid, MAX_POOLS};
use crate::memory::{Closed, ProducerSide, Readers, TxSettings};
use crate::ring::lease;
use crate::shm::view::MappedRing;
use crate::shm::wait::{self, Deadline, WaitConfig};

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
fn unavailable(e: CudaError) -> CreateErrorKind {
    CreateErrorKind::MemoryUnavailable { reason: super::with_proc_hint(e.to_string()) }
}

/// A pool table entry of a CUDA producer: the slots' own allocation (0) or one registered
/// with [`Producer::register`](crate::Producer::register).
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

/// The producer's CUDA side.
///
/// Invariants: `pools[i]` is what pool table entry `i` names (LIVE, generation 1).
pub struct CudaTx {
    /// The ring's name, for lifecycle events.
    name: String,
    ctx: Arc<Context>,
    uuid: [u8; 16],
    /// Leaked, with `fences`, when a close gives up on freeing them.
    pools: Leakable<Vec<PoolMemory>>,
    /// Distance between slots in pool 0.
    stride: usize,
    fences: Leakable<TxFences>,
    /// How pools are shared: legacy IPC handles, or VMM (the fd server and what it offers).
    share: TxShare,
    /// Buffers: the ring's capacity plus its spares.
    buffers: usize,
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
    /// Allocates the buffers (and, with event fences, their events), and writes the pool
    /// table and buffer lines of a segment nobody sees yet; VMM: starts the fd server first.
    fn build(
        ctx: &Arc<Context>,
        map: &MappedRing,
        slot_size: usize,
        buffers: usize,
        settings: &TxSettings,
    ) -> Result<CudaTx, CudaError> {
        let stride = slot_size.div_ceil(SLOT_ALIGN) * SLOT_ALIGN;
        let uuid = ctx.uuid()?;
        let tables = map.gpu();
        store_uuid(&tables.header.device_uuid, uuid);
        let share = TxShare::start(map, settings)?;
        let pool = share.alloc(ctx, stride * buffers)?;
        let words = words(ctx, settings)?;
        let fences = match TxFences::new(ctx, map, words, buffers) {
            // `Fence::Auto` chose words, which could not be set up (the segment could not be
            // page-locked for the device): events need nothing of the kind.
            Err(e) if words && settings.memory_fence.is_none() && settings.vmm.is_none() => {
                tracing::warn!(ring = %map.segment().name().ring(), error = %e, "memory fences unavailable: fencing with events");
                TxFences::new(ctx, map, false, buffers)?
            }
            made => made?,
        };
        let mut side = CudaTx {
            name: map.segment().name().ring().to_owned(),
            ctx: ctx.clone(),
            uuid,
            pools: Leakable::new(Vec::new()),
            stride,
            fences: Leakable::new(fences),
            share,
            buffers,
            stream: Stream::new(ctx)?,
            unfenced: settings.unfenced,
            linger: DEFAULT_LINGER,
            poll: settings.gpu_poll,
        };
        let registered = |e| match e {
            RegisterError::Cuda(e) => e,
            other => CudaError::Unavailable(format!("registering a pool: {other}")),
        };
        side.add_pool(map, pool).map_err(registered)?;
        let header = &tables.header;
        // Relaxed (both): published by the Release store of `magic`.
        header.sharing.store(side.share.kind(), Ordering::Relaxed);
        header.fence.store(side.fences.kind(), Ordering::Relaxed);
        for line in tables.buffers {
            // Relaxed (both): published by the Release store of `magic`.
            line.pool.store(0, Ordering::Relaxed);
            line.ready_done.store(0, Ordering::Relaxed);
            side.fences.add_buffer(ctx, line)?;
        }
        Ok(side)
    }

    /// Writes `mem` into the next pool table entry, and shares it the ring's way: its IPC
    /// handle in the entry (legacy), or its fd in the server's offer (VMM), before the entry
    /// turns LIVE.
    fn add_pool(&mut self, map: &MappedRing, mem: PoolMemory) -> Result<PoolId, RegisterError> {
        let index = self.pools.len();
        if index >= MAX_POOLS {
            return Err(RegisterError::TableFull);
        }
        let cuda = |e: DriverError| RegisterError::from(e);
        self.share.accepts(&mem)?;
        let _bound = self.ctx.bind().map_err(cuda)?;
        self.share.fits(&self.ctx, &mem)?;
        if !matches!(mem, PoolMemory::OwnedVmm(_)) {
            // SAFETY: a context is current.
            let (base, size) = unsafe { driver::mem_address_range(mem.ptr()) }
                .map_err(|_| RegisterError::OtherDevice)?;
            // Both ways share whole allocations: only the base of one may be registered, and
            // the size we declare must not exceed it. (Our own VMM pools are that by making.)
            if base != mem.ptr() || size < mem.size() {
                return Err(RegisterError::Cuda(CudaError::Unavailable(format!(
                    "{:#x}+{} is not the base of an allocation of at least that size",
                    mem.ptr(),
                    mem.size()
                ))));
            }
        }
        let entry = &map.gpu().pools[index];
        // Relaxed (all): published by the Release store of `state` below.
        entry.size.store(mem.size() as u64, Ordering::Relaxed);
        store_uuid(&entry.device_uuid, self.uuid);
        let generation = entry.generation.fetch_add(1, Ordering::Relaxed) + 1;
        // SAFETY: our context is current (`_bound`); `mem` is our own VMM pool, or the driver
        // said just above that it is the base of a live allocation of it.
        unsafe { self.share.share(&mem, entry, (index, generation), &self.ctx) }?;
        // Release: a consumer that Acquire-loads LIVE sees the fields above (and, VMM, finds
        // the pool in the server's offer, which was replaced before this store).
        entry.state.store(pool_state::LIVE, Ordering::Release);
        self.pools.push(mem);
        Ok(PoolId(index as u32))
    }

    /// The device's context.
    pub(crate) fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    /// The producer's own stream.
    pub(crate) fn stream(&self) -> &Stream {
        &self.stream
    }

    /// How long a closing producer waits for its consumers to leave.
    pub(crate) fn set_linger(&mut self, linger: Duration) {
        self.linger = linger;
    }

    /// "legacy" or "vmm".
    pub(crate) fn sharing_name(&self) -> &'static str {
        self.share.name()
    }

    /// The fence in use: [`Fence::Events`](super::Fence::Events) or
    /// [`Fence::Memory`](super::Fence::Memory), never `Auto`.
    pub(crate) fn fence(&self) -> super::Fence {
        if self.fences.kind() == fence_kind::MEMORY {
            super::Fence::Memory
        } else {
            super::Fence::Events
        }
    }

    /// Registers `pool`, allocated by the user, as the next pool.
    pub(crate) fn register(
        &mut self,
        map: &MappedRing,
        pool: DevicePool,
    ) -> Result<PoolId, RegisterError> {
        self.add_pool(map, PoolMemory::Owned(pool))
    }

    /// Allocates a pool of `bytes` the ring's way (VMM sharing: `cuMemCreate` memory) and
    /// registers it.
    pub(crate) fn alloc_pool(
        &mut self,
        map: &MappedRing,
        bytes: usize,
    ) -> Result<PoolId, RegisterError> {
        let pool = self.share.alloc(&self.ctx, bytes)?;
        self.add_pool(map, pool)
    }

    /// Registers `size` bytes at `ptr`, memory the caller owns, as the next pool.
    ///
    /// # Safety
    /// As `Producer::register_raw`: `ptr` is the base of a dedicated allocation of at least
    /// `size` bytes on the ring's device, made the ring's sharing way, which stays allocated
    /// (and mapped) until the producer has dropped.
    pub(crate) unsafe fn register_raw(
        &mut self,
        map: &MappedRing,
        ptr: CUdeviceptr,
        size: usize,
    ) -> Result<PoolId, RegisterError> {
        self.add_pool(map, PoolMemory::Borrowed { ptr, size })
    }

    /// Device address and size of pool `id`, if it is one of ours.
    pub(crate) fn pool(&self, id: PoolId) -> Option<(CUdeviceptr, usize)> {
        let p = self.pools.get(id.0 as usize)?;
        Some((p.ptr(), p.size()))
    }

    /// Drops our imports of entry `entry`'s release events (event fences): the producer is
    /// about to free the entry (its consumer retired, died or was evicted), after which its
    /// owner may destroy them.
    fn forget_reader(&mut self, entry: usize, generation: u32) {
        self.fences.forget(&self.name, entry, generation, self.buffers);
    }

    /// Whether every buffer's last write is done.
    fn all_written(&self, map: &MappedRing) -> bool {
        self.fences.all_written(map, self.buffers)
    }
}

/// Whether the fences are memory words: with `Fence::Memory`, always with VMM sharing, and with
/// `Fence::Auto` where `ctx`'s device can use 64-bit stream memory operations.
fn words(ctx: &Context, settings: &TxSettings) -> Result<bool, DriverError> {
    match (settings.vmm.is_some(), settings.memory_fence) {
        (true, _) | (false, Some(true)) => Ok(true),
        (false, Some(false)) => Ok(false),
        (false, None) => driver::can_use_64_bit_stream_mem_ops(driver::device(ctx.ordinal())?),
    }
}

/// Refuses settings this build cannot honour, before the segment exists: VMM sharing needs a
/// device that shares `cuMemCreate` memory by fd; memory fences (`Fence::Memory`, and always
/// with VMM) need 64-bit stream memory operations.
fn check_settings(ctx: &Context, settings: &TxSettings) -> Result<(), CreateErrorKind> {
    let vmm = settings.vmm.is_some();
    let words = words(ctx, settings).map_err(|e| unavailable(e.into()))?;
    let lack = lacks(ctx.ordinal(), vmm, words);
    if let Some(lack) = lack.map_err(|e| unavailable(e.into()))? {
        let what = if vmm { "Sharing::Vmm" } else { "Fence::Memory" };
        return Err(CreateErrorKind::MemoryUnavailable {
            reason: format!("{what} needs {lack}, which this device does not support"),
        });
    }
    Ok(())
}

impl ProducerSide for CudaTx {
    type Stream = Stream;

    /// The device's context.
    type Prepared = Arc<Context>;

    fn prepare(settings: &TxSettings) -> Result<Arc<Context>, CreateErrorKind> {
        let ctx = Context::new(settings.device).map_err(unavailable)?;
        check_settings(&ctx, settings)?;
        Ok(ctx)
    }

    fn create(
        ctx: Arc<Context>,
        settings: &TxSettings,
        map: &MappedRing,
    ) -> Result<Self, CreateErrorKind> {
        let params = map.params();
        let (slot_size, buffers) = (params.slot_size as usize, params.buffers() as usize);
        CudaTx::build(&ctx, map, slot_size, buffers, settings).map_err(unavailable)
    }

    fn spin(&self) -> Duration {
        self.poll
    }

    /// Whether buffer `slot`'s previous message, published with its ready fence, is written on
    /// the GPU. Waiting for it bounds how far the CPU runs ahead of the GPU to one lap of the
    /// ring; without it, a producer faster than the GPU fills the driver's launch queue and
    /// latency grows to tens of milliseconds.
    fn written(&mut self, map: &MappedRing, slot: usize) -> Result<bool, Fault> {
        self.fences.written(map, slot, &self.stream)
    }

    /// Whether every active consumer that read message `prev` in slot `slot` (its release line
    /// says so) has finished reading it on its GPU: its release fence for the slot is done
    /// (events: its release event completed; memory words: its release word reached
    /// `prev + 1`). A consumer whose event cannot be opened or queried is named for eviction
    /// (the failure is its entry's alone), its imports dropped.
    fn readers_done(&mut self, map: &MappedRing, slot: usize, prev: u64) -> Result<Readers, Fault> {
        if self.unfenced {
            return Ok(Readers::Done);
        }
        let mut busy = false;
        for e in 0..map.ring().consumers.len() {
            // Acquire: pairs with the consumer's Release CAS to ACTIVE, after it wrote its
            // release lines.
            let seen = map.ring().consumers[e].lease.load(Ordering::Acquire);
            if lease::state(seen) != lease::ACTIVE {
                continue;
            }
            let line = &map.gpu().releases_of(e)[slot];
            // Acquire: pairs with the consumer's Release store made after it queued its
            // release fence for `prev`.
            if line.released.load(Ordering::Acquire) != prev + 1 {
                continue;
            }
            let ring = (self.name.as_str(), self.buffers);
            match self.fences.reader_done(&self.ctx, map, (e, seen), (slot, prev), ring)? {
                Readers::Done => {}
                Readers::Busy => busy = true,
                evict @ Readers::Evict { .. } => return Ok(evict),
            }
        }
        Ok(if busy { Readers::Busy } else { Readers::Done })
    }

    fn forget(&mut self, entry: usize, generation: u32) {
        self.forget_reader(entry, generation);
    }

    fn publish(
        &mut self,
        map: &MappedRing,
        slot: usize,
        seq: u64,
        at: Option<(u32, u64)>,
        stream: Option<&Stream>,
    ) -> Result<(), PublishError> {
        let (pool, offset) = at.unwrap_or((0, (slot * self.stride) as u64));
        let stream = stream.unwrap_or(&self.stream);
        let tables = map.gpu();
        self.fences.record_ready(&self.ctx, &tables.buffers[slot], (slot, seq), stream)?;
        // Relaxed: only this producer writes pool entries.
        let generation = tables.pools[pool as usize].generation.load(Ordering::Relaxed);
        let line = &tables.buffers[slot];
        // Relaxed: published by the Release stamp store in `publish_claimed`.
        line.pool.store(pool, Ordering::Relaxed);
        line.pool_generation.store(generation, Ordering::Relaxed);
        line.offset.store(offset, Ordering::Relaxed);
        Ok(())
    }

    fn buffer_addr(&self, _: &MappedRing, slot: usize) -> u64 {
        self.pools[0].ptr() + (slot * self.stride) as u64
    }

    /// Consumers map our memory while they drain: a closing producer gives them this long.
    fn linger(&self) -> Option<Duration> {
        Some(self.linger)
    }

    /// Waits for our own writes, drops our imports of consumers' events, stops serving fds, and
    /// frees the device memory, unless someone may still use it: then it is left to process
    /// exit. (VMM: a consumer's import keeps the memory alive by itself, so only our own
    /// unfinished writes keep it.)
    fn close(&mut self, map: &MappedRing, all_left: bool) -> Closed {
        // Our own writes must end before the memory is freed. Poll rather than synchronize: a
        // wedged GPU must not hang the process here.
        let config = WaitConfig { spin: Duration::ZERO, tick: Duration::from_millis(10) };
        let written = wait::wait_until(None, config, Deadline::after(WRITES_PATIENCE), |_| {
            self.all_written(map).then_some(())
        })
        .is_some();
        // Whoever is still there may destroy its events once we are gone: close our imports
        // of them first, always.
        for e in 0..map.params().max_consumers as usize {
            self.forget_reader(e, 0);
        }
        // VMM: stop serving fds; an import already made keeps its memory alive without us.
        let vmm = self.share.close();
        // A lost context (ours, or as the process knows it: another device's) closes as a dead
        // producer would, leaving everything to process exit: its consumers take it for dead.
        let lost = crate::context_lost().is_some();
        if lost || !written || (!all_left && !vmm) {
            tracing::warn!(
                ring = %self.name, all_left, written,
                "consumers may still use the ring's device memory: leaving it to process exit"
            );
            // Someone may still map the memory or wait on our events, or our GPU work may still
            // write it (or the segment's words): freeing it now could corrupt a reader. Leave
            // it to process exit (the producer stays alive to consumers until then).
            self.pools.leak();
            self.fences.leak();
            return Closed::Kept;
        }
        self.pools.clear();
        tracing::debug!(target: "gpuring::lifecycle", ring = %self.name, "producer pools freed");
        // The fences go when the producer drops, while the segment is still mapped.
        Closed::Freed
    }
}
