//! The consumer: opens a ring, receives messages, releases them on drop. One type for every
//! memory kind: [`Consumer<M>`] is the ring's consumer state ([`ring`]) plus what memory kind
//! `M` adds ([`crate::memory`]).

#[cfg(feature = "tokio")]
mod asynch;
#[cfg(feature = "cuda")]
mod cuda;
mod event_loop;
mod ring;

use std::ops::Deref;
use std::time::{Duration, Instant};

#[cfg(feature = "tokio")]
pub use asynch::Messages;
#[cfg(feature = "cuda")]
pub use cuda::{GpuConsumer, GpuReadSlot};
pub(crate) use ring::ConsumerRing;

use crate::error::Fault;
use crate::error::{OpenError, OpenErrorKind, RecvError, RecvTimeoutError, TryRecvError};
use crate::format::MemoryKind;
use crate::memory::{ConsumerSide, Host, Member, Memory, Quiesced, RxSettings};
use crate::ring::{Leave, Mode, Pinned, Policy, StartAt};
use crate::shm::wait::Deadline;

/// How often a waiting open looks again for the ring.
pub(crate) const OPEN_RETRY: Duration = Duration::from_millis(5);

/// One try of a waiting open that did not give a consumer.
pub(crate) enum Attempt {
    /// An error to return at once.
    Failed(OpenErrorKind),
    /// Not there or not ready yet; the error to give if the wait ends now.
    NotYet(OpenErrorKind),
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
    /// `None`: the ring's policy's default mode.
    mode: Option<Mode>,
    allow_foreign_owner: bool,
    spin: Duration,
    liveness: Duration,
    /// The ring directory; `None`: [`crate::shm::default_dir`] when the ring is opened.
    dir: Option<std::path::PathBuf>,
    /// What only some memory kinds read (CUDA: device, polling).
    pub(crate) kind: RxSettings,
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

    /// How this consumer receives: [`Mode::Lossless`], [`Mode::Queue`] or [`Mode::Latest`].
    /// Default: the ring's policy's mode ([`Policy::default_mode`]). Consumers of different modes
    /// share one ring: a lossless recorder and live `Latest` inference consumers, say.
    ///
    /// ```
    /// # use gpuring::{Consumer, Mode, Policy, Producer};
    /// let mut tx = Producer::builder("doc-consumer-mode").policy(Policy::Overwrite).create()?;
    /// let rx = Consumer::builder("doc-consumer-mode").mode(Mode::Latest).open()?;
    /// for i in 0..5u8 {
    ///     tx.send(&[i], b"")?;
    /// }
    /// let newest = rx.recv()?;
    /// assert_eq!((&*newest, newest.lag()), (&[4u8][..], 4)); // skipped 0..=3
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn mode(mut self, mode: Mode) -> Self {
        self.mode = Some(mode);
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

    /// The directory to find the ring in, as this process sees it: the producer's
    /// ([`ProducerBuilder::dir`](crate::ProducerBuilder::dir)). Default `/dev/shm`, or the
    /// directory the environment variable `GPURING_DIR` names.
    ///
    /// ```
    /// # use gpuring::{Consumer, OpenErrorKind, Producer};
    /// let dir = std::env::temp_dir().join(format!("doc-rings-rx-{}", std::process::id()));
    /// std::fs::create_dir_all(&dir)?;
    /// let tx = Producer::builder("doc-consumer-dir").dir(&dir).create()?;
    /// let rx = Consumer::builder("doc-consumer-dir").dir(&dir).open()?;
    /// // Not in the default directory.
    /// let elsewhere = Consumer::builder("doc-consumer-dir").dir("/dev/shm").open();
    /// assert!(matches!(elsewhere.unwrap_err().kind(), OpenErrorKind::NotFound));
    /// # drop((rx, tx)); std::fs::remove_dir_all(&dir)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn dir(mut self, dir: impl Into<std::path::PathBuf>) -> Self {
        self.dir = Some(dir.into());
        self
    }

