//! The consumer's side of a CUDA ring ([`CudaRx`]): what it opens of the producer's (pools,
//! ready fences), its release fences, and its answers to the consumer (place, release, leave).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use std::os::fd::AsFd;

use super::fence::{order_after, Signal};
use super::placement::{place, Driver, Placement};
use super::words::SegmentWords;
use super::{lacks, Leakable};
use crate::cuda::driver::{self, CUdeviceptr, CUresult, DriverError};
use crate::cuda::{Context, CudaError, IpcEvent, IpcMapping, Stream, VmmImportError, VmmMapping};
use crate::error::{Corruption, Fault, OpenErrorKind};
use crate::format::gpu::{
    check_descriptor, fence_kind, load_uuid, pool_state, release_bank, release_value, released_by,
    sharing_kind, GpuSlotLine, KnownPool, MAX_POOLS,
};
use crate::format::offer::decode;
use crate::format::Params;
use crate::memory::{ConsumerSide, Member, Quiesced, RxSettings};
use crate::ring::Pinned;
use crate::shm::fdpass::{fd_address, fetch_from, FetchError};
use crate::shm::view::MappedRing;
use crate::shm::wait::{self, Deadline, WaitConfig};

/// Why a pool could not be mapped.
enum OpenFault {
    /// Its pool table entry (or the producer's offer of it) is damaged.
    Corrupt(Corruption),
    /// The driver refused.
    Cuda(CudaError),
    /// VMM: the producer's fd server refused us; its reason.
    Refused(String),
    /// VMM: the producer's fd server could not be reached, or answered what no gpuring server
    /// sends.
    Fetch(String),
}

impl OpenFault {
    fn cuda(e: DriverError) -> OpenFault {
        OpenFault::Cuda(e.into())
    }

    /// As an error of `open`: the unreachable server of a producer that closed or died means
    /// `Disconnected` (so that `open_when_ready` waits for its successor).
    fn opening(self, map: &MappedRing) -> OpenErrorKind {
        match self {
            OpenFault::Corrupt(c) => OpenErrorKind::Corrupt(c),
            OpenFault::Cuda(e) => cuda_err(e),
            OpenFault::Refused(reason) => OpenErrorKind::PeerRefused { reason },
            OpenFault::Fetch(_) if producer_gone(map) => OpenErrorKind::Disconnected,
            OpenFault::Fetch(reason) => OpenErrorKind::MemoryUnavailable { reason },
        }
    }

    /// As a fault of `recv` (a pool registered after we joined). Not `Disconnected` even if the
    /// producer is gone: messages in pools we mapped may still be there to receive.
    fn receiving(self) -> Fault {
        match self {
            OpenFault::Corrupt(c) => Fault::Corrupt(c),
            OpenFault::Cuda(e) => Fault::Cuda(e),
            OpenFault::Refused(why) | OpenFault::Fetch(why) => {
                Fault::Cuda(CudaError::Unavailable(format!("mapping a new pool: {why}")))
            }
        }
    }
}

/// Whether the ring's producer closed it or is dead (its liveness lock is free:
/// `shm::presence`).
fn producer_gone(map: &MappedRing) -> bool {
    // Acquire: pairs with the producer's Release store of `closed`.
    map.header().closed.load(Ordering::Acquire) != 0
        || !map.segment().held(crate::shm::presence::PRODUCER)
}

/// VMM: how long a consumer retries an unreachable fd server whose producer still looks alive.
const FETCH_PATIENCE: Duration = Duration::from_secs(2);

/// Memory fences: what a leaving consumer writes into the ready words of a producer that died,
/// so that GPU waits on them end: never a real value (`seq + 1` stays far below it). The
/// memory the waits guard stays mapped: our imports hold it (VMM by design; legacy IPC
/// imports outlive their exporter too, as tests/gpu_peers.rs's kills check).
const PRODUCER_DIED: u64 = u64::MAX;

/// Largest pool a consumer accepts from a pool table (1 TiB, as for slot sizes).
const MAX_POOL_SIZE: u64 = Params::MAX_SLOT_SIZE;

/// How long a dropped consumer waits for its own GPU work to finish while the producer lives,
/// before it leaves everything to process exit (its stream may wait on a fence the producer's
/// failed context will never write).
const IDLE_PATIENCE: Duration = Duration::from_secs(30);

