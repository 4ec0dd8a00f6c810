//! Where a ring's payload lives: the memory kinds a [`Producer`](crate::Producer) and a
//! [`Consumer`](crate::Consumer) are generic over.
//!
//! One producer type and one consumer type serve every kind; a kind supplies only what differs
//! (this module's two crate-private traits):
//!
//! * on the producer's side: the tables it adds to a new segment, what it waits for before it
//!   hands a claimed buffer out (for CUDA, that its own last write and its readers' GPU reads of
//!   the buffer are done), what it records before a publish (CUDA: the ready fence and the
//!   descriptor), what it drops when a consumer's entry is freed, and how it closes;
//! * on the consumer's side: what it opens when it joins, where a pinned message is (host: in
//!   the segment; CUDA: a device pointer, ordered on a stream), what it records before a
//!   release, and how it leaves.
//!
//! [`Host`] keeps the payload in the segment and adds nothing; [`Cuda`] keeps it in device
//! memory, shared either by legacy IPC handles or, with `Sharing::Vmm`, as `cuMemCreate`
//! memory handed out by file descriptor. The sharing is a setting of the `Cuda` kind that the
//! segment records, not a kind of its own: everything but the handle and fence steps is the
//! same.

use std::time::Duration;

use crate::consumer::ConsumerRing;
use crate::error::{CreateErrorKind, OpenErrorKind, PublishError};
use crate::format::view::MappedRing;
use crate::format::MemoryKind;
use crate::producer::ProducerRing;
use crate::ring::Pinned;

#[cfg(feature = "cuda")]
pub(crate) mod cuda;
mod fault;
mod host;

pub(crate) use fault::Fault;
pub use host::Host;

mod sealed {
    /// Only this crate's memory kinds implement [`super::Memory`].
    pub trait Sealed {}
}

/// A memory kind: [`Host`] or [`Cuda`]. Sealed: the kinds are this crate's.
///
/// ```
/// use gpuring::{Host, Memory, MemoryKind, Producer};
///
/// // Code generic over the memory kind: the same ring operations for both.
/// fn describe<M: Memory>(tx: &Producer<M>) -> String {
///     format!("{} in {:?} memory, {} slots", tx.name(), M::KIND, tx.capacity())
/// }
/// let tx = Producer::builder("doc-memory-trait").create()?;
/// assert_eq!(describe(&tx), "doc-memory-trait in Host memory, 8 slots");
/// assert_eq!(Host::KIND, MemoryKind::Host);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[allow(private_bounds)]
pub trait Memory: sealed::Sealed + Sized + Send + 'static {
    /// The kind, as the segment records it.
    const KIND: MemoryKind;
    /// What this kind adds to a producer.
    #[doc(hidden)]
    type Tx: ProducerSide;
    /// What this kind adds to a consumer.
    #[doc(hidden)]
    type Rx: ConsumerSide;
}

#[cfg(feature = "cuda")]
pub use cuda::{
    Cuda, Fence, GpuConsumer, GpuProducer, GpuReadSlot, GpuWriteSlot, PoolId, Sharing,
    DEFAULT_LINGER, SLOT_ALIGN,
};

/// Default for `gpu_poll` on both builders (CUDA rings): how long the CPU polls a pending
/// event (`cuEventQuery`, ~50 ns) before it hands the wait to the GPU (`cuStreamWaitEvent`).
/// See docs/performance.md for the measurements behind the value.
///
/// ```
/// use std::time::Duration;
/// assert_eq!(gpuring::DEFAULT_GPU_POLL, Duration::from_micros(30));
/// ```
pub const DEFAULT_GPU_POLL: Duration = Duration::from_micros(30);

/// The settings on a producer's builder that only some memory kinds read (the CUDA ones).
#[derive(Clone, Debug)]
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) struct TxSettings {
    /// The device the ring's memory is on (`create_gpu`'s argument).
    pub device: i32,
    /// How long `acquire` spins on a pending GPU event before it yields.
    pub gpu_poll: Duration,
    /// Order GPU work with memory words (`Fence::Memory`) rather than events.
    pub memory_fence: bool,
    /// Test support: do not wait for consumers' release events (`unfenced_for_tests`).
    pub unfenced: bool,
    /// VMM sharing (`Sharing::Vmm`) and whom it serves; `None`: legacy IPC.
    pub vmm: Option<crate::shm::fdpass::PeerPolicy>,
}

impl TxSettings {
    /// Whether the fences are memory words in the segment: with `Fence::Memory`, and always
    /// with VMM sharing.
    #[cfg(feature = "cuda")]
    pub(crate) fn words(&self) -> bool {
        self.memory_fence || self.vmm.is_some()
    }
}

impl Default for TxSettings {
    fn default() -> Self {
        TxSettings {
            device: 0,
            gpu_poll: DEFAULT_GPU_POLL,
            memory_fence: false,
            unfenced: false,
            vmm: None,
        }
    }
}

