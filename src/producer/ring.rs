//! What every producer has, whatever its memory kind: the mapped segment, the ring protocol's
//! state, waiting for a free buffer, and looking after the consumer table.

use std::sync::atomic::{fence, Ordering};
use std::time::{Duration, Instant};

use super::{monotonic_ns, ProducerBuilder};
use crate::doorbells::ProducerBells;
use crate::error::{Corruption, CreateErrorKind, Fault};
use crate::format::header::{CLOSED_CUT, CLOSED_DONE, CLOSED_LOST};
use crate::format::{Layout, MemoryKind, MAGIC};
use crate::ring::layout::{BLOCKED_ON_CONSUMERS, BLOCKED_ON_HELD};
use crate::ring::producer::{wants_wake, Blocked, ClaimError, Claimed, Want};
use crate::ring::{audit, lease, park, ProducerCore, Reaped, Recount, Ring, RingCorrupt};
use crate::shm::clock::{self, Tick};
use crate::shm::view::MappedRing;
use crate::shm::wait::{self, Deadline, WaitConfig};
use crate::shm::waiter::{Waiter, WakeOn};
use crate::shm::{presence, RingDir, Segment, ShmName};

/// The ring's side of a producer. `Producer<M>` (`super`) is this plus memory kind `M`'s side.
pub(crate) struct ProducerRing {
    map: MappedRing,
    core: ProducerCore,
    wait: WaitConfig,
    /// Whether [`ProducerRing::close`] ran.
    closed: bool,
    /// The stream was cut ([`mark_cut`](Self::mark_cut)): the close tells consumers so.
    cut: bool,
    /// The consumer table's (`joins`, `retires`) counts when it was last reaped.
    table_seen: (u64, u64),
    /// When the table was last reaped: it is reaped at least once per liveness interval while
    /// the producer acquires, blocked or not.
    last_reap: Tick,
    /// Its doorbell, and the addresses of parked consumers' doorbells.
    bells: ProducerBells,
}

/// What the memory kind does when the producer frees a consumer table entry (`entry`,
/// `generation`): drop what it opened of it. Called before the entry is freed.
pub(crate) type OnFree<'a> = &'a mut (dyn FnMut(usize, u32) + Send);

/// Reaps `ring`'s consumer table (see [`crate::ring::reclaim`]): dead consumers are taken out,
/// retired entries finished, evicted ones' holds given back. Wakes consumers if it froze buffers.
/// Unless the ring is `closed`, and if the last claim found every candidate held, also audits
/// the held counts of the buffers the next claim may take (`ring::reclaim::audit`), so that a
/// count a damaged segment left too high cannot hold the producer back for ever. Forgets `core`'s cached minimum cursor if anything changed.
fn look_after(
    seg: &Segment,
    ring: &Ring<'_>,
    core: &mut ProducerCore,
    bells: &ProducerBells,
    on_free: OnFree<'_>,
    closed: bool,
) -> Result<Reaped, RingCorrupt> {
    // Closed: nothing is published any more, and a recount's freeze could make a draining
    // consumer take a published message for none (`ring::reclaim`).
    let recount = if closed { Recount::No } else { Recount::Yes };
    // The owner of an entry holds that entry's liveness lock (`shm::presence`), in whatever
    // pid namespace it runs.
    let owner_alive = |entry: usize, _pid: u32| seg.held(presence::consumer(entry));
    let r = crate::ring::reap(
        ring,
        owner_alive,
        |entry, generation| {
            tracing::debug!(target: "gpuring::lifecycle", entry, generation, "entry freed");
            // Relaxed: the entry is FINISHING and ours; its owner wrote the token before it
            // first parked, ordered by the reap's Acquire load of the lease.
            bells.forget(entry, ring.consumers[entry].bell.load(Ordering::Relaxed));
            on_free(entry, generation)
        },
        recount,
    )?;
    if r.dead > 0 || r.holds > 0 {
        tracing::info!(dead = r.dead, freed = r.freed, holds = r.holds, "dead consumers reclaimed");
    }
    let mut wake = r.wake_consumers;
    let mut lowered = false;
    // Only while the producer waits for a held buffer: an audit freezes each held buffer for a
    // moment, which a running producer has no reason to do.
    if !closed && core.waits_on_held() {
        let candidates: Vec<usize> = core.candidates(ring).collect();
        for buffer in candidates {
            let (l, w) = audit(ring, buffer)?;
            (lowered, wake) = (lowered || l, wake || w);
        }
    }
    if wake {
        wake_consumers(ring, bells);
    }
    if r.dead > 0 || r.freed > 0 || r.holds > 0 || lowered {
        core.forget_min_cursor();
    }
    // Once per look (a liveness tick at least), the gate's next refresh scans the whole table:
    // a damaged segment that hid a gating entry from one scan hides it for a tick at most.
    core.rescan_table();
    Ok(r)
}

