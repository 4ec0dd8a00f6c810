//! A consumer: opens a ring, receives messages, releases them on drop.

use std::cell::Cell;
use std::ops::Deref;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::doorbells::ConsumerBells;
use crate::error::{Corruption, OpenError, RecvError, RecvTimeoutError, TryRecvError};
use crate::format::view::MappedRing;
use crate::format::{MemoryKind, Params};
use crate::ring::{
    park, ConsumerCore, JoinError, Leave, Left, Pinned, Policy, RingCorrupt, StartAt,
};
use crate::shm::process::ProcessId;
use crate::shm::{OpenOptions, Segment, ShmName};
use crate::wait::{self, WaitConfig};

/// The error of a join whose entry was taken from it before it became active.
fn lost(entry: usize) -> OpenError {
    let reason = crate::ring::lease::evict_reason::NONE;
    OpenError::Corrupt(Corruption::Ring(RingCorrupt::Evicted { entry: entry as u32, reason }))
}

/// Configures and opens a [`Consumer`]. Start from [`Consumer::builder`].
///
/// ```
/// use gpuring::{Consumer, Producer, StartAt};
///
/// # let tx = Producer::builder("doc-consumer-builder").create()?;
/// let rx = Consumer::builder("doc-consumer-builder").start_at(StartAt::Oldest).open()?;
/// assert_eq!(rx.name(), "doc-consumer-builder");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug)]
pub struct ConsumerBuilder {
    name: String,
    start: StartAt,
    allow_foreign_owner: bool,
    spin: Duration,
    liveness: Duration,
    /// The device to read on (CUDA rings); `None`: the producer's.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) device: Option<i32>,
    /// CUDA rings: how long `recv` polls a frame's ready event before a GPU-side wait.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) gpu_poll: Duration,
}

impl ConsumerBuilder {
    /// Where to start reading. Default [`StartAt::Newest`].
    ///
    /// ```
    /// # use gpuring::{Consumer, Producer, StartAt};
    /// let mut tx = Producer::builder("doc-consumer-start-at").create()?;
    /// tx.send(b"one", b"")?;
    /// tx.send(b"two", b"")?;
    /// let rx = Consumer::builder("doc-consumer-start-at").start_at(StartAt::Oldest).open()?;
    /// assert_eq!(&*rx.recv()?, b"one"); // `StartAt::Newest` would give "two"
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn start_at(mut self, start: StartAt) -> Self {
        self.start = start;
        self
    }

