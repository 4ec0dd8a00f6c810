//! The producer: creates a ring, fills slots, publishes them. One type for every memory kind:
//! [`Producer<M>`] is the ring's producer state ([`ring`]) plus what memory kind `M` adds
//! ([`crate::memory`]).

#[cfg(feature = "tokio")]
mod asynch;
#[cfg(feature = "cuda")]
mod cuda;
mod loan;
mod ring;

use std::ops::{Deref, DerefMut};
use std::time::Duration;

#[cfg(feature = "cuda")]
pub use cuda::{GpuProducer, GpuWriteSlot};
pub use loan::Loan;
pub(crate) use ring::ProducerRing;

use crate::error::Fault;
use crate::error::{
    AcquireError, AcquireTimeoutError, Corruption, CreateError, CreateErrorKind, PublishError,
    SendError, TryAcquireError,
};
use crate::format::{Layout, MemoryKind, Params};
use crate::memory::{Closed, Host, Memory, ProducerSide, Readers, TxSettings};
use crate::ring::producer::{Claimed, Want};
use crate::ring::Policy;
use crate::shm::process::ProcessId;
use crate::shm::wait::{self, Deadline, WaitConfig};
use crate::shm::waiter::{block_on, Waiter};
use crate::stats::ConsumerInfo;