/// Wakes the consumers that sleep (futex) or are parked (doorbells); `wants_wake` said yes.
fn wake_consumers(ring: &Ring<'_>, bells: &ProducerBells) {
    wait::wake_all(ring.consumer_wake);
    if park::has_parked(ring.consumer_wake) {
        bells.ring_parked(ring);
    }
}

/// Whether the consumer table's (`joins`, `retires`) counts moved since `seen`, which is
/// brought up to date: a consumer joined or retired, and a reap should look at it.
fn table_moved(ring: &Ring<'_>, seen: &mut (u64, u64)) -> bool {
    let line = ring.producer;
    // Acquire: pairs with the consumers' Release bumps, made after their lease CASes, so a
    // reap that follows a moved count sees the entry that moved it.
    let now = (line.joins.load(Ordering::Acquire), line.retires.load(Ordering::Acquire));
    std::mem::replace(seen, now) != now
}

/// A claim's wait, accounted in the producer's line for readers of the segment (`gpuring
/// stat`, the exporter): the time goes into `blocked_ns` as it passes (each liveness tick and
/// at the end), so the counter never goes back and a stall shows while it happens.
///
/// A stall is one run of waits: `blocked_since` is set by its first wait and kept across
/// waits that time out (a caller looping on `acquire_timeout`, as Python's `send` and the
/// GStreamer sink do), and cleared by a successful claim or the close. `blocked_seen` says
/// when a waiter last accounted, so that readers stop showing a stall nobody waits in any
/// more (a caller that gave up, a dropped async wait).
struct Stall<'r, 'a> {
    ring: &'r Ring<'a>,
    /// Up to when the time is accounted.
    accounted: Instant,
}

impl<'r, 'a> Stall<'r, 'a> {
    /// Starts accounting a wait; a new stall unless the previous wait's is still recent.
    fn begin(ring: &'r Ring<'a>) -> Self {
        let now = monotonic_ns().max(1);
        let line = ring.producer;
        // Relaxed (all the marks): statistics, written only by the producer.
        let seen = line.blocked_seen.load(Ordering::Relaxed);
        if line.blocked_since.load(Ordering::Relaxed) == 0
            || now.saturating_sub(seen) > STALL_GAP_NS
        {
            line.blocked_since.store(now, Ordering::Relaxed);
        }
        line.blocked_seen.store(now, Ordering::Relaxed);
        Stall { ring, accounted: Instant::now() }
    }

    /// Adds the time since the last accounting to `blocked_ns`.
    fn account(&mut self) {
        let now = Instant::now();
        let ns = (now - std::mem::replace(&mut self.accounted, now)).as_nanos() as u64;
        let line = self.ring.producer;
        let total = line.blocked_ns.load(Ordering::Relaxed);
        line.blocked_ns.store(total.saturating_add(ns), Ordering::Relaxed);
        line.blocked_seen.store(monotonic_ns().max(1), Ordering::Relaxed);
    }

