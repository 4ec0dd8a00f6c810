//! [`AnyProducer`] and its slot [`AnyWriteSlot`].

use std::time::Duration;

#[cfg(feature = "cuda")]
use std::sync::Arc;

#[cfg(feature = "cuda")]
use crate::cuda::{Context, Stream};
use crate::{
    AcquireError, AcquireTimeoutError, Host, MemoryKind, Policy, Producer, PublishError,
    WaitForConsumersError, WriteSlot,
};
#[cfg(feature = "cuda")]
use crate::{CreateError, Cuda, ProducerBuilder};

/// A producer of either memory kind: a [`Producer<Host>`] or a [`Producer<Cuda>`](crate::Cuda),
/// chosen at run time.
///
/// ```
/// use gpuring::any::AnyProducer;
/// use gpuring::{MemoryKind, Producer};
///
/// let tx = AnyProducer::from(Producer::builder("doc-any-producer").create()?);
/// assert_eq!(tx.memory(), MemoryKind::Host);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct AnyProducer(Tx);

// Not boxed: the CUDA producer is a few hundred bytes larger, and bindings box the whole.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
enum Tx {
    Host(Producer<Host>),
    #[cfg(feature = "cuda")]
    Cuda(Producer<Cuda>),
}

impl From<Producer<Host>> for AnyProducer {
    /// Wraps a host-memory producer.
    ///
    /// ```
    /// # use gpuring::{any::AnyProducer, Producer};
    /// let tx: AnyProducer = Producer::builder("doc-any-producer-from").create()?.into();
    /// assert!(!tx.is_cuda());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    fn from(tx: Producer<Host>) -> AnyProducer {
        AnyProducer(Tx::Host(tx))
    }
}

#[cfg(feature = "cuda")]
impl From<Producer<Cuda>> for AnyProducer {
    /// Wraps a CUDA producer.
    ///
    /// ```no_run
    /// # use gpuring::{any::AnyProducer, Producer};
    /// let tx: AnyProducer = Producer::builder("cam0").create_gpu(0)?.into();
    /// assert!(tx.is_cuda());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    fn from(tx: Producer<Cuda>) -> AnyProducer {
        AnyProducer(Tx::Cuda(tx))
    }
}

impl AnyProducer {
    /// Creates `builder`'s ring in `memory` ([`ProducerBuilder::create_in`]; CUDA memory on
    /// the builder's `device`).
    ///
    /// ```
    /// # use gpuring::{any::AnyProducer, MemoryKind, Producer};
    /// let b = Producer::builder("doc-any-producer-create");
    /// let tx = AnyProducer::create(b, MemoryKind::Host)?;
    /// assert_eq!(tx.name(), "doc-any-producer-create");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[cfg(feature = "cuda")]
    pub fn create(
        builder: ProducerBuilder,
        memory: MemoryKind,
    ) -> Result<AnyProducer, CreateError> {
        Ok(match memory {
            MemoryKind::Host => builder.create_in::<Host>()?.into(),
            MemoryKind::Cuda => builder.create_in::<Cuda>()?.into(),
        })
    }