    /// The ring directory this builder opens the ring in.
    pub(crate) fn ring_dir(&self) -> std::path::PathBuf {
        self.dir.clone().unwrap_or_else(crate::shm::default_dir)
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

    /// Opens the ring, waiting up to `timeout` for it to appear and be ready, and ends the
    /// builder, like [`open`](Self::open): an operation with a timeout, as
    /// [`TcpStream::connect_timeout`](std::net::TcpStream::connect_timeout) is, not a setting.
    /// For a consumer started before its producer. Gives [`OpenErrorKind::NotFound`] if no ring
    /// of this name appeared, [`OpenErrorKind::TimedOut`] if one appeared but was not ready in
    /// time, [`OpenErrorKind::Disconnected`] if its producer died; other errors at once.
    ///
    /// ```
    /// # use gpuring::{Consumer, OpenErrorKind, Producer};
    /// # use std::time::Duration;
    /// # let tx = Producer::builder("doc-consumer-open-timeout").create()?;
    /// let rx = Consumer::builder("doc-consumer-open-timeout").open_timeout(Duration::from_secs(5))?;
    /// let absent = Consumer::builder("doc-consumer-never-made").open_timeout(Duration::from_millis(20));
    /// assert!(matches!(absent.err().unwrap().kind(), OpenErrorKind::NotFound));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// It returns the consumer, so nothing follows it in the builder chain:
    ///
    /// ```compile_fail,E0599
    /// # use std::time::Duration;
    /// let rx = gpuring::Consumer::builder("cam0").open_timeout(Duration::from_secs(5)).open();
    /// ```
    pub fn open_timeout(self, timeout: Duration) -> Result<Consumer, OpenError> {
        self.open_in_when_ready(None, timeout)
    }

    /// Opens a ring of memory kind `M` (see [`open_in`](Self::open_in)), waiting up to
    /// `timeout` for it to appear and be ready, and ends the builder: what
    /// [`open_timeout`](Self::open_timeout) does for a host ring.
    ///
    /// ```
    /// # use gpuring::{Consumer, Host, Producer};
    /// # use std::time::Duration;
    /// # let tx = Producer::builder("doc-consumer-open-in-timeout").create()?;
    /// let b = Consumer::builder("doc-consumer-open-in-timeout");
    /// let rx = b.open_in_timeout::<Host>(Duration::from_secs(5))?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn open_in_timeout<M: Memory>(self, timeout: Duration) -> Result<Consumer<M>, OpenError> {
        self.open_in_when_ready(None, timeout)
    }