    /// Ends the wait (accounted by the drop); the stall is over if it got a buffer (or an
    /// error).
    fn end(self, got: bool) {
        if got {
            clear_stall(self.ring);
        }
    }
}

impl Drop for Stall<'_, '_> {
    /// Every wait's end, a dropped one's included (an async claim cancelled): its time counts.
    fn drop(&mut self) {
        self.account();
    }
}

/// The stall is over: no wait marks.
fn clear_stall(ring: &Ring<'_>) {
    // Relaxed: statistics, written only by the producer.
    ring.producer.blocked_since.store(0, Ordering::Relaxed);
    ring.producer.blocked_on.store(0, Ordering::Relaxed);
}

/// Waits whose accountings are further apart than this are separate stalls.
const STALL_GAP_NS: u64 = 1_000_000_000;

impl ProducerRing {
    /// Creates the segment for `memory` as `b` says, lets `init` fill in the memory kind's
    /// tables, then publishes the header. If `init` fails, the segment is removed again.
    pub(crate) fn build<P, T>(
        b: &ProducerBuilder,
        memory: MemoryKind,
        prepare: impl FnOnce() -> Result<P, CreateErrorKind>,
        init: impl FnOnce(P, &MappedRing) -> Result<T, CreateErrorKind>,
    ) -> Result<(ProducerRing, T), CreateErrorKind> {
        let name = ShmName::new(&b.name).map_err(CreateErrorKind::InvalidName)?;
        let params = b.params(memory)?;
        let dir = RingDir::open(b.ring_dir()).map_err(CreateErrorKind::Io)?;
        match dir.check() {
            Ok(concerns) => {
                for c in concerns {
                    tracing::warn!(dir = %dir.path().display(), "ring directory: {c}");
                }
            }
            Err(e) => tracing::debug!(error = %e, "cannot check the ring directory"),
        }
        // Once the settings are known to be good, and before the segment exists.
        let prepared = prepare()?;
        let layout = Layout::of(&params);
        // Replaces a dead producer's segment of this name, if there is one.
        let seg = crate::shm::stale::create(&dir, &name, layout.total, b.mode)?;
        // Build everything, then publish the header with `magic` last.
        params.write(seg.header(), layout.total as u64);
        let map = MappedRing::new(seg, params, layout);
        // Published by the Release store of `magic` below.
        crate::ring::initialize(&map.ring());
        let core = ProducerCore::new(&map.ring());
        // Dropped on failure below: that marks it closed and unlinks the name.
        let ring = ProducerRing {
            map,
            core,
            wait: WaitConfig { spin: b.spin, tick: b.liveness },
            closed: false,
            cut: false,
            table_seen: (0, 0),
            last_reap: Tick::now(),
            bells: ProducerBells::bind(&dir, &b.name, params.epoch, b.mode, params.max_consumers),
        };
        let extra = init(prepared, &ring.map)?;
        // Release: a consumer that Acquire-loads the magic sees the whole built segment.
        ring.map.header().magic.store(MAGIC, Ordering::Release);
        tracing::info!(
            ring = %b.name, ?memory, capacity = params.capacity, spares = params.spares,
            slot_size = params.slot_size,
            policy = ?ring.map.policy(), epoch = params.epoch, "ring created"
        );
        Ok((ring, extra))
    }

    /// The ring's name.
    pub(crate) fn name(&self) -> &str {
        self.map.segment().name().ring()
    }

    /// The mapped segment.
    pub(crate) fn map(&self) -> &MappedRing {
        &self.map
    }

    /// Keeps the producer's liveness lock until the process exits (`Segment::
    /// keep_presence_until_exit`): for a close that leaves device memory to process exit.
    pub(crate) fn keep_presence_until_exit(&mut self) {
        self.map.segment_mut().keep_presence_until_exit();
    }

    /// How waiting is configured.
    pub(crate) fn wait_config(&self) -> WaitConfig {
        self.wait
    }