    /// The ring's memory kind.
    ///
    /// ```
    /// # use gpuring::{any::AnyProducer, MemoryKind, Producer};
    /// let tx = AnyProducer::from(Producer::builder("doc-any-producer-memory").create()?);
    /// assert_eq!(tx.memory(), MemoryKind::Host);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn memory(&self) -> MemoryKind {
        each!(Tx, &self.0, tx => tx.memory())
    }

    /// Whether the ring holds CUDA memory.
    ///
    /// ```
    /// # use gpuring::{any::AnyProducer, Producer};
    /// let tx = AnyProducer::from(Producer::builder("doc-any-producer-is-cuda").create()?);
    /// assert!(!tx.is_cuda());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn is_cuda(&self) -> bool {
        self.memory() == MemoryKind::Cuda
    }

    /// The ring's name ([`Producer::name`]).
    ///
    /// ```
    /// # use gpuring::{any::AnyProducer, Producer};
    /// let tx = AnyProducer::from(Producer::builder("doc-any-producer-name").create()?);
    /// assert_eq!(tx.name(), "doc-any-producer-name");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn name(&self) -> &str {
        each!(Tx, &self.0, tx => tx.name())
    }

    /// Slots in the ring ([`Producer::capacity`]).
    ///
    /// ```
    /// # use gpuring::{any::AnyProducer, Producer};
    /// let b = Producer::builder("doc-any-producer-capacity").capacity(4);
    /// assert_eq!(AnyProducer::from(b.create()?).capacity(), 4);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn capacity(&self) -> u32 {
        each!(Tx, &self.0, tx => tx.capacity())
    }

    /// Spare buffers ([`Producer::spare_buffers`]).
    ///
    /// ```
    /// # use gpuring::{any::AnyProducer, Producer};
    /// let b = Producer::builder("doc-any-producer-spares").spare_buffers(2);
    /// assert_eq!(AnyProducer::from(b.create()?).spare_buffers(), 2);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn spare_buffers(&self) -> u32 {
        each!(Tx, &self.0, tx => tx.spare_buffers())
    }

    /// Largest message in bytes ([`Producer::slot_size`]).
    ///
    /// ```
    /// # use gpuring::{any::AnyProducer, Producer};
    /// let b = Producer::builder("doc-any-producer-slot-size").slot_size(4096);
    /// assert_eq!(AnyProducer::from(b.create()?).slot_size(), 4096);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn slot_size(&self) -> usize {
        each!(Tx, &self.0, tx => tx.slot_size())
    }

    /// Bytes of user header per message ([`Producer::user_header_size`]).
    ///
    /// ```
    /// # use gpuring::{any::AnyProducer, Producer};
    /// let b = Producer::builder("doc-any-producer-header").user_header_size(32);
    /// assert_eq!(AnyProducer::from(b.create()?).user_header_size(), 32);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn user_header_size(&self) -> usize {
        each!(Tx, &self.0, tx => tx.user_header_size())
    }

    /// The ring's policy ([`Producer::policy`]).
    ///
    /// ```
    /// # use gpuring::{any::AnyProducer, Policy, Producer};
    /// let tx = AnyProducer::from(Producer::builder("doc-any-producer-policy").create()?);
    /// assert_eq!(tx.policy(), Policy::Block);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn policy(&self) -> Policy {
        each!(Tx, &self.0, tx => tx.policy())
    }

    /// Messages published so far ([`Producer::published`]).
    ///
    /// ```
    /// # use gpuring::{any::AnyProducer, Producer};
    /// let tx = AnyProducer::from(Producer::builder("doc-any-producer-published").create()?);
    /// assert_eq!(tx.published(), 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn published(&self) -> u64 {
        each!(Tx, &self.0, tx => tx.published())
    }

    /// Consumers joined now ([`Producer::consumer_count`]).
    ///
    /// ```
    /// # use gpuring::{any::AnyProducer, Consumer, Producer};
    /// let tx = AnyProducer::from(Producer::builder("doc-any-producer-count").create()?);
    /// let _rx = Consumer::open("doc-any-producer-count")?;
    /// assert_eq!(tx.consumer_count(), 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn consumer_count(&self) -> usize {
        each!(Tx, &self.0, tx => tx.consumer_count())
    }

    /// The ring instance's id ([`Producer::epoch`]).
    ///
    /// ```
    /// # use gpuring::{any::AnyProducer, Consumer, Producer};
    /// let tx = AnyProducer::from(Producer::builder("doc-any-producer-epoch").create()?);
    /// assert_eq!(Consumer::open("doc-any-producer-epoch")?.epoch(), tx.epoch());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn epoch(&self) -> u64 {
        each!(Tx, &self.0, tx => tx.epoch())
    }

    /// Waits until at least `n` consumers have joined, at most `timeout`
    /// ([`Producer::wait_for_consumers`]).
    ///
    /// ```
    /// # use gpuring::{any::AnyProducer, Consumer, Producer};
    /// # use std::time::Duration;
    /// let mut tx = AnyProducer::from(Producer::builder("doc-any-producer-wait").create()?);
    /// let _rx = Consumer::open("doc-any-producer-wait")?;
    /// assert_eq!(tx.wait_for_consumers(1, Duration::from_secs(10))?, 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn wait_for_consumers(
        &mut self,
        n: usize,
        timeout: Duration,
    ) -> Result<usize, WaitForConsumersError> {
        each!(Tx, &mut self.0, tx => tx.wait_for_consumers(n, timeout))
    }

    /// Closes the ring as cut ([`Producer::abort`]).
    ///
    /// ```
    /// # use gpuring::{any::AnyProducer, Consumer, Ended, Producer};
    /// let tx = AnyProducer::from(Producer::builder("doc-any-producer-abort").create()?);
    /// let rx = Consumer::open("doc-any-producer-abort")?;
    /// tx.abort();
    /// assert!(rx.recv().is_err());
    /// assert_eq!(rx.ended(), Some(Ended::Died));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn abort(self) {
        each!(Tx, self.0, tx => tx.abort())
    }

    /// A slot for the next message, waiting as long as it takes ([`Producer::acquire`]).
    ///
    /// ```
    /// # use gpuring::{any::AnyProducer, Producer};
    /// let mut tx = AnyProducer::from(Producer::builder("doc-any-producer-acquire").create()?);
    /// let slot = tx.acquire()?;
    /// assert_eq!(slot.publish(0, b"")?, 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn acquire(&mut self) -> Result<AnyWriteSlot<'_>, AcquireError> {
        each!(Tx, &mut self.0, tx => tx.acquire().map(AnyWriteSlot::from))
    }

    /// A slot for the next message, waiting at most `timeout`
    /// ([`Producer::acquire_timeout`]).
    ///
    /// ```
    /// # use gpuring::{any::AnyProducer, AcquireTimeoutError, Consumer, Producer};
    /// # use std::time::Duration;
    /// let b = Producer::builder("doc-any-producer-acquire-timeout").capacity(1);
    /// let mut tx = AnyProducer::from(b.create()?);
    /// let _rx = Consumer::open("doc-any-producer-acquire-timeout")?;
    /// tx.acquire()?.publish(0, b"")?; // unread: the ring is full
    /// let r = tx.acquire_timeout(Duration::from_millis(10));
    /// assert!(matches!(r, Err(AcquireTimeoutError::Timeout)));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn acquire_timeout(
        &mut self,
        timeout: Duration,
    ) -> Result<AnyWriteSlot<'_>, AcquireTimeoutError> {
        each!(Tx, &mut self.0, tx => tx.acquire_timeout(timeout).map(AnyWriteSlot::from))
    }

    /// CUDA rings: a slot to be written on `stream`, a stream of the ring's context
    /// ([`Producer::acquire_on`](crate::Producer#method.acquire_on)). A host ring has no
    /// stream to order: it acquires as [`acquire`](Self::acquire) does.
    ///
    /// ```no_run
    /// # use gpuring::{any::AnyProducer, Producer};
    /// let mut tx = AnyProducer::from(Producer::builder("cam0").create_gpu(0)?);
    /// let stream = gpuring::cuda::Stream::new(tx.context().expect("a CUDA ring"))?;
    /// let slot = tx.acquire_on(&stream)?;
    /// slot.publish(0, b"")?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[cfg(feature = "cuda")]
    pub fn acquire_on<'a>(
        &'a mut self,
        stream: &'a Stream,
    ) -> Result<AnyWriteSlot<'a>, AcquireError> {
        match &mut self.0 {
            Tx::Host(tx) => tx.acquire().map(AnyWriteSlot::from),
            Tx::Cuda(tx) => tx.acquire_on(stream).map(AnyWriteSlot::from),
        }
    }

    /// CUDA rings: [`acquire_on`](Self::acquire_on), waiting at most `timeout`. A host ring
    /// acquires as [`acquire_timeout`](Self::acquire_timeout) does.
    ///
    /// ```no_run
    /// # use gpuring::{any::AnyProducer, Producer};
    /// # use std::time::Duration;
    /// let mut tx = AnyProducer::from(Producer::builder("cam0").create_gpu(0)?);
    /// let stream = gpuring::cuda::Stream::new(tx.context().expect("a CUDA ring"))?;
    /// let slot = tx.acquire_on_timeout(&stream, Duration::from_secs(1))?;
    /// slot.publish(0, b"")?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[cfg(feature = "cuda")]
    pub fn acquire_on_timeout<'a>(
        &'a mut self,
        stream: &'a Stream,
        timeout: Duration,
    ) -> Result<AnyWriteSlot<'a>, AcquireTimeoutError> {
        match &mut self.0 {
            Tx::Host(tx) => tx.acquire_timeout(timeout).map(AnyWriteSlot::from),
            Tx::Cuda(tx) => tx.acquire_on_timeout(stream, timeout).map(AnyWriteSlot::from),
        }
    }

    /// CUDA rings: the GPU the ring's memory is on; `None` for host rings.
    ///
    /// ```
    /// # use gpuring::{any::AnyProducer, Producer};
    /// let tx = AnyProducer::from(Producer::builder("doc-any-producer-device").create()?);
    /// assert_eq!(tx.device(), None);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn device(&self) -> Option<i32> {
        #[cfg(feature = "cuda")]
        if let Some(ctx) = self.context() {
            return Some(ctx.ordinal());
        }
        None
    }

    /// CUDA rings: the ring's context ([`Producer::context`](crate::Producer#method.context));
    /// `None` for host rings.
    ///
    /// ```
    /// # use gpuring::{any::AnyProducer, Producer};
    /// let tx = AnyProducer::from(Producer::builder("doc-any-producer-context").create()?);
    /// assert!(tx.context().is_none());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[cfg(feature = "cuda")]
    pub fn context(&self) -> Option<&Arc<Context>> {
        self.cuda().map(Producer::context)
    }

    /// CUDA rings: the producer's own stream
    /// ([`Producer::stream`](crate::Producer#method.stream)); `None` for host rings.
    ///
    /// ```
    /// # use gpuring::{any::AnyProducer, Producer};
    /// let tx = AnyProducer::from(Producer::builder("doc-any-producer-stream").create()?);
    /// assert!(tx.stream().is_none());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[cfg(feature = "cuda")]
    pub fn stream(&self) -> Option<&Stream> {
        self.cuda().map(Producer::stream)
    }

    /// The host-memory producer, if the ring holds host memory.
    ///
    /// ```
    /// # use gpuring::{any::AnyProducer, Producer};
    /// let tx = AnyProducer::from(Producer::builder("doc-any-producer-host").create()?);
    /// assert_eq!(tx.host().map(|t| t.capacity()), Some(8));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn host(&self) -> Option<&Producer<Host>> {
        match &self.0 {
            Tx::Host(tx) => Some(tx),
            #[cfg(feature = "cuda")]
            Tx::Cuda(_) => None,
        }
    }

    /// The host producer, mutably: [`host`](Self::host) (for what takes `&mut`, such as loans).
    ///
    /// ```
    /// # use gpuring::{any::AnyProducer, Producer};
    /// let mut tx = AnyProducer::from(Producer::builder("doc-any-producer-host-mut").create()?);
    /// let loan = tx.host_mut().expect("a host ring").lend()?;
    /// tx.host_mut().unwrap().end_loan(loan)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn host_mut(&mut self) -> Option<&mut Producer<Host>> {
        match &mut self.0 {
            Tx::Host(tx) => Some(tx),
            #[cfg(feature = "cuda")]
            Tx::Cuda(_) => None,
        }
    }

    /// The CUDA producer, if the ring holds CUDA memory: for what only CUDA rings do
    /// (registered pools, linger).
    ///
    /// ```
    /// # use gpuring::{any::AnyProducer, Producer};
    /// let tx = AnyProducer::from(Producer::builder("doc-any-producer-cuda").create()?);
    /// assert!(tx.cuda().is_none());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[cfg(feature = "cuda")]
    pub fn cuda(&self) -> Option<&Producer<Cuda>> {
        match &self.0 {
            Tx::Host(_) => None,
            Tx::Cuda(tx) => Some(tx),
        }
    }

    /// The CUDA producer, mutably: [`cuda`](Self::cuda).
    ///
    /// ```
    /// # use gpuring::{any::AnyProducer, Producer};
    /// let mut tx = AnyProducer::from(Producer::builder("doc-any-producer-cuda-mut").create()?);
    /// assert!(tx.cuda_mut().is_none());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[cfg(feature = "cuda")]
    pub fn cuda_mut(&mut self) -> Option<&mut Producer<Cuda>> {
        match &mut self.0 {
            Tx::Host(_) => None,
            Tx::Cuda(tx) => Some(tx),
        }
    }
}

