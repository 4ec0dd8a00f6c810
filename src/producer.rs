//! The producer: creates a ring, fills slots, publishes them.

use std::ops::{Deref, DerefMut};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::doorbells::ProducerBells;
use crate::error::{
    AcquireError, AcquireTimeoutError, Corruption, CreateError, PublishError, SendError,
    TryAcquireError,
};
use crate::format::view::MappedRing;
use crate::format::{MemoryKind, Params, MAGIC};
use crate::ring::producer::{wants_wake, ClaimError};
use crate::ring::{audit, park, stamp, Policy, ProducerCore, Reaped, Recount, RingCorrupt};
use crate::shm::process::ProcessId;
use crate::shm::ShmName;
use crate::stats::ConsumerInfo;
use crate::wait::{self, WaitConfig};
use crate::Layout;

/// Configures and creates a [`Producer`]. Start from [`Producer::builder`].
///
/// ```
/// use gpuring::{Policy, Producer};
///
/// let tx = Producer::builder("doc-producer-builder")
///     .capacity(4)
///     .policy(Policy::Overwrite)
///     .create()?;
/// assert_eq!(tx.capacity(), 4);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug)]
pub struct ProducerBuilder {
    name: String,
    pub(crate) capacity: u32,
    pub(crate) slot_size: usize,
    user_header_size: u32,
    max_consumers: u32,
    policy: Policy,
    mode: u32,
    spin: Duration,
    liveness: Duration,
    /// Test-only: skip the GPU release-event waits (see `docs/gpu.md`, release-fence test).
    pub(crate) unfenced: bool,
    /// CUDA rings: how long `acquire` polls a reader's release event before a GPU-side wait.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) gpu_poll: Duration,
    /// CUDA rings: use the memory-word fence (`gpu::Fence::Memory`) rather than events.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) memory_fence: bool,
}