/// The settings on a consumer's builder that only some memory kinds read (the CUDA ones).
#[derive(Clone, Copy, Debug)]
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) struct RxSettings {
    /// The device to read on; `None`: the producer's.
    pub device: Option<i32>,
    /// How long `recv` polls a message's ready event before a GPU-side wait.
    pub gpu_poll: Duration,
}

impl Default for RxSettings {
    fn default() -> Self {
        RxSettings { device: None, gpu_poll: DEFAULT_GPU_POLL }
    }
}

/// What a memory kind adds to a producer. Every method but `create` runs on a ring whose
/// segment is published. Slot indices here are *buffer* indices (`capacity + spares` of them;
/// see `crate::ring`). The producer calls them in this order per message: `written` on the
/// buffer one lap back (the run-ahead bound, until true), its own claim of a buffer, `written`
/// on that buffer if it is another one and `readers_done` (each until true), then `publish` when
/// the user publishes. `forget` runs before the producer frees a consumer's entry, `close` once, at
/// drop.
pub(crate) trait ProducerSide: Send + Sized + 'static {
    /// The stream a buffer is written on (`()` for host memory, which has none).
    type Stream: 'static;

    /// What the kind needs before the segment exists (CUDA: the device's context).
    type Prepared;

    /// Makes what the kind needs first, so that a kind that cannot be had (no usable GPU) is
    /// refused before the segment is created (or a dead producer's replaced).
    fn prepare(settings: &TxSettings) -> Result<Self::Prepared, CreateErrorKind>;

    /// Creates the kind's tables in the segment, which nobody sees yet.
    fn create(
        prepared: Self::Prepared,
        settings: &TxSettings,
        map: &MappedRing,
    ) -> Result<Self, CreateErrorKind>;

    /// How long the producer spins on a pending condition of this kind before it yields.
    fn spin(&self) -> Duration;

    /// Whether the GPU (or whatever writes the payload) has finished writing buffer `slot`'s
    /// previous message, so it can be written again.
    fn written(&mut self, ring: &ProducerRing, slot: usize) -> Result<bool, Fault>;

    /// Whether the consumers that read message `prev` in buffer `slot` are done reading it (on
    /// their GPUs): called once the buffer is claimed. May evict a consumer through `ring`.
    fn readers_done(
        &mut self,
        ring: &mut ProducerRing,
        slot: usize,
        prev: u64,
    ) -> Result<bool, Fault>;

    /// Drops what the producer opened of consumer entry `entry` (generation `generation`).
    fn forget(&mut self, entry: usize, generation: u32);

    /// Records what consumers need to read the message in buffer `slot` (pool `pool`, at
    /// `offset`), written on `stream` (or the producer's own): the fence, the descriptor.
    fn publish(
        &mut self,
        ring: &ProducerRing,
        slot: usize,
        at: (u32, u64),
        stream: Option<&Self::Stream>,
    ) -> Result<(), PublishError>;

    /// Where a plain `publish` of buffer `slot` puts the message: (pool, offset).
    fn slot_region(&self, slot: usize) -> (u32, u64);

    /// Where buffer `slot`'s bytes are: a host address in this process, or a device address.
    fn slot_addr(&self, ring: &ProducerRing, slot: usize) -> u64;

    /// Closes the ring (the producer is dropped).
    fn close(&mut self, ring: &mut ProducerRing);
}

/// What a memory kind adds to a consumer. `Send + Sync`, as the consumer is: its `&self`
/// methods may run on several threads at once.
pub(crate) trait ConsumerSide: Sized + Send + Sync + 'static {
    /// The stream a message is read on (`()` for host memory).
    type Stream: Send + Sync + 'static;

    /// Opens what the consumer of claimed entry `entry` (generation `generation`) needs, before
    /// it becomes active.
    fn join(
        settings: &RxSettings,
        map: &MappedRing,
        entry: usize,
        generation: u32,
    ) -> Result<Self, OpenErrorKind>;

    /// Finds pinned message `m` and orders the next work on `stream` (or the kind's own) after
    /// its writer's. Returns where its bytes are: a host address in this process, or a device
    /// address.
    fn place(
        &self,
        ring: &ConsumerRing,
        m: &Pinned,
        stream: Option<&Self::Stream>,
    ) -> Result<u64, Fault>;

    /// Records that the reads of `m` queued so far on `stream` (or the kind's own) are the
    /// last; the ring release follows.
    fn release(
        &self,
        ring: &ConsumerRing,
        m: &Pinned,
        stream: Option<&Self::Stream>,
    ) -> Result<(), Fault>;

    /// Leaves the ring (the consumer is dropped).
    fn leave(&mut self, ring: &mut ConsumerRing);
}