    /// Accept a ring created by another user. Off by default.
    ///
    /// ```
    /// # use gpuring::{Consumer, Producer};
    /// # let tx = Producer::builder("doc-consumer-foreign-owner").create()?;
    /// let rx = Consumer::builder("doc-consumer-foreign-owner").allow_foreign_owner(true).open()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn allow_foreign_owner(mut self, allow: bool) -> Self {
        self.allow_foreign_owner = allow;
        self
    }

    /// How long a receive spins and yields before sleeping. Default 50 µs.
    ///
    /// ```
    /// # use gpuring::{Consumer, Producer};
    /// # use std::time::Duration;
    /// # let tx = Producer::builder("doc-consumer-spin").create()?;
    /// // Sleep at once when no message is waiting, without spinning first.
    /// let rx = Consumer::builder("doc-consumer-spin").spin(Duration::ZERO).open()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn spin(mut self, spin: Duration) -> Self {
        self.spin = spin;
        self
    }

    /// How often a waiting receive checks that the producer is alive. Default 100 ms.
    ///
    /// ```
    /// # use gpuring::{Consumer, Producer};
    /// # use std::time::Duration;
    /// # let tx = Producer::builder("doc-consumer-liveness").create()?;
    /// let rx = Consumer::builder("doc-consumer-liveness")
    ///     .liveness_interval(Duration::from_millis(20))
    ///     .open()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn liveness_interval(mut self, every: Duration) -> Self {
        self.liveness = every;
        self
    }

    /// Waits up to `timeout` for ring `name` to exist with a live producer whose instance is not
    /// `not_epoch` (pass the epoch of a ring whose producer died to wait for its successor),
    /// then opens it with `open`. Errors other than "not there yet" are returned at once.
    ///
    /// ```
    /// # use gpuring::{Consumer, OpenError, Producer};
    /// # use std::time::Duration;
    /// # let tx = Producer::builder("doc-consumer-open-when-ready").create()?;
    /// let ready = Consumer::builder("doc-consumer-open-when-ready");
    /// let rx = ready.open_when_ready(None, Duration::from_secs(5))?; // the ring exists: no wait
    /// let absent = Consumer::builder("doc-consumer-never-created");
    /// let r = absent.open_when_ready(None, Duration::from_millis(20));
    /// assert!(matches!(r, Err(OpenError::Disconnected)));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn open_when_ready(
        self,
        not_epoch: Option<u64>,
        timeout: Duration,
    ) -> Result<Consumer, OpenError> {
        self.retry_open(not_epoch, timeout, |b| b.open(), |c: &Consumer| c.epoch())
    }

    /// The waiting loop behind `open_when_ready` (and its CUDA twin).
    pub(crate) fn retry_open<T>(
        self,
        not_epoch: Option<u64>,
        timeout: Duration,
        open: impl Fn(ConsumerBuilder) -> Result<T, OpenError>,
        epoch: impl Fn(&T) -> u64,
    ) -> Result<T, OpenError> {
        let deadline = Instant::now() + timeout;
        loop {
            let retry = match open(self.clone()) {
                Ok(c) if not_epoch.is_some_and(|e| e == epoch(&c)) => true,
                Ok(c) => return Ok(c),
                // Not there yet, half-built (between the producer's shm_open and ftruncate,
                // or before its magic), or the old instance.
                Err(
                    OpenError::NotFound
                    | OpenError::NotInitialized
                    | OpenError::Truncated { .. }
                    | OpenError::Disconnected,
                ) => true,
                Err(e) => return Err(e),
            };
            if retry && Instant::now() >= deadline {
                return Err(OpenError::Disconnected);
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Opens a host-memory ring and joins it. A CUDA ring is refused with
    /// [`OpenError::WrongMemory`]; open it with `open_gpu`.
    ///
    /// ```
    /// # use gpuring::{Consumer, OpenError, Producer};
    /// # let tx = Producer::builder("doc-consumer-builder-open").create()?;
    /// let rx = Consumer::builder("doc-consumer-builder-open").open()?;
    /// let absent = Consumer::builder("doc-consumer-not-created").open();
    /// assert!(matches!(absent, Err(OpenError::NotFound)));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn open(self) -> Result<Consumer, OpenError> {
        Ok(self.open_kind(MemoryKind::Host, |_, _, _| Ok(()))?.0)
    }

    /// Opens ring `name` of memory kind `kind`, claims a consumer table entry, lets `setup` fill
    /// in the transport's state for it, then joins. If `setup` fails, the entry is freed again.
    pub(crate) fn open_kind<T>(
        self,
        kind: MemoryKind,
        setup: impl FnOnce(&MappedRing, usize, u32) -> Result<T, OpenError>,
    ) -> Result<(Consumer, T), OpenError> {
        let builder = self.clone();
        let name = ShmName::new(&self.name).map_err(OpenError::InvalidName)?;
        let opts = OpenOptions { allow_foreign_owner: self.allow_foreign_owner };
        let seg = Segment::open(&name, opts)?;
        let (params, layout) = Params::read(seg.header(), seg.len() as u64)?;
        if params.memory_kind != kind {
            return Err(OpenError::WrongMemory { found: params.memory_kind });
        }
        let map = MappedRing::new(seg, params, layout);
        let producer =
            ProcessId { pid: params.producer_pid, start_time: params.producer_start_time };
        // Acquire: pairs with the producer's Release store of `closed`.
        if map.header().closed.load(Ordering::Acquire) != 0 || !producer.is_alive() {
            return Err(OpenError::Disconnected);
        }
        let me = ProcessId::current();
        let ring = map.ring();
        let joining = ConsumerCore::claim(&ring, me.pid, me.start_time).map_err(|e| match e {
            JoinError::Full => OpenError::TooManyConsumers { max: params.max_consumers },
            JoinError::Lost => lost(0),
        })?;
        let joining_index = joining.index();
        let extra = match setup(&map, joining.index(), joining.generation()) {
            Ok(extra) => extra,
            Err(e) => {
                joining.abandon(&ring);
                return Err(e);
            }
        };
        let core = joining.activate(&ring, self.start).map_err(|_| lost(joining_index))?;
        tracing::info!(
            ring = %self.name, entry = joining_index, ?kind, producer_pid = params.producer_pid,
            "consumer joined"
        );
        let join_wake = core.join_wake();
        let consumer = Consumer {
            map,
            core,
            producer,
            producer_dead: Cell::new(false),
            last_check: Cell::new(Instant::now()),
            deferred: Cell::new(None),
            wait: WaitConfig { spin: self.spin, tick: self.liveness },
            left: false,
            builder,
            bells: ConsumerBells::default(),
            #[cfg(feature = "tokio")]
            bell: Default::default(),
        };
        if join_wake {
            consumer.wake_producer();
        }
        Ok((consumer, extra))
    }
}

/// One consumer of a ring. Every consumer receives every message (unless it lags under
/// [`Policy::Overwrite`]).
///
/// `recv` takes `&self`, so one consumer may hold several messages at once. A consumer is
/// `Send` but not `Sync`: use one per thread.
///
/// ```
/// use gpuring::{Consumer, Producer};
///
/// let mut tx = Producer::builder("doc-consumer-type").create()?;
/// let rx = Consumer::open("doc-consumer-type")?;
/// tx.send(b"a", b"")?;
/// tx.send(b"b", b"")?;
/// let (a, b) = (rx.recv()?, rx.recv()?); // two messages held at once
/// assert_eq!((&*a, &*b), (&b"a"[..], &b"b"[..]));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// It can move to another thread:
///
/// ```
/// # use gpuring::{Consumer, Producer};
/// # let tx = Producer::builder("doc-consumer-send").create()?;
/// let rx = Consumer::open("doc-consumer-send")?;
/// std::thread::scope(|s| {
///     s.spawn(move || rx.try_recv().is_ok());
/// });
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// Threads cannot share one, because `Consumer` is not `Sync`:
///
/// ```compile_fail,E0277
/// # use gpuring::{Consumer, Producer};
/// # let tx = Producer::builder("doc-consumer-not-sync").create()?;
/// let rx = Consumer::open("doc-consumer-not-sync")?;
/// std::thread::scope(|s| {
///     s.spawn(|| rx.try_recv().is_ok()); // error: `Consumer` cannot be shared between threads
/// });
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Consumer {
    map: MappedRing,
    core: ConsumerCore,
    producer: ProcessId,
    /// Set once the producer was found dead; then the consumer drains and disconnects.
    producer_dead: Cell<bool>,
    /// When the producer's liveness was last checked.
    last_check: Cell<Instant>,
    /// Damage found while releasing (in `Drop`), reported by the next receive.
    deferred: Cell<Option<Corruption>>,
    wait: WaitConfig,
    /// Whether [`Consumer::leave`] ran.
    left: bool,
    /// How it was opened, for [`Consumer::reconnect`].
    builder: ConsumerBuilder,
    /// For ringing the producer's doorbell.
    bells: ConsumerBells,
    /// Its own doorbell, made by the first async wait.
    #[cfg(feature = "tokio")]
    pub(crate) bell: crate::asynch::BellCell,
}

impl Consumer {
    /// Opens ring `name` with default settings (start at the newest message).
    ///
    /// ```
    /// # use gpuring::{Consumer, Producer};
    /// # let tx = Producer::builder("doc-consumer-open").create()?;
    /// let rx = Consumer::open("doc-consumer-open")?;
    /// assert_eq!(rx.name(), "doc-consumer-open");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn open(name: &str) -> Result<Consumer, OpenError> {
        Consumer::builder(name).open()
    }

    /// Starts configuring a consumer of ring `name`.
    ///
    /// ```
    /// # use gpuring::{Consumer, Producer, StartAt};
    /// # let tx = Producer::builder("doc-consumer-builder-fn").create()?;
    /// let rx = Consumer::builder("doc-consumer-builder-fn").start_at(StartAt::Next).open()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn builder(name: &str) -> ConsumerBuilder {
        ConsumerBuilder {
            name: name.to_owned(),
            start: StartAt::Newest,
            allow_foreign_owner: false,
            spin: Duration::from_micros(50),
            liveness: Duration::from_millis(100),
            device: None,
            gpu_poll: crate::DEFAULT_GPU_POLL,
        }
    }

    /// The ring's name.
    ///
    /// ```
    /// # use gpuring::{Consumer, Producer};
    /// # let tx = Producer::builder("doc-consumer-name").create()?;
    /// let rx = Consumer::open("doc-consumer-name")?;
    /// assert_eq!(rx.name(), "doc-consumer-name");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn name(&self) -> &str {
        self.map.segment().name().ring()
    }

    /// Number of slots.
    ///
    /// ```
    /// # use gpuring::{Consumer, Producer};
    /// let tx = Producer::builder("doc-consumer-capacity").capacity(4).create()?;
    /// let rx = Consumer::open("doc-consumer-capacity")?;
    /// assert_eq!(rx.capacity(), 4);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn capacity(&self) -> u32 {
        self.map.params().capacity
    }

    /// Largest message.
    ///
    /// ```
    /// # use gpuring::{Consumer, Producer};
    /// let tx = Producer::builder("doc-consumer-slot-size").slot_size(4096).create()?;
    /// let rx = Consumer::open("doc-consumer-slot-size")?;
    /// assert_eq!(rx.slot_size(), 4096);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn slot_size(&self) -> usize {
        self.map.slot_size()
    }

    /// User header bytes per message.
    ///
    /// ```
    /// # use gpuring::{Consumer, Producer};
    /// let tx = Producer::builder("doc-consumer-header-size").user_header_size(16).create()?;
    /// let rx = Consumer::open("doc-consumer-header-size")?;
    /// assert_eq!(rx.user_header_size(), 16);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn user_header_size(&self) -> usize {
        self.map.user_header_size()
    }

    /// The producer's policy.
    ///
    /// ```
    /// # use gpuring::{Consumer, Policy, Producer};
    /// let tx = Producer::builder("doc-consumer-policy").policy(Policy::Overwrite).create()?;
    /// let rx = Consumer::open("doc-consumer-policy")?;
    /// assert_eq!(rx.policy(), Policy::Overwrite);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn policy(&self) -> Policy {
        self.map.policy()
    }

    /// The producer's process id.
    ///
    /// ```
    /// # use gpuring::{Consumer, Producer};
    /// # let tx = Producer::builder("doc-consumer-producer-pid").create()?;
    /// let rx = Consumer::open("doc-consumer-producer-pid")?;
    /// assert_eq!(rx.producer_pid(), std::process::id()); // the producer is this process here
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn producer_pid(&self) -> u32 {
        self.producer.pid
    }

    /// The ring instance's epoch: differs between a ring and a later one with the same name.
    ///
    /// ```
    /// # use gpuring::{Consumer, Producer};
    /// let tx = Producer::builder("doc-consumer-epoch").create()?;
    /// let rx = Consumer::open("doc-consumer-epoch")?;
    /// assert_eq!(rx.epoch(), tx.epoch());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn epoch(&self) -> u64 {
        self.map.params().epoch
    }

    /// After `Disconnected`: waits up to `timeout` for a new producer to create the ring again
    /// under the same name (a new instance, see [`epoch`](Self::epoch)) and opens it with the
    /// same settings. `Disconnected` if none came.
    ///
    /// ```
    /// # use gpuring::{Consumer, Producer, RecvError};
    /// # use std::time::Duration;
    /// let tx = Producer::builder("doc-consumer-reconnect").create()?;
    /// let rx = Consumer::open("doc-consumer-reconnect")?;
    /// drop(tx); // the producer goes away...
    /// assert!(matches!(rx.recv(), Err(RecvError::Disconnected)));
    /// let tx = Producer::builder("doc-consumer-reconnect").create()?; // ...and a new one starts
    /// let rx = rx.reconnect(Duration::from_secs(5))?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn reconnect(&self, timeout: Duration) -> Result<Consumer, OpenError> {
        tracing::info!(ring = %self.name(), old_epoch = self.epoch(), "reconnecting");
        self.builder.clone().open_when_ready(Some(self.epoch()), timeout)
    }

    /// Receives the next message if one is waiting.
    ///
    /// ```
    /// # use gpuring::{Consumer, Producer, TryRecvError};
    /// # let mut tx = Producer::builder("doc-consumer-try-recv").create()?;
    /// # let rx = Consumer::open("doc-consumer-try-recv")?;
    /// assert!(matches!(rx.try_recv(), Err(TryRecvError::Empty)));
    /// tx.send(b"hi", b"")?;
    /// assert_eq!(&*rx.try_recv()?, b"hi");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn try_recv(&self) -> Result<ReadSlot<'_>, TryRecvError> {
        let m = self.try_pin()?;
        Ok(ReadSlot { consumer: self, m })
    }

    /// Pins the next message if one is waiting.
    pub(crate) fn try_pin(&self) -> Result<Pinned, TryRecvError> {
        match self.poll_once() {
            Some(Ok(m)) => Ok(m),
            Some(Err(e)) => Err(e),
            None => Err(TryRecvError::Empty),
        }
    }

    /// Receives the next message, waiting as long as it takes. Returns `Disconnected` once the
    /// producer has closed (or died) and every message it published was received.
    ///
    /// ```
    /// # use gpuring::{Consumer, Producer};
    /// # let mut tx = Producer::builder("doc-consumer-recv").create()?;
    /// # let rx = Consumer::open("doc-consumer-recv")?;
    /// tx.send(b"hi", b"")?;
    /// let msg = rx.recv()?;
    /// assert_eq!(&*msg, b"hi");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn recv(&self) -> Result<ReadSlot<'_>, RecvError> {
        match self.recv_until(None) {
            Ok(slot) => Ok(slot),
            Err(RecvTimeoutError::Disconnected) => Err(RecvError::Disconnected),
            Err(RecvTimeoutError::Corrupt(c)) => Err(RecvError::Corrupt(c)),
            Err(RecvTimeoutError::Timeout) => unreachable!("no deadline"),
        }
    }

    /// Receives the next message, waiting at most `timeout`.
    ///
    /// ```
    /// # use gpuring::{Consumer, Producer, RecvTimeoutError};
    /// # use std::time::Duration;
    /// # let tx = Producer::builder("doc-consumer-recv-timeout").create()?;
    /// # let rx = Consumer::open("doc-consumer-recv-timeout")?;
    /// let r = rx.recv_timeout(Duration::from_millis(10)); // nothing was sent
    /// assert!(matches!(r, Err(RecvTimeoutError::Timeout)));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn recv_timeout(&self, timeout: Duration) -> Result<ReadSlot<'_>, RecvTimeoutError> {
        self.recv_until(Some(Instant::now() + timeout))
    }

    /// An iterator that receives until the producer disconnects (or the segment is damaged).
    ///
    /// ```
    /// # use gpuring::{Consumer, Producer};
    /// # let mut tx = Producer::builder("doc-consumer-iter").create()?;
    /// # let rx = Consumer::open("doc-consumer-iter")?;
    /// tx.send(b"a", b"")?;
    /// tx.send(b"b", b"")?;
    /// drop(tx);
    /// let all: Vec<Vec<u8>> = rx.iter().map(|msg| msg.to_vec()).collect();
    /// assert_eq!(all, [b"a", b"b"]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn iter(&self) -> Iter<'_> {
        Iter { consumer: self }
    }

    fn recv_until(&self, deadline: Option<Instant>) -> Result<ReadSlot<'_>, RecvTimeoutError> {
        let m = self.pin_until(deadline)?;
        Ok(ReadSlot { consumer: self, m })
    }

    /// Pins the next message, waiting until `deadline` (or for ever).
    pub(crate) fn pin_until(&self, deadline: Option<Instant>) -> Result<Pinned, RecvTimeoutError> {
        let line = self.map.ring().consumer_wake;
        let idle = || {
            self.check_producer();
            None
        };
        match wait::wait_until(line, self.wait, deadline, || self.poll_once(), idle) {
            Some(Ok(m)) => Ok(m),
            Some(Err(TryRecvError::Disconnected)) => Err(RecvTimeoutError::Disconnected),
            Some(Err(TryRecvError::Corrupt(c))) => Err(RecvTimeoutError::Corrupt(c)),
            Some(Err(TryRecvError::Empty)) | None => Err(RecvTimeoutError::Timeout),
        }
    }

    /// Whether the producer closed or died.
    fn closed(&self) -> bool {
        // Acquire: pairs with the producer's Release store, so every message it published
        // before closing is visible to the pin that follows.
        self.producer_dead.get() || self.map.header().closed.load(Ordering::Acquire) != 0
    }

    pub(crate) fn check_producer(&self) {
        self.last_check.set(Instant::now());
        if self.map.segment().truncated() {
            self.deferred.set(Some(Corruption::Truncated));
        }
        if !self.producer.is_alive() && !self.producer_dead.replace(true) {
            tracing::warn!(ring = %self.name(), pid = self.producer.pid, "producer found dead");
        }
        // Our cursor in the entry may have been overwritten (a damaged segment): a lower value
        // would hold a Block producer back while we wait for it. Put ours back.
        if self.core.refresh_cursor(&self.map.ring()) {
            self.wake_producer();
        }
    }

    /// One attempt: a message, an error, or `None` (nothing yet).
    pub(crate) fn poll_once(&self) -> Option<Result<Pinned, TryRecvError>> {
        // Once per liveness interval whatever happens, errors included: a consumer that gets
        // an error at every call must still learn that the segment was truncated.
        if self.last_check.get().elapsed() >= self.wait.tick {
            self.check_producer();
        }
        if let Some(c) = self.deferred.take() {
            return Some(Err(TryRecvError::Corrupt(c)));
        }
        if self.map.segment().faulted() {
            return Some(Err(TryRecvError::Corrupt(Corruption::Truncated)));
        }
        match self.pin() {
            Ok(Some(m)) => Some(Ok(m)),
            Err(c) => Some(Err(TryRecvError::Corrupt(c))),
            Ok(None) if !self.closed() => None,
            // Closed: anything published before the close is visible now; look once more.
            Ok(None) => match self.pin() {
                Ok(Some(m)) => Some(Ok(m)),
                Ok(None) => {
                    let ring = self.map.ring();
                    if !self.core.next_is_there(&ring) {
                        return Some(Err(TryRecvError::Disconnected));
                    }
                    // Our next message is there, frozen by a recount (or thawed since): not
                    // "nothing left". Closed or dead, the producer recounts no more, and one
                    // killed mid-recount never thaws it: thaw it, then pin again.
                    crate::ring::thaw(&ring, self.core.next_seq());
                    None
                }
                Err(c) => Some(Err(TryRecvError::Corrupt(c))),
            },
        }
    }

    fn pin(&self) -> Result<Option<Pinned>, Corruption> {
        let ring = self.map.ring();
        let Some((m, wake)) = self.core.try_pin(&ring)? else {
            return Ok(None);
        };
        self.core.write_stats(&ring);
        if wake {
            self.wake_producer();
        }
        if m.len > self.map.params().slot_size {
            self.release(m.slot);
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
            self.bells.knock_producer(self.name(), self.epoch());
        }
    }

    /// Releases pinned slot `slot`.
    pub(crate) fn release(&self, slot: usize) {
        let ring = self.map.ring();
        let released = self.core.release(&ring, slot);
        self.core.write_stats(&ring);
        match released {
            Ok(true) => self.wake_producer(),
            Ok(false) => {}
            Err(c) => self.deferred.set(Some(c.into())),
        }
    }
}