    /// Opens the ring, waiting up to `timeout` for it to appear and be ready, and ends the
    /// builder, as [`open_timeout`](Self::open_timeout) does, but skipping the instance whose
    /// epoch is `not_epoch`: after the producer of epoch `not_epoch` died, this waits for the
    /// next producer of the same name ([`Consumer::reconnect`] uses it). With `None`, the same
    /// as `open_timeout`. If only that old instance is seen until `timeout`:
    /// [`OpenErrorKind::Disconnected`].
    ///
    /// ```
    /// # use gpuring::{Consumer, OpenErrorKind, Producer};
    /// # use std::time::Duration;
    /// # let tx = Producer::builder("doc-consumer-open-when-ready").create()?;
    /// let ready = Consumer::builder("doc-consumer-open-when-ready");
    /// let rx = ready.open_when_ready(None, Duration::from_secs(5))?; // the ring exists: no wait
    /// let absent = Consumer::builder("doc-consumer-never-created");
    /// let r = absent.open_when_ready(None, Duration::from_millis(20));
    /// assert!(matches!(r.err().unwrap().kind(), OpenErrorKind::NotFound));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn open_when_ready(
        self,
        not_epoch: Option<u64>,
        timeout: Duration,
    ) -> Result<Consumer, OpenError> {
        self.open_in_when_ready(not_epoch, timeout)
    }

    /// Opens a ring of memory kind `M` (see [`open_in`](Self::open_in)), waiting up to
    /// `timeout` for an instance other than `not_epoch` to appear and be ready, and ends the
    /// builder: what [`open_when_ready`](Self::open_when_ready) does for a host ring.
    ///
    /// ```
    /// # use gpuring::{Consumer, Host, Producer};
    /// # use std::time::Duration;
    /// # let tx = Producer::builder("doc-consumer-open-in-when-ready").create()?;
    /// let b = Consumer::builder("doc-consumer-open-in-when-ready");
    /// let rx = b.open_in_when_ready::<Host>(None, Duration::from_secs(5))?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn open_in_when_ready<M: Memory>(
        self,
        not_epoch: Option<u64>,
        timeout: Duration,
    ) -> Result<Consumer<M>, OpenError> {
        // None: a timeout past the clock's range waits as long as it takes.
        let deadline = Instant::now().checked_add(timeout);
        loop {
            let not_yet = match self.try_open_once::<M>(not_epoch) {
                Ok(c) => return Ok(c),
                Err(Attempt::Failed(e)) => return Err(self.failed(e)),
                Err(Attempt::NotYet(why)) => why,
            };
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Err(self.failed(not_yet));
            }
            std::thread::sleep(OPEN_RETRY);
        }
    }

    /// One try of a waiting open: the consumer, an error to return, or (`NotYet`) the error
    /// to give if the wait ends now.
    pub(crate) fn try_open_once<M: Memory>(
        &self,
        not_epoch: Option<u64>,
    ) -> Result<Consumer<M>, Attempt> {
        // A process that waits for a producer makes no GPU call: it must still learn that its
        // context was lost meanwhile (under MPS a faulted client that lingers keeps the new
        // producer from getting a context).
        if let Some(l) = crate::context_lost() {
            return Err(Attempt::Failed(OpenErrorKind::ContextLost(l)));
        }
        match self.open_kind::<M>() {
            Ok(c) if not_epoch.is_some_and(|e| e == c.epoch()) => {
                Err(Attempt::NotYet(OpenErrorKind::Disconnected))
            }
            Ok(c) => Ok(c),
            // Not there yet, or the old instance (its producer dead).
            Err(e @ (OpenErrorKind::NotFound | OpenErrorKind::Disconnected)) => {
                Err(Attempt::NotYet(e))
            }
            // Half-built: between the producer's shm_open and ftruncate, or before its magic.
            Err(OpenErrorKind::NotInitialized | OpenErrorKind::Truncated { .. }) => {
                Err(Attempt::NotYet(OpenErrorKind::TimedOut))
            }
            Err(e) => Err(Attempt::Failed(e)),
        }
    }

    /// Opens a host-memory ring and joins it. A CUDA ring is refused with
    /// [`OpenErrorKind::WrongMemory`]; open it with `open_gpu`.
    ///
    /// ```
    /// # use gpuring::{Consumer, OpenErrorKind, Producer};
    /// # let tx = Producer::builder("doc-consumer-builder-open").create()?;
    /// let rx = Consumer::builder("doc-consumer-builder-open").open()?;
    /// let absent = Consumer::builder("doc-consumer-not-created").open();
    /// assert!(matches!(absent.err().unwrap().kind(), OpenErrorKind::NotFound));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn open(self) -> Result<Consumer, OpenError> {
        self.open_in()
    }

    /// Opens a ring of memory kind `M` and joins it: what [`open`](Self::open) does for
    /// [`Host`], and `open_gpu` for [`Cuda`](crate::Cuda). A ring of another kind is refused
    /// with [`OpenErrorKind::WrongMemory`]. For code generic over the memory kind.
    ///
    /// ```
    /// use gpuring::{Consumer, Host, Memory, Producer};
    ///
    /// fn join<M: Memory>(name: &str) -> Result<Consumer<M>, gpuring::OpenError> {
    ///     Consumer::builder(name).open_in::<M>()
    /// }
    /// let tx = Producer::builder("doc-consumer-open-in").create()?;
    /// let rx = join::<Host>("doc-consumer-open-in")?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn open_in<M: Memory>(self) -> Result<Consumer<M>, OpenError> {
        self.open_kind().map_err(|e| self.failed(e))
    }

    /// [`open_in`](Self::open_in), failing with what went wrong only.
    fn open_kind<M: Memory>(&self) -> Result<Consumer<M>, OpenErrorKind> {
        crate::error::check_context().map_err(OpenErrorKind::ContextLost)?;
        let settings = self.kind;
        let closing_frees = M::Rx::MAPS_PRODUCER_MEMORY;
        let (ring, mem) =
            ConsumerRing::open(self, M::KIND, closing_frees, |map, entry, generation| {
                M::Rx::join(&settings, map, Member { entry, generation })
            })
            .map_err(|e| crate::error::or_lost(e, OpenErrorKind::ContextLost))?;
        Ok(Consumer { ring, mem })
    }

    /// Opening this ring failed with `kind`.
    pub(crate) fn failed(&self, kind: OpenErrorKind) -> OpenError {
        OpenError::in_dir(&self.name, &self.ring_dir(), kind)
    }
}