/// A pool's memory as this process maps it.
enum Mapping {
    /// Legacy: opened from its IPC handle.
    Ipc(IpcMapping),
    /// VMM: imported from the fd the producer sent.
    Vmm(VmmMapping),
}

impl Mapping {
    fn ptr(&self) -> CUdeviceptr {
        match self {
            Mapping::Ipc(m) => m.ptr(),
            Mapping::Vmm(m) => m.ptr(),
        }
    }
}

/// A pool this consumer mapped.
struct OpenPool {
    known: KnownPool,
    mapping: Mapping,
}

/// How the consumer's GPU work is ordered against the producer's: the segment's `fence`.
enum RxFences {
    Events(EventsRx),
    Words(WordsRx),
}

/// Memory word fences: the segment, page-locked for our device, and what we waited for.
///
/// Invariants: `awaited[b]` is the highest `seq + 1` this consumer made a stream wait for (or
/// polled) in buffer `b`'s ready word, 0 for none: the only words a dead producer's waits of
/// ours can hang on.
struct WordsRx {
    words: SegmentWords,
    awaited: Vec<AtomicU64>,
}

impl WordsRx {
    /// Raises the ready words of a dead producer that are still below what we waited for (the
    /// messages it published but died before writing) to [`PRODUCER_DIED`], so that our GPU
    /// waits on them end. Words of messages it finished are left alone: other consumers still
    /// receive those frames.
    fn unblock(&self, lines: &[GpuSlotLine]) {
        for (line, awaited) in lines.iter().zip(&self.awaited) {
            // Relaxed (all): nothing is published with these; GPUs poll the word over PCIe.
            let want = awaited.load(Ordering::Relaxed);
            let seen = line.ready_done.load(Ordering::Relaxed);
            if want != 0 && seen < want {
                // From the value seen only: a late write of the dying context that completed
                // the message meanwhile wins.
                let _ = line.ready_done.compare_exchange(
                    seen,
                    PRODUCER_DIED,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                );
            }
        }
    }
}

/// Interprocess event fences.
///
/// Invariants: `ready[i]` is buffer `i`'s ready event, opened from the segment; `release[i]`
/// is our release event for buffer `i`, whose handle is in our release line `i`.
struct EventsRx {
    release: Vec<IpcEvent>,
    ready: Vec<IpcEvent>,
}

/// The consumer's CUDA state.
///
/// Invariants: each `pools[p]` maps pool table entry `p` in generation `known.generation`, and
/// its mapping is at least `known.size` bytes. Field order is drop order: the stream before the
/// fences and mappings.
pub struct CudaRx {
    stream: Stream,
    /// Leaked, with `pools`, when our GPU work never finished, or (release events) when the
    /// producer may still have them open.
    fences: Leakable<RxFences>,
    /// VMM sharing: pools come as fds from the producer's server; else from IPC handles.
    vmm: bool,
    /// The mapped pools. Locked only to look a pool up or put one in: never while one is
    /// mapped, so threads sharing the consumer read mapped pools while another thread maps a
    /// new one (a VMM map waits on the producer's fd server).
    pools: Leakable<Mutex<Vec<Option<OpenPool>>>>,
    /// Held while a pool registered after we joined is mapped, so that each is mapped once.
    opening: Mutex<()>,
    /// On `placed.own`'s device.
    ctx: Arc<Context>,
    /// The device we read on and the one the ring's memory is on (the same, or a peer).
    placed: Placement,
    /// How long to poll a ready fence before a GPU-side wait.
    poll: Duration,
}

impl CudaRx {
    /// The context we read in.
    pub(crate) fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    /// Our own stream.
    pub(crate) fn stream(&self) -> &Stream {
        &self.stream
    }

    /// The device the ring's memory is on, as this process numbers devices.
    pub(crate) fn memory_device(&self) -> i32 {
        self.placed.ring
    }

    /// "legacy" or "vmm".
    pub(crate) fn sharing_name(&self) -> &'static str {
        if self.vmm {
            "vmm"
        } else {
            "legacy"
        }
    }
}

fn cuda_err(e: impl Into<CudaError>) -> OpenErrorKind {
    OpenErrorKind::MemoryUnavailable { reason: e.into().to_string() }
}