/// Used by the async layer (`src/asynch/`).
#[cfg(feature = "tokio")]
impl Consumer {
    /// How long one wait lasts before checking the producer.
    pub(crate) fn liveness_tick(&self) -> Duration {
        self.wait.tick
    }

    /// Whether the producer's liveness is due for a check.
    pub(crate) fn liveness_due(&self) -> bool {
        self.last_check.get().elapsed() >= self.wait.tick
    }
}

/// Used by the CUDA layer (`src/gpu/`).
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
impl Consumer {
    /// The mapped segment.
    pub(crate) fn map(&self) -> &MappedRing {
        &self.map
    }

    /// The settings it was opened with.
    pub(crate) fn settings(&self) -> ConsumerBuilder {
        self.builder.clone()
    }

    /// Its consumer table entry.
    pub(crate) fn entry(&self) -> usize {
        self.core.index()
    }

    /// Whether the producer is known to be dead (checked on the liveness tick).
    pub(crate) fn wait_config(&self) -> WaitConfig {
        self.wait
    }

    /// Steps aside without leaving (see `ConsumerCore::step_aside`).
    pub(crate) fn step_aside(&mut self) -> bool {
        self.left = true;
        self.core.step_aside(&self.map.ring())
    }

    /// Its consumer table entry's generation while it owns it.
    pub(crate) fn generation(&self) -> u32 {
        self.core.generation()
    }