/// Spare buffers of a ring whose builder does not set them (see
/// [`ProducerBuilder::spare_buffers`]), where the ring's limits leave room for them.
///
/// ```
/// # use gpuring::{Producer, DEFAULT_SPARES};
/// let tx = Producer::builder("doc-default-spares").create()?;
/// assert_eq!(tx.spare_buffers(), DEFAULT_SPARES);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub const DEFAULT_SPARES: u32 = 8;

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
    /// `None`: [`DEFAULT_SPARES`], fewer where the ring's limits leave less room.
    spares: Option<u32>,
    pub(crate) slot_size: usize,
    user_header_size: u32,
    max_consumers: u32,
    policy: Policy,
    mode: u32,
    spin: Duration,
    liveness: Duration,
    /// The ring directory; `None`: [`crate::shm::default_dir`] when the ring is created.
    dir: Option<std::path::PathBuf>,
    /// What only some memory kinds read (CUDA: device, polling, fence).
    pub(crate) kind: TxSettings,
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

    /// Spare buffers: payload buffers beyond one per slot, which the producer swaps in when it
    /// laps a message that a consumer still holds, so that holding a message never makes it
    /// wait. Default 8: four consumers holding two messages each at any time (fewer where the
    /// limits below leave less room). With more consumers that hold messages, or consumers
    /// that hold many, raise it; each spare costs one slot's memory (`spare_buffers(0)` keeps a
    /// ring as small as before spares existed). When every spare is held too, the producer
    /// waits for a release. `capacity + spares` is at most 65536, and
    /// `(capacity + spares) x max_consumers` at most 2^20.
    ///
    /// ```
    /// # use gpuring::{Consumer, Policy, Producer};
    /// let mut tx = Producer::builder("doc-producer-spares")
    ///     .capacity(2)
    ///     .spare_buffers(1)
    ///     .policy(Policy::Overwrite)
    ///     .create()?;
    /// let rx = Consumer::open("doc-producer-spares")?;
    /// tx.send(b"held", b"")?;
    /// let held = rx.recv()?;
    /// for i in 0..10u8 {
    ///     tx.send(&[i], b"")?; // laps the held message: never waits for it
    /// }
    /// assert_eq!(&*held, b"held"); // still intact
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn spare_buffers(mut self, spares: u32) -> Self {
        self.spares = Some(spares);
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
    /// # use gpuring::{Consumer, OpenErrorKind, Producer};
    /// let tx = Producer::builder("doc-producer-max-consumers").max_consumers(1).create()?;
    /// let first = Consumer::open("doc-producer-max-consumers")?;
    /// let second = Consumer::open("doc-producer-max-consumers");
    /// assert!(matches!(second.err().unwrap().kind(), OpenErrorKind::TooManyConsumers { max: 1 }));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn max_consumers(mut self, n: u32) -> Self {
        self.max_consumers = n;
        self
    }

    /// The delivery mode of consumers that do not choose one ([`Policy::default_mode`]): what
    /// happens when the slowest of them is a full ring behind. Default [`Policy::Block`].
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

    /// The directory the ring lives in: its file and every socket of its. Default `/dev/shm`,
    /// or the directory the environment variable `GPURING_DIR` names. Consumers must look in
    /// the same directory (as they see it): for containers, a volume both share, ideally a
    /// tmpfs (a Kubernetes `emptyDir` with `medium: Memory`). See docs/guide.md, "Containers".
    ///
    /// ```
    /// # use gpuring::{Consumer, Producer};
    /// let dir = std::env::temp_dir().join(format!("doc-rings-{}", std::process::id()));
    /// std::fs::create_dir_all(&dir)?;
    /// let mut tx = Producer::builder("doc-producer-dir").dir(&dir).create()?;
    /// assert!(dir.join("gpuring.doc-producer-dir").exists());
    /// let rx = Consumer::builder("doc-producer-dir").dir(&dir).open()?;
    /// tx.send(b"hi", b"")?;
    /// assert_eq!(&*rx.recv()?, b"hi");
    /// # drop((rx, tx)); std::fs::remove_dir_all(&dir)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn dir(mut self, dir: impl Into<std::path::PathBuf>) -> Self {
        self.dir = Some(dir.into());
        self
    }

    /// The ring directory this builder creates the ring in.
    pub(crate) fn ring_dir(&self) -> std::path::PathBuf {
        self.dir.clone().unwrap_or_else(crate::shm::default_dir)
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

    /// Test support (feature `test-support`): a CUDA producer that does not wait for
    /// consumers' release events before reusing a slot, to show that the fence test catches
    /// torn frames. Never use it.
    ///
    /// ```
    /// # use gpuring::Producer;
    /// // `false` is the default.
    /// let builder = Producer::builder("doc-producer-unfenced").unfenced_for_tests(false);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[cfg(feature = "test-support")]
    #[doc(hidden)]
    pub fn unfenced_for_tests(mut self, unfenced: bool) -> Self {
        self.kind.unfenced = unfenced;
        self
    }

    pub(crate) fn params(&self, memory: MemoryKind) -> Result<Params, CreateErrorKind> {
        let bad = |field, reason| Err(CreateErrorKind::InvalidConfig { field, reason });
        if self.capacity == 0 || self.capacity > Params::MAX_CAPACITY {
            return bad("capacity", "must be 1..=65536");
        }
        if self.max_consumers == 0 || self.max_consumers > Params::MAX_CONSUMERS {
            return bad("max_consumers", "must be 1..=4096");
        }
        // Buffers the limits allow: in all, and per consumer (a hold record each).
        let room = (Params::MAX_BUFFERS as u64)
            .min(Params::MAX_SLOT_RECORDS / self.max_consumers as u64)
            .saturating_sub(self.capacity as u64);
        let spares = match self.spares {
            Some(n) if n as u64 > room => {
                return bad(
                    "spare_buffers",
                    "capacity + spare buffers must be at most 65536, and times max_consumers \
                     at most 2^20",
                );
            }
            Some(n) => n,
            None => DEFAULT_SPARES.min(room as u32),
        };
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
            spares,
            max_consumers: self.max_consumers,
            slot_size: self.slot_size as u64,
            user_header_size: self.user_header_size,
            policy: self.policy as u32,
            memory_kind: memory,
            producer_pid: me.pid,
            producer_start_time: me.start_time,
            epoch: new_epoch(me),
            producer_ns: crate::shm::ns::Namespaces::current().to_words(),
        };
        // Every field was checked above; this catches a combination they missed, which a
        // consumer would otherwise refuse (`Params::check` is what it runs).
        if let Err(Corruption::Field { field, .. }) = p.check() {
            return bad(field, "out of range for the ring's layout");
        }
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
    /// # use gpuring::{CreateErrorKind, MemoryKind, Producer};
    /// let tx = Producer::builder("doc-producer-create").create()?;
    /// assert_eq!(tx.memory(), MemoryKind::Host);
    /// // The name is taken while `tx` lives.
    /// let again = Producer::builder("doc-producer-create").create();
    /// assert!(matches!(again.err().unwrap().kind(), CreateErrorKind::AlreadyExists { .. }));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn create(self) -> Result<Producer<Host>, CreateError> {
        self.create_in()
    }

    /// Creates a ring of memory kind `M`: what [`create`](Self::create) does for [`Host`], and
    /// `create_gpu` for [`Cuda`](crate::Cuda) (on the device set with `device`, default 0). For
    /// code generic over the memory kind.
    ///
    /// ```
    /// use gpuring::{Host, Memory, Producer};
    ///
    /// fn make<M: Memory>(name: &str) -> Result<Producer<M>, gpuring::CreateError> {
    ///     Producer::builder(name).capacity(4).create_in::<M>()
    /// }
    /// let tx = make::<Host>("doc-producer-create-in")?;
    /// assert_eq!(tx.capacity(), 4);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn create_in<M: Memory>(self) -> Result<Producer<M>, CreateError> {
        let failed = |e| CreateError::in_dir(&self.name, &self.ring_dir(), e);
        crate::error::check_context().map_err(|l| failed(CreateErrorKind::ContextLost(l)))?;
        let prepare = || M::Tx::prepare(&self.kind);
        let init = |prepared, map: &_| M::Tx::create(prepared, &self.kind, map);
        let (ring, mem) = ProducerRing::build(&self, M::KIND, prepare, init)
            .map_err(|e| failed(crate::error::or_lost(e, CreateErrorKind::ContextLost)))?;
        Ok(Producer { ring, mem })
    }
}