impl CudaRx {
    /// Sets up consumer table entry `entry` (claimed, not active yet): picks the device, sets
    /// up the ring's fences (events: creates and publishes our release events, opens the ready
    /// events; memory words: page-locks the segment, clears our release words) and maps the
    /// live pools the ring's way.
    fn join(
        map: &MappedRing,
        Member { entry, generation }: Member,
        settings: &RxSettings,
    ) -> Result<CudaRx, OpenErrorKind> {
        let tables = map.gpu();
        let bad = |field, value| OpenErrorKind::Corrupt(Corruption::Field { field, value });
        // Relaxed (both): written before `magic`, which the open acquired.
        let vmm = match tables.header.sharing.load(Ordering::Relaxed) {
            sharing_kind::LEGACY => false,
            sharing_kind::VMM => true,
            other => return Err(bad("gpu.sharing", other as u64)),
        };
        // Relaxed: written before `magic`, which the open acquired.
        let words = match tables.header.fence.load(Ordering::Relaxed) {
            fence_kind::MEMORY => true,
            fence_kind::EVENTS if !vmm => false,
            other => return Err(bad("gpu.fence", other as u64)),
        };
        let placed = place(settings.device, load_uuid(&tables.header.device_uuid), &Driver)?;
        // The producer's device has what the ring needs; the one we read on may be another.
        if let Some(lack) = lacks(placed.own, vmm, words).map_err(cuda_err)? {
            return Err(OpenErrorKind::MemoryUnavailable {
                reason: format!(
                    "this ring needs {lack}, which device {} does not support; read on device {}",
                    placed.own, placed.ring
                ),
            });
        }
        if let Some(reason) = (!vmm).then(|| legacy_refusal(map.params(), words)).flatten() {
            return Err(OpenErrorKind::MemoryUnavailable { reason });
        }
        if !vmm && made_here(map.params()) {
            // The driver would refuse with CUDA_ERROR_INVALID_CONTEXT: say why instead.
            return Err(OpenErrorKind::MemoryUnavailable {
                reason: "CUDA IPC handles cannot be opened in the process that made them: \
                         consume a legacy-sharing CUDA ring from another process than its \
                         producer's, or create it with Sharing::Vmm"
                    .into(),
            });
        }
        let ctx = Context::new(placed.own).map_err(cuda_err)?;
        let fences = if words {
            let words = SegmentWords::register(&ctx, map).map_err(cuda_err)?;
            for line in tables.releases_of(entry) {
                // Relaxed (both): published by the Release store of the generation below.
                line.release_done[release_bank(generation)].store(0, Ordering::Relaxed);
                line.released.store(0, Ordering::Relaxed);
                // Release: a producer that Acquire-loads this generation sees the words above.
                line.generation.store(generation, Ordering::Release);
            }
            let awaited = (0..tables.buffer_count).map(|_| AtomicU64::new(0)).collect();
            RxFences::Words(WordsRx { words, awaited })
        } else {
            RxFences::Events(EventsRx::join(&ctx, map, entry, generation)?)
        };
        let side = CudaRx {
            stream: Stream::new(&ctx).map_err(cuda_err)?,
            fences: Leakable::new(fences),
            vmm,
            pools: Leakable::new(Mutex::new((0..MAX_POOLS).map(|_| None).collect())),
            opening: Mutex::new(()),
            ctx,
            placed,
            poll: settings.gpu_poll,
        };
        side.open_pools(&mut side.pools(), map, None).map_err(|e| e.opening(map))?;
        Ok(side)
    }

    /// Checks pool table entry `p`: live (else `None`), of a sane size, on the ring's device.
    fn check_entry(map: &MappedRing, p: usize) -> Result<Option<KnownPool>, OpenFault> {
        let entry = &map.gpu().pools[p];
        let bad = |field, value| OpenFault::Corrupt(Corruption::Field { field, value });
        // Acquire: pairs with the producer's Release store of LIVE.
        if entry.state.load(Ordering::Acquire) != pool_state::LIVE {
            return Ok(None);
        }
        // Relaxed: written before LIVE, which we acquired.
        let generation = entry.generation.load(Ordering::Relaxed);
        let size = entry.size.load(Ordering::Relaxed);
        if size == 0 || size > MAX_POOL_SIZE {
            return Err(bad("pool.size", size));
        }
        if load_uuid(&entry.device_uuid) != load_uuid(&map.gpu().header.device_uuid) {
            return Err(bad("pool.device_uuid", p as u64));
        }
        Ok(Some(KnownPool { generation, size }))
    }