    /// The buffer of the message one lap before the next, once there is one (see
    /// `ProducerCore::lapped_buffer`).
    pub(crate) fn lapped_buffer(&self) -> Option<usize> {
        self.core.lapped_buffer(&self.map.ring())
    }

    /// See `ProducerCore::declare_lost`.
    pub(crate) fn declare_lost(&mut self, n: u64) {
        self.core.declare_lost(n);
    }

    /// Messages published so far = sequence number of the next one.
    pub(crate) fn published(&self) -> u64 {
        self.core.next_seq()
    }

    /// A claim's first try, which never waits (most claims end here): refuses a truncated
    /// segment; looks after the consumer table when it changed (a consumer joined or retired: a
    /// retiring one waits for us) or a liveness interval has passed, so that dead consumers are
    /// noticed while the producer runs, not only when it is blocked; then tries to claim a
    /// buffer for the next message. `None`: none is free; [`claim_wait`](Self::claim_wait) goes
    /// on. `on_free` is told of each entry a reap frees.
    pub(crate) fn claim_now(
        &mut self,
        want: Want,
        on_free: OnFree<'_>,
    ) -> Option<Result<Claimed, Fault>> {
        if self.map.segment().faulted() {
            return Some(Err(Fault::Corrupt(Corruption::Truncated)));
        }
        if table_moved(&self.map.ring(), &mut self.table_seen)
            || clock::due(self.last_reap.elapsed(), self.wait.tick)
        {
            if let Err(c) = self.reap_with(on_free) {
                return Some(Err(c.into()));
            }
        }
        claim(&mut self.core, &self.map.ring(), want)
    }

    /// After a [`claim_now`](Self::claim_now) that found no buffer free: waits for one as `how`
    /// says, on the producer's wake line (blocking) or doorbell (async), which a consumer's
    /// release (or retire) knocks on, looking after the consumer table at each liveness tick.
    pub(crate) async fn claim_wait(
        &mut self,
        how: Waiter,
        want: Want,
        on_free: OnFree<'_>,
    ) -> Result<Claimed, Fault> {
        if how.gives_up_now() {
            return Err(Fault::Blocked);
        }
        // At the start too: a loop of short waits may never reach a tick.
        if let Some(lost) = crate::context_lost() {
            return Err(Fault::ContextLost(lost));
        }
        let ProducerRing { map, core, wait, last_reap, table_seen, bells, closed, .. } = self;
        let (ring, bells) = (map.ring(), &*bells);
        // Dropped with the future if an async claim is cancelled: its time counts all the same.
        // A lend's wait is not the producer's: the stream goes on meanwhile.
        let mut stall = (want != Want::Loan).then(|| Stall::begin(&ring));
        let wake = WakeOn { line: ring.producer_wake, bell: bells.own() };
        let claimed = how
            .wait(Some(wake), *wait, |tick| {
                if tick {
                    if let Some(stall) = stall.as_mut() {
                        stall.account();
                    }
                    // A producer blocked on its consumers makes no GPU call: it must still
                    // learn that its context was lost (see `crate::context_lost`).
                    if let Some(l) = crate::context_lost() {
                        return Some(Err(Fault::ContextLost(l)));
                    }
                }
                let look = (tick || table_moved(&ring, table_seen)).then_some(&mut *last_reap);
                claim_step(map.segment(), &ring, (core, want), look, bells, on_free, *closed)
            })
            .await
            .unwrap_or(Err(Fault::Blocked));
        if let Some(stall) = stall {
            stall.end(!matches!(claimed, Err(Fault::Blocked)));
        }
        claimed
    }

    /// Reaps the consumer table and audits the next claim's buffers (`look_after`), telling the memory
    /// kind about each entry it frees.
    pub(crate) fn reap_with(&mut self, on_free: OnFree<'_>) -> Result<Reaped, Corruption> {
        self.last_reap = Tick::now();
        let ProducerRing { map, core, bells, closed, .. } = self;
        Ok(look_after(map.segment(), &map.ring(), core, bells, on_free, *closed)?)
    }