impl ProducerBuilder {
    /// Number of slots (messages in flight). Default 8.
    ///
    /// ```
    /// # use gpuring::Producer;
    /// let tx = Producer::builder("doc-producer-builder-capacity").capacity(4).create()?;
    /// assert_eq!(tx.capacity(), 4);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn capacity(mut self, capacity: u32) -> Self {
        self.capacity = capacity;
        self
    }

    /// Largest message, in bytes. Default 64 KiB.
    ///
    /// ```
    /// # use gpuring::Producer;
    /// let tx = Producer::builder("doc-producer-builder-slot-size").slot_size(4096).create()?;
    /// assert_eq!(tx.slot_size(), 4096);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn slot_size(mut self, bytes: usize) -> Self {
        self.slot_size = bytes;
        self
    }

    /// Bytes of user header carried with each message (frame shape, format...). Default 64.
    ///
    /// ```
    /// # use gpuring::Producer;
    /// let tx = Producer::builder("doc-producer-builder-header").user_header_size(16).create()?;
    /// assert_eq!(tx.user_header_size(), 16);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn user_header_size(mut self, bytes: u32) -> Self {
        self.user_header_size = bytes;
        self
    }

    /// Size of the consumer table. Default 64.
    ///
    /// ```
    /// # use gpuring::{Consumer, OpenError, Producer};
    /// let tx = Producer::builder("doc-producer-max-consumers").max_consumers(1).create()?;
    /// let first = Consumer::open("doc-producer-max-consumers")?;
    /// let second = Consumer::open("doc-producer-max-consumers");
    /// assert!(matches!(second, Err(OpenError::TooManyConsumers { max: 1 })));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn max_consumers(mut self, n: u32) -> Self {
        self.max_consumers = n;
        self
    }

    /// What to do when the slowest consumer is a full ring behind. Default [`Policy::Block`].
    ///
    /// ```
    /// # use gpuring::{Policy, Producer};
    /// let tx = Producer::builder("doc-producer-policy-set").policy(Policy::Overwrite).create()?;
    /// assert_eq!(tx.policy(), Policy::Overwrite);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn policy(mut self, policy: Policy) -> Self {
        self.policy = policy;
        self
    }

    /// Permission bits of the segment, applied exactly (no umask). Default `0o600`: only this
    /// user can open the ring.
    ///
    /// ```
    /// # use gpuring::Producer;
    /// # use std::os::unix::fs::PermissionsExt;
    /// // Let this user's group open the ring too.
    /// let tx = Producer::builder("doc-producer-mode").mode(0o660).create()?;
    /// let file = std::fs::metadata("/dev/shm/gpuring.doc-producer-mode")?;
    /// assert_eq!(file.permissions().mode() & 0o777, 0o660);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn mode(mut self, mode: u32) -> Self {
        self.mode = mode;
        self
    }

    /// How long a blocked `acquire` spins and yields before sleeping. Default 50 µs.
    ///
    /// ```
    /// # use gpuring::Producer;
    /// # use std::time::Duration;
    /// // Sleep at once when the ring is full, without spinning first.
    /// let tx = Producer::builder("doc-producer-spin").spin(Duration::ZERO).create()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn spin(mut self, spin: Duration) -> Self {
        self.spin = spin;
        self
    }

    /// How long a waiting `acquire` goes between checks for dead consumers. Default 100 ms.
    ///
    /// ```
    /// # use gpuring::Producer;
    /// # use std::time::Duration;
    /// let tx = Producer::builder("doc-producer-liveness")
    ///     .liveness_interval(Duration::from_millis(20))
    ///     .create()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn liveness_interval(mut self, every: Duration) -> Self {
        self.liveness = every;
        self
    }

    /// Test-only: a CUDA producer that does not wait for consumers' release events before
    /// reusing a slot, to show that the fence test catches torn frames. Never use it.
    ///
    /// ```
    /// # use gpuring::Producer;
    /// // `false` is the default.
    /// let builder = Producer::builder("doc-producer-unfenced").unfenced_for_tests(false);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[doc(hidden)]
    pub fn unfenced_for_tests(mut self, unfenced: bool) -> Self {
        self.unfenced = unfenced;
        self
    }

    fn params(&self, memory: MemoryKind) -> Result<Params, CreateError> {
        let bad = |field, reason| Err(CreateError::InvalidConfig { field, reason });
        if self.capacity == 0 || self.capacity > Params::MAX_CAPACITY {
            return bad("capacity", "must be 1..=65536");
        }
        if self.max_consumers == 0 || self.max_consumers > Params::MAX_CONSUMERS {
            return bad("max_consumers", "must be 1..=4096");
        }
        if self.slot_size == 0 || self.slot_size as u64 > Params::MAX_SLOT_SIZE {
            return bad("slot_size", "must be 1 byte..=1 TiB");
        }
        if self.user_header_size > Params::MAX_USER_HEADER {
            return bad("user_header_size", "must be at most 65536");
        }
        if self.mode & !0o777 != 0 {
            return bad("mode", "only permission bits (0o777) are allowed");
        }
        let me = ProcessId::current();
        let p = Params {
            capacity: self.capacity,
            max_consumers: self.max_consumers,
            slot_size: self.slot_size as u64,
            user_header_size: self.user_header_size,
            policy: self.policy as u32,
            memory_kind: memory,
            producer_pid: me.pid,
            producer_start_time: me.start_time,
            epoch: new_epoch(me),
        };
        let total = Layout::of(&p).total as u64;
        if total > isize::MAX as u64 {
            return bad("slot_size", "capacity x slot_size is too large to map");
        }
        Ok(p)
    }

    /// Creates a host-memory ring (payload in the segment). If a ring with this name exists but
    /// its producer is dead, the stale segment is removed first.
    ///
    /// ```
    /// # use gpuring::{CreateError, MemoryKind, Producer};
    /// let tx = Producer::builder("doc-producer-create").create()?;
    /// assert_eq!(tx.memory(), MemoryKind::Host);
    /// // The name is taken while `tx` lives.
    /// let again = Producer::builder("doc-producer-create").create();
    /// assert!(matches!(again, Err(CreateError::AlreadyExists { .. })));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn create(self) -> Result<Producer, CreateError> {
        Ok(self.build(MemoryKind::Host, |_| Ok(()))?.0)
    }

    /// Creates the segment for `memory`, lets `init` fill in the transport's tables, then
    /// publishes the header. If `init` fails, the segment is removed again.
    pub(crate) fn build<T>(
        self,
        memory: MemoryKind,
        init: impl FnOnce(&MappedRing) -> Result<T, CreateError>,
    ) -> Result<(Producer, T), CreateError> {
        let name = ShmName::new(&self.name).map_err(CreateError::InvalidName)?;
        let params = self.params(memory)?;
        let layout = Layout::of(&params);
        // Replaces a dead producer's segment of this name, if there is one.
        let seg = crate::shm::stale::create(&name, layout.total, self.mode)?;
        // Build everything, then publish the header with `magic` last.
        let header = seg.header();
        params.write(header, layout.total as u64);
        let map = MappedRing::new(seg, params, layout);
        let ring = map.ring();
        for (i, line) in ring.slots.iter().enumerate() {
            // Relaxed: published by the Release store of `magic` below.
            line.stamp.store(stamp::initial(i as u32, params.capacity), Ordering::Relaxed);
        }
        let wait = WaitConfig { spin: self.spin, tick: self.liveness };
        // Dropped on failure below: that marks it closed and unlinks the name.
        let producer = Producer {
            map,
            core: ProducerCore::new(),
            wait,
            closed: false,
            table_seen: (0, 0),
            last_reap: Instant::now(),
            bells: ProducerBells::bind(&self.name, params.epoch, params.max_consumers),
        };
        let extra = init(&producer.map)?;
        // Release: a consumer that Acquire-loads the magic sees the whole built segment.
        producer.map.header().magic.store(MAGIC, Ordering::Release);
        // Built: the creator's exclusive lock on the file becomes a shared one (shm/stale.rs).
        producer.map.segment().mark_ready();
        tracing::info!(
            ring = %self.name, ?memory, capacity = params.capacity, slot_size = params.slot_size,
            policy = ?producer.map.policy(), epoch = params.epoch, "ring created"
        );
        Ok((producer, extra))
    }
}

