//! The producer's side of a CUDA ring ([`CudaTx`]): its device memory and pools, the ready
//! fences it records, and its answers to the producer (written, readers done, close).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use std::os::fd::OwnedFd;

use super::words::SegmentWords;
use super::{lacks, Leakable};
use crate::cuda::driver::{self, CUdeviceptr};
use crate::cuda::{
    export_raw_fd, Context, CudaError, DevicePool, DriverError, IpcEvent, Stream, VmmPool,
};
use crate::error::{CreateErrorKind, Fault, PublishError, RegisterError};
use crate::format::gpu::{
    fence_kind, pool_state, release_bank, released_by, sharing_kind, store_uuid, MAX_POOLS,
};
use crate::format::offer::{encode, OfferedPool};
use crate::memory::{Closed, ProducerSide, Readers, TxSettings};
use crate::ring::lease::{self, evict_reason};
use crate::shm::fdpass::{FdServer, PeerPolicy};
use crate::shm::unixsock::fd_file;
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
    /// A legacy pool (`cuMemAlloc`), shared by IPC handle.
    Owned(DevicePool),
    /// A VMM pool (`cuMemCreate`), shared by fd.
    OwnedVmm(VmmPool),
    /// Registered by `register_raw`; its owner keeps it alive (the caller's promise).
    Borrowed { ptr: CUdeviceptr, size: usize },
}

impl PoolMemory {
    fn ptr(&self) -> CUdeviceptr {
        match self {
            PoolMemory::Owned(p) => p.ptr(),
            PoolMemory::OwnedVmm(p) => p.ptr(),
            PoolMemory::Borrowed { ptr, .. } => *ptr,
        }
    }

