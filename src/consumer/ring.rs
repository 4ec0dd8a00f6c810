//! What every consumer has, whatever its memory kind: the mapped segment, its table entry and
//! cursor, waiting for a message, watching the producer, and leaving.

use std::sync::atomic::{fence, AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use super::ConsumerBuilder;
use crate::doorbells::{BellCell, ConsumerBells};
use crate::error::{Corruption, Fault, OpenErrorKind};
use crate::format::header::{CLOSED_DONE, CLOSED_LOST};
use crate::format::{MemoryKind, Params};
use crate::memory::Member;
use crate::ring::{park, ConsumerCore, JoinError, Leave, Left, Pinned, RingCorrupt};
use crate::shm::clock::{self, Tick};
use crate::shm::doorbell::Doorbell;
use crate::shm::ns::Namespaces;
use crate::shm::process::ProcessId;
use crate::shm::view::MappedRing;
use crate::shm::wait::{self, Deadline, WaitConfig};
use crate::shm::{presence, OpenOptions, RingDir, Segment, ShmName};

/// The error of a join whose entry was taken from it before it became active.
fn lost(entry: usize) -> OpenErrorKind {
    let reason = crate::ring::lease::evict_reason::NONE;
    OpenErrorKind::Corrupt(Corruption::Ring(RingCorrupt::Evicted { entry: entry as u32, reason }))
}

/// What receiving and releasing change, behind one lock: the protocol's consumer state is
/// single-threaded (`ConsumerCore` is `!Sync`), and the lock is what lets threads and tasks
/// share one consumer. It is held only for a pin or a release, never across a wait.
struct Receiving {
    core: ConsumerCore,
    /// Damage found while releasing (in `Drop`), reported by the next receive.
    deferred: Option<Corruption>,
}

/// The ring's side of a consumer. `Consumer<M>` (`super`) is this plus memory kind `M`'s side.
///
/// `Sync`: every `&self` method may run on several threads at once (pins and releases take
/// `receiving`; the rest are atomics or read-only).
pub(crate) struct ConsumerRing {
    map: MappedRing,
    receiving: Mutex<Receiving>,
    /// The cursor as of the last pin attempt, read without the lock by a poll deciding whether
    /// to take it (`Ring::may_pin`). Relaxed (every access): a hint that only grows, so a stale
    /// value makes a poll take the lock for nothing, never miss a message.
    next: AtomicU64,
    /// Set, for good, once damage was deferred (`Receiving::deferred`), a pin failed, or a
    /// liveness check found the entry no longer ours (an eviction is reported at every later
    /// receive): from then on every poll takes the lock.
    /// Relaxed (every access): stored under the lock; a poll that reads a stale `false`
    /// reports the damage at its next look (the liveness check's at the latest).
    troubled: AtomicBool,
    /// Copies of the entry's fixed facts, read without the lock.
    index: usize,
    generation: u32,
    mode: crate::ring::Mode,
    /// The producer as the header names it: for display only (its pid is its own pid
    /// namespace's). Its liveness is its lock on the file (`shm::presence`).
    producer: ProcessId,
    /// Set once the producer was found dead; then the consumer drains and disconnects.
    /// Relaxed (every access): a flag this process sets from what the kernel's lock table
    /// says; nothing else is published with it.
    producer_dead: AtomicBool,
    /// When the producer's liveness was last checked, in nanoseconds since `opened`.
    /// Relaxed (every access): it only paces the checks.
    last_check: AtomicU64,
    /// When it opened, on the coarse clock of the liveness ticks.
    opened: Tick,
    wait: WaitConfig,
    /// Whether [`ConsumerRing::leave`] (or `step_aside`) ran.
    left: bool,
    /// How it was opened, for `Consumer::reconnect`.
    builder: ConsumerBuilder,
    /// For ringing the producer's doorbell.
    bells: ConsumerBells,
    /// Its own doorbell, made by the first async wait.
    bell: BellCell,
    /// Whether an outside event loop parked it ([`ConsumerRing::arm`]). Relaxed (every
    /// access): its swaps only pair each park with one unpark; `park` fences by itself.
    armed: AtomicBool,
}

impl ConsumerRing {
    /// Opens ring `b.name` of memory kind `kind`, claims a consumer table entry, lets `setup`
    /// fill in the memory kind's state for it, then joins. If `setup` fails, the entry is freed
    /// again. `closing_frees`: the kind's consumers map memory that a closing producer frees, so
    /// a ring that closed while we claimed the entry is refused (`Disconnected`).
    pub(crate) fn open<T>(
        b: &ConsumerBuilder,
        kind: MemoryKind,
        closing_frees: bool,
        setup: impl FnOnce(&MappedRing, usize, u32) -> Result<T, OpenErrorKind>,
    ) -> Result<(ConsumerRing, T), OpenErrorKind> {
        let name = ShmName::new(&b.name).map_err(OpenErrorKind::InvalidName)?;
        let opts = OpenOptions { allow_foreign_owner: b.allow_foreign_owner };
        let dir = RingDir::open(b.ring_dir()).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => OpenErrorKind::NotFound,
            _ => OpenErrorKind::Io(e),
        })?;
        let seg = Segment::open(&dir, &name, opts)?;
        let (params, layout) = Params::read(seg.header(), seg.len() as u64)?;
        if params.memory_kind != kind {
            return Err(OpenErrorKind::WrongMemory { found: params.memory_kind });
        }
        let map = MappedRing::new(seg, params, layout);
        let producer =
            ProcessId { pid: params.producer_pid, start_time: params.producer_start_time };
        // Acquire: pairs with the producer's Release store of `closed`.
        if map.header().closed.load(Ordering::Acquire) != 0
            || !map.segment().held(presence::PRODUCER)
        {
            return Err(OpenErrorKind::Disconnected);
        }
        let me = ProcessId::current();
        let ring = map.ring();
        let seg = map.segment();
        // The description our liveness locks go on: a ring we cannot lock is not joined, since
        // the producer would take us for dead (`ring::reclaim`).
        seg.open_holder().map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => OpenErrorKind::Disconnected,
            _ => OpenErrorKind::Io(e),
        })?;
        // The entry's lock is ours from before the claim. A lock that fails (out of locks)
        // skips the entry, and the failure is what the open reports if no entry is left.
        let failed = std::cell::RefCell::new(None);
        let hold = |entry| match seg.try_hold(presence::consumer(entry)) {
            Ok(took) => took,
            Err(e) => {
                *failed.borrow_mut() = Some(e);
                false
            }
        };
        let let_go = |entry| seg.release(presence::consumer(entry));
        let joining = ConsumerCore::claim_held(&ring, me.pid, me.start_time, hold, let_go);
        let joining = joining.map_err(|e| match (e, failed.take()) {
            (JoinError::Full, Some(e)) => OpenErrorKind::Io(e),
            (JoinError::Full, None) => {
                OpenErrorKind::TooManyConsumers { max: params.max_consumers }
            }
            (JoinError::Lost, _) => lost(0),
        })?;
        let joining_index = joining.index();
        for (word, value) in
            ring.consumers[joining_index].namespaces.iter().zip(Namespaces::current().to_words())
        {
            // Relaxed: for display; published by the Release CAS to ACTIVE.
            word.store(value, Ordering::Relaxed);
        }
        if closing_frees {
            // Our entry is JOINING. SeqCst, against the fence of a closing producer's linger
            // (`ProducerRing::linger`): either it sees our entry taken (and waits for us before
            // its memory goes), or we see `closed` here (and give up).
            fence(Ordering::SeqCst);
            // Acquire: pairs with the producer's Release store of `closed`.
            if map.header().closed.load(Ordering::Acquire) != 0 {
                joining.abandon(&ring);
                return Err(OpenErrorKind::Disconnected);
            }
        }
        let extra = match setup(&map, joining.index(), joining.generation()) {
            Ok(extra) => extra,
            Err(e) => {
                joining.abandon(&ring);
                return Err(e);
            }
        };
        let mode = b.mode.unwrap_or(map.policy().default_mode());
        let core = joining.activate(&ring, b.start, mode).map_err(|_| lost(joining_index))?;
        tracing::info!(
            ring = %b.name, entry = joining_index, ?kind, ?mode, producer_pid = params.producer_pid,
            "consumer joined"
        );
        let join_wake = core.join_wake();
        let (index, mode) = (core.index(), core.mode());
        let core_generation = core.generation();
        let consumer = ConsumerRing {
            map,
            next: AtomicU64::new(core.next_seq()),
            receiving: Mutex::new(Receiving { core, deferred: None }),
            troubled: AtomicBool::new(false),
            index,
            generation: core_generation,
            mode,
            producer,
            producer_dead: AtomicBool::new(false),
            last_check: AtomicU64::new(0),
            opened: Tick::now(),
            wait: WaitConfig { spin: b.spin, tick: b.liveness },
            left: false,
            builder: b.clone(),
            bells: ConsumerBells::default(),
            bell: BellCell::default(),
            armed: AtomicBool::new(false),
        };
        if join_wake {
            consumer.wake_producer();
        }
        Ok((consumer, extra))
    }

    /// The ring's name.
    pub(crate) fn name(&self) -> &str {
        self.map.segment().name().ring()
    }

    /// The mapped segment.
    pub(crate) fn map(&self) -> &MappedRing {
        &self.map
    }

    /// The producer's process.
    pub(crate) fn producer(&self) -> ProcessId {
        self.producer
    }

    /// The settings it was opened with.
    pub(crate) fn settings(&self) -> &ConsumerBuilder {
        &self.builder
    }

    /// Its delivery mode.
    pub(crate) fn mode(&self) -> crate::ring::Mode {
        self.mode
    }

    /// The receive state, locked. A panic while it was held (none is expected: the protocol
    /// reports damage as errors) leaves it as consistent as the shared entry it mirrors.
    fn receiving(&self) -> MutexGuard<'_, Receiving> {
        self.receiving.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Its consumer table entry.
    #[cfg(feature = "tokio")]
    pub(crate) fn entry(&self) -> usize {
        self.index
    }

    /// Its consumer table entry and the generation it owns it as.
    pub(crate) fn member(&self) -> Member {
        Member { entry: self.index, generation: self.generation }
    }

    /// How waiting is configured.
    pub(crate) fn wait_config(&self) -> WaitConfig {
        self.wait
    }

    /// Pins the next message, waiting until `deadline` on the consumers' wake line.
    pub(crate) fn pin_until(&self, deadline: Deadline) -> Result<Pinned, Fault> {
        let line = self.map.ring().consumer_wake;
        // `poll_once` checks the producer once per liveness interval by itself.
        let pinned = wait::wait_until(Some(line), self.wait, deadline, |_| self.poll_once());
        pinned.unwrap_or(Err(Fault::Blocked))
    }

    /// [`pin_until`](Self::pin_until) without a deadline, awaiting the message (feature
    /// `tokio`): the task parks on its own doorbell, which the producer knocks on after a
    /// publish.
    #[cfg(feature = "tokio")]
    pub(crate) async fn pin_async(&self) -> Result<Pinned, Fault> {
        use crate::shm::wait_async::{wait_async, Wake};
        let ring = self.map.ring();
        let wake = Wake {
            line: ring.consumer_wake,
            flag: Some(&ring.consumers[self.entry()].parked),
            bell: self.doorbell(),
            emptied: Some(self.bell.owed()),
        };
        wait_async(Some(wake), self.wait, |_| self.poll_once()).await
    }

    /// Its doorbell, bound on first use (`None` if none could be bound).
    pub(crate) fn doorbell(&self) -> Option<&Doorbell> {
        let entry = &self.map.ring().consumers[self.index];
        let seg = self.map.segment();
        self.bell.get(seg.dir(), self.name(), self.map.params().epoch, &entry.bell)
    }

    /// Parks it for an outside event loop, once however often it is called: from here on the
    /// producer's publishes and close knock on its doorbell. Binds the doorbell first.
    pub(crate) fn arm(&self) {
        self.doorbell();
        if !self.armed.swap(true, Ordering::Relaxed) {
            let ring = self.map.ring();
            park::park(ring.consumer_wake, Some(&ring.consumers[self.index].parked));
        }
    }

    /// Undoes [`arm`](Self::arm) (if armed) and empties the doorbell.
    pub(crate) fn disarm(&self) {
        if self.armed.swap(false, Ordering::Relaxed) {
            let ring = self.map.ring();
            park::unpark(ring.consumer_wake, Some(&ring.consumers[self.index].parked));
        }
        self.bell.quiet();
    }

    /// How the stream ended, if it did: closed (the producer's clean close, which it makes
    /// before it exits, so it wins over a later death), or died: killed, crashed, or closed
    /// as cut (checked now).
    pub(crate) fn ended(&self) -> Option<crate::Ended> {
        // Liveness first: a producer that closed, then exited, is seen closed by the read
        // below (it closed before it exited), never as dead.
        let alive = !self.producer_dead.load(Ordering::Relaxed) && self.producer_lock_held();
        // Acquire: pairs with the producer's Release store of `closed`.
        match self.map.header().closed.load(Ordering::Acquire) {
            CLOSED_DONE => Some(crate::Ended::Closed),
            CLOSED_LOST => Some(crate::Ended::ContextLost),
            0 if alive => None,
            // Cut (`abort`, a panic), dead, or a value only a damaged segment holds.
            _ => Some(crate::Ended::Died),
        }
    }

    /// Whether the producer closed or died.
    fn closed(&self) -> bool {
        // Acquire: pairs with the producer's Release store, so every message it published
        // before closing is visible to the pin that follows. Loaded first, even when the
        // producer is known dead (`CLOSED_LOST` makes it so while its process lingers).
        self.map.header().closed.load(Ordering::Acquire) != 0
            || self.producer_dead.load(Ordering::Relaxed)
    }

    /// Looks after its link to the producer: the segment's size, the producer's liveness, its
    /// own cursor.
    fn check_producer(&self) {
        self.last_check.store(self.since_opened(), Ordering::Relaxed);
        let refreshed = {
            let mut r = self.receiving();
            if self.map.segment().truncated() {
                r.deferred = Some(Corruption::Truncated);
                self.troubled.store(true, Ordering::Relaxed);
            }
            // An entry no longer ours is told at every receive from here on, messages or not.
            if r.core.check_lease(&self.map.ring()).is_err() {
                // Relaxed: see the field.
                self.troubled.store(true, Ordering::Relaxed);
            }
            // Our cursor in the entry may have been overwritten (a damaged segment): a lower
            // value would hold a Block producer back while we wait for it. Put ours back.
            r.core.refresh_cursor(&self.map.ring())
        };
        // A producer whose GPU context was lost counts as dead from its close on, though its
        // process may linger: its GPU writes nothing any more, so nothing may wait for it.
        // Relaxed: `closed` once set never changes; `closed()` loads it again with Acquire
        // before anything published is read.
        let lost = self.map.header().closed.load(Ordering::Relaxed) == CLOSED_LOST;
        if (lost || !self.producer_lock_held()) && !self.producer_dead.swap(true, Ordering::Relaxed)
        {
            tracing::warn!(ring = %self.name(), pid = self.producer.pid, lost, "producer found dead");
        }
        if refreshed {
            self.wake_producer();
        }
    }

    /// Whether the producer's liveness lock is held (`shm::presence`): it runs.
    fn producer_lock_held(&self) -> bool {
        self.map.segment().held(presence::PRODUCER)
    }

    /// Nanoseconds since it opened.
    fn since_opened(&self) -> u64 {
        Tick::now().nanos_since(self.opened)
    }

    /// Whether the producer still runs (checked now).
    pub(crate) fn producer_alive(&self) -> bool {
        self.check_producer();
        !self.producer_dead.load(Ordering::Relaxed)
    }

    /// One attempt: a message, an error (`Disconnected` included), or `None` (nothing yet).
    /// Something got passes on a wake-up that a wait of ours took from another (`BellCell`).
    fn poll_once(&self) -> Option<Result<Pinned, Fault>> {
        let got = self.look_once();
        if got.is_some() {
            let parked = &self.map.ring().consumers[self.index].parked;
            // Relaxed: after `settle`'s fence.
            self.bell.settle(|| parked.load(Ordering::Relaxed) > 0);
        }
        got
    }

    /// [`poll_once`](Self::poll_once) without the relay.
    fn look_once(&self) -> Option<Result<Pinned, Fault>> {
        let faulted = self.map.segment().faulted();
        let ring = self.map.ring();
        // A look without the lock at whether anything is there (Relaxed: see the fields; a
        // waiter's re-check before it sleeps follows its SeqCst fence, see `Ring::may_pin`).
        let there = !faulted
            && (self.troubled.load(Ordering::Relaxed)
                || ring.may_pin(self.next.load(Ordering::Relaxed)));
        let mut first = None;
        if there {
            match self.pin() {
                Ok(Some(m)) => {
                    if let Err(e) = self.look_after_producer() {
                        self.release(m.buffer);
                        return Some(Err(e));
                    }
                    return Some(Ok(m));
                }
                tried => first = Some(tried),
            }
        }
        let due = match self.look_after_producer() {
            Ok(due) => due,
            Err(e) => return Some(Err(e)),
        };
        if faulted {
            return Some(Err(Fault::Corrupt(Corruption::Truncated)));
        }
        let got = match first {
            Some(Err(c)) => Err(c),
            // Tried already, and the liveness check found nothing new to report.
            Some(tried) if !due => tried,
            // Nothing there, by the look without the lock: no lock is taken, unless a liveness
            // check ran (it may have found us evicted) or the producer closed.
            None if !due && !self.closed() => return None,
            _ => self.pin(),
        };
        match got {
            Ok(Some(m)) => Some(Ok(m)),
            Err(c) => Some(Err(Fault::Corrupt(c))),
            Ok(None) if !self.closed() => None,
            // Closed: anything published before the close is visible now; look once more.
            Ok(None) => match self.pin() {
                Ok(Some(m)) => Some(Ok(m)),
                Ok(None) => {
                    let r = self.receiving();
                    if !r.core.next_is_there(&ring) {
                        // A producer whose context was lost is most often a fault that, under
                        // MPS, reached this process too: if so, that is what it learns.
                        return Some(Err(match crate::context_lost() {
                            Some(l) => Fault::ContextLost(l),
                            None => Fault::Disconnected,
                        }));
                    }
                    // Our next message is there, frozen by a recount (or thawed since): not
                    // "nothing left". Closed or dead, the producer recounts no more, and one
                    // killed mid-recount never thaws it: thaw it, then pin again.
                    crate::ring::thaw(&ring, r.core.next_seq());
                    None
                }
                Err(c) => Some(Err(Fault::Corrupt(c))),
            },
        }
    }

    /// The liveness check ([`check_producer`](Self::check_producer)) if one is due: once per
    /// liveness interval, whatever happens (errors included: a consumer that gets an error at
    /// every call must still learn that the segment was truncated). Returns whether it ran, or
    /// what a receive must report instead of a message: a lost GPU context. A consumer that
    /// only waits makes no other GPU call: it must still learn that its context was lost, and
    /// exit (under MPS a faulted client that lingers keeps every other process from getting a
    /// context).
    fn look_after_producer(&self) -> Result<bool, Fault> {
        let since = self.since_opened().saturating_sub(self.last_check.load(Ordering::Relaxed));
        if !clock::due(Duration::from_nanos(since), self.wait.tick) {
            return Ok(false);
        }
        self.check_producer();
        match crate::context_lost() {
            Some(l) => Err(Fault::ContextLost(l)),
            None => Ok(true),
        }
    }

    /// Damage found earlier (while releasing), then one pin attempt.
    fn pin(&self) -> Result<Option<Pinned>, Corruption> {
        let ring = self.map.ring();
        let (m, wake) = {
            let mut r = self.receiving();
            if let Some(c) = r.deferred.take() {
                return Err(c);
            }
            let pinned = r.core.try_pin(&ring);
            // Relaxed (both): see the fields. `next` is set under the lock: it never goes back.
            self.next.store(r.core.next_seq(), Ordering::Relaxed);
            if pinned.is_err() {
                self.troubled.store(true, Ordering::Relaxed);
            }
            let Some((m, wake)) = pinned? else {
                return Ok(None);
            };
            r.core.write_stats(&ring);
            (m, wake)
        };
        if wake {
            self.wake_producer();
        }
        if m.len > self.map.params().slot_size {
            self.release(m.buffer);
            return Err(Corruption::MessageLength {
                len: m.len,
                slot_size: self.map.params().slot_size,
            });
        }
        Ok(Some(m))
    }

    /// Wakes the producer, sleeping (futex) or parked (its doorbell); `wants_wake` said yes.
    fn wake_producer(&self) {
        let ring = self.map.ring();
        wait::wake_all(ring.producer_wake);
        if park::has_parked(ring.producer_wake) {
            self.bells.knock_producer(
                self.map.segment().dir(),
                self.name(),
                self.map.params().epoch,
            );
        }
    }

    /// Releases pinned slot `slot`.
    pub(crate) fn release(&self, slot: usize) {
        let ring = self.map.ring();
        let released = {
            let mut r = self.receiving();
            let released = r.core.release(&ring, slot);
            r.core.write_stats(&ring);
            if let Err(c) = released {
                r.deferred.get_or_insert(c.into());
                self.troubled.store(true, Ordering::Relaxed);
            }
            released
        };
        if released == Ok(true) {
            self.wake_producer();
        }
    }

    /// Steps aside without leaving (see `ConsumerCore::step_aside`).
    pub(crate) fn step_aside(&mut self) -> bool {
        self.left = true;
        // The entry stays ours until the process exits: so does its liveness lock, or the
        // producer would take us for dead and reclaim what our GPU work still reads.
        self.map.segment_mut().keep_presence_until_exit();
        self.disarm();
        let core = &self.receiving.get_mut().unwrap_or_else(PoisonError::into_inner).core;
        core.step_aside(&self.map.ring())
    }

    /// Leaves the ring: gives back what it still holds (leaked read slots; the caller is done
    /// reading them), then frees or retires its entry (`how`). `None` if it already left.
    pub(crate) fn leave(&mut self, how: Leave) -> Option<Left> {
        if std::mem::replace(&mut self.left, true) {
            return None;
        }
        // An outside event loop's park ends with us: wakers must not ring a freed entry.
        self.disarm();
        let ring = self.map.ring();
        let core = &self.receiving.get_mut().unwrap_or_else(PoisonError::into_inner).core;
        let left = core.leave(&ring, how);
        if left.wake {
            self.wake_producer();
        }
        if left.released > 0 {
            tracing::warn!(ring = %self.name(), slots = left.released, "left holding leaked slots: given back");
        }
        tracing::info!(ring = %self.name(), "consumer left");
        Some(left)
    }
}