/// A claimed slot of an [`AnyProducer`]: a [`WriteSlot`] of either memory kind. Dropping it
/// unpublished gives it back, as a [`WriteSlot`] does.
///
/// ```
/// # use gpuring::{any::AnyProducer, Producer};
/// let mut tx = AnyProducer::from(Producer::builder("doc-any-write-slot").create()?);
/// let mut slot = tx.acquire()?;
/// slot.bytes_mut().expect("host memory")[..2].copy_from_slice(b"hi");
/// assert_eq!(slot.publish(2, b"")?, 0);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct AnyWriteSlot<'a>(Claimed<'a>);

enum Claimed<'a> {
    Host(WriteSlot<'a, Host>),
    #[cfg(feature = "cuda")]
    Cuda(WriteSlot<'a, Cuda>),
}

impl<'a> From<WriteSlot<'a, Host>> for AnyWriteSlot<'a> {
    /// Wraps a host-memory slot.
    ///
    /// ```
    /// # use gpuring::{any::AnyWriteSlot, Producer};
    /// let mut tx = Producer::builder("doc-any-write-slot-from").create()?;
    /// let slot = AnyWriteSlot::from(tx.acquire()?);
    /// assert_eq!(slot.seq(), 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    fn from(slot: WriteSlot<'a, Host>) -> AnyWriteSlot<'a> {
        AnyWriteSlot(Claimed::Host(slot))
    }
}

