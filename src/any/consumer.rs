//! [`AnyConsumer`] and its messages, [`AnyReadSlot`].

use std::os::fd::BorrowedFd;
use std::time::Duration;

#[cfg(feature = "cuda")]
use std::sync::Arc;

#[cfg(feature = "cuda")]
use crate::cuda::{Context, Stream};
use crate::{
    Consumer, ConsumerBuilder, Ended, Host, MemoryKind, Mode, OpenError, Policy, ReadSlot,
    RecvError, RecvTimeoutError, TryRecvError,
};
#[cfg(feature = "cuda")]
use crate::{Cuda, OpenErrorKind};

/// A consumer of either memory kind: a [`Consumer<Host>`] or a [`Consumer<Cuda>`](crate::Cuda),
/// whichever the ring holds.
///
/// ```
/// use gpuring::any::AnyConsumer;
/// use gpuring::{Consumer, MemoryKind, Producer};
///
/// let _tx = Producer::builder("doc-any-consumer").create()?;
/// let rx = AnyConsumer::open(Consumer::builder("doc-any-consumer"))?;
/// assert_eq!(rx.memory(), MemoryKind::Host);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct AnyConsumer(Rx);

// Not boxed: the CUDA consumer is a few hundred bytes larger, and bindings box the whole.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
enum Rx {
    Host(Consumer<Host>),
    #[cfg(feature = "cuda")]
    Cuda(Consumer<Cuda>),
}

impl From<Consumer<Host>> for AnyConsumer {
    /// Wraps a host-memory consumer.
    ///
    /// ```
    /// # use gpuring::{any::AnyConsumer, Consumer, Producer};
    /// # let _tx = Producer::builder("doc-any-consumer-from").create()?;
    /// let rx: AnyConsumer = Consumer::open("doc-any-consumer-from")?.into();
    /// assert!(!rx.is_cuda());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    fn from(rx: Consumer<Host>) -> AnyConsumer {
        AnyConsumer(Rx::Host(rx))
    }
}

#[cfg(feature = "cuda")]
impl From<Consumer<Cuda>> for AnyConsumer {
    /// Wraps a CUDA consumer.
    ///
    /// ```no_run
    /// # use gpuring::{any::AnyConsumer, Consumer};
    /// let rx: AnyConsumer = Consumer::open_gpu("cam0")?.into();
    /// assert!(rx.is_cuda());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    fn from(rx: Consumer<Cuda>) -> AnyConsumer {
        AnyConsumer(Rx::Cuda(rx))
    }
}

/// Whether `e` says the ring holds CUDA memory (a host open was refused for it).
#[cfg(feature = "cuda")]
fn holds_cuda(e: &OpenError) -> bool {
    matches!(e.kind(), OpenErrorKind::WrongMemory { found: MemoryKind::Cuda })
}