/// One consumer of a ring, in host memory ([`Host`], the default) or CUDA memory
/// ([`Cuda`](crate::Cuda), opened by `ConsumerBuilder::open_gpu`). Every consumer receives
/// every message (unless it lags under [`Policy::Overwrite`]).
///
/// `recv` takes `&self`, so one consumer may hold several messages at once. A consumer is
/// `Send` and `Sync`: threads and tasks may share one (each message goes to one of them), and
/// a message may be released on any thread.
///
/// Dropping it leaves the ring: its table entry is freed and it no longer holds the producer
/// back.
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
/// Threads may share one; each message goes to one of them, and a message received on one
/// thread may be dropped (released) on another:
///
/// ```
/// # use gpuring::{Consumer, Producer};
/// let mut tx = Producer::builder("doc-consumer-sync").capacity(8).create()?;
/// let rx = Consumer::open("doc-consumer-sync")?;
/// for i in 0..6u8 {
///     tx.send(&[i], b"")?;
/// }
/// drop(tx);
/// let (rx, got) = (&rx, std::sync::Mutex::new(Vec::new()));
/// std::thread::scope(|s| {
///     for _ in 0..3 {
///         s.spawn(|| {
///             while let Ok(m) = rx.recv() {
///                 got.lock().unwrap().push(m[0]);
///             }
///         });
///     }
/// });
/// let mut got = got.into_inner()?;
/// got.sort();
/// assert_eq!(got, [0, 1, 2, 3, 4, 5]); // every message once
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Consumer<M: Memory = Host> {
    /// What memory kind `M` adds. Dropped before `ring`, while the segment is still mapped
    /// (CUDA unregisters its page-lock of the segment).
    mem: M::Rx,
    /// The ring's side: segment, entry, cursor, waiting, liveness.
    ring: ConsumerRing,
}

impl Consumer<Host> {
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
            mode: None,
            allow_foreign_owner: false,
            spin: Duration::from_micros(50),
            liveness: Duration::from_millis(100),
            dir: None,
            kind: RxSettings::default(),
        }
    }
}