    /// Maps the live pools we have not mapped yet (`only`: just that one), the ring's way:
    /// legacy, from each entry's IPC handle; VMM, from the fds of one fetch from the
    /// producer's server, each checked against the pool table and imported on our device.
    fn open_pools(
        &self,
        pools: &mut [Option<OpenPool>],
        map: &MappedRing,
        only: Option<usize>,
    ) -> Result<(), OpenFault> {
        let wanted = |pools: &[Option<OpenPool>], p: usize| {
            only.is_none_or(|o| o == p) && pools[p].is_none()
        };
        let bad = |field, value| OpenFault::Corrupt(Corruption::Field { field, value });
        match self.vmm {
            false => {
                for p in 0..MAX_POOLS {
                    if !wanted(pools, p) {
                        continue;
                    }
                    let Some(known) = CudaRx::check_entry(map, p)? else { continue };
                    let handle = driver::mem_handle_from_bytes(&map.gpu().pools[p].handle.load());
                    let size = known.size as usize;
                    let mapping =
                        IpcMapping::open(&self.ctx, handle, size).map_err(OpenFault::cuda)?;
                    if mapping.mapped_size().map_err(OpenFault::cuda)? < size {
                        return Err(bad("pool.size", known.size));
                    }
                    pools[p] = Some(OpenPool { known, mapping: Mapping::Ipc(mapping) });
                }
            }
            true => {
                let epoch = map.params().epoch;
                let addr = fd_address(map.segment().dir(), map.segment().name().ring(), epoch)
                    .map_err(|e| OpenFault::Fetch(e.to_string()))?;
                let owner = map.segment().owner();
                // A killed producer's socket closes before the kernel reports the process gone
                // (while its device files are torn down): look again for a while, so that the
                // open ends as `Disconnected` rather than `MemoryUnavailable`.
                let deadline = Instant::now() + FETCH_PATIENCE;
                let fetched = loop {
                    match fetch_from(&addr, owner) {
                        Err(FetchError::Unreachable(_))
                            if Instant::now() < deadline && !producer_gone(map) =>
                        {
                            std::thread::sleep(Duration::from_millis(10));
                        }
                        other => break other,
                    }
                };
                let (payload, fds) = fetched.map_err(|e| match e {
                    FetchError::Refused(why) => OpenFault::Refused(why),
                    other => OpenFault::Fetch(other.to_string()),
                })?;
                let offered = decode(&payload, fds.len(), epoch).map_err(|why| {
                    OpenFault::Fetch(format!("the producer's fd server sent a bad offer: {why}"))
                })?;
                // Every fd we do not map is closed when `fds` drops.
                for (offer, fd) in offered.iter().zip(&fds) {
                    let p = offer.pool as usize;
                    if !wanted(pools, p) {
                        continue;
                    }
                    // An offered pool not LIVE yet is mapped when a message first names it.
                    let Some(known) = CudaRx::check_entry(map, p)? else { continue };
                    if known.generation != offer.generation {
                        return Err(bad("offer.generation", offer.generation as u64));
                    }
                    if known.size != offer.size {
                        return Err(bad("offer.size", offer.size));
                    }
                    let mapping = VmmMapping::import(&self.ctx, fd.as_fd(), known.size as usize)
                        .map_err(|e| match e {
                            VmmImportError::OtherDevice { found } => {
                                bad("pool.device", found.map_or(u64::MAX, |d| d as u64))
                            }
                            VmmImportError::Size(_) => bad("pool.size", known.size),
                            VmmImportError::Driver(e) => OpenFault::cuda(e),
                        })?;
                    // Peer access lets us map other GPUs' memory too: the pool must be on the
                    // ring's, as its table entry says.
                    if mapping.device() != self.placed.ring {
                        return Err(bad("pool.device", mapping.device() as u64));
                    }
                    pools[p] = Some(OpenPool { known, mapping: Mapping::Vmm(mapping) });
                }
            }
        }
        Ok(())
    }

