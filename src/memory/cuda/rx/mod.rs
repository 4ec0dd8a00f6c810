//! The consumer's side of a CUDA ring ([`CudaRx`]): what it opens of the producer's (pools,
//! ready fences), its release fences, and its answers to the consumer (place, release, leave).
//!
//! Two choices of the segment shape it, each made of two halves with the same methods:
//! how pools are mapped (`gpu.sharing`, [`RxShare`]: `legacy` IPC handles from the pool
//! table, or `vmm` fds fetched from the producer's server), and how our GPU work is ordered
//! against the producer's (`gpu.fence`, [`RxFences`]: interprocess `events`, or memory `words`
//! in the segment; VMM always uses words).
//! `share` and `fences` hold the two enums, whose methods call the same method of the half
//! they hold (`legacy` or `vmm`; `events` or `words`): `CudaRx` reads as one path.

mod events;
mod fences;
mod legacy;
mod share;
mod vmm;
mod words;

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use self::fences::RxFences;
use self::legacy::LegacyRx;
use self::share::{OpenPool, RxShare};
use self::vmm::VmmRx;
use super::placement::{place, Driver, Placement};
use super::{lacks, Leakable};
use crate::cuda::driver::{self, CUdeviceptr, DriverError};
use crate::cuda::{Context, CudaError, Stream};
use crate::error::{Corruption, Fault, OpenErrorKind};
use crate::format::gpu::{
    check_descriptor, fence_kind, load_uuid, pool_state, release_bank, release_value, sharing_kind,
    KnownPool, MAX_POOLS,
};
use crate::format::Params;
use crate::memory::{ConsumerSide, Member, Quiesced, RxSettings};
use crate::ring::Pinned;
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
            OpenFault::Cuda(e) => e.into(),
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

/// Largest pool a consumer accepts from a pool table (1 TiB, as for slot sizes).
const MAX_POOL_SIZE: u64 = Params::MAX_SLOT_SIZE;

/// How long a dropped consumer waits for its own GPU work to finish while the producer lives,
/// before it leaves everything to process exit (its stream may wait on a fence the producer's
/// failed context will never write).
const IDLE_PATIENCE: Duration = Duration::from_secs(30);

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
    /// How pools come: as fds from the producer's server (VMM), or from IPC handles.
    share: RxShare,
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
        self.share.name()
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
        member: Member,
        settings: &RxSettings,
    ) -> Result<CudaRx, OpenErrorKind> {
        let tables = map.gpu();
        let bad = |field, value| OpenErrorKind::Corrupt(Corruption::Field { field, value });
        // Relaxed (both): written before `magic`, which the open acquired.
        let (share, vmm) = match tables.header.sharing.load(Ordering::Relaxed) {
            sharing_kind::LEGACY => (RxShare::Legacy(LegacyRx), false),
            sharing_kind::VMM => (RxShare::Vmm(VmmRx), true),
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
            // What would fit instead: event fences need nothing of the device, VMM does.
            let instead = if vmm {
                ""
            } else {
                ", or have the producer fence with events (Fence::Events, `--fence events`)"
            };
            return Err(OpenErrorKind::MemoryUnavailable {
                reason: format!(
                    "this ring needs {lack}, which device {} does not support; read on device \
                     {}{instead}",
                    placed.own, placed.ring
                ),
            });
        }
        share.refuse(map, words)?;
        let ctx = Context::new(placed.own).map_err(cuda_err)?;
        let fences = RxFences::join(&ctx, map, member, words)?;
        let side = CudaRx {
            stream: Stream::new(&ctx).map_err(cuda_err)?,
            fences: Leakable::new(fences),
            share,
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
        self.share.open_pools(&self.ctx, self.placed.ring, pools, map, wanted)
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
        let queued = self.fences.record_release(&self.ctx, stream, m.buffer, (word, value));
        if queued.is_err() {
            // Without the fence the producer could overwrite what our stream still reads: wait
            // here instead (an error path, not the steady state). If even that fails the
            // context is broken and nothing of ours reads any more; the slot is released all
            // the same, or it would stay held for ever. Memory words: the CPU writes the word
            // the GPU could not (Release: after the wait), once the reads are over: the wait
            // succeeded, or it failed, and a context that cannot even synchronize runs nothing
            // more (its errors are sticky), as a failed event record lets the producer go on.
            let _ = stream.synchronize();
            self.fences.release_by_cpu(word, value);
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
        self.fences.quiesce()
    }

    /// Our release events go once the producer let go of them (`let_go`); if it did not in
    /// time, or the entry was no longer ours, they stay until exit, in case it still has them
    /// open.
    fn retired(&mut self, _: &MappedRing, Member { entry, generation }: Member, let_go: bool) {
        if let_go {
            self.fences.retired();
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
    /// A ready word at `PRODUCER_DIED` (`words`) means the producer died before it wrote the
    /// message (a leaving consumer set it, see `wait_idle`): `Disconnected`, not a frame.
    fn order_after_write(
        &self,
        map: &MappedRing,
        m: &Pinned,
        stream: &Stream,
    ) -> Result<(), Fault> {
        self.fences.order_after_write(map, m, self.poll, &self.ctx, stream)
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
        let idle = || {
            let stream_idle = match self.stream.is_idle() {
                Ok(idle) => idle,
                // Any other failure with event fences: as before, taken for idle (their
                // records complete or fail with the context). With words: look again.
                Err(e) if !e.context_lost() => self.fences.idle_if_query_failed(),
                Err(_) => {
                    // Our context failed (errors are sticky): none of its work runs any more,
                    // including release writes it had queued. Write them from the CPU, as
                    // `release` does when it cannot queue one, or the producer would wait for
                    // them until we exit. (Event fences: their records complete or fail with
                    // the context; nothing to write.)
                    self.fences.context_lost(lines, generation);
                    true
                }
            };
            stream_idle && self.fences.released(lines, generation)
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
            if gone || unblocked {
                // Memory fences: our streams may wait on ready words the dead producer's GPU
                // will never write. They are host memory we map: raise the ones below what we
                // waited for to PRODUCER_DIED, so that the waits end (what they then read is
                // unfinished, but we are leaving: nothing of ours uses it, and the memory stays
                // valid, our imports hold it). Another consumer that has not yet placed such a
                // message gets `Disconnected` for it, not the frame (`order_after_write`).
                // Raised at every look from the first on, in case a late write of the dying
                // context lowers a word again; a second grace follows the first. The segment
                // is the dead instance's: a successor makes a new file. (Event fences: nothing
                // to raise, and `unblock` says false.)
                let words = self.fences.unblock(tables.buffers);
                if words && !unblocked {
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