impl<M: Memory> Consumer<M> {
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
        self.ring.name()
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
        self.ring.map().params().capacity
    }

    /// The ring's spare buffers: how many messages consumers may hold in all before the
    /// producer must wait for a release (an `Overwrite` producer included).
    ///
    /// ```
    /// # use gpuring::{Consumer, Producer};
    /// let tx = Producer::builder("doc-consumer-spares").spare_buffers(3).create()?;
    /// let rx = Consumer::open("doc-consumer-spares")?;
    /// assert_eq!(rx.spare_buffers(), 3);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn spare_buffers(&self) -> u32 {
        self.ring.map().params().spares
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
        self.ring.map().slot_size()
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
        self.ring.map().user_header_size()
    }

    /// This consumer's delivery mode (the one it chose, or the ring's default).
    ///
    /// ```
    /// # use gpuring::{Consumer, Mode, Policy, Producer};
    /// let tx = Producer::builder("doc-consumer-mode-get").policy(Policy::Block).create()?;
    /// let rx = Consumer::open("doc-consumer-mode-get")?;
    /// assert_eq!(rx.mode(), Mode::Lossless); // Block's default
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn mode(&self) -> Mode {
        self.ring.mode()
    }

    /// The producer's policy: the default delivery mode.
    ///
    /// ```
    /// # use gpuring::{Consumer, Policy, Producer};
    /// let tx = Producer::builder("doc-consumer-policy").policy(Policy::Overwrite).create()?;
    /// let rx = Consumer::open("doc-consumer-policy")?;
    /// assert_eq!(rx.policy(), Policy::Overwrite);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn policy(&self) -> Policy {
        self.ring.map().policy()
    }

    /// How the ring's stream ended: `None` while its producer is live, then
    /// [`Ended::Closed`](crate::Ended::Closed) if the producer closed the ring (the stream is
    /// complete), [`Ended::Died`](crate::Ended::Died) if its process ended without closing
    /// it, or [`Ended::ContextLost`](crate::Ended::ContextLost) if its GPU context was lost (in
    /// both, the stream was cut). Ask after a receive returned `Disconnected`.
    ///
    /// ```
    /// use gpuring::{Consumer, Ended, Producer, RecvError};
    ///
    /// let mut tx = Producer::builder("doc-consumer-ended").create()?;
    /// let rx = Consumer::open("doc-consumer-ended")?;
    /// tx.send(b"last", b"")?;
    /// drop(tx);
    /// while rx.recv().is_ok() {}
    /// match rx.ended() {
    ///     Some(Ended::Closed) => println!("complete"),
    ///     Some(Ended::Died) => eprintln!("the stream was cut"),
    ///     Some(Ended::ContextLost) => eprintln!("cut: the producer's GPU context was lost"),
    ///     None => unreachable!("Disconnected comes only once the producer is gone"),
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn ended(&self) -> Option<crate::Ended> {
        self.ring.ended()
    }

    /// Whether the producer still holds the ring (its process runs and has not closed it),
    /// probed now, one system call. Receives look by themselves; this is for a consumer that
    /// waits on its own for a message's GPU work (polling a stream), so that a producer killed
    /// between publishing and its GPU's signal cannot hold it for ever.
    ///
    /// ```
    /// # use gpuring::{Consumer, Producer};
    /// let tx = Producer::builder("doc-consumer-producer-alive").create()?;
    /// let rx = Consumer::open("doc-consumer-producer-alive")?;
    /// assert!(rx.producer_alive());
    /// drop(tx);
    /// assert!(!rx.producer_alive());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn producer_alive(&self) -> bool {
        self.ring.producer_alive()
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
        self.ring.producer().pid
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
        self.ring.map().params().epoch
    }

    /// After `Disconnected`: waits up to `timeout` for a new producer to create the ring again
    /// under the same name (a new instance, see [`epoch`](Self::epoch)) and opens it with the
    /// same settings: `Disconnected` if only the old instance was there until `timeout`,
    /// `NotFound` if the ring is gone and none came.
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
    pub fn reconnect(&self, timeout: Duration) -> Result<Consumer<M>, OpenError> {
        tracing::info!(ring = %self.name(), old_epoch = self.epoch(), "reconnecting");
        self.ring.settings().clone().open_in_when_ready(Some(self.epoch()), timeout)
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
    pub fn try_recv(&self) -> Result<ReadSlot<'_, M>, TryRecvError> {
        Ok(self.receive(Deadline::Now, None)?)
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
    pub fn recv(&self) -> Result<ReadSlot<'_, M>, RecvError> {
        Ok(self.receive(Deadline::Never, None)?)
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
    pub fn recv_timeout(&self, timeout: Duration) -> Result<ReadSlot<'_, M>, RecvTimeoutError> {
        Ok(self.receive(Deadline::after(timeout), None)?)
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
    pub fn iter(&self) -> Iter<'_, M> {
        Iter { consumer: self }
    }

    /// The one receive: pins the next message, waiting until `deadline`, then has the memory
    /// kind place it, read on `stream` (or the kind's own).
    pub(crate) fn receive<'a>(
        &'a self,
        deadline: Deadline,
        stream: Option<&'a <M::Rx as ConsumerSide>::Stream>,
    ) -> Result<ReadSlot<'a, M>, Fault> {
        crate::error::check_context()?;
        let m = self.ring.pin_until(deadline)?;
        self.placed(m, stream)
    }

    /// Pinned message `m` as a [`ReadSlot`], once the memory kind has placed it (for CUDA:
    /// found its device address and ordered `stream` after its writer). If that fails the
    /// message is released again.
    pub(crate) fn placed<'a>(
        &'a self,
        m: Pinned,
        stream: Option<&'a <M::Rx as ConsumerSide>::Stream>,
    ) -> Result<ReadSlot<'a, M>, Fault> {
        let placed = crate::error::check_context()
            .map_err(Fault::ContextLost)
            .and_then(|()| self.mem.place(self.ring.map(), &m, stream));
        match placed {
            Ok(addr) => Ok(ReadSlot { consumer: self, m, addr, stream }),
            Err(e) => {
                self.ring.release(m.buffer);
                Err(e)
            }
        }
    }

    /// The ring's side.
    #[cfg(feature = "tokio")]
    pub(crate) fn ring(&self) -> &ConsumerRing {
        &self.ring
    }

    /// The memory kind's side.
    #[cfg(feature = "cuda")]
    pub(crate) fn mem(&self) -> &M::Rx {
        &self.mem
    }

    /// The memory kind.
    ///
    /// ```
    /// # use gpuring::{Consumer, MemoryKind, Producer};
    /// # let tx = Producer::builder("doc-consumer-memory").create()?;
    /// let rx = Consumer::open("doc-consumer-memory")?;
    /// assert_eq!(rx.memory(), MemoryKind::Host);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn memory(&self) -> MemoryKind {
        M::KIND
    }
}