    pub(crate) fn producer_alive(&self) -> bool {
        self.check_producer();
        !self.producer_dead.get()
    }

    /// Leaves the ring: gives back what it still holds (leaked read slots; the caller is done
    /// reading them), then frees or retires its entry (`how`). `None` if it already left.
    pub(crate) fn leave(&mut self, how: Leave) -> Option<Left> {
        if std::mem::replace(&mut self.left, true) {
            return None;
        }
        let ring = self.map.ring();
        let left = self.core.leave(&ring, how);
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

impl Drop for Consumer {
    fn drop(&mut self) {
        self.leave(Leave::Free);
    }
}

/// A received message. It stays valid (the producer cannot overwrite it) until dropped.
///
/// Derefs to the message bytes.
///
/// ```
/// use gpuring::{Consumer, Producer};
///
/// # let mut tx = Producer::builder("doc-consumer-read-slot").create()?;
/// # let rx = Consumer::open("doc-consumer-read-slot")?;
/// tx.send(b"frame", b"")?;
/// let msg = rx.recv()?; // the slot is held from here...
/// assert_eq!(&*msg, b"frame");
/// drop(msg); // ...to here; then the producer may reuse it
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// A message borrows its consumer, so it cannot outlive it:
///
/// ```compile_fail,E0505
/// # use gpuring::{Consumer, Producer};
/// # let mut tx = Producer::builder("doc-consumer-read-slot-outlive").create()?;
/// # let rx = Consumer::open("doc-consumer-read-slot-outlive")?;
/// # tx.send(b"frame", b"")?;
/// let msg = rx.recv()?;
/// drop(rx); // error: `rx` is still borrowed by `msg`
/// drop(msg);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct ReadSlot<'a> {
    consumer: &'a Consumer,
    /// Invariant: pinned by `consumer`, `len <= slot_size`.
    m: Pinned,
}

impl<'a> ReadSlot<'a> {
    /// Wraps message `m`, which `consumer` has just pinned and checked.
    #[cfg_attr(not(feature = "tokio"), allow(dead_code))]
    pub(crate) fn new(consumer: &'a Consumer, m: Pinned) -> ReadSlot<'a> {
        ReadSlot { consumer, m }
    }

    /// Sequence number: the count of messages the producer published before this one.
    ///
    /// ```
    /// # use gpuring::{Consumer, Producer};
    /// # let mut tx = Producer::builder("doc-consumer-seq").create()?;
    /// # let rx = Consumer::open("doc-consumer-seq")?;
    /// tx.send(b"a", b"")?;
    /// tx.send(b"b", b"")?;
    /// assert_eq!(rx.recv()?.seq(), 0);
    /// assert_eq!(rx.recv()?.seq(), 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn seq(&self) -> u64 {
        self.m.seq
    }