#[cfg(feature = "cuda")]
impl<'a> From<WriteSlot<'a, Cuda>> for AnyWriteSlot<'a> {
    /// Wraps a CUDA slot.
    ///
    /// ```no_run
    /// # use gpuring::{any::AnyWriteSlot, Producer};
    /// let mut tx = Producer::builder("cam0").create_gpu(0)?;
    /// let slot = AnyWriteSlot::from(tx.acquire()?);
    /// assert!(slot.stream().is_some());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    fn from(slot: WriteSlot<'a, Cuda>) -> AnyWriteSlot<'a> {
        AnyWriteSlot(Claimed::Cuda(slot))
    }
}

impl<'a> AnyWriteSlot<'a> {
    /// Where the slot's bytes are ([`WriteSlot::ptr`]): a device address in a CUDA ring, an
    /// address in this process in a host ring.
    ///
    /// ```
    /// # use gpuring::{any::AnyProducer, Producer};
    /// let mut tx = AnyProducer::from(Producer::builder("doc-any-write-slot-ptr").create()?);
    /// let mut slot = tx.acquire()?;
    /// assert_eq!(slot.ptr(), slot.bytes_mut().unwrap().as_ptr() as u64);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn ptr(&self) -> u64 {
        each!(Claimed, &self.0, s => s.ptr())
    }

    /// The bytes the slot can hold: the ring's slot size.
    ///
    /// ```
    /// # use gpuring::{any::AnyProducer, Producer};
    /// let b = Producer::builder("doc-any-write-slot-capacity").slot_size(4096);
    /// let mut tx = AnyProducer::from(b.create()?);
    /// assert_eq!(tx.acquire()?.capacity(), 4096);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn capacity(&self) -> usize {
        match &self.0 {
            Claimed::Host(s) => s.len(),
            #[cfg(feature = "cuda")]
            Claimed::Cuda(s) => s.capacity(),
        }
    }

    /// The index of the buffer being written ([`WriteSlot::buffer`]).
    ///
    /// ```
    /// # use gpuring::{any::AnyProducer, Producer};
    /// let mut tx = AnyProducer::from(Producer::builder("doc-any-write-slot-buffer").create()?);
    /// assert_eq!(tx.acquire()?.buffer(), 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn buffer(&self) -> usize {
        each!(Claimed, &self.0, s => s.buffer())
    }

    /// The sequence number this message will have ([`WriteSlot::seq`]).
    ///
    /// ```
    /// # use gpuring::{any::AnyProducer, Producer};
    /// let mut tx = AnyProducer::from(Producer::builder("doc-any-write-slot-seq").create()?);
    /// tx.acquire()?.publish(0, b"")?;
    /// assert_eq!(tx.acquire()?.seq(), 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn seq(&self) -> u64 {
        each!(Claimed, &self.0, s => s.seq())
    }

    /// Host rings: the slot's bytes, to write the message into; `None` for CUDA rings (write
    /// those on [`stream`](Self::stream)).
    ///
    /// ```
    /// # use gpuring::{any::AnyProducer, Producer};
    /// let b = Producer::builder("doc-any-write-slot-bytes").slot_size(64);
    /// let mut tx = AnyProducer::from(b.create()?);
    /// let mut slot = tx.acquire()?;
    /// assert_eq!(slot.bytes_mut().map(|b| b.len()), Some(64));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn bytes_mut(&mut self) -> Option<&mut [u8]> {
        match &mut self.0 {
            Claimed::Host(s) => Some(s),
            #[cfg(feature = "cuda")]
            Claimed::Cuda(_) => None,
        }
    }

    /// CUDA rings: the stream to write the slot on
    /// ([`WriteSlot::stream`](crate::WriteSlot#method.stream)); `None` for host rings.
    ///
    /// ```
    /// # use gpuring::{any::AnyProducer, Producer};
    /// let mut tx = AnyProducer::from(Producer::builder("doc-any-write-slot-stream").create()?);
    /// assert!(tx.acquire()?.stream().is_none());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[cfg(feature = "cuda")]
    pub fn stream(&self) -> Option<&Stream> {
        self.cuda().map(WriteSlot::stream)
    }

    /// The CUDA slot, if the ring holds CUDA memory: for what only CUDA slots do
    /// (`copy_from`, `publish_region`).
    ///
    /// ```
    /// # use gpuring::{any::AnyProducer, Producer};
    /// let mut tx = AnyProducer::from(Producer::builder("doc-any-write-slot-cuda").create()?);
    /// assert!(tx.acquire()?.cuda().is_none());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[cfg(feature = "cuda")]
    pub fn cuda(&self) -> Option<&WriteSlot<'a, Cuda>> {
        match &self.0 {
            Claimed::Host(_) => None,
            Claimed::Cuda(s) => Some(s),
        }
    }

    /// Publishes the first `len` bytes with user header `header` ([`WriteSlot::publish`]).
    /// Returns the sequence number.
    ///
    /// ```
    /// # use gpuring::{any::AnyProducer, Consumer, Producer};
    /// let mut tx = AnyProducer::from(Producer::builder("doc-any-write-slot-publish").create()?);
    /// let rx = Consumer::open("doc-any-write-slot-publish")?;
    /// let mut slot = tx.acquire()?;
    /// slot.bytes_mut().unwrap()[..2].copy_from_slice(b"hi");
    /// assert_eq!(slot.publish(2, b"text")?, 0);
    /// assert_eq!(&*rx.recv()?, b"hi");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn publish(self, len: usize, header: &[u8]) -> Result<u64, PublishError> {
        each!(Claimed, self.0, s => s.publish(len, header))
    }
}