/// Shows the ring it reads and how.
///
/// ```
/// # let _tx = gpuring::Producer::builder("doc-consumer-debug").create()?;
/// let rx = gpuring::Consumer::open("doc-consumer-debug")?;
/// assert!(format!("{rx:?}").starts_with("Consumer { ring: \"doc-consumer-debug\""));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
impl<M: Memory> std::fmt::Debug for Consumer<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Consumer")
            .field("ring", &self.name())
            .field("memory", &self.memory())
            .field("mode", &self.mode())
            .field("epoch", &self.epoch())
            .finish_non_exhaustive()
    }
}

/// Leaves the ring, once the memory kind is quiet (for CUDA: its GPU work done, its mappings
/// of the producer's memory closed), in the way the kind says: the entry freed, retired until
/// the producer lets go of what it holds of ours, or kept stepped aside until the process
/// exits (work that never finished). See docs/gpu.md, "Leaving".
impl<M: Memory> Drop for Consumer<M> {
    fn drop(&mut self) {
        let Consumer { ring, mem } = self;
        let member = ring.member();
        let alive = || ring.producer_alive();
        match mem.quiesce(ring.map(), member, ring.wait_config(), &alive) {
            Quiesced::Free => {
                ring.leave(Leave::Free);
            }
            Quiesced::StepAside => {
                ring.step_aside();
            }
            Quiesced::Retire => {
                let let_go = ring.retire();
                mem.retired(ring.map(), member, let_go);
            }
        }
    }
}

/// A received message. It stays valid (the producer cannot overwrite it) until dropped.
///
/// In host memory it derefs to the message bytes. In CUDA memory it gives their device address
/// ([`ptr`](Self::ptr)) and the stream that already waits for the producer's writes
/// (`stream`); dropping it records the consumer's release event on that stream, so the
/// producer rewrites the slot only after the kernels queued there.
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
pub struct ReadSlot<'a, M: Memory = Host> {
    consumer: &'a Consumer<M>,
    /// Invariant: pinned by `consumer`, `len <= slot_size`.
    m: Pinned,
    /// Where its bytes are, as the memory kind placed it: a host address in this process, or
    /// a device address.
    addr: u64,
    /// The stream it is read on, if not the memory kind's own (CUDA: `recv_on`).
    stream: Option<&'a <M::Rx as ConsumerSide>::Stream>,
}

impl<'a, M: Memory> ReadSlot<'a, M> {
    /// Its consumer and stream (for the memory kinds' own methods).
    #[cfg(feature = "cuda")]
    pub(crate) fn parts(&self) -> (&'a Consumer<M>, Option<&'a <M::Rx as ConsumerSide>::Stream>) {
        (self.consumer, self.stream)
    }