    /// The mapped pools, locked. The lock guards only the table: a panic while it was held
    /// leaves each entry mapped or not, both valid.
    fn pools(&self) -> MutexGuard<'_, Vec<Option<OpenPool>>> {
        self.pools.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Maps pool `p`, registered after we joined, unless another thread did meanwhile; with the
    /// table unlocked while it maps.
    fn map_new_pool(&self, map: &MappedRing, p: usize) -> Result<(), Fault> {
        let _one_at_a_time = self.opening.lock().unwrap_or_else(PoisonError::into_inner);
        if self.pools()[p].is_some() {
            return Ok(()); // another thread mapped it while we waited
        }
        let mut fresh: Vec<Option<OpenPool>> = (0..MAX_POOLS).map(|_| None).collect();
        self.open_pools(&mut fresh, map, Some(p)).map_err(OpenFault::receiving)?;
        // Only this thread puts pools in after the join (under `opening`): the entry is empty.
        self.pools()[p] = fresh[p].take();
        Ok(())
    }

    /// The device address of pinned message `m`, after checking its descriptor. Maps a pool
    /// the producer registered after we joined (once).
    fn locate(&self, map: &MappedRing, m: &Pinned) -> Result<CUdeviceptr, Fault> {
        let line = &map.gpu().buffers[m.buffer];
        // Relaxed: written before the publish stamp store, which our pin acquired.
        let pool = line.pool.load(Ordering::Relaxed);
        let generation = line.pool_generation.load(Ordering::Relaxed);
        let offset = line.offset.load(Ordering::Relaxed);
        let known = |pools: &[Option<OpenPool>]| -> Vec<Option<KnownPool>> {
            pools.iter().map(|o| o.as_ref().map(|o| o.known)).collect()
        };
        let p = pool as usize;
        let mut pools = self.pools();
        if p < MAX_POOLS && pools[p].is_none() {
            drop(pools);
            self.map_new_pool(map, p)?;
            pools = self.pools();
        }
        let d = check_descriptor(pool, generation, offset, m.len, &known(&pools))
            .map_err(Fault::Corrupt)?;
        let base = pools[d.pool].as_ref().expect("checked: mapped").mapping.ptr();
        Ok(base + d.offset)
    }
}

impl EventsRx {
    /// Creates and publishes our release events in entry `entry`'s lines (generation
    /// `generation`), and opens the buffers' ready events.
    fn join(
        ctx: &Arc<Context>,
        map: &MappedRing,
        entry: usize,
        generation: u32,
    ) -> Result<EventsRx, OpenErrorKind> {
        let tables = map.gpu();
        // Our release lines: the producer reads them only once our entry is ACTIVE in this
        // generation, so nobody reads them while we write.
        let mut release = Vec::with_capacity(tables.buffer_count);
        for line in tables.releases_of(entry) {
            let ev = IpcEvent::new(ctx).map_err(cuda_err)?;
            let handle = ev.ipc_handle().map_err(cuda_err)?;
            line.release_event.store(&driver::event_handle_bytes(&handle));
            // Relaxed: published by the Release CAS to ACTIVE when we join.
            line.released.store(0, Ordering::Relaxed);
            // Release: a producer that Acquire-loads this generation sees the handle above.
            line.generation.store(generation, Ordering::Release);
            release.push(ev);
        }
        let ready = tables
            .buffers
            .iter()
            .map(|line| {
                let h = driver::event_handle_from_bytes(&line.ready_event.load());
                IpcEvent::open(ctx, h)
            })
            .collect::<Result<Vec<_>, _>>()
            .map_err(events_err)?;
        Ok(EventsRx { release, ready })
    }
}

/// A failure to open the producer's ready events. The driver opens an interprocess event
/// through a file in the producer's /dev/shm: where this process has another /dev/shm (a
/// container's own, Docker's default), it fails with `CUDA_ERROR_MAP_FAILED`. Said so, with
/// what would work, rather than as a bare driver error.
fn events_err(e: DriverError) -> OpenErrorKind {
    if e.code != CUresult::CUDA_ERROR_MAP_FAILED {
        return cuda_err(e);
    }
    OpenErrorKind::MemoryUnavailable {
        reason: format!(
            "this ring's fences are CUDA interprocess events, which this process cannot open \
             ({e}): the driver opens them through the producer's /dev/shm, and this process \
             does not see it (a container's own /dev/shm?). Share the producer's /dev/shm \
             with every process of the ring, or create the ring with memory fences \
             (Fence::Memory, `--fence memory`) or VMM sharing, which need only the ring \
             directory shared (docs/containers.md)"
        ),
    }
}