/// A fresh instance id: time, pid and random bits, so that a restarted ring differs from its
/// predecessor (pids alone repeat across pid namespaces: every container's first process is 1).
fn new_epoch(me: ProcessId) -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Realtime);
    let mut random = [0u8; 8];
    let _ = rustix::rand::getrandom(&mut random, rustix::rand::GetRandomFlags::empty());
    let time = (t.tv_sec as u64).wrapping_mul(1_000_000_000).wrapping_add(t.tv_nsec as u64);
    (time ^ (me.pid as u64) ^ u64::from_ne_bytes(random)).max(1)
}

/// The single producer of a ring, in host memory ([`Host`], the default) or CUDA memory
/// ([`Cuda`](crate::Cuda), made by `ProducerBuilder::create_gpu`).
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
pub struct Producer<M: Memory = Host> {
    /// What memory kind `M` adds. Dropped before `ring`, while the segment is still mapped
    /// (CUDA unregisters its page-lock of the segment).
    mem: M::Tx,
    /// The ring's side: segment, protocol, waiting, reaping.
    ring: ProducerRing,
}

impl Producer<Host> {
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
            spares: None,
            slot_size: 64 * 1024,
            user_header_size: 64,
            max_consumers: 64,
            policy: Policy::Block,
            mode: 0o600,
            spin: Duration::from_micros(50),
            liveness: Duration::from_millis(100),
            dir: None,
            kind: TxSettings::default(),
        }
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
        self.check_fits(data)?;
        let slot = self.acquire_until(Deadline::Never, None).map_err(SendError::from)?;
        slot.send(data, header)
    }

    /// What `send` and `send_async` refuse before they wait for a slot: `data` larger than one.
    pub(crate) fn check_fits(&self, data: &[u8]) -> Result<(), SendError> {
        if data.len() > self.slot_size() {
            let e = PublishError::TooLong { len: data.len(), slot_size: self.slot_size() };
            return Err(SendError::Publish(e));
        }
        Ok(())
    }
}

impl WriteSlot<'_, Host> {
    /// The rest of `send` and `send_async`: copies `data` (checked to fit) in and publishes it.
    pub(crate) fn send(mut self, data: &[u8], header: &[u8]) -> Result<u64, SendError> {
        self[..data.len()].copy_from_slice(data);
        Ok(self.publish(data.len(), header)?)
    }
}