impl AnyConsumer {
    /// Opens `builder`'s ring in whatever memory it holds ([`ConsumerBuilder::open_in`]: host
    /// first, then CUDA if the ring says it holds that). Without feature `cuda`, a CUDA ring is
    /// refused with [`OpenErrorKind::WrongMemory`](crate::OpenErrorKind::WrongMemory).
    ///
    /// ```
    /// # use gpuring::{any::AnyConsumer, Consumer, Producer};
    /// # let _tx = Producer::builder("doc-any-consumer-open").create()?;
    /// let rx = AnyConsumer::open(Consumer::builder("doc-any-consumer-open"))?;
    /// assert_eq!(rx.name(), "doc-any-consumer-open");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn open(builder: ConsumerBuilder) -> Result<AnyConsumer, OpenError> {
        #[cfg(feature = "cuda")]
        let builder_for_cuda = builder.clone();
        match builder.open_in::<Host>() {
            #[cfg(feature = "cuda")]
            Err(e) if holds_cuda(&e) => Ok(builder_for_cuda.open_in::<Cuda>()?.into()),
            other => Ok(other?.into()),
        }
    }

    /// Opens `builder`'s ring in `memory`, refusing a ring of the other kind with
    /// [`OpenErrorKind::WrongMemory`](crate::OpenErrorKind::WrongMemory).
    ///
    /// ```
    /// # use gpuring::{any::AnyConsumer, Consumer, MemoryKind, Producer};
    /// # let _tx = Producer::builder("doc-any-consumer-open-in").create()?;
    /// let b = Consumer::builder("doc-any-consumer-open-in");
    /// assert!(AnyConsumer::open_in(b.clone(), MemoryKind::Cuda).is_err());
    /// assert!(AnyConsumer::open_in(b, MemoryKind::Host).is_ok());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[cfg(feature = "cuda")]
    pub fn open_in(builder: ConsumerBuilder, memory: MemoryKind) -> Result<AnyConsumer, OpenError> {
        Ok(match memory {
            MemoryKind::Host => builder.open_in::<Host>()?.into(),
            MemoryKind::Cuda => builder.open_in::<Cuda>()?.into(),
        })
    }

    /// [`open`](Self::open), waiting up to `timeout` for an instance other than `not_epoch`
    /// to appear and be ready ([`ConsumerBuilder::open_in_when_ready`]).
    ///
    /// ```
    /// # use gpuring::{any::AnyConsumer, Consumer, Producer};
    /// # use std::time::Duration;
    /// # let _tx = Producer::builder("doc-any-consumer-when-ready").create()?;
    /// let b = Consumer::builder("doc-any-consumer-when-ready");
    /// let rx = AnyConsumer::open_when_ready(b, None, Duration::from_secs(5))?;
    /// assert!(!rx.is_cuda());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn open_when_ready(
        builder: ConsumerBuilder,
        not_epoch: Option<u64>,
        timeout: Duration,
    ) -> Result<AnyConsumer, OpenError> {
        #[cfg(feature = "cuda")]
        let builder_for_cuda = builder.clone();
        match builder.open_in_when_ready::<Host>(not_epoch, timeout) {
            #[cfg(feature = "cuda")]
            Err(e) if holds_cuda(&e) => {
                Ok(builder_for_cuda.open_in_when_ready::<Cuda>(not_epoch, timeout)?.into())
            }
            other => Ok(other?.into()),
        }
    }

    /// The ring's memory kind.
    ///
    /// ```
    /// # use gpuring::{any::AnyConsumer, Consumer, MemoryKind, Producer};
    /// # let _tx = Producer::builder("doc-any-consumer-memory").create()?;
    /// let rx = AnyConsumer::open(Consumer::builder("doc-any-consumer-memory"))?;
    /// assert_eq!(rx.memory(), MemoryKind::Host);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn memory(&self) -> MemoryKind {
        each!(Rx, &self.0, rx => rx.memory())
    }

    /// Whether the ring holds CUDA memory.
    ///
    /// ```
    /// # use gpuring::{any::AnyConsumer, Consumer, Producer};
    /// # let _tx = Producer::builder("doc-any-consumer-is-cuda").create()?;
    /// let rx = AnyConsumer::open(Consumer::builder("doc-any-consumer-is-cuda"))?;
    /// assert!(!rx.is_cuda());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn is_cuda(&self) -> bool {
        self.memory() == MemoryKind::Cuda
    }

    /// The ring's name ([`Consumer::name`]).
    ///
    /// ```
    /// # use gpuring::{any::AnyConsumer, Consumer, Producer};
    /// # let _tx = Producer::builder("doc-any-consumer-name").create()?;
    /// let rx = AnyConsumer::from(Consumer::open("doc-any-consumer-name")?);
    /// assert_eq!(rx.name(), "doc-any-consumer-name");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn name(&self) -> &str {
        each!(Rx, &self.0, rx => rx.name())
    }

    /// Slots in the ring ([`Consumer::capacity`]).
    ///
    /// ```
    /// # use gpuring::{any::AnyConsumer, Consumer, Producer};
    /// # let _tx = Producer::builder("doc-any-consumer-capacity").capacity(4).create()?;
    /// let rx = AnyConsumer::from(Consumer::open("doc-any-consumer-capacity")?);
    /// assert_eq!(rx.capacity(), 4);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn capacity(&self) -> u32 {
        each!(Rx, &self.0, rx => rx.capacity())
    }

    /// The ring's spare buffers ([`Consumer::spare_buffers`]).
    ///
    /// ```
    /// # use gpuring::{any::AnyConsumer, Consumer, Producer};
    /// # let _tx = Producer::builder("doc-any-consumer-spares").spare_buffers(2).create()?;
    /// let rx = AnyConsumer::from(Consumer::open("doc-any-consumer-spares")?);
    /// assert_eq!(rx.spare_buffers(), 2);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn spare_buffers(&self) -> u32 {
        each!(Rx, &self.0, rx => rx.spare_buffers())
    }

    /// Largest message in bytes ([`Consumer::slot_size`]).
    ///
    /// ```
    /// # use gpuring::{any::AnyConsumer, Consumer, Producer};
    /// # let _tx = Producer::builder("doc-any-consumer-slot-size").slot_size(4096).create()?;
    /// let rx = AnyConsumer::from(Consumer::open("doc-any-consumer-slot-size")?);
    /// assert_eq!(rx.slot_size(), 4096);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn slot_size(&self) -> usize {
        each!(Rx, &self.0, rx => rx.slot_size())
    }

    /// Bytes of user header per message ([`Consumer::user_header_size`]).
    ///
    /// ```
    /// # use gpuring::{any::AnyConsumer, Consumer, Producer};
    /// # let _tx = Producer::builder("doc-any-consumer-header").user_header_size(32).create()?;
    /// let rx = AnyConsumer::from(Consumer::open("doc-any-consumer-header")?);
    /// assert_eq!(rx.user_header_size(), 32);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn user_header_size(&self) -> usize {
        each!(Rx, &self.0, rx => rx.user_header_size())
    }

    /// This consumer's delivery mode ([`Consumer::mode`]).
    ///
    /// ```
    /// # use gpuring::{any::AnyConsumer, Consumer, Mode, Producer};
    /// # let _tx = Producer::builder("doc-any-consumer-mode").create()?;
    /// let rx = AnyConsumer::from(Consumer::open("doc-any-consumer-mode")?);
    /// assert_eq!(rx.mode(), Mode::Lossless);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn mode(&self) -> Mode {
        each!(Rx, &self.0, rx => rx.mode())
    }

    /// The ring's policy ([`Consumer::policy`]).
    ///
    /// ```
    /// # use gpuring::{any::AnyConsumer, Consumer, Policy, Producer};
    /// # let _tx = Producer::builder("doc-any-consumer-policy").create()?;
    /// let rx = AnyConsumer::from(Consumer::open("doc-any-consumer-policy")?);
    /// assert_eq!(rx.policy(), Policy::Block);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn policy(&self) -> Policy {
        each!(Rx, &self.0, rx => rx.policy())
    }

    /// How the stream ended, once it did ([`Consumer::ended`]).
    ///
    /// ```
    /// # use gpuring::{any::AnyConsumer, Consumer, Ended, Producer};
    /// let tx = Producer::builder("doc-any-consumer-ended").create()?;
    /// let rx = AnyConsumer::from(Consumer::open("doc-any-consumer-ended")?);
    /// assert_eq!(rx.ended(), None);
    /// drop(tx);
    /// assert!(rx.recv().is_err());
    /// assert_eq!(rx.ended(), Some(Ended::Closed));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn ended(&self) -> Option<Ended> {
        each!(Rx, &self.0, rx => rx.ended())
    }

    /// Whether the producer is alive ([`Consumer::producer_alive`]).
    ///
    /// ```
    /// # use gpuring::{any::AnyConsumer, Consumer, Producer};
    /// let _tx = Producer::builder("doc-any-consumer-alive").create()?;
    /// let rx = AnyConsumer::from(Consumer::open("doc-any-consumer-alive")?);
    /// assert!(rx.producer_alive());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn producer_alive(&self) -> bool {
        each!(Rx, &self.0, rx => rx.producer_alive())
    }

    /// The ring instance's id ([`Consumer::epoch`]).
    ///
    /// ```
    /// # use gpuring::{any::AnyConsumer, Consumer, Producer};
    /// let tx = Producer::builder("doc-any-consumer-epoch").create()?;
    /// let rx = AnyConsumer::from(Consumer::open("doc-any-consumer-epoch")?);
    /// assert_eq!(rx.epoch(), tx.epoch());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn epoch(&self) -> u64 {
        each!(Rx, &self.0, rx => rx.epoch())
    }

    /// The doorbell's descriptor, bound on first use ([`Consumer::doorbell_fd`]).
    ///
    /// ```
    /// # use gpuring::{any::AnyConsumer, Consumer, Producer};
    /// # let _tx = Producer::builder("doc-any-consumer-doorbell").create()?;
    /// let rx = AnyConsumer::from(Consumer::open("doc-any-consumer-doorbell")?);
    /// let _fd = rx.doorbell_fd(); // None where no socket could be bound
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn doorbell_fd(&self) -> Option<BorrowedFd<'_>> {
        each!(Rx, &self.0, rx => rx.doorbell_fd())
    }

    /// Arms the doorbell ([`Consumer::arm_doorbell`]).
    ///
    /// ```
    /// # use gpuring::{any::AnyConsumer, Consumer, Producer};
    /// # let _tx = Producer::builder("doc-any-consumer-arm").create()?;
    /// let rx = AnyConsumer::from(Consumer::open("doc-any-consumer-arm")?);
    /// rx.arm_doorbell();
    /// rx.disarm_doorbell();
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn arm_doorbell(&self) {
        each!(Rx, &self.0, rx => rx.arm_doorbell())
    }

    /// Disarms and empties the doorbell ([`Consumer::disarm_doorbell`]).
    ///
    /// ```
    /// # use gpuring::{any::AnyConsumer, Consumer, Producer};
    /// # let _tx = Producer::builder("doc-any-consumer-disarm").create()?;
    /// let rx = AnyConsumer::from(Consumer::open("doc-any-consumer-disarm")?);
    /// rx.disarm_doorbell(); // disarming an unarmed doorbell is fine
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn disarm_doorbell(&self) {
        each!(Rx, &self.0, rx => rx.disarm_doorbell())
    }

    /// How often a wait looks at the producer's liveness ([`Consumer::liveness_interval`]).
    ///
    /// ```
    /// # use gpuring::{any::AnyConsumer, Consumer, Producer};
    /// # use std::time::Duration;
    /// # let _tx = Producer::builder("doc-any-consumer-liveness").create()?;
    /// let rx = AnyConsumer::from(Consumer::open("doc-any-consumer-liveness")?);
    /// assert!(rx.liveness_interval() > Duration::ZERO);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn liveness_interval(&self) -> Duration {
        each!(Rx, &self.0, rx => rx.liveness_interval())
    }

    /// The next message if one is waiting ([`Consumer::try_recv`]).
    ///
    /// ```
    /// # use gpuring::{any::AnyConsumer, Consumer, Producer, TryRecvError};
    /// # let _tx = Producer::builder("doc-any-consumer-try-recv").create()?;
    /// let rx = AnyConsumer::from(Consumer::open("doc-any-consumer-try-recv")?);
    /// assert_eq!(rx.try_recv().err(), Some(TryRecvError::Empty));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn try_recv(&self) -> Result<AnyReadSlot<'_>, TryRecvError> {
        each!(Rx, &self.0, rx => rx.try_recv().map(AnyReadSlot::from))
    }

    /// The next message, waiting as long as it takes ([`Consumer::recv`]).
    ///
    /// ```
    /// # use gpuring::{any::AnyConsumer, Consumer, Producer};
    /// let mut tx = Producer::builder("doc-any-consumer-recv").create()?;
    /// let rx = AnyConsumer::from(Consumer::open("doc-any-consumer-recv")?);
    /// tx.send(b"hello", b"")?;
    /// assert_eq!(rx.recv()?.bytes(), Some(&b"hello"[..]));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn recv(&self) -> Result<AnyReadSlot<'_>, RecvError> {
        each!(Rx, &self.0, rx => rx.recv().map(AnyReadSlot::from))
    }

    /// The next message, waiting at most `timeout` ([`Consumer::recv_timeout`]).
    ///
    /// ```
    /// # use gpuring::{any::AnyConsumer, Consumer, Producer, RecvTimeoutError};
    /// # use std::time::Duration;
    /// # let _tx = Producer::builder("doc-any-consumer-recv-timeout").create()?;
    /// let rx = AnyConsumer::from(Consumer::open("doc-any-consumer-recv-timeout")?);
    /// let r = rx.recv_timeout(Duration::from_millis(10));
    /// assert_eq!(r.err(), Some(RecvTimeoutError::Timeout));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn recv_timeout(&self, timeout: Duration) -> Result<AnyReadSlot<'_>, RecvTimeoutError> {
        each!(Rx, &self.0, rx => rx.recv_timeout(timeout).map(AnyReadSlot::from))
    }

    /// CUDA rings: the next message, read on `stream`, a stream of this consumer's context
    /// ([`Consumer::recv_on`](crate::Consumer#method.recv_on)). A host ring has no GPU work
    /// to order: it receives as [`recv`](Self::recv) does.
    ///
    /// ```no_run
    /// # use gpuring::{any::AnyConsumer, Consumer};
    /// let rx = AnyConsumer::open(Consumer::builder("cam0"))?;
    /// let stream = gpuring::cuda::Stream::new(rx.context().expect("a CUDA ring"))?;
    /// let frame = rx.recv_on(&stream)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[cfg(feature = "cuda")]
    pub fn recv_on<'a>(&'a self, stream: &'a Stream) -> Result<AnyReadSlot<'a>, RecvError> {
        match &self.0 {
            Rx::Host(rx) => rx.recv().map(AnyReadSlot::from),
            Rx::Cuda(rx) => rx.recv_on(stream).map(AnyReadSlot::from),
        }
    }

    /// CUDA rings: [`recv_on`](Self::recv_on), waiting at most `timeout`. A host ring
    /// receives as [`recv_timeout`](Self::recv_timeout) does.
    ///
    /// ```no_run
    /// # use gpuring::{any::AnyConsumer, Consumer};
    /// # use std::time::Duration;
    /// let rx = AnyConsumer::open(Consumer::builder("cam0"))?;
    /// let stream = gpuring::cuda::Stream::new(rx.context().expect("a CUDA ring"))?;
    /// let frame = rx.recv_on_timeout(&stream, Duration::from_secs(1))?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[cfg(feature = "cuda")]
    pub fn recv_on_timeout<'a>(
        &'a self,
        stream: &'a Stream,
        timeout: Duration,
    ) -> Result<AnyReadSlot<'a>, RecvTimeoutError> {
        match &self.0 {
            Rx::Host(rx) => rx.recv_timeout(timeout).map(AnyReadSlot::from),
            Rx::Cuda(rx) => rx.recv_on_timeout(stream, timeout).map(AnyReadSlot::from),
        }
    }

    /// CUDA rings: the GPU this consumer reads on (its context's); `None` for host rings.
    ///
    /// ```
    /// # use gpuring::{any::AnyConsumer, Consumer, Producer};
    /// # let _tx = Producer::builder("doc-any-consumer-device").create()?;
    /// let rx = AnyConsumer::from(Consumer::open("doc-any-consumer-device")?);
    /// assert_eq!(rx.device(), None);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn device(&self) -> Option<i32> {
        #[cfg(feature = "cuda")]
        if let Some(ctx) = self.context() {
            return Some(ctx.ordinal());
        }
        None
    }

    /// CUDA rings: the context this consumer reads in
    /// ([`Consumer::context`](crate::Consumer#method.context)); `None` for host rings.
    ///
    /// ```
    /// # use gpuring::{any::AnyConsumer, Consumer, Producer};
    /// # let _tx = Producer::builder("doc-any-consumer-context").create()?;
    /// let rx = AnyConsumer::from(Consumer::open("doc-any-consumer-context")?);
    /// assert!(rx.context().is_none());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[cfg(feature = "cuda")]
    pub fn context(&self) -> Option<&Arc<Context>> {
        self.cuda().map(Consumer::context)
    }

    /// CUDA rings: the consumer's own stream
    /// ([`Consumer::stream`](crate::Consumer#method.stream)); `None` for host rings.
    ///
    /// ```
    /// # use gpuring::{any::AnyConsumer, Consumer, Producer};
    /// # let _tx = Producer::builder("doc-any-consumer-stream").create()?;
    /// let rx = AnyConsumer::from(Consumer::open("doc-any-consumer-stream")?);
    /// assert!(rx.stream().is_none());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[cfg(feature = "cuda")]
    pub fn stream(&self) -> Option<&Stream> {
        self.cuda().map(Consumer::stream)
    }

    /// The host-memory consumer, if the ring holds host memory.
    ///
    /// ```
    /// # use gpuring::{any::AnyConsumer, Consumer, Producer};
    /// # let _tx = Producer::builder("doc-any-consumer-host").create()?;
    /// let rx = AnyConsumer::from(Consumer::open("doc-any-consumer-host")?);
    /// assert!(rx.host().is_some());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn host(&self) -> Option<&Consumer<Host>> {
        match &self.0 {
            Rx::Host(rx) => Some(rx),
            #[cfg(feature = "cuda")]
            Rx::Cuda(_) => None,
        }
    }

    /// The CUDA consumer, if the ring holds CUDA memory: for what only CUDA consumers do.
    ///
    /// ```
    /// # use gpuring::{any::AnyConsumer, Consumer, Producer};
    /// # let _tx = Producer::builder("doc-any-consumer-cuda").create()?;
    /// let rx = AnyConsumer::from(Consumer::open("doc-any-consumer-cuda")?);
    /// assert!(rx.cuda().is_none());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[cfg(feature = "cuda")]
    pub fn cuda(&self) -> Option<&Consumer<Cuda>> {
        match &self.0 {
            Rx::Host(_) => None,
            Rx::Cuda(rx) => Some(rx),
        }
    }
}