    /// Where the message's bytes are: a device address (`CUdeviceptr`) in a CUDA ring, their
    /// address in this process in a host ring (where [`Deref`] gives them as a slice).
    ///
    /// ```
    /// # use gpuring::{Consumer, Producer};
    /// # let mut tx = Producer::builder("doc-consumer-ptr").create()?;
    /// # let rx = Consumer::open("doc-consumer-ptr")?;
    /// tx.send(b"frame", b"")?;
    /// let msg = rx.recv()?;
    /// assert_eq!(msg.ptr(), msg.as_ptr() as u64);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn ptr(&self) -> u64 {
        self.addr
    }

    /// Releases it now, returning what the memory kind's release reported (CUDA: recording
    /// the release event); dropping it does the same and ignores that.
    #[cfg(feature = "cuda")]
    pub(crate) fn finish(self) -> Result<(), Fault> {
        let this = std::mem::ManuallyDrop::new(self);
        let c = this.consumer;
        let r = c.mem.release(c.ring.map(), c.ring.member(), &this.m, this.stream);
        c.ring.release(this.m.buffer);
        r
    }

    /// Message length in bytes.
    ///
    /// ```
    /// # use gpuring::{Consumer, Producer};
    /// # let mut tx = Producer::builder("doc-consumer-len").create()?;
    /// # let rx = Consumer::open("doc-consumer-len")?;
    /// tx.send(b"frame", b"")?;
    /// assert_eq!(rx.recv()?.len(), 5);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn len(&self) -> usize {
        self.m.len as usize
    }

    /// Whether the message is empty (0 bytes).
    ///
    /// ```
    /// # use gpuring::{Consumer, Producer};
    /// # let mut tx = Producer::builder("doc-consumer-is-empty").create()?;
    /// # let rx = Consumer::open("doc-consumer-is-empty")?;
    /// tx.send(b"", b"header only")?;
    /// assert!(rx.recv()?.is_empty());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn is_empty(&self) -> bool {
        self.m.len == 0
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

    /// Messages this consumer lost just before this one: overwritten unread, skipped for a newer
    /// one (`Latest`), or declared lost upstream by the producer
    /// ([`Producer::declare_lost`](crate::Producer::declare_lost): a bridge's gaps).
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
        let map = self.consumer.ring.map();
        // SAFETY: the slot is pinned, so no correct producer writes its user header until we
        // release it; the region is `user_header_size` bytes inside the mapping.
        unsafe {
            std::slice::from_raw_parts(map.user_header(self.m.buffer), map.user_header_size())
        }
    }

    /// The index of the buffer that carries the message (for diagnostics): one of the ring's
    /// `capacity + spare_buffers` buffers, not its position in the ring.
    ///
    /// ```
    /// # use gpuring::{Consumer, Producer};
    /// # let mut tx = Producer::builder("doc-consumer-slot").capacity(4).spare_buffers(2).create()?;
    /// # let rx = Consumer::open("doc-consumer-slot")?;
    /// tx.send(b"frame", b"")?;
    /// let msg = rx.recv()?;
    /// assert!(msg.buffer() < 4 + 2);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn buffer(&self) -> usize {
        self.m.buffer
    }
}

impl Deref for ReadSlot<'_, Host> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        let map = self.consumer.ring.map();
        // SAFETY: the slot is pinned (no correct producer writes it until release) and
        // len <= slot_size, checked when it was pinned, so the bytes lie in the slot's payload.
        unsafe { std::slice::from_raw_parts(map.payload(self.m.buffer), self.m.len as usize) }
    }
}

impl<M: Memory> Drop for ReadSlot<'_, M> {
    fn drop(&mut self) {
        let c = self.consumer;
        // A failure is the memory kind's to handle (CUDA: it synchronizes instead); the slot
        // is released all the same, or it would stay held for ever.
        let _ = c.mem.release(c.ring.map(), c.ring.member(), &self.m, self.stream);
        c.ring.release(self.m.buffer);
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
pub struct Iter<'a, M: Memory = Host> {
    consumer: &'a Consumer<M>,
}

impl<'a, M: Memory> Iterator for Iter<'a, M> {
    type Item = ReadSlot<'a, M>;
    fn next(&mut self) -> Option<ReadSlot<'a, M>> {
        self.consumer.recv().ok()
    }
}

impl<'a, M: Memory> IntoIterator for &'a Consumer<M> {
    type Item = ReadSlot<'a, M>;
    type IntoIter = Iter<'a, M>;
    fn into_iter(self) -> Iter<'a, M> {
        self.iter()
    }
}

/// Threads and tasks may share a consumer, and a message may be held across an `.await` in a
/// spawned task: checked at compile time for both memory kinds.
const _: () = {
    const fn shared<T: Send + Sync>() {}
    shared::<Consumer<Host>>();
    shared::<ReadSlot<'static, Host>>();
    #[cfg(feature = "cuda")]
    shared::<Consumer<crate::Cuda>>();
    #[cfg(feature = "cuda")]
    shared::<ReadSlot<'static, crate::Cuda>>();
};