impl ConsumerRing {
    /// Leaves by retiring the entry (the producer holds something of ours it must drop first),
    /// then waits until the producer has let go of it, or is closed and gone, or is dead.
    /// Returns whether it let go; if not within [`LEAVE_PATIENCE`], the entry is freed here and
    /// whatever the producer may still hold of ours must stay until the process exits (also
    /// when the entry was not ours any more).
    pub(crate) fn retire(&mut self) -> bool {
        let Some(retiring) = self.leave(Leave::Retire).and_then(|l| l.retiring) else {
            return false;
        };
        let Member { entry, generation } = self.member();
        tracing::debug!(target: "gpuring::lifecycle", entry, generation, "consumer retiring");
        let lines = self.map.ring();
        let mut first = true;
        let let_go = wait::wait_until(None, self.wait, Deadline::after(LEAVE_PATIENCE), |tick| {
            if crate::ring::consumer::retire_done(&lines, entry, retiring) {
                return Some(());
            }
            let look = std::mem::replace(&mut first, false) || tick;
            (look && !self.producer_alive()).then_some(())
        })
        .is_some();
        if !let_go {
            crate::ring::consumer::give_up_retiring(&lines, entry, retiring);
            tracing::info!(
                ring = %self.name(), entry,
                "the producer did not let go of our entry in time: what it holds stays until exit"
            );
        }
        let_go
    }
}

/// How long a retiring consumer waits for the producer to let go of its entry.
const LEAVE_PATIENCE: Duration = Duration::from_millis(500);

impl Drop for ConsumerRing {
    fn drop(&mut self) {
        self.leave(Leave::Free);
    }
}