/// A fresh instance id: time and pid, so that a restarted ring differs from its predecessor.
fn new_epoch(me: ProcessId) -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Realtime);
    (t.tv_sec as u64).wrapping_mul(1_000_000_000).wrapping_add(t.tv_nsec as u64) ^ (me.pid as u64)
}

/// The single producer of a ring.
///
/// Dropping it closes the ring: consumers receive what was published, then
/// [`RecvError::Disconnected`](crate::RecvError::Disconnected). The segment's name is removed at
/// once; consumers keep their mappings until they drop.
///
/// ```
/// use gpuring::{Consumer, Producer, RecvError};
///
/// let mut tx = Producer::builder("doc-producer-type").create()?;
/// let rx = Consumer::open("doc-producer-type")?;
/// tx.send(b"hello", b"")?;
/// drop(tx);
/// assert_eq!(&*rx.recv()?, b"hello");
/// assert!(matches!(rx.recv(), Err(RecvError::Disconnected)));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Producer {
    map: MappedRing,
    core: ProducerCore,
    wait: WaitConfig,
    /// Whether [`Producer::close`] ran.
    closed: bool,
    /// The consumer table's (`joins`, `retires`) counts when it was last reaped.
    table_seen: (u64, u64),
    /// When the table was last reaped: it is reaped at least once per liveness interval while
    /// the producer acquires, blocked or not.
    last_reap: Instant,
    /// Its doorbell, and the addresses of parked consumers' doorbells.
    bells: ProducerBells,
}

/// What the transport does when the producer frees a consumer table entry (`entry`,
/// `generation`): drop what it opened of it. Called before the entry is freed. Host rings keep
/// nothing per consumer and pass [`no_hook`].
pub(crate) type OnFree<'a> = &'a mut (dyn FnMut(usize, u32) + Send);

/// The [`OnFree`] of a ring that keeps nothing per consumer.
pub(crate) fn no_hook() -> impl FnMut(usize, u32) + Send {
    |_, _| {}
}

/// Whether the owner of a consumer table entry still runs: by pid and start time, or by pid
/// alone while its start time is not stored yet (see `ring::reclaim`).
fn owner_alive(pid: u32, start_time: Option<u64>) -> bool {
    match start_time {
        Some(start_time) => ProcessId { pid, start_time }.is_alive(),
        None => crate::shm::process::is_running(pid),
    }
}

/// Reaps `ring`'s consumer table (see [`crate::ring::reclaim`]): dead consumers are taken out,
/// retired entries finished, evicted ones' holds given back. Wakes consumers if it froze slots.
fn reap(
    ring: &crate::ring::Ring<'_>,
    bells: &mut ProducerBells,
    on_free: OnFree<'_>,
    recount: Recount,
) -> Result<Reaped, RingCorrupt> {
    let r = crate::ring::reap(
        ring,
        owner_alive,
        |entry, generation| {
            tracing::debug!(target: "gpuring::lifecycle", entry, generation, "entry freed");
            on_free(entry, generation)
        },
        recount,
    )?;
    if r.dead > 0 || r.slots > 0 {
        tracing::info!(dead = r.dead, freed = r.freed, slots = r.slots, "dead consumers reclaimed");
    }
    if r.wake_consumers {
        wake_consumers(ring, bells);
    }
    Ok(r)
}