    /// CLOCK_MONOTONIC nanoseconds when the producer published it.
    ///
    /// ```
    /// # use gpuring::{Consumer, Producer};
    /// # let mut tx = Producer::builder("doc-consumer-timestamp").create()?;
    /// # let rx = Consumer::open("doc-consumer-timestamp")?;
    /// tx.send(b"frame", b"")?;
    /// let msg = rx.recv()?;
    /// let age_ns = gpuring::monotonic_ns() - msg.timestamp_ns();
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn timestamp_ns(&self) -> u64 {
        self.m.timestamp_ns
    }

    /// Messages this consumer lost (overwritten unread) just before this one.
    ///
    /// ```
    /// # use gpuring::{Consumer, Policy, Producer};
    /// # let mut tx =
    /// #     Producer::builder("doc-consumer-lag").capacity(2).policy(Policy::Overwrite).create()?;
    /// let rx = Consumer::open("doc-consumer-lag")?;
    /// for i in 0..5u8 {
    ///     tx.send(&[i], b"")?;
    /// }
    /// let msg = rx.recv()?;
    /// assert_eq!((msg.seq(), msg.lag()), (3, 3)); // messages 0, 1 and 2 were overwritten
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn lag(&self) -> u64 {
        self.m.lag
    }

    /// The user header, `user_header_size` bytes (zero-padded past what the producer wrote).
    ///
    /// ```
    /// # use gpuring::{Consumer, Producer};
    /// let mut tx = Producer::builder("doc-consumer-header").user_header_size(8).create()?;
    /// let rx = Consumer::open("doc-consumer-header")?;
    /// tx.send(b"frame", b"rgba")?;
    /// assert_eq!(rx.recv()?.header(), b"rgba\0\0\0\0");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn header(&self) -> &[u8] {
        let map = &self.consumer.map;
        // SAFETY: the slot is pinned, so no correct producer writes its user header until we
        // release it; the region is `user_header_size` bytes inside the mapping.
        unsafe { std::slice::from_raw_parts(map.user_header(self.m.slot), map.user_header_size()) }
    }