    /// Evicts the consumer of entry `entry`, whose lease was seen as `seen`, for `reason` (a
    /// `ring::lease::evict_reason`): a failure the producer met was attributable to that entry
    /// alone, so that consumer goes and the others are served on. Returns whether it evicted.
    pub(crate) fn evict(&mut self, entry: usize, seen: u64, reason: u32) -> bool {
        let ring = self.map.ring();
        let evicted = crate::ring::evict(&ring, entry, seen, reason);
        if evicted {
            let why = crate::ring::lease::evict_reason::describe(reason);
            let pid = crate::ring::lease::pid(seen);
            tracing::warn!(ring = %self.name(), entry, pid, "consumer evicted: {why}");
            self.core.forget_min_cursor();
        }
        evicted
    }

    /// Writes `header` into claimed buffer `buffer`'s user header and publishes message `len`
    /// as `seq`, the next sequence number. The caller checked `len` and `header` against what
    /// the message may hold.
    pub(crate) fn publish_claimed(&mut self, buffer: usize, seq: u64, len: u64, header: &[u8]) {
        let map = &self.map;
        let max = map.user_header_size();
        debug_assert!(header.len() <= max, "the caller checks the header's length");
        let dst = map.user_header(buffer);
        // SAFETY: the buffer is claimed by us, so no correct peer touches its user header; the
        // region is `max` bytes long and header.len() <= max.
        unsafe {
            std::ptr::copy_nonoverlapping(header.as_ptr(), dst, header.len());
            std::ptr::write_bytes(dst.add(header.len()), 0, max - header.len());
        }
        let ring = map.ring();
        let (published, wake) = self.core.publish(&ring, len, monotonic_ns());
        debug_assert_eq!(published, seq);
        if wake {
            wake_consumers(&ring, &self.bells);
        }
    }

    /// Whether a claim of the next message is in progress (its slot was dropped unpublished).
    pub(crate) fn is_claimed(&self) -> bool {
        self.core.is_claimed()
    }

    /// Whether buffer `buffer` is lent out and not yet published (`ProducerCore::is_lent`).
    pub(crate) fn is_lent(&self, buffer: usize) -> bool {
        self.core.is_lent(buffer)
    }

    /// Whether a lend could ever succeed without a loan ending first: some spare is neither
    /// lent nor kept (`ProducerCore::may_lend`).
    pub(crate) fn may_lend(&self) -> bool {
        self.core.may_lend()
    }

    /// Takes back lent buffer `buffer` unpublished (`ProducerCore::give_back`).
    pub(crate) fn give_back(&mut self, buffer: usize, written: bool) {
        self.core.give_back(&self.map.ring(), buffer, written);
    }

    /// Ends the loan of published buffer `buffer` (`ProducerCore::end_kept`).
    pub(crate) fn end_kept(&mut self, buffer: usize) {
        self.core.end_kept(buffer);
    }

    /// Makes the close say the stream was cut (`Ended::Died` for consumers).
    pub(crate) fn mark_cut(&mut self) {
        self.cut = true;
    }