/// Wakes the consumers that sleep (futex) or are parked (doorbells); `wants_wake` said yes.
fn wake_consumers(ring: &crate::ring::Ring<'_>, bells: &mut ProducerBells) {
    wait::wake_all(ring.consumer_wake);
    if park::has_parked(ring.consumer_wake) {
        bells.ring_parked(ring);
    }
}

/// Adds the time since `started` to the producer's blocked-time statistic.
fn add_blocked(ring: &crate::ring::Ring<'_>, started: Instant) {
    let ns = started.elapsed().as_nanos() as u64;
    // Relaxed: a statistic, written only by the producer.
    let total = ring.producer.blocked_ns.load(Ordering::Relaxed);
    ring.producer.blocked_ns.store(total + ns, Ordering::Relaxed);
}

/// Used by the async layer (`src/asynch/`).
#[cfg(feature = "tokio")]
impl Producer {
    /// The fields an async wait borrows at once.
    pub(crate) fn async_parts(&mut self) -> (&MappedRing, &mut ProducerCore, &ProducerBells) {
        (&self.map, &mut self.core, &self.bells)
    }

    /// How long one wait lasts before looking for dead consumers.
    pub(crate) fn liveness_tick(&self) -> Duration {
        self.wait.tick
    }

    /// Adds the time since `started` to the blocked-time statistic.
    pub(crate) fn add_blocked(&self, started: Instant) {
        add_blocked(&self.map.ring(), started);
    }
}