/// Why legacy sharing cannot work between us and the ring's producer, if it cannot: said at
/// once, before the driver is asked. Both limits come from the driver's use of process ids,
/// which mean nothing across pid namespaces (containers):
/// - it refuses a memory handle whose exporter has our pid (it takes it for our own), and a
///   container's first process is pid 1 in every container;
/// - it backs an interprocess event with a file in /dev/shm named after its creator's pid, so
///   processes of equal pids in pid namespaces that share a /dev/shm overwrite each other's
///   events: waits end early and frames are read before they are written. Event fences
///   are therefore refused across pid namespaces.
fn legacy_refusal(params: &Params, words: bool) -> Option<String> {
    use crate::shm::ns::{Kind, Namespaces};
    let theirs = Namespaces::from_words(params.producer_ns);
    if !theirs.differ(&Namespaces::current()).contains(&Kind::Pid) {
        return None;
    }
    let pid = std::process::id();
    if params.producer_pid == pid {
        return Some(format!(
            "the producer runs in another pid namespace with the same pid as this process \
             ({pid}; a container's first process is pid 1 in every container), and the CUDA \
             driver refuses legacy IPC handles of a process with our pid: create the ring with \
             VMM sharing, or start one of the two under another pid (docs/containers.md)"
        ));
    }
    (!words).then(|| {
        "this ring's fences are CUDA interprocess events and its producer runs in another pid \
         namespace: the driver names an event's memory in /dev/shm after its creator's pid, so \
         processes of equal pids in other pid namespaces that share a /dev/shm would overwrite \
         each other's events (frames read before they are written). Create the ring with \
         memory fences (Fence::Memory, `--fence memory`) or VMM sharing, or run the producer \
         and its consumers in one pid namespace (docs/containers.md)"
            .to_owned()
    })
}

/// Whether the ring's producer is this very process (its pid, start time and pid namespace
/// are ours). Its pid alone cannot tell: in another pid namespace (another container) the
/// producer may have our number.
fn made_here(params: &Params) -> bool {
    use crate::shm::ns::{Kind, Namespaces};
    let me = crate::shm::process::ProcessId::current();
    let theirs = Namespaces::from_words(params.producer_ns);
    let other_ns = theirs.differ(&Namespaces::current()).contains(&Kind::Pid);
    params.producer_pid == me.pid && params.producer_start_time == me.start_time && !other_ns
}

impl ConsumerSide for CudaRx {
    type Stream = Stream;

    fn join(
        settings: &RxSettings,
        map: &MappedRing,
        member: Member,
    ) -> Result<Self, OpenErrorKind> {
        driver::available().map_err(|why| OpenErrorKind::MemoryUnavailable {
            reason: super::with_proc_hint(format!("CUDA unavailable: {why}")),
        })?;
        CudaRx::join(map, member, settings)
    }

    fn place(&self, map: &MappedRing, m: &Pinned, stream: Option<&Stream>) -> Result<u64, Fault> {
        let ptr = self.locate(map, m)?;
        self.order_after_write(map, m, stream.unwrap_or(&self.stream))?;
        Ok(ptr)
    }

    /// Queues `m`'s release fence on `stream` (events: records our release event; memory
    /// words: writes our release word) and says so in our release line; the caller then
    /// releases the slot. The producer polls that fence before it rewrites the buffer.
    fn release(
        &self,
        map: &MappedRing,
        member: Member,
        m: &Pinned,
        stream: Option<&Stream>,
    ) -> Result<(), Fault> {
        let stream = stream.unwrap_or(&self.stream);
        let line = &map.gpu().releases_of(member.entry)[m.buffer];
        let generation = member.generation;
        let word = &line.release_done[release_bank(generation)];
        let value = release_value(generation, m.seq);
        let queued = match &*self.fences {
            RxFences::Events(events) => events.release[m.buffer].record(stream),
            RxFences::Words(w) => {
                let device = w.words.device(word);
                self.ctx.bind().and_then(|_bound| {
                    // SAFETY: the word lies in the segment, page-locked for our device until
                    // we leave (after this write is done); the stream is live.
                    unsafe { driver::stream_write_value64(stream.raw(), device, value) }
                })
            }
        };
        if queued.is_err() {
            // Without the fence the producer could overwrite what our stream still reads: wait
            // here instead (an error path, not the steady state). If even that fails the
            // context is broken and nothing of ours reads any more; the slot is released all
            // the same, or it would stay held for ever. Memory words: the CPU writes the word
            // the GPU could not (Release: after the wait), once the reads are over: the wait
            // succeeded, or it failed, and a context that cannot even synchronize runs nothing
            // more (its errors are sticky), as a failed event record lets the producer go on.
            let _ = stream.synchronize();
            if matches!(*self.fences, RxFences::Words(_)) {
                word.store(value, Ordering::Release);
            }
        }
        // Release: pairs with the producer's Acquire load; it waits for the fence queued
        // above only when it sees this value.
        line.released.store(m.seq + 1, Ordering::Release);
        Ok(queued?)
    }