    /// Marks the ring closed, wakes the consumers and removes the name. Idempotent.
    pub(crate) fn close(&mut self) {
        if std::mem::replace(&mut self.closed, true) {
            return;
        }
        tracing::info!(ring = %self.name(), published = self.published(), "ring closed");
        let ring = self.map.ring();
        clear_stall(&ring);
        // A panic unwinding through the producer cuts the stream as `abort` does; a lost GPU
        // context cuts it too, and says so.
        let lost = crate::context_lost().is_some();
        let how = match () {
            _ if lost => CLOSED_LOST,
            _ if self.cut || std::thread::panicking() => CLOSED_CUT,
            _ => CLOSED_DONE,
        };
        // Release: consumers that see `closed` (Acquire) see every publish before it.
        self.map.header().closed.store(how, Ordering::Release);
        if wants_wake(ring.consumer_wake) {
            wake_consumers(&ring, &self.bells);
        }
        // A ring closed by a lost context keeps its name until a restarted producer replaces
        // it (its producer is dead by then), so that `gpuring stat` and the exporter show why
        // it stopped; one that was never published (its build failed) does not.
        // Relaxed: our own store.
        let published = self.map.header().magic.load(Ordering::Relaxed) == MAGIC;
        if lost && published {
            tracing::warn!(ring = %self.name(), "ring closed: this process's GPU context is lost");
        } else {
            self.map.segment().unlink();
        }
    }

    /// After the close, for a memory kind whose consumers map memory of ours: waits up to
    /// `linger` for every consumer to leave, reaping every tick meanwhile (retiring consumers
    /// are let go, `on_free` first; dead ones reclaimed). Returns whether all left.
    pub(crate) fn linger(&mut self, linger: Duration, on_free: OnFree<'_>) -> bool {
        // SeqCst, against the fence a joining consumer makes between claiming its entry and
        // loading `closed`: either it sees `closed` (and gives up) or `consumers_gone` below
        // sees its entry taken (and waits for it).
        fence(Ordering::SeqCst);
        let config = WaitConfig { tick: Duration::from_millis(10), ..self.wait };
        wait::wait_until(None, config, Deadline::after(linger), |tick| {
            if tick {
                let _ = self.reap_with(on_free);
            }
            consumers_gone(self.map.segment(), &self.map.ring()).then_some(())
        })
        .is_some()
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
        lease::state(l) == lease::FREE || !seg.held(presence::consumer(index))
    })
}

/// One step of a claim's wait: if `look` (the liveness tick, or a table that moved), look after
/// the consumer table first and note when in `look`; then try to take a buffer for `want`.
fn claim_step(
    seg: &Segment,
    ring: &Ring<'_>,
    (core, want): (&mut ProducerCore, Want),
    look: Option<&mut Tick>,
    bells: &ProducerBells,
    on_free: OnFree<'_>,
    closed: bool,
) -> Option<Result<Claimed, Fault>> {
    if let Some(last_reap) = look {
        *last_reap = Tick::now();
        if let Err(c) = look_after(seg, ring, core, bells, on_free, closed) {
            return Some(Err(Fault::Corrupt(c.into())));
        }
    }
    match core.try_take(ring, want) {
        Ok(claimed) => Some(Ok(claimed)),
        Err(ClaimError::Blocked(_)) if want == Want::Loan => None,
        Err(ClaimError::Blocked(why)) => {
            let on = match why {
                Blocked::Consumers => BLOCKED_ON_CONSUMERS,
                Blocked::Held => BLOCKED_ON_HELD,
            };
            // Relaxed: a statistic (see `start_blocked`); stored only when it changes.
            if ring.producer.blocked_on.load(Ordering::Relaxed) != on {
                ring.producer.blocked_on.store(on, Ordering::Relaxed);
            }
            None
        }
        Err(ClaimError::Corrupt(c)) => Some(Err(Fault::Corrupt(c.into()))),
    }
}

/// One try at taking a buffer for what `want` says: `None` while none is free (or, for an
/// adoption, while the gate is shut).
fn claim(core: &mut ProducerCore, ring: &Ring<'_>, want: Want) -> Option<Result<Claimed, Fault>> {
    match core.try_take(ring, want) {
        Ok(claimed) => Some(Ok(claimed)),
        Err(ClaimError::Blocked(_)) => None,
        Err(ClaimError::Corrupt(c)) => Some(Err(Fault::Corrupt(c.into()))),
    }
}

impl Drop for ProducerRing {
    fn drop(&mut self) {
        self.close();
    }
}