impl Producer {
    /// Starts configuring a ring named `name`.
    ///
    /// ```
    /// # use gpuring::Producer;
    /// let tx = Producer::builder("doc-producer-new").capacity(16).slot_size(4096).create()?;
    /// assert_eq!((tx.capacity(), tx.slot_size()), (16, 4096));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn builder(name: &str) -> ProducerBuilder {
        ProducerBuilder {
            name: name.to_owned(),
            capacity: 8,
            slot_size: 64 * 1024,
            user_header_size: 64,
            max_consumers: 64,
            policy: Policy::Block,
            mode: 0o600,
            spin: Duration::from_micros(50),
            liveness: Duration::from_millis(100),
            unfenced: false,
            gpu_poll: crate::DEFAULT_GPU_POLL,
            memory_fence: false,
        }
    }

    /// The ring's name.
    ///
    /// ```
    /// # use gpuring::Producer;
    /// let tx = Producer::builder("doc-producer-name").create()?;
    /// assert_eq!(tx.name(), "doc-producer-name");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn name(&self) -> &str {
        self.map.segment().name().ring()
    }

    /// Number of slots.
    ///
    /// ```
    /// # use gpuring::Producer;
    /// let tx = Producer::builder("doc-producer-capacity").create()?;
    /// assert_eq!(tx.capacity(), 8); // the default
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn capacity(&self) -> u32 {
        self.map.params().capacity
    }

    /// Largest message.
    ///
    /// ```
    /// # use gpuring::Producer;
    /// let tx = Producer::builder("doc-producer-slot-size").create()?;
    /// assert_eq!(tx.slot_size(), 64 * 1024); // the default
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn slot_size(&self) -> usize {
        self.map.slot_size()
    }

    /// User header bytes per message.
    ///
    /// ```
    /// # use gpuring::Producer;
    /// let tx = Producer::builder("doc-producer-user-header-size").create()?;
    /// assert_eq!(tx.user_header_size(), 64); // the default
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn user_header_size(&self) -> usize {
        self.map.user_header_size()
    }

    /// The policy.
    ///
    /// ```
    /// # use gpuring::{Policy, Producer};
    /// let tx = Producer::builder("doc-producer-policy").create()?;
    /// assert_eq!(tx.policy(), Policy::Block); // the default
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn policy(&self) -> Policy {
        self.map.policy()
    }

    /// Messages published so far.
    ///
    /// ```
    /// # use gpuring::Producer;
    /// let mut tx = Producer::builder("doc-producer-published").create()?;
    /// tx.send(b"a", b"")?;
    /// tx.send(b"b", b"")?;
    /// assert_eq!(tx.published(), 2);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn published(&self) -> u64 {
        self.core.next_seq()
    }

    /// Consumers currently joined.
    ///
    /// ```
    /// # use gpuring::{Consumer, Producer};
    /// let tx = Producer::builder("doc-producer-consumer-count").create()?;
    /// assert_eq!(tx.consumer_count(), 0);
    /// let rx = Consumer::open("doc-producer-consumer-count")?;
    /// assert_eq!(tx.consumer_count(), 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn consumer_count(&self) -> usize {
        crate::stats::consumer_count(&self.map.ring())
    }

    /// A snapshot of every joined consumer's counters.
    ///
    /// ```
    /// # use gpuring::{Consumer, Producer};
    /// # let tx = Producer::builder("doc-producer-consumers").create()?;
    /// let rx = Consumer::open("doc-producer-consumers")?;
    /// let info = tx.consumers();
    /// assert_eq!(info.len(), 1);
    /// assert_eq!(info[0].pid, std::process::id());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn consumers(&self) -> Vec<ConsumerInfo> {
        crate::stats::consumers(&self.map.ring())
    }

    /// Slots that some consumer holds now. Once every consumer has released what it received
    /// (or died and was reaped), this is 0: a slot still counted then has leaked.
    ///
    /// ```
    /// # use gpuring::{Consumer, Producer};
    /// # let mut tx = Producer::builder("doc-producer-held-slots").create()?;
    /// # let rx = Consumer::open("doc-producer-held-slots")?;
    /// tx.send(b"frame", b"")?;
    /// let msg = rx.recv()?;
    /// assert_eq!(tx.held_slots(), 1);
    /// drop(msg);
    /// assert_eq!(tx.held_slots(), 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn held_slots(&self) -> usize {
        crate::stats::held_slots(&self.map.ring())
    }

    /// The ring instance's epoch (see `Consumer::epoch`).
    ///
    /// ```
    /// # use gpuring::{Consumer, Producer};
    /// let tx = Producer::builder("doc-producer-epoch").create()?;
    /// let rx = Consumer::open("doc-producer-epoch")?;
    /// assert_eq!(rx.epoch(), tx.epoch());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn epoch(&self) -> u64 {
        self.map.params().epoch
    }

    /// The memory kind (host for rings made by [`ProducerBuilder::create`]).
    ///
    /// ```
    /// # use gpuring::{MemoryKind, Producer};
    /// let tx = Producer::builder("doc-producer-memory").create()?;
    /// assert_eq!(tx.memory(), MemoryKind::Host);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn memory(&self) -> MemoryKind {
        self.map.params().memory_kind
    }

    /// A slot for the next message, if one is free now.
    ///
    /// ```
    /// # use gpuring::{Consumer, Producer, TryAcquireError};
    /// let mut tx = Producer::builder("doc-producer-try-acquire").capacity(1).create()?;
    /// let rx = Consumer::open("doc-producer-try-acquire")?;
    /// tx.try_acquire()?.publish(0, b"")?;
    /// // `rx` has not read message 0 yet, so the only slot is not free.
    /// assert!(matches!(tx.try_acquire(), Err(TryAcquireError::Full)));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn try_acquire(&mut self) -> Result<WriteSlot<'_>, TryAcquireError> {
        let slot = self.try_claim(&mut no_hook())?;
        Ok(WriteSlot { producer: self, slot })
    }

    /// Claims the next slot if it is free now. Returns its index.
    pub(crate) fn try_claim(&mut self, on_free: OnFree<'_>) -> Result<usize, TryAcquireError> {
        if self.map.segment().faulted() {
            return Err(TryAcquireError::Corrupt(Corruption::Truncated));
        }
        self.maintain(on_free).map_err(TryAcquireError::Corrupt)?;
        match self.core.try_claim(&self.map.ring()) {
            Ok(slot) => Ok(slot),
            Err(ClaimError::Blocked(_)) => Err(TryAcquireError::Full),
            Err(ClaimError::Corrupt(c)) => Err(TryAcquireError::Corrupt(c.into())),
        }
    }

    /// A slot for the next message, waiting as long as it takes (under `Block`, for the slowest
    /// consumer; under both policies, for consumers that hold the slot).
    ///
    /// ```
    /// # use gpuring::Producer;
    /// let mut tx = Producer::builder("doc-producer-acquire").create()?;
    /// let mut slot = tx.acquire()?;
    /// slot[..5].copy_from_slice(b"hello");
    /// assert_eq!(slot.publish(5, b"")?, 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn acquire(&mut self) -> Result<WriteSlot<'_>, AcquireError> {
        match self.acquire_until(None) {
            Ok(slot) => Ok(slot),
            Err(AcquireTimeoutError::Corrupt(c)) => Err(AcquireError::Corrupt(c)),
            Err(AcquireTimeoutError::Timeout) => unreachable!("no deadline"),
        }
    }

    /// A slot for the next message, waiting at most `timeout`.
    ///
    /// ```
    /// # use gpuring::{AcquireTimeoutError, Consumer, Producer};
    /// # use std::time::Duration;
    /// let mut tx = Producer::builder("doc-producer-acquire-timeout").capacity(1).create()?;
    /// let rx = Consumer::open("doc-producer-acquire-timeout")?;
    /// tx.send(b"unread", b"")?;
    /// let r = tx.acquire_timeout(Duration::from_millis(10));
    /// assert!(matches!(r, Err(AcquireTimeoutError::Timeout)));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn acquire_timeout(
        &mut self,
        timeout: Duration,
    ) -> Result<WriteSlot<'_>, AcquireTimeoutError> {
        self.acquire_until(Some(Instant::now() + timeout))
    }

    fn acquire_until(
        &mut self,
        deadline: Option<Instant>,
    ) -> Result<WriteSlot<'_>, AcquireTimeoutError> {
        let slot = self.claim_until(deadline, &mut no_hook())?;
        Ok(WriteSlot { producer: self, slot })
    }

    /// Claims the next slot, waiting until `deadline` (or for ever). Returns its index.
    pub(crate) fn claim_until(
        &mut self,
        deadline: Option<Instant>,
        on_free: OnFree<'_>,
    ) -> Result<usize, AcquireTimeoutError> {
        if self.map.segment().faulted() {
            return Err(AcquireTimeoutError::Corrupt(Corruption::Truncated));
        }
        self.maintain(on_free).map_err(AcquireTimeoutError::Corrupt)?;
        let Producer { map, core, wait, last_reap, bells, .. } = self;
        let ring = map.ring();
        let claim = |core: &mut ProducerCore| match core.try_claim(&ring) {
            Ok(slot) => Some(Ok(slot)),
            Err(ClaimError::Blocked(_)) => None,
            Err(ClaimError::Corrupt(c)) => Some(Err(AcquireTimeoutError::Corrupt(c.into()))),
        };
        let first = claim(core);
        match first {
            Some(r) => r,
            None => {
                let started = Instant::now();
                let core = std::cell::RefCell::new(core);
                // Every liveness tick spent waiting: look for dead consumers to reclaim, then
                // try again at once.
                let tick = wait.tick;
                let idle = || {
                    // Wake-ups also end here: look for the dead once per liveness interval.
                    if last_reap.elapsed() < tick {
                        return None;
                    }
                    *last_reap = Instant::now();
                    let mut core = core.borrow_mut();
                    match reap(&ring, bells, on_free, Recount::Yes).and_then(|r| {
                        let (lowered, wake) = audit(&ring, ring.slot_of(core.next_seq()))?;
                        if wake {
                            wake_consumers(&ring, bells);
                        }
                        Ok(r.dead > 0 || r.freed > 0 || r.slots > 0 || lowered)
                    }) {
                        Ok(false) => None,
                        Ok(true) => {
                            core.forget_min_cursor();
                            claim(&mut core)
                        }
                        Err(c) => Some(Err(AcquireTimeoutError::Corrupt(c.into()))),
                    }
                };
                let r = wait::wait_until(
                    ring.producer_wake,
                    *wait,
                    deadline,
                    || claim(&mut core.borrow_mut()),
                    idle,
                );
                add_blocked(&ring, started);
                r.unwrap_or(Err(AcquireTimeoutError::Timeout))
            }
        }
    }

    /// Reclaims every consumer whose process died: its held slots come back, it stops gating
    /// the producer and its table entry is freed. Returns how many were freed. `acquire` does
    /// this by itself when a consumer joins and every liveness interval it spends waiting.
    ///
    /// ```
    /// # use gpuring::{Consumer, Producer};
    /// let mut tx = Producer::builder("doc-producer-reap").create()?;
    /// let rx = Consumer::open("doc-producer-reap")?;
    /// assert_eq!(tx.reap()?, 0); // `rx` is alive
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn reap(&mut self) -> Result<usize, Corruption> {
        Ok(self.reap_with(&mut no_hook())?.freed as usize)
    }

    /// [`reap`](Self::reap), telling the transport about each entry it frees.
    /// Also audits the next slot's held count (`ring::reclaim::audit`), so a count that a
    /// damaged segment left too high cannot hold the producer back for ever.
    pub(crate) fn reap_with(&mut self, on_free: OnFree<'_>) -> Result<Reaped, Corruption> {
        self.last_reap = Instant::now();
        let ring = self.map.ring();
        // Closed: nothing is published any more, and a recount's freeze could make a draining
        // consumer take a published message for none (`ring::reclaim`).
        if self.closed {
            return Ok(reap(&ring, &mut self.bells, on_free, Recount::No)?);
        }
        let r = reap(&ring, &mut self.bells, on_free, Recount::Yes)?;
        let (lowered, wake) = audit(&ring, ring.slot_of(self.core.next_seq()))?;
        if wake {
            wake_consumers(&ring, &mut self.bells);
        }
        if r.dead > 0 || r.freed > 0 || r.slots > 0 || lowered {
            self.core.forget_min_cursor();
        }
        Ok(r)
    }

    /// Reaps when the consumer table changed since the last look (a consumer joined or
    /// retired) or a liveness interval has passed: dead consumers are noticed while the
    /// producer runs, not only when it is blocked, and retiring consumers are let go quickly.
    pub(crate) fn maintain(&mut self, on_free: OnFree<'_>) -> Result<(), Corruption> {
        let line = self.map.ring().producer;
        // Acquire: pairs with the consumers' Release bumps, made after their lease CASes, so a
        // reap that follows a moved count sees the entry that moved it.
        let seen = (line.joins.load(Ordering::Acquire), line.retires.load(Ordering::Acquire));
        if seen != self.table_seen || self.last_reap.elapsed() >= self.wait.tick {
            self.table_seen = seen;
            self.reap_with(on_free)?;
        }
        Ok(())
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

    /// Copies `data` into the next slot and publishes it with `header`, waiting for a slot as
    /// [`acquire`](Self::acquire) does. Returns the message's sequence number.
    ///
    /// ```
    /// # use gpuring::{Consumer, Producer};
    /// # let mut tx = Producer::builder("doc-producer-send").create()?;
    /// # let rx = Consumer::open("doc-producer-send")?;
    /// assert_eq!(tx.send(b"hello", b"text")?, 0);
    /// assert_eq!(&*rx.recv()?, b"hello");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn send(&mut self, data: &[u8], header: &[u8]) -> Result<u64, SendError> {
        if data.len() > self.slot_size() {
            let e = PublishError::TooLong { len: data.len(), slot_size: self.slot_size() };
            return Err(SendError::Publish(e));
        }
        let mut slot = self.acquire().map_err(|AcquireError::Corrupt(c)| SendError::Corrupt(c))?;
        slot[..data.len()].copy_from_slice(data);
        slot.publish(data.len(), header).map_err(SendError::Publish)
    }
}