impl<M: Memory> Producer<M> {
    /// The ring's name.
    ///
    /// ```
    /// # use gpuring::Producer;
    /// let tx = Producer::builder("doc-producer-name").create()?;
    /// assert_eq!(tx.name(), "doc-producer-name");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn name(&self) -> &str {
        self.ring.name()
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
        self.ring.map().params().capacity
    }

    /// Spare buffers (see [`ProducerBuilder::spare_buffers`]).
    ///
    /// ```
    /// # use gpuring::Producer;
    /// let tx = Producer::builder("doc-producer-spares-get").create()?;
    /// assert_eq!(tx.spare_buffers(), 8); // the default
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn spare_buffers(&self) -> u32 {
        self.ring.map().params().spares
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
        self.ring.map().slot_size()
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
        self.ring.map().user_header_size()
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
        self.ring.map().policy()
    }

    /// Declares `n` messages lost before the next one this producer publishes: for a producer
    /// that relays a stream (a network bridge, a capture card's dropped frames) and knows of a
    /// gap upstream. Every consumer counts them in the [`lag`](crate::ReadSlot::lag) of that
    /// message (or of its next message, if it skips that one), as if the ring had lost them.
    ///
    /// ```
    /// # use gpuring::{Consumer, Producer};
    /// let mut tx = Producer::builder("doc-producer-declare-lost").create()?;
    /// let rx = Consumer::open("doc-producer-declare-lost")?;
    /// tx.send(b"frame 1", b"")?;
    /// tx.declare_lost(3); // frames 2 to 4 never arrived
    /// tx.send(b"frame 5", b"")?;
    /// assert_eq!(rx.recv()?.lag(), 0);
    /// assert_eq!(rx.recv()?.lag(), 3);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn declare_lost(&mut self, n: u64) {
        self.ring.declare_lost(n);
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
        self.ring.published()
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
        crate::stats::consumer_count(&self.ring.map().ring())
    }

    /// Waits until at least `n` consumers have joined (consumers found dead meanwhile are
    /// reaped and do not count), or `timeout` passes. Messages sent before a consumer joins
    /// never reach it: a lossless job starts its consumers first and waits for them here
    /// (README, "Startup order"). Returns how many had joined; a wait in a process whose GPU
    /// context is lost ends with [`WaitForConsumersError::ContextLost`](crate::WaitForConsumersError).
    ///
    /// ```
    /// # use gpuring::{Consumer, Producer};
    /// # use std::time::Duration;
    /// let mut tx = Producer::builder("doc-producer-wait-for-consumers").create()?;
    /// let rx = Consumer::open("doc-producer-wait-for-consumers")?; // another process, usually
    /// assert_eq!(tx.wait_for_consumers(1, Duration::from_secs(10))?, 1);
    /// tx.send(b"first", b"")?; // rx receives it
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn wait_for_consumers(
        &mut self,
        n: usize,
        timeout: Duration,
    ) -> Result<usize, crate::WaitForConsumersError> {
        use crate::WaitForConsumersError as E;
        let cfg = self.ring.wait_config();
        // Take out consumers already dead first: one that joined and died must not count.
        let _ = self.reap();
        let joined = wait::wait_until(None, cfg, Deadline::after(timeout), |tick| {
            // A producer that only waits makes no GPU call: it must still learn that its
            // context was lost (see `crate::context_lost`; at most one probe per 50 ms).
            if let Some(lost) = crate::context_lost() {
                return Some(Err(E::ContextLost(lost)));
            }
            if tick {
                // A consumer that died after joining must not count.
                let _ = self.reap();
            }
            let joined = self.consumer_count();
            (joined >= n).then_some(Ok(joined))
        });
        let timeout =
            || E::Timeout(crate::ConsumersTimeout { joined: self.consumer_count(), wanted: n });
        joined.unwrap_or_else(|| Err(timeout()))
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
        let map = self.ring.map();
        crate::stats::consumers(map.segment(), &map.ring())
    }

    /// Buffers that some consumer holds now. Once every consumer has released what it received
    /// (or died and was reaped), this is 0: a buffer still counted then has leaked.
    ///
    /// ```
    /// # use gpuring::{Consumer, Producer};
    /// # let mut tx = Producer::builder("doc-producer-held-slots").create()?;
    /// # let rx = Consumer::open("doc-producer-held-slots")?;
    /// tx.send(b"frame", b"")?;
    /// let msg = rx.recv()?;
    /// assert_eq!(tx.held_buffers(), 1);
    /// drop(msg);
    /// assert_eq!(tx.held_buffers(), 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn held_buffers(&self) -> usize {
        crate::stats::held_buffers(&self.ring.map().ring())
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
        self.ring.map().params().epoch
    }

    /// The memory kind: `M::KIND`.
    ///
    /// ```
    /// # use gpuring::{MemoryKind, Producer};
    /// let tx = Producer::builder("doc-producer-memory").create()?;
    /// assert_eq!(tx.memory(), MemoryKind::Host);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn memory(&self) -> MemoryKind {
        M::KIND
    }

    /// Reclaims every consumer whose process died: its held slots come back, it stops gating
    /// the producer and its table entry is freed. Returns how many entries were freed.
    /// `acquire` does this by itself once per liveness interval and whenever a consumer joins or
    /// leaves.
    ///
    /// ```
    /// # use gpuring::{Consumer, Producer};
    /// let mut tx = Producer::builder("doc-producer-reap").create()?;
    /// let rx = Consumer::open("doc-producer-reap")?;
    /// assert_eq!(tx.reap()?, 0); // `rx` is alive
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn reap(&mut self) -> Result<usize, Corruption> {
        let Producer { ring, mem } = self;
        Ok(ring.reap_with(&mut |e, g| mem.forget(e, g))?.freed as usize)
    }

    /// A slot for the next message, if one is free now. In a CUDA ring, a slot whose previous
    /// readers are still reading it on their GPUs is not free: the next acquire picks up where
    /// this one stopped.
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
    pub fn try_acquire(&mut self) -> Result<WriteSlot<'_, M>, TryAcquireError> {
        Ok(self.acquire_until(Deadline::Now, None)?)
    }

    /// A slot for the next message, waiting as long as it takes (under `Block`, for the slowest
    /// consumer; under both policies, for consumers that hold the slot, and in a CUDA ring for
    /// their GPU reads of it).
    ///
    /// ```
    /// # use gpuring::Producer;
    /// let mut tx = Producer::builder("doc-producer-acquire").create()?;
    /// let mut slot = tx.acquire()?;
    /// slot[..5].copy_from_slice(b"hello");
    /// assert_eq!(slot.publish(5, b"")?, 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn acquire(&mut self) -> Result<WriteSlot<'_, M>, AcquireError> {
        Ok(self.acquire_until(Deadline::Never, None)?)
    }

    /// A slot for the next message, waiting at most `timeout`. After `Timeout` the next acquire
    /// picks up where this one stopped.
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
    ) -> Result<WriteSlot<'_, M>, AcquireTimeoutError> {
        Ok(self.acquire_until(Deadline::after(timeout), None)?)
    }

    /// The one acquire (`acquire_start`, then `acquire_finish` if it must wait) on this
    /// thread, until `deadline`; the slot is written on `stream` (or the memory kind's own).
    pub(crate) fn acquire_until<'a>(
        &'a mut self,
        deadline: Deadline,
        stream: Option<&'a <M::Tx as ProducerSide>::Stream>,
    ) -> Result<WriteSlot<'a, M>, Fault> {
        // The steady state makes no future at all: only a wait runs one (on this thread).
        let buffer = match self.acquire_start()? {
            Acquiring::Done(buffer) => buffer,
            started => block_on(self.acquire_finish(Waiter::Blocking(deadline), started))?,
        };
        Ok(WriteSlot::new(self, buffer, stream))
    }

    /// The one acquire, awaited (the blocking one runs the same two parts, `acquire_start`
    /// and `acquire_finish`, in `acquire_until`): waits for the payload's write of the
    /// message one lap back to be done (the run-ahead bound), claims a buffer, waits for the
    /// buffer's previous write and its readers, and returns the buffer. See docs/gpu.md,
    /// "Run-ahead" and "Reusing a buffer".
    #[cfg(feature = "tokio")]
    pub(crate) async fn acquire_with(&mut self, how: Waiter) -> Result<usize, Fault> {
        match self.acquire_start()? {
            Acquiring::Done(buffer) => Ok(buffer),
            started => self.acquire_finish(how, started).await,
        }
    }

    /// The acquire as far as it goes without a wait: the steady state of a ring whose
    /// consumers keep up ends here, with `Done`; otherwise it says where the wait begins.
    fn acquire_start(&mut self) -> Result<Acquiring, Fault> {
        crate::error::check_context()?;
        let lapped = self.ring.lapped_buffer();
        if let Some(buffer) = lapped {
            if !self.written(buffer)? {
                return Ok(Acquiring::Lapped(buffer));
            }
        }
        let Some(claimed) = self.take_now(Want::Next) else {
            return Ok(Acquiring::Take(lapped));
        };
        let claimed = claimed?;
        if self.settled(claimed, lapped)? {
            return Ok(Acquiring::Done(claimed.buffer));
        }
        Ok(Acquiring::Settle(claimed, lapped))
    }

    /// The rest of an acquire from where [`acquire_start`](Self::acquire_start) stopped, each
    /// wait entered only when its condition is not met at once.
    async fn acquire_finish(&mut self, how: Waiter, from: Acquiring) -> Result<usize, Fault> {
        let (claimed, lapped) = match from {
            Acquiring::Done(buffer) => return Ok(buffer),
            Acquiring::Settle(claimed, lapped) => {
                // `acquire_start` found it unsettled: straight to the waits.
                self.settle(how, claimed, lapped).await?;
                return Ok(claimed.buffer);
            }
            Acquiring::Lapped(buffer) => {
                self.poll(how, |p| p.written(buffer)).await?;
                (self.take_with(how, Want::Next).await?, Some(buffer))
            }
            Acquiring::Take(lapped) => (self.take_with(how, Want::Next).await?, lapped),
        };
        if !self.settled(claimed, lapped)? {
            self.settle(how, claimed, lapped).await?;
        }
        Ok(claimed.buffer)
    }

    /// A take's first try, which never waits: `None` if it must (see `ProducerRing::
    /// claim_now`).
    pub(crate) fn take_now(&mut self, want: Want) -> Option<Result<Claimed, Fault>> {
        let Producer { ring, mem } = &mut *self;
        ring.claim_now(want, &mut |e, g| mem.forget(e, g))
    }

    /// Takes a buffer for what `want` says, waiting as `how` says while none is free (or, for
    /// an adoption, while the `Lossless` gate is shut).
    pub(crate) async fn take_with(&mut self, how: Waiter, want: Want) -> Result<Claimed, Fault> {
        if let Some(claimed) = self.take_now(want) {
            return claimed;
        }
        let Producer { ring, mem } = &mut *self;
        ring.claim_wait(how, want, &mut |e, g| mem.forget(e, g)).await
    }

    /// Whether buffer `claimed` may be written now, with no wait (see
    /// [`settle`](Self::settle)).
    fn settled(&mut self, claimed: Claimed, lapped: Option<usize>) -> Result<bool, Fault> {
        let buffer = claimed.buffer;
        let Some(prev) = claimed.prev else { return Ok(true) };
        Ok((lapped == Some(buffer) || self.written(buffer)?) && self.readers_done(buffer, prev)?)
    }

    /// Waits until buffer `claimed` may be written: its previous write is done (unless it is
    /// `lapped`, the buffer whose write was waited for already) and the readers of the message
    /// it carried are done with it.
    pub(crate) async fn settle(
        &mut self,
        how: Waiter,
        claimed: Claimed,
        lapped: Option<usize>,
    ) -> Result<(), Fault> {
        let buffer = claimed.buffer;
        if let Some(prev) = claimed.prev {
            if lapped != Some(buffer) && !self.written(buffer)? {
                self.poll(how, |p| p.written(buffer)).await?;
            }
            if !self.readers_done(buffer, prev)? {
                self.poll(how, |p| p.readers_done(buffer, prev)).await?;
            }
        }
        Ok(())
    }

    /// Whether the payload's last write of `buffer` is done, as the memory kind tells.
    fn written(&mut self, buffer: usize) -> Result<bool, Fault> {
        self.mem.written(self.ring.map(), buffer)
    }

    /// Whether the readers of message `prev` in `buffer` are done with it, as the memory kind
    /// tells; a consumer it names as failed is evicted, and the others are asked about again.
    /// Each eviction takes an entry out or finds it changed hands, so a table's worth of them
    /// ends the asking; past that (a damaged table), the caller's wait asks again later.
    fn readers_done(&mut self, buffer: usize, prev: u64) -> Result<bool, Fault> {
        for _ in 0..=self.ring.map().params().max_consumers {
            match self.mem.readers_done(self.ring.map(), buffer, prev)? {
                Readers::Done => return Ok(true),
                Readers::Busy => return Ok(false),
                Readers::Evict { entry, seen, reason } => {
                    self.ring.evict(entry, seen, reason);
                }
            }
        }
        Ok(false)
    }

    /// Polls `done` until it says yes (or a blocking wait's deadline passes: `Blocked`),
    /// reaping the consumer table once per liveness interval meanwhile (dead consumers are
    /// noticed, retiring ones let go), with no waker (nobody wakes a producer for a GPU event),
    /// spinning for the memory kind's spin time first.
    async fn poll(
        &mut self,
        how: Waiter,
        mut done: impl FnMut(&mut Self) -> Result<bool, Fault>,
    ) -> Result<(), Fault> {
        // A wait that polls memory words makes no GPU call: it must still learn that its
        // context was lost (see `crate::context_lost`), at its start (a loop of short waits
        // may never reach a tick) and at each tick.
        if let Some(lost) = crate::context_lost() {
            return Err(Fault::ContextLost(lost));
        }
        let config = WaitConfig { spin: self.mem.spin(), ..self.ring.wait_config() };
        let step = |tick| {
            if tick {
                if let Some(lost) = crate::context_lost() {
                    return Some(Err(Fault::ContextLost(lost)));
                }
                if let Err(c) = self.reap() {
                    return Some(Err(Fault::Corrupt(c)));
                }
            }
            match done(self) {
                Ok(false) => None,
                Ok(true) => Some(Ok(())),
                Err(e) => Some(Err(e)),
            }
        };
        how.wait(None, config, step).await.unwrap_or(Err(Fault::Blocked))
    }

    /// The ring's side and the memory kind's, borrowed at once.
    #[cfg(feature = "cuda")]
    pub(crate) fn parts(&mut self) -> (&mut ProducerRing, &mut M::Tx) {
        (&mut self.ring, &mut self.mem)
    }

    /// The memory kind's side.
    #[cfg(feature = "cuda")]
    pub(crate) fn mem(&self) -> &M::Tx {
        &self.mem
    }
}