    /// The first half of leaving, in the order that keeps every CUDA object valid while someone
    /// uses it (docs/gpu.md, "Leaving"): our GPU work ends; we close what we opened of the
    /// producer (mappings, ready events). Memory words: the producer opened nothing of ours, so
    /// the entry is freed at once. Events: the entry retires, the producer drops its imports of
    /// our release events and frees it, and only then ([`retired`](Self::retired)) may those
    /// events go.
    fn quiesce(
        &mut self,
        map: &MappedRing,
        member: Member,
        wait: WaitConfig,
        producer_alive: &dyn Fn() -> bool,
    ) -> Quiesced {
        if !self.wait_idle(map, member, wait, producer_alive) {
            // Our stream waits on a fence that will never complete (its producer died, or its
            // context failed): nothing it queued may be closed or destroyed under it. Leave it
            // all to process exit.
            let ring = map.segment().name().ring();
            tracing::warn!(ring = %ring, "our GPU work did not finish: leaving it to exit");
            self.pools.leak();
            self.fences.leak();
            // A live producer must not see the entry free, or it would free the memory our
            // unfinished work reads: keep it (stepped aside) until we exit.
            return if producer_alive() { Quiesced::StepAside } else { Quiesced::Free };
        }
        let Member { entry, generation } = member;
        self.pools.get_mut().unwrap_or_else(PoisonError::into_inner).clear();
        tracing::debug!(target: "gpuring::lifecycle", entry, generation, "consumer mappings closed");
        match &mut *self.fences {
            RxFences::Words(_) => Quiesced::Free,
            RxFences::Events(events) => {
                events.ready.clear();
                Quiesced::Retire
            }
        }
    }

    /// Our release events go once the producer let go of them (`let_go`); if it did not in
    /// time, or the entry was no longer ours, they stay until exit, in case it still has them
    /// open.
    fn retired(&mut self, _: &MappedRing, Member { entry, generation }: Member, let_go: bool) {
        if let_go {
            if let RxFences::Events(events) = &mut *self.fences {
                events.release.clear();
            }
            tracing::debug!(target: "gpuring::lifecycle", entry, generation, "consumer release events destroyed");
        } else {
            self.fences.leak();
        }
    }
}

impl CudaRx {
    /// Makes work queued on `stream` from now on run after the producer's writes of `m`:
    /// nothing if they completed (seen within the `gpu_poll` window), else a GPU-side wait on
    /// the ready event, or on the buffer's ready word (memory fences).
    ///
    /// A ready word at [`PRODUCER_DIED`] means the producer died before it wrote the
    /// message (a leaving consumer set it, see `wait_idle`): `Disconnected`, not a frame.
    fn order_after_write(
        &self,
        map: &MappedRing,
        m: &Pinned,
        stream: &Stream,
    ) -> Result<(), Fault> {
        let signal = match &*self.fences {
            RxFences::Events(events) => Signal::Event(&events.ready[m.buffer]),
            RxFences::Words(w) => {
                let cpu = &map.gpu().buffers[m.buffer].ready_done;
                // Relaxed: only compared; the set-by-a-leaver value publishes nothing.
                if cpu.load(Ordering::Relaxed) == PRODUCER_DIED {
                    return Err(Fault::Disconnected);
                }
                // Relaxed: read by our own leave, after our threads are done with us.
                w.awaited[m.buffer].fetch_max(m.seq + 1, Ordering::Relaxed);
                Signal::Word { cpu, device: w.words.device(cpu), value: m.seq + 1 }
            }
        };
        // SAFETY: a ready word lies in the segment we page-locked, which stays so while we
        // live, and the producer writes seq + 1 there after message `seq`.
        unsafe { order_after(signal, self.poll, &self.ctx, stream) }?;
        if let RxFences::Words(_) = &*self.fences {
            // A leaver may have set the word between our look and the poll, which then took
            // PRODUCER_DIED for done: not a frame either.
            // Relaxed: only compared.
            let cpu = &map.gpu().buffers[m.buffer].ready_done;
            if cpu.load(Ordering::Relaxed) == PRODUCER_DIED {
                return Err(Fault::Disconnected);
            }
        }
        Ok(())
    }