/// Used by the CUDA layer (`src/gpu/`).
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
impl Producer {
    /// The mapped segment.
    pub(crate) fn map(&self) -> &MappedRing {
        &self.map
    }

    /// How waiting is configured.
    pub(crate) fn wait_config(&self) -> WaitConfig {
        self.wait
    }

    /// Writes `header` into claimed slot `slot`'s user header and publishes message `len`.
    /// The caller checked `len` against what the message may hold.
    pub(crate) fn publish_claimed(
        &mut self,
        slot: usize,
        len: u64,
        header: &[u8],
    ) -> Result<u64, PublishError> {
        let map = &self.map;
        let max = map.user_header_size();
        if header.len() > max {
            return Err(PublishError::HeaderTooLong { len: header.len(), max });
        }
        let dst = map.user_header(slot);
        // SAFETY: the slot is claimed by us, so no correct peer touches its user header; the
        // region is `max` bytes long and header.len() <= max.
        unsafe {
            std::ptr::copy_nonoverlapping(header.as_ptr(), dst, header.len());
            std::ptr::write_bytes(dst.add(header.len()), 0, max - header.len());
        }
        let ring = map.ring();
        let (seq, wake) = self.core.publish(&ring, len, monotonic_ns());
        if wake {
            self.wake_consumers();
        }
        Ok(seq)
    }