    /// Slot index (for diagnostics).
    ///
    /// ```
    /// # use gpuring::{Consumer, Producer};
    /// # let mut tx = Producer::builder("doc-consumer-slot").create()?;
    /// # let rx = Consumer::open("doc-consumer-slot")?;
    /// tx.send(b"frame", b"")?;
    /// let msg = rx.recv()?;
    /// assert!(msg.slot() < rx.capacity() as usize);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn slot(&self) -> usize {
        self.m.slot
    }
}

impl Deref for ReadSlot<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        let map = &self.consumer.map;
        // SAFETY: the slot is pinned (no correct producer writes it until release) and
        // len <= slot_size, checked when it was pinned, so the bytes lie in the slot's payload.
        unsafe { std::slice::from_raw_parts(map.payload(self.m.slot), self.m.len as usize) }
    }
}

impl Drop for ReadSlot<'_> {
    fn drop(&mut self) {
        self.consumer.release(self.m.slot);
    }
}

/// Receives until the producer disconnects. See [`Consumer::iter`].
///
/// ```
/// # use gpuring::{Consumer, Producer};
/// # let mut tx = Producer::builder("doc-consumer-iter-type").create()?;
/// # let rx = Consumer::open("doc-consumer-iter-type")?;
/// tx.send(b"frame", b"")?;
/// drop(tx); // the loop ends once the producer is gone and every message was received
/// for msg in &rx {
///     assert_eq!(&*msg, b"frame");
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Iter<'a> {
    consumer: &'a Consumer,
}

impl<'a> Iterator for Iter<'a> {
    type Item = ReadSlot<'a>;
    fn next(&mut self) -> Option<ReadSlot<'a>> {
        self.consumer.recv().ok()
    }
}

impl<'a> IntoIterator for &'a Consumer {
    type Item = ReadSlot<'a>;
    type IntoIter = Iter<'a>;
    fn into_iter(self) -> Iter<'a> {
        self.iter()
    }
}