impl<M: Memory> Producer<M> {
    /// Closes the ring as cut: consumers receive what was published, then `Disconnected`, and
    /// [`Consumer::ended`](crate::Consumer::ended) tells them
    /// [`Ended::Died`](crate::Ended::Died), not `Closed`: for a job that failed part-way, so
    /// that a recorder does not take its output for complete. (A panic that unwinds through
    /// a producer does the same; dropping it otherwise closes the ring as complete.)
    ///
    /// ```
    /// use gpuring::{Consumer, Ended, Producer};
    ///
    /// let mut tx = Producer::builder("doc-producer-abort").create()?;
    /// let rx = Consumer::open("doc-producer-abort")?;
    /// tx.send(b"part 1", b"")?;
    /// tx.abort(); // the job failed
    /// assert_eq!(&*rx.recv()?, b"part 1");
    /// assert!(rx.recv().is_err());
    /// assert_eq!(rx.ended(), Some(Ended::Died));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn abort(mut self) {
        self.ring.mark_cut();
    }
}

/// Shows the ring it writes.
///
/// ```
/// let tx = gpuring::Producer::builder("doc-producer-debug").create()?;
/// assert!(format!("{tx:?}").starts_with("Producer { ring: \"doc-producer-debug\""));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
impl<M: Memory> std::fmt::Debug for Producer<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Producer")
            .field("ring", &self.name())
            .field("memory", &self.memory())
            .field("capacity", &self.capacity())
            .field("epoch", &self.epoch())
            .finish_non_exhaustive()
    }
}