    /// Wakes the consumers that sleep (futex) or are parked (doorbells); `wants_wake` said yes.
    fn wake_consumers(&mut self) {
        wake_consumers(&self.map.ring(), &mut self.bells);
    }

    /// Marks the ring closed, wakes the consumers and removes the name. Idempotent.
    pub(crate) fn close(&mut self) {
        if std::mem::replace(&mut self.closed, true) {
            return;
        }
        tracing::info!(ring = %self.name(), published = self.published(), "ring closed");
        let ring = self.map.ring();
        // Release: consumers that see `closed` (Acquire) see every publish before it.
        self.map.header().closed.store(1, Ordering::Release);
        if wants_wake(ring.consumer_wake) {
            self.wake_consumers();
        }
        self.map.segment().unlink();
    }
}

impl Drop for Producer {
    fn drop(&mut self) {
        self.close();
    }
}

/// A claimed slot: fill it, then [`publish`](WriteSlot::publish) it. Dropping it unpublished keeps
/// it claimed; the next acquire returns the same slot.
///
/// Derefs to the slot's whole payload buffer (`slot_size` bytes).
///
/// ```
/// use gpuring::Producer;
///
/// let mut tx = Producer::builder("doc-producer-write-slot").create()?;
/// let mut slot = tx.acquire()?;
/// slot[0] = 1;
/// slot.publish(1, b"")?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// A slot cannot be used after `publish`, which takes it by value:
///
/// ```compile_fail,E0382
/// # use gpuring::Producer;
/// # let mut tx = Producer::builder("doc-producer-write-slot-moved").create()?;
/// let mut slot = tx.acquire()?;
/// slot.publish(1, b"")?;
/// slot[0] = 1; // error: `slot` was moved by `publish`
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// A producer hands out one slot at a time: `acquire` borrows it until the slot is published or
/// dropped:
///
/// ```compile_fail,E0499
/// # use gpuring::Producer;
/// # let mut tx = Producer::builder("doc-producer-write-slot-two").create()?;
/// let first = tx.acquire()?;
/// let second = tx.acquire()?; // error: `tx` is still borrowed by `first`
/// first.publish(0, b"")?;
/// second.publish(0, b"")?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct WriteSlot<'a> {
    producer: &'a mut Producer,
    /// Invariant: claimed by `producer` and not yet published.
    slot: usize,
}