/// A received message of an [`AnyConsumer`]: a [`ReadSlot`] of either memory kind, released
/// on drop as a [`ReadSlot`] is.
///
/// ```
/// # use gpuring::{any::AnyConsumer, Consumer, Producer};
/// let mut tx = Producer::builder("doc-any-read-slot").create()?;
/// let rx = AnyConsumer::from(Consumer::open("doc-any-read-slot")?);
/// tx.send(b"hello", b"text")?;
/// let msg = rx.recv()?;
/// assert_eq!(msg.len(), 5);
/// assert!(msg.header().starts_with(b"text")); // zero-padded to the ring's header size
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct AnyReadSlot<'a>(Received<'a>);

enum Received<'a> {
    Host(ReadSlot<'a, Host>),
    #[cfg(feature = "cuda")]
    Cuda(ReadSlot<'a, Cuda>),
}

impl<'a> From<ReadSlot<'a, Host>> for AnyReadSlot<'a> {
    /// Wraps a host-memory message.
    ///
    /// ```
    /// # use gpuring::{any::AnyReadSlot, Consumer, Producer};
    /// let mut tx = Producer::builder("doc-any-read-slot-from").create()?;
    /// let rx = Consumer::open("doc-any-read-slot-from")?;
    /// tx.send(b"hi", b"")?;
    /// assert_eq!(AnyReadSlot::from(rx.recv()?).len(), 2);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    fn from(slot: ReadSlot<'a, Host>) -> AnyReadSlot<'a> {
        AnyReadSlot(Received::Host(slot))
    }
}