/// Closes the ring. A memory kind whose consumers map memory of the producer's (CUDA) is given
/// time for them to leave, then lets go of that memory: freed, or left to process exit while
/// someone may still use it, and the producer then stays alive to consumers until it exits.
impl<M: Memory> Drop for Producer<M> {
    fn drop(&mut self) {
        let Producer { ring, mem } = self;
        ring.close();
        let Some(linger) = mem.linger() else { return };
        // A producer whose context is lost is dead to its consumers (`CLOSED_LOST`): it does
        // not wait for them, and its memory kind leaves everything to process exit.
        let lost = crate::context_lost().is_some();
        let all_left = !lost && ring.linger(linger, &mut |e, g| mem.forget(e, g));
        let closed = mem.close(ring.map(), all_left);
        // Whoever still retires may destroy what it exported once the memory kind dropped what
        // it opened of it (its close did; telling it again costs nothing): let them all go.
        let _ = ring.reap_with(&mut |e, g| mem.forget(e, g));
        if closed == Closed::Kept {
            ring.keep_presence_until_exit();
        }
    }
}

/// Where an acquire stands after its first, waitless part (`Producer::acquire_start`).
#[derive(Clone, Copy)]
enum Acquiring {
    /// Buffer claimed and free to write.
    Done(usize),
    /// The payload write of the message one lap back (in this buffer) is not done yet.
    Lapped(usize),
    /// No buffer is free; the lapped buffer, if any, was written.
    Take(Option<usize>),
    /// Claimed, but its previous write or readers are not done yet; the lapped buffer.
    Settle(Claimed, Option<usize>),
}