impl<'a> WriteSlot<'a> {
    /// Wraps slot `slot`, which `producer` has just claimed.
    #[cfg_attr(not(feature = "tokio"), allow(dead_code))]
    pub(crate) fn new(producer: &'a mut Producer, slot: usize) -> WriteSlot<'a> {
        WriteSlot { producer, slot }
    }

    /// Sequence number this message will have.
    ///
    /// ```
    /// # use gpuring::Producer;
    /// let mut tx = Producer::builder("doc-producer-write-slot-seq").create()?;
    /// tx.send(b"first", b"")?;
    /// let slot = tx.acquire()?;
    /// assert_eq!(slot.seq(), 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn seq(&self) -> u64 {
        self.producer.core.next_seq()
    }

    /// Publishes the first `len` bytes of the slot with user header `header` (shorter than the
    /// ring's user-header size is fine; the rest is zeroed). Returns the sequence number.
    ///
    /// ```
    /// # use gpuring::Producer;
    /// # let mut tx = Producer::builder("doc-producer-publish").create()?;
    /// let mut slot = tx.acquire()?;
    /// slot[..2].copy_from_slice(b"hi");
    /// let seq = slot.publish(2, b"text")?; // consumers see 2 bytes and the header
    /// assert_eq!(seq, 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn publish(self, len: usize, header: &[u8]) -> Result<u64, PublishError> {
        let slot_size = self.producer.map.slot_size();
        if len > slot_size {
            return Err(PublishError::TooLong { len, slot_size });
        }
        self.producer.publish_claimed(self.slot, len as u64, header)
    }
}

impl Deref for WriteSlot<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        let map = &self.producer.map;
        // SAFETY: the slot is claimed by us (no correct peer writes it) and lies in the mapping.
        unsafe { std::slice::from_raw_parts(map.payload(self.slot), map.slot_size()) }
    }
}

impl DerefMut for WriteSlot<'_> {
    fn deref_mut(&mut self) -> &mut [u8] {
        let map = &self.producer.map;
        // SAFETY: as in `deref`; `&mut self` makes this the only reference we hand out.
        unsafe { std::slice::from_raw_parts_mut(map.payload(self.slot), map.slot_size()) }
    }
}

/// CLOCK_MONOTONIC in nanoseconds, the clock of message timestamps.
///
/// ```
/// # use gpuring::{Consumer, Producer};
/// # let mut tx = Producer::builder("doc-producer-monotonic-ns").create()?;
/// # let rx = Consumer::open("doc-producer-monotonic-ns")?;
/// tx.send(b"frame", b"")?;
/// let msg = rx.recv()?;
/// let age_ns = gpuring::monotonic_ns() - msg.timestamp_ns();
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn monotonic_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}