    fn size(&self) -> usize {
        match self {
            PoolMemory::Owned(p) => p.size(),
            PoolMemory::OwnedVmm(p) => p.size(),
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

/// How the producer's buffers are fenced: the segment's `fence`.
enum TxFences {
    Events(EventsTx),
    Words(WordsTx),
}

/// Interprocess events (legacy sharing with `Fence::Events`).
///
/// Invariants: `ready[i]` is buffer `i`'s ready event, whose handle is in the buffer's line.
struct EventsTx {
    ready: Vec<IpcEvent>,
    /// Per consumer table entry and buffer, the release event we opened (`buffers` per entry).
    /// Dropped before the entry is freed (`forget_reader`): a consumer destroys the events it
    /// exported only once its entry is freed, or never (see docs/gpu.md, "Leaving").
    readers: Vec<Option<ReaderEvent>>,
}

/// Sequence words in the segment (VMM sharing, or legacy with `Fence::Memory`): no IPC event,
/// so nothing of another process is opened, and they work wherever the segment's file is
/// shared (containers with a private /dev/shm included).
///
/// Invariants: `published[b]` is `seq + 1` of the last message published in buffer `b` (0:
/// none), what its `ready_done` word reaches once the message's writes are done.
struct WordsTx {
    /// The segment, page-locked for our device: where the GPU writes the ready words.
    words: SegmentWords,
    published: Vec<u64>,
}

impl WordsTx {
    /// Page-locks the segment for `ctx`'s device.
    fn new(ctx: &Arc<Context>, map: &MappedRing) -> Result<WordsTx, CudaError> {
        let words = SegmentWords::register(ctx, map)?;
        Ok(WordsTx { words, published: vec![0; map.buffer_count()] })
    }

    /// Whether buffer `b`'s last published message is written (its ready word reached).
    fn written(&self, map: &MappedRing, b: usize) -> bool {
        // Acquire: the GPU wrote the word after the message's writes; reusing the buffer
        // comes after.
        map.gpu().buffers[b].ready_done.load(Ordering::Acquire) >= self.published[b]
    }
}

/// VMM sharing: pools handed out by fd.
///
/// Invariants: `offered[i]` describes `fds[i]`, one per pool table entry we filled, and the
/// server offers exactly these.
struct VmmTx {
    /// The fd server; `None` once the producer closed (a closed ring takes no new consumer).
    server: Option<FdServer>,
    fds: Vec<OwnedFd>,
    offered: Vec<OfferedPool>,
    epoch: u64,
}

impl VmmTx {
    /// Starts serving ring instance `map`'s pools (none yet) to the peers `policy` admits.
    /// Runs before the segment is published, so every consumer that sees it finds the server
    /// listening.
    fn start(map: &MappedRing, policy: PeerPolicy) -> Result<VmmTx, CudaError> {
        let epoch = map.params().epoch;
        let name = map.segment().name().ring();
        let (dir, mode) = (map.segment().dir(), map.segment().mode());
        let payload = encode(epoch, &[]);
        let served = FdServer::start(dir, &fd_file(name, epoch), mode, Vec::new(), payload, policy);
        let server = served.map_err(|e| {
            CudaError::Unavailable(format!("cannot serve the ring's memory by fd: {e}"))
        })?;
        Ok(VmmTx { server: Some(server), fds: Vec::new(), offered: Vec::new(), epoch })
    }

    /// Adds pool `pool` (its fd, entry, generation and size) to what the server offers.
    fn offer(&mut self, fd: OwnedFd, pool: OfferedPool) -> Result<(), CudaError> {
        let failed = |e: std::io::Error| CudaError::Unavailable(format!("offering a pool: {e}"));
        let mut fds = Vec::with_capacity(self.fds.len() + 1);
        for f in self.fds.iter().chain(std::iter::once(&fd)) {
            fds.push(f.try_clone().map_err(failed)?);
        }
        let mut offered = self.offered.clone();
        offered.push(pool);
        let Some(server) = &self.server else {
            return Err(CudaError::Unavailable("the producer is closed".into()));
        };
        server.set_offer(fds, encode(self.epoch, &offered)).map_err(failed)?;
        self.fds.push(fd);
        self.offered = offered;
        Ok(())
    }
}

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
    /// VMM sharing: the fd server and what it offers; `None`: legacy IPC handles.
    vmm: Option<VmmTx>,
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
        let (vmm, pool, sharing) = match &settings.vmm {
            None => {
                let pool = PoolMemory::Owned(DevicePool::new(ctx, stride * buffers)?);
                (None, pool, sharing_kind::LEGACY)
            }
            Some(policy) => {
                let vmm = VmmTx::start(map, policy.clone())?;
                let pool = PoolMemory::OwnedVmm(VmmPool::new(ctx, stride * buffers)?);
                (Some(vmm), pool, sharing_kind::VMM)
            }
        };
        let (fences, fence) = if settings.words() {
            (TxFences::Words(WordsTx::new(ctx, map)?), fence_kind::MEMORY)
        } else {
            let readers = map.params().max_consumers as usize * buffers;
            let ready = Vec::with_capacity(buffers);
            let events = EventsTx { ready, readers: (0..readers).map(|_| None).collect() };
            (TxFences::Events(events), fence_kind::EVENTS)
        };
        let mut side = CudaTx {
            name: map.segment().name().ring().to_owned(),
            ctx: ctx.clone(),
            uuid,
            pools: Leakable::new(Vec::new()),
            stride,
            fences: Leakable::new(fences),
            vmm,
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
        header.sharing.store(sharing, Ordering::Relaxed);
        header.fence.store(fence, Ordering::Relaxed);
        for line in tables.buffers {
            // Relaxed (both): published by the Release store of `magic`.
            line.pool.store(0, Ordering::Relaxed);
            line.ready_done.store(0, Ordering::Relaxed);
            if let TxFences::Events(events) = &mut *side.fences {
                let ev = IpcEvent::new(ctx)?;
                line.ready_event.store(&driver::event_handle_bytes(&ev.ipc_handle()?));
                events.ready.push(ev);
            }
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
        let cuda = |e: DriverError| RegisterError::Cuda(e.into());
        match (&self.vmm, &mem) {
            (None, PoolMemory::OwnedVmm(_)) => {
                return Err(RegisterError::WrongSharing { ring: "legacy" });
            }
            (Some(_), PoolMemory::Owned(_)) => {
                return Err(RegisterError::WrongSharing { ring: "vmm" });
            }
            _ => {}
        }
        let _bound = self.ctx.bind().map_err(cuda)?;
        if let (Some(_), PoolMemory::Borrowed { size, .. }) = (&self.vmm, &mem) {
            // Consumers map the pool's size from offset 0, which the driver allows only in
            // whole granules (ours: the recommended one, a multiple of the minimum).
            let granule = driver::mem_granularity(self.ctx.ordinal()).map_err(cuda)?;
            if size % granule != 0 {
                return Err(RegisterError::Cuda(CudaError::Unavailable(format!(
                    "a VMM pool's size must be a multiple of the device's allocation \
                     granularity ({granule} bytes), not {size}"
                ))));
            }
        }
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
        match &mut self.vmm {
            None => {
                // SAFETY: `mem.ptr()` is the base of a live allocation in the current context
                // (checked just above by the driver).
                let handle = unsafe { driver::ipc_get_mem_handle(mem.ptr()) }.map_err(cuda)?;
                entry.handle.store(&driver::mem_handle_bytes(&handle));
            }
            Some(vmm) => {
                let fd = match &mem {
                    PoolMemory::OwnedVmm(pool) => pool.export_fd().map_err(cuda)?,
                    // SAFETY: `mem.ptr()` is a live mapping of this context (checked above);
                    // the export fails for memory that is not a POSIX-fd `cuMemCreate`
                    // allocation.
                    _ => unsafe { export_raw_fd(&self.ctx, mem.ptr()) }
                        .map_err(|_| RegisterError::WrongSharing { ring: "vmm" })?,
                };
                let size = mem.size() as u64;
                vmm.offer(fd, OfferedPool { pool: index as u32, generation, size })?;
            }
        }
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
        match self.vmm {
            None => "legacy",
            Some(_) => "vmm",
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
        let pool = match self.vmm {
            None => PoolMemory::Owned(DevicePool::new(&self.ctx, bytes)?),
            Some(_) => PoolMemory::OwnedVmm(VmmPool::new(&self.ctx, bytes)?),
        };
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
        let TxFences::Events(events) = &mut *self.fences else { return };
        let n = self.buffers;
        let mine = &mut events.readers[entry * n..(entry + 1) * n];
        if mine.iter().any(Option::is_some) {
            mine.iter_mut().for_each(|r| *r = None);
            let ring = &self.name;
            tracing::debug!(target: "gpuring::lifecycle", ring = %ring, entry, generation, "producer imports dropped");
        }
    }

    /// Whether every buffer's last write is done.
    fn all_written(&self, map: &MappedRing) -> bool {
        match &*self.fences {
            TxFences::Events(e) => e.ready.iter().all(|ev| ev.is_complete().unwrap_or(true)),
            TxFences::Words(w) => (0..self.buffers).all(|b| w.written(map, b)),
        }
    }
}

impl EventsTx {
    /// The release event of consumer `entry` (whose lease we saw as `seen`, ACTIVE) for
    /// `slot`, opened once per occupant.
    fn reader_event(
        &mut self,
        ctx: &Arc<Context>,
        map: &MappedRing,
        (entry, seen): (usize, u64),
        (slot, buffers): (usize, usize),
    ) -> Result<&IpcEvent, EventFault> {
        let generation = lease::generation(seen);
        let cached = &mut self.readers[entry * buffers + slot];
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
            let event = IpcEvent::open(ctx, handle).map_err(EventFault::of)?;
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

/// Refuses settings this build cannot honour, before the segment exists: VMM sharing needs a
/// device that shares `cuMemCreate` memory by fd; memory fences (`Fence::Memory`, and always
/// with VMM) need 64-bit stream memory operations.
fn check_settings(ctx: &Context, settings: &TxSettings) -> Result<(), CreateErrorKind> {
    let vmm = settings.vmm.is_some();
    let lack = lacks(ctx.ordinal(), vmm, settings.words());
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
        match &*self.fences {
            TxFences::Events(events) => Ok(events.ready[slot].is_complete()?),
            TxFences::Words(words) if words.written(map, slot) => Ok(true),
            TxFences::Words(_) => {
                // Not yet: unless our context failed (a kernel fault is sticky), after which
                // its GPU writes no word again. A word is no driver call, so ask the driver
                // here, or this wait would never end; the failure ends it as an event query's
                // would.
                match self.stream.is_idle() {
                    Err(e) if e.context_lost() => Err(Fault::Cuda(e.into())),
                    _ => Ok(false),
                }
            }
        }
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
            let events = match &mut *self.fences {
                TxFences::Events(events) => events,
                TxFences::Words(_) => {
                    // Acquire: the consumer's GPU wrote the word after its reads of `prev`;
                    // our rewrite of the buffer comes after.
                    let generation = lease::generation(seen);
                    let word = line.release_done[release_bank(generation)].load(Ordering::Acquire);
                    busy |= !released_by(word, generation, prev);
                    continue;
                }
            };
            let looked = match events.reader_event(&self.ctx, map, (e, seen), (slot, self.buffers))
            {
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
                Err(EventFault::Failed(why)) if events.ready[slot].is_complete().is_err() => {
                    return Err(Fault::Cuda(why));
                }
                Err(EventFault::Failed(why)) => {
                    let generation = lease::generation(seen);
                    tracing::warn!(entry = e, generation, %why, "a consumer's release event failed");
                    self.forget_reader(e, generation);
                    let reason = evict_reason::RELEASE_EVENT;
                    return Ok(Readers::Evict { entry: e, seen, reason });
                }
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
        match &mut *self.fences {
            TxFences::Events(events) => events.ready[slot].record(stream)?,
            TxFences::Words(words) => {
                let word = words.words.device(&tables.buffers[slot].ready_done);
                let _bound = self.ctx.bind()?;
                // SAFETY: the word lies in the segment, page-locked for our device until the
                // producer closes (after its last write is done); the stream is live.
                unsafe { driver::stream_write_value64(stream.raw(), word, seq + 1) }?;
                words.published[slot] = seq + 1;
            }
        }
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
        let vmm = self.vmm.is_some();
        if let Some(v) = &mut self.vmm {
            v.server = None;
        }
        if !written || (!all_left && !vmm) {
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