/// A claimed slot: fill it, then [`publish`](WriteSlot::publish) it. Dropping it unpublished keeps
/// it claimed; the next acquire returns the same slot.
///
/// In host memory it derefs to the slot's whole payload buffer (`slot_size` bytes); in CUDA
/// memory it gives the device pointer and the stream to write it on.
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
pub struct WriteSlot<'a, M: Memory = Host> {
    producer: &'a mut Producer<M>,
    /// Invariant: claimed by `producer` and not yet published.
    slot: usize,
    /// The stream it is written on, if not the memory kind's own (CUDA: `acquire_on`).
    stream: Option<&'a <M::Tx as ProducerSide>::Stream>,
}

impl<'a, M: Memory> WriteSlot<'a, M> {
    /// Wraps buffer `slot`, which `producer` has just claimed (and waited for), to be written
    /// on `stream` (or the memory kind's own).
    pub(crate) fn new(
        producer: &'a mut Producer<M>,
        slot: usize,
        stream: Option<&'a <M::Tx as ProducerSide>::Stream>,
    ) -> WriteSlot<'a, M> {
        WriteSlot { producer, slot, stream }
    }

    /// Its producer, slot index and stream (for the memory kinds' own methods).
    #[cfg(feature = "cuda")]
    pub(crate) fn parts(
        &self,
    ) -> (&Producer<M>, usize, Option<&'a <M::Tx as ProducerSide>::Stream>) {
        (self.producer, self.slot, self.stream)
    }

    /// Where the slot's bytes are: a device address (`CUdeviceptr`, aligned to
    /// [`SLOT_ALIGN`](crate::memory::SLOT_ALIGN)) in a CUDA ring, their address in this process in
    /// a host ring (where [`DerefMut`] gives them as a slice).
    ///
    /// ```
    /// # use gpuring::Producer;
    /// let mut tx = Producer::builder("doc-producer-write-slot-ptr").create()?;
    /// let mut slot = tx.acquire()?;
    /// assert_eq!(slot.ptr(), slot.as_mut_ptr() as u64);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn ptr(&self) -> u64 {
        let Producer { ring, mem } = &*self.producer;
        mem.buffer_addr(ring.map(), self.slot)
    }

    /// The index of the buffer being written (for diagnostics): one of the ring's
    /// `capacity + spare_buffers` buffers. While nobody holds a message, message `s` goes to
    /// buffer `s % capacity`; a spare takes the place of a held one.
    ///
    /// ```
    /// # use gpuring::Producer;
    /// let mut tx = Producer::builder("doc-producer-write-slot-slot").capacity(4).create()?;
    /// tx.send(b"first", b"")?;
    /// assert_eq!(tx.acquire()?.buffer(), 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn buffer(&self) -> usize {
        self.slot
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
        self.producer.ring.published()
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
        let slot_size = self.producer.slot_size();
        if len > slot_size {
            return Err(PublishError::TooLong { len, slot_size });
        }
        self.publish_at(None, len as u64, header)
    }

    /// Publishes message `len` at `at` (a pool and an offset; `None`: the slot's own buffer),
    /// whose length the caller checked: the memory kind's records first (fences, descriptor),
    /// then the ring's.
    pub(crate) fn publish_at(
        self,
        at: Option<(u32, u64)>,
        len: u64,
        header: &[u8],
    ) -> Result<u64, PublishError> {
        crate::error::check_context()?;
        let Producer { ring, mem } = self.producer;
        let max = ring.map().user_header_size();
        if header.len() > max {
            return Err(PublishError::HeaderTooLong { len: header.len(), max });
        }
        let seq = ring.published();
        mem.publish(ring.map(), self.slot, seq, at, self.stream)?;
        ring.publish_claimed(self.slot, seq, len, header);
        Ok(seq)
    }
}

impl Deref for WriteSlot<'_, Host> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        let map = self.producer.ring.map();
        // SAFETY: the slot is claimed by us (no correct peer writes it) and lies in the mapping.
        unsafe { std::slice::from_raw_parts(map.payload(self.slot), map.slot_size()) }
    }
}

impl DerefMut for WriteSlot<'_, Host> {
    fn deref_mut(&mut self) -> &mut [u8] {
        let map = self.producer.ring.map();
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