#[cfg(feature = "cuda")]
impl<'a> From<ReadSlot<'a, Cuda>> for AnyReadSlot<'a> {
    /// Wraps a CUDA message.
    ///
    /// ```no_run
    /// # use gpuring::{any::AnyReadSlot, Consumer};
    /// let rx = Consumer::open_gpu("cam0")?;
    /// assert!(AnyReadSlot::from(rx.recv()?).stream().is_some());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    fn from(slot: ReadSlot<'a, Cuda>) -> AnyReadSlot<'a> {
        AnyReadSlot(Received::Cuda(slot))
    }
}

impl AnyReadSlot<'_> {
    /// Where the message's bytes are ([`ReadSlot::ptr`]): a device address in a CUDA ring, an
    /// address in this process in a host ring.
    ///
    /// ```
    /// # use gpuring::{any::AnyConsumer, Consumer, Producer};
    /// let mut tx = Producer::builder("doc-any-read-slot-ptr").create()?;
    /// let rx = AnyConsumer::from(Consumer::open("doc-any-read-slot-ptr")?);
    /// tx.send(b"hi", b"")?;
    /// let msg = rx.recv()?;
    /// assert_eq!(msg.ptr(), msg.bytes().unwrap().as_ptr() as u64);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn ptr(&self) -> u64 {
        each!(Received, &self.0, s => s.ptr())
    }

    /// The message's length in bytes ([`ReadSlot::len`]).
    ///
    /// ```
    /// # use gpuring::{any::AnyConsumer, Consumer, Producer};
    /// let mut tx = Producer::builder("doc-any-read-slot-len").create()?;
    /// let rx = AnyConsumer::from(Consumer::open("doc-any-read-slot-len")?);
    /// tx.send(b"hello", b"")?;
    /// assert_eq!(rx.recv()?.len(), 5);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn len(&self) -> usize {
        each!(Received, &self.0, s => s.len())
    }

    /// Whether the message has no bytes ([`ReadSlot::is_empty`]).
    ///
    /// ```
    /// # use gpuring::{any::AnyConsumer, Consumer, Producer};
    /// let mut tx = Producer::builder("doc-any-read-slot-empty").create()?;
    /// let rx = AnyConsumer::from(Consumer::open("doc-any-read-slot-empty")?);
    /// tx.send(b"", b"header only")?;
    /// assert!(rx.recv()?.is_empty());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The message's sequence number ([`ReadSlot::seq`]).
    ///
    /// ```
    /// # use gpuring::{any::AnyConsumer, Consumer, Producer};
    /// let mut tx = Producer::builder("doc-any-read-slot-seq").create()?;
    /// let rx = AnyConsumer::from(Consumer::open("doc-any-read-slot-seq")?);
    /// tx.send(b"first", b"")?;
    /// assert_eq!(rx.recv()?.seq(), 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn seq(&self) -> u64 {
        each!(Received, &self.0, s => s.seq())
    }

    /// When the producer published it, CLOCK_MONOTONIC nanoseconds
    /// ([`ReadSlot::timestamp_ns`]).
    ///
    /// ```
    /// # use gpuring::{any::AnyConsumer, Consumer, Producer};
    /// let mut tx = Producer::builder("doc-any-read-slot-ts").create()?;
    /// let rx = AnyConsumer::from(Consumer::open("doc-any-read-slot-ts")?);
    /// tx.send(b"now", b"")?;
    /// assert!(rx.recv()?.timestamp_ns() <= gpuring::monotonic_ns());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn timestamp_ns(&self) -> u64 {
        each!(Received, &self.0, s => s.timestamp_ns())
    }

    /// Messages this consumer lost just before this one ([`ReadSlot::lag`]).
    ///
    /// ```
    /// # use gpuring::{any::AnyConsumer, Consumer, Producer};
    /// let mut tx = Producer::builder("doc-any-read-slot-lag").create()?;
    /// let rx = AnyConsumer::from(Consumer::open("doc-any-read-slot-lag")?);
    /// tx.send(b"first", b"")?;
    /// assert_eq!(rx.recv()?.lag(), 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn lag(&self) -> u64 {
        each!(Received, &self.0, s => s.lag())
    }

    /// The message's user header ([`ReadSlot::header`]).
    ///
    /// ```
    /// # use gpuring::{any::AnyConsumer, Consumer, Producer};
    /// let mut tx = Producer::builder("doc-any-read-slot-header").create()?;
    /// let rx = AnyConsumer::from(Consumer::open("doc-any-read-slot-header")?);
    /// tx.send(b"", b"text")?;
    /// assert_eq!(&rx.recv()?.header()[..4], b"text");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn header(&self) -> &[u8] {
        each!(Received, &self.0, s => s.header())
    }

    /// The index of the buffer the message is in ([`ReadSlot::buffer`]).
    ///
    /// ```
    /// # use gpuring::{any::AnyConsumer, Consumer, Producer};
    /// let mut tx = Producer::builder("doc-any-read-slot-buffer").create()?;
    /// let rx = AnyConsumer::from(Consumer::open("doc-any-read-slot-buffer")?);
    /// tx.send(b"first", b"")?;
    /// assert_eq!(rx.recv()?.buffer(), 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn buffer(&self) -> usize {
        each!(Received, &self.0, s => s.buffer())
    }

    /// Host rings: the message's bytes; `None` for CUDA rings (read those on
    /// [`stream`](Self::stream)).
    ///
    /// ```
    /// # use gpuring::{any::AnyConsumer, Consumer, Producer};
    /// let mut tx = Producer::builder("doc-any-read-slot-bytes").create()?;
    /// let rx = AnyConsumer::from(Consumer::open("doc-any-read-slot-bytes")?);
    /// tx.send(b"hello", b"")?;
    /// assert_eq!(rx.recv()?.bytes(), Some(&b"hello"[..]));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn bytes(&self) -> Option<&[u8]> {
        match &self.0 {
            Received::Host(s) => Some(s),
            #[cfg(feature = "cuda")]
            Received::Cuda(_) => None,
        }
    }

    /// CUDA rings: the stream that waits for the message
    /// ([`ReadSlot::stream`](crate::ReadSlot#method.stream)); `None` for host rings.
    ///
    /// ```
    /// # use gpuring::{any::AnyConsumer, Consumer, Producer};
    /// let mut tx = Producer::builder("doc-any-read-slot-stream").create()?;
    /// let rx = AnyConsumer::from(Consumer::open("doc-any-read-slot-stream")?);
    /// tx.send(b"hi", b"")?;
    /// assert!(rx.recv()?.stream().is_none());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[cfg(feature = "cuda")]
    pub fn stream(&self) -> Option<&Stream> {
        match &self.0 {
            Received::Host(_) => None,
            Received::Cuda(s) => Some(s.stream()),
        }
    }

    /// Releases the message, reporting a failure to record a CUDA ring's release event
    /// ([`ReadSlot::release`](crate::ReadSlot#method.release)). A host message is released as
    /// by a drop, which cannot fail.
    ///
    /// ```
    /// # use gpuring::{any::AnyConsumer, Consumer, Producer};
    /// let mut tx = Producer::builder("doc-any-read-slot-release").create()?;
    /// let rx = AnyConsumer::from(Consumer::open("doc-any-read-slot-release")?);
    /// tx.send(b"hi", b"")?;
    /// rx.recv()?.release()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[cfg(feature = "cuda")]
    pub fn release(self) -> Result<(), crate::ReleaseError> {
        match self.0 {
            Received::Host(s) => {
                drop(s);
                Ok(())
            }
            Received::Cuda(s) => s.release(),
        }
    }
}