    /// Waits until our GPU work is done: the stream and every release fence complete. Polls,
    /// checking the producer's liveness once per liveness interval; false if the producer died
    /// and our work still waits (on a fence of its that will never complete), or if it is not
    /// done after [`IDLE_PATIENCE`] (a producer whose context failed never writes its fences).
    fn wait_idle(
        &self,
        map: &MappedRing,
        Member { entry, generation }: Member,
        config: WaitConfig,
        producer_alive: &dyn Fn() -> bool,
    ) -> bool {
        let tables = map.gpu();
        let lines = tables.releases_of(entry);
        let bank = release_bank(generation);
        let idle = || {
            let stream_idle = match self.stream.is_idle() {
                Ok(idle) => idle,
                // Any other failure with event fences: as before, taken for idle (their
                // records complete or fail with the context). With words: look again.
                Err(e) if !e.context_lost() => matches!(*self.fences, RxFences::Events(_)),
                Err(_) => {
                    // Our context failed (errors are sticky): none of its work runs any more,
                    // including release writes it had queued. Write them from the CPU, as
                    // `release` does when it cannot queue one, or the producer would wait for
                    // them until we exit. (Event fences: their records complete or fail with
                    // the context; nothing to write.)
                    if let RxFences::Words(_) = &*self.fences {
                        for l in lines {
                            // Relaxed: our own store. Release: after our reads, which ended.
                            let released = l.released.load(Ordering::Relaxed);
                            if released != 0 {
                                let value = release_value(generation, released - 1);
                                l.release_done[bank].store(value, Ordering::Release);
                            }
                        }
                    }
                    true
                }
            };
            stream_idle
                && match &*self.fences {
                    RxFences::Events(events) => {
                        events.release.iter().all(|ev| ev.is_complete().unwrap_or(true))
                    }
                    // Acquire: our GPU wrote the word after its reads; the unmapping comes
                    // after. Relaxed: `released` is our own store.
                    RxFences::Words(_) => lines.iter().all(|l| {
                        let released = l.released.load(Ordering::Relaxed);
                        let word = l.release_done[bank].load(Ordering::Acquire);
                        released == 0 || released_by(word, generation, released - 1)
                    }),
                }
        };
        let mut producer_dead_since = None;
        let mut unblocked = false;
        let deadline = Deadline::after(IDLE_PATIENCE);
        wait::wait_until(None, config, deadline, |tick| {
            if idle() {
                return Some(true);
            }
            if tick && producer_dead_since.is_none() && !producer_alive() {
                producer_dead_since = Some(Instant::now());
            }
            // Grace for work that was about to complete when the producer died.
            let gone = producer_dead_since.is_some_and(|t| t.elapsed() > Duration::from_secs(1));
            if let (RxFences::Words(w), true) = (&*self.fences, gone || unblocked) {
                // Memory fences: our streams may wait on ready words the dead producer's GPU
                // will never write. They are host memory we map: raise the ones below what we
                // waited for to PRODUCER_DIED, so that the waits end (what they then read is
                // unfinished, but we are leaving: nothing of ours uses it, and the memory stays
                // valid, our imports hold it). Another consumer that has not yet placed such a
                // message gets `Disconnected` for it, not the frame (`order_after_write`).
                // Raised at every look from the first on, in case a late write of the dying
                // context lowers a word again; a second grace follows the first. The segment
                // is the dead instance's: a successor makes a new file.
                w.unblock(tables.buffers);
                if !unblocked {
                    let ring = map.segment().name().ring();
                    tracing::info!(ring = %ring, "producer dead: its ready words set, to end our waits");
                    (unblocked, producer_dead_since) = (true, Some(Instant::now()));
                    return None;
                }
            }
            gone.then_some(false)
        })
        .unwrap_or(false)
    }
}
