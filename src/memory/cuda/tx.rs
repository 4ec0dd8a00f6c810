//! The producer's side of a CUDA ring ([`CudaTx`]), and what only CUDA producers and their
//! slots have: the context and stream, registered pools, device pointers, `acquire_on`.

use std::sync::atomic::{fence, Ordering};
use std::sync::Arc;
use std::time::Duration;

use std::os::fd::OwnedFd;

use super::words::SegmentWords;
use super::{lacks, same_device, Cuda};
use crate::cuda::driver::{self, CUdeviceptr};
use crate::cuda::{
    export_raw_fd, Context, CudaError, DevicePool, DriverError, IpcEvent, Stream, VmmPool,
};
use crate::error::{
    AcquireError, AcquireTimeoutError, CreateErrorKind, PublishError, RegisterError,
};
use crate::format::gpu::{
    fence_kind, pool_state, release_bank, released_by, sharing_kind, store_uuid, MAX_POOLS,
};
use crate::format::offer::{encode, OfferedPool};
use crate::format::view::MappedRing;
use crate::memory::{Fault, ProducerSide, TxSettings};
use crate::producer::{Producer, ProducerRing, WriteSlot};
use crate::ring::lease::{self, evict_reason};
use crate::ring::Ring;
use crate::shm::fdpass::{FdServer, PeerPolicy};
use crate::shm::unixsock::fd_file;
use crate::shm::Segment;
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
    pools: Vec<PoolMemory>,
    /// Distance between slots in pool 0.
    stride: usize,
    fences: TxFences,
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
            pools: Vec::new(),
            stride,
            fences,
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
            if let TxFences::Events(events) = &mut side.fences {
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

    /// Drops our imports of entry `entry`'s release events (event fences): the producer is
    /// about to free the entry (its consumer retired, died or was evicted), after which its
    /// owner may destroy them.
    fn forget_reader(&mut self, entry: usize, generation: u32) {
        let TxFences::Events(events) = &mut self.fences else { return };
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
        match &self.fences {
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

/// Whether every owned entry of `ring` is gone for a closing producer: free, or owned by a
/// dead process (its entry's liveness lock is free: `shm::presence`). (A retiring entry is
/// freed by the closing producer's reaps.)
fn consumers_gone(seg: &Segment, ring: &Ring<'_>) -> bool {
    ring.consumers.iter().enumerate().all(|(index, e)| {
        // Acquire: pairs with a leaving consumer's Release CAS, made after it closed its
        // mappings of our memory.
        let l = e.lease.load(Ordering::Acquire);
        lease::state(l) == lease::FREE || !seg.held(crate::shm::presence::consumer(index))
    })
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
    fn written(&mut self, ring: &ProducerRing, slot: usize) -> Result<bool, Fault> {
        match &self.fences {
            TxFences::Events(events) => Ok(events.ready[slot].is_complete()?),
            TxFences::Words(words) if words.written(ring.map(), slot) => Ok(true),
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
    /// `prev + 1`). A consumer whose event cannot be opened or queried is evicted (the failure
    /// is its entry's alone) and no longer waited for.
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
            // Acquire: pairs with the consumer's Release store made after it queued its
            // release fence for `prev`.
            if line.released.load(Ordering::Acquire) != prev + 1 {
                continue;
            }
            let events = match &mut self.fences {
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
        let tables = ring.map().gpu();
        let seq = ring.published();
        match &mut self.fences {
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

    fn slot_region(&self, slot: usize) -> (u32, u64) {
        (0, (slot * self.stride) as u64)
    }

    fn slot_addr(&self, _: &ProducerRing, slot: usize) -> u64 {
        self.pools[0].ptr() + (slot * self.stride) as u64
    }

    /// Closes the ring, waits up to the linger time for consumers to leave, and frees the
    /// device memory, unless someone may still use it: then it is left to process exit. (VMM:
    /// a consumer's import keeps the memory alive by itself, so only our own unfinished writes
    /// keep it.)
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
            consumers_gone(ring.map().segment(), &ring.map().ring()).then_some(())
        })
        .is_some();
        // Our own writes must end before the memory is freed. Poll rather than synchronize: a
        // wedged GPU must not hang the process here.
        let written = wait::wait_until(None, config, Deadline::after(WRITES_PATIENCE), |_| {
            self.all_written(ring.map()).then_some(())
        })
        .is_some();
        // Whoever is still there may destroy its events once we are gone: close our imports
        // of them first, always; then let go of every retiring entry.
        let entries = ring.map().params().max_consumers as usize;
        for e in 0..entries {
            self.forget_reader(e, 0);
        }
        let _ = ring.reap_with(&mut |_, _| {});
        // VMM: stop serving fds; an import already made keeps its memory alive without us.
        let vmm = self.vmm.is_some();
        if let Some(v) = &mut self.vmm {
            v.server = None;
        }
        if !written || (!all_left && !vmm) {
            tracing::warn!(
                ring = %ring.name(), all_left, written,
                "consumers may still use the ring's device memory: leaving it to process exit"
            );
            // Someone may still map the memory or wait on our events, or our GPU work may still
            // write it (or the segment's words): freeing it now could corrupt a reader. Leave
            // it to process exit, and stay alive to consumers until then.
            ring.keep_presence_until_exit();
            std::mem::forget(std::mem::take(&mut self.pools));
            let fences = std::mem::replace(&mut self.fences, TxFences::Events(EventsTx::empty()));
            std::mem::forget(fences);
            return;
        }
        drop(std::mem::take(&mut self.pools));
        // Memory fences: unregister the segment now, while it is still mapped.
        drop(std::mem::replace(&mut self.fences, TxFences::Events(EventsTx::empty())));
        tracing::debug!(target: "gpuring::lifecycle", ring = %ring.name(), "producer pools freed");
    }
}

impl EventsTx {
    /// Nothing: what a closed producer's side is left with.
    fn empty() -> EventsTx {
        EventsTx { ready: Vec::new(), readers: Vec::new() }
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
        let (ring, mem) = self.parts();
        mem.add_pool(ring.map(), PoolMemory::Owned(pool))
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
        let (ring, mem) = self.parts();
        let pool = match mem.vmm {
            None => PoolMemory::Owned(DevicePool::new(&mem.ctx, bytes)?),
            Some(_) => PoolMemory::OwnedVmm(VmmPool::new(&mem.ctx, bytes)?),
        };
        mem.add_pool(ring.map(), pool)
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
        match self.mem().vmm {
            None => "legacy",
            Some(_) => "vmm",
        }
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
