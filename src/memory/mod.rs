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

use crate::error::{CreateErrorKind, Fault, OpenErrorKind, PublishError};
use crate::format::MemoryKind;
use crate::ring::Pinned;
use crate::shm::view::MappedRing;
use crate::shm::wait::WaitConfig;

#[cfg(feature = "cuda")]
pub(crate) mod cuda;
mod host;

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
pub use cuda::{Cuda, Fence, PoolId, Sharing, DEFAULT_LINGER, SLOT_ALIGN};
// The CUDA aliases of the API types are the producer's and the consumer's (`producer::cuda`,
// `consumer::cuda`); they stay reachable here, where they were first published. The one
// mention of the layers above in this module: a name, not a dependency of its code.
#[cfg(feature = "cuda")]
#[doc(no_inline)]
pub use crate::consumer::{GpuConsumer, GpuReadSlot};
#[cfg(feature = "cuda")]
#[doc(no_inline)]
pub use crate::producer::{GpuProducer, GpuWriteSlot};

/// Default for `gpu_poll` on both builders (CUDA rings). A consumer polls a pending ready
/// fence (a load of a memory word, or `cuEventQuery` of an event, ~50 ns) for this long before
/// it hands the wait to the GPU (`cuStreamWaitValue64` or `cuStreamWaitEvent`): a wait the CPU
/// saw end costs the GPU nothing. A producer spins this long on a pending release fence before
/// it yields. See docs/performance.md for the measurements behind the value.
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
    /// Order GPU work with memory words (`Some(true)`: `Fence::Memory`), with events
    /// (`Some(false)`: `Fence::Events`), or with memory words where the device can use them
    /// (`None`: `Fence::Auto`).
    pub memory_fence: Option<bool>,
    /// Test support: do not wait for consumers' release events (`unfenced_for_tests`).
    pub unfenced: bool,
    /// VMM sharing (`Sharing::Vmm`) and whom it serves; `None`: legacy IPC.
    pub vmm: Option<crate::shm::fdpass::PeerPolicy>,
}

impl Default for TxSettings {
    fn default() -> Self {
        TxSettings {
            device: 0,
            gpu_poll: DEFAULT_GPU_POLL,
            memory_fence: None,
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

/// What a consumer table entry's release fences tell a producer that waits to reuse a buffer
/// ([`ProducerSide::readers_done`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) enum Readers {
    /// Every reader of the buffer's previous message is done with it.
    Done,
    /// Some reader is not done yet: ask again.
    Busy,
    /// Consumer `entry`, whose lease was seen as `seen`, failed in a way that is its entry's
    /// alone (`reason`: a `ring::lease::evict_reason`): the producer evicts it, then asks again.
    Evict { entry: usize, seen: u64, reason: u32 },
}

/// How a consumer leaves, once its memory kind is quiet ([`ConsumerSide::quiesce`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) enum Quiesced {
    /// Free the entry now: nothing of ours is left that the producer holds.
    Free,
    /// Retire the entry and wait for the producer to let go of it (it holds imports of ours),
    /// then tell the kind ([`ConsumerSide::retired`]).
    Retire,
    /// Our GPU work never finished: keep the entry (stepped aside) until the process exits, so
    /// that the producer does not free what that work still reads.
    StepAside,
}

/// What a closing producer's memory kind did with its memory ([`ProducerSide::close`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Closed {
    /// Freed: nobody can use it any more.
    Freed,
    /// Left to process exit, because someone may still use it: the producer stays alive to
    /// consumers (its liveness lock) until then.
    Kept,
}

/// A consumer table entry as its occupant knows it: the index and the generation it joined as.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Member {
    pub entry: usize,
    pub generation: u32,
}

/// What a memory kind adds to a producer: it answers, the producer acts (claims, evicts,
/// reaps, closes). Every method but `prepare` and `create` runs on a ring whose segment is
/// published, and sees the mapped segment, never the producer. Buffer indices here are *buffer*
/// indices (`capacity + spares` of them; see `crate::ring`). The producer asks, per message:
/// `written` on the buffer one lap back (the run-ahead bound, until true), then claims a buffer,
/// then `written` on that buffer if it is another one and `readers_done` (each until done), then
/// `publish` when the user publishes. `forget` runs before the producer frees a consumer's
/// entry; at drop, after the ring is closed, `linger` and `close`.
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
    fn spin(&self) -> Duration {
        Duration::ZERO
    }

    /// Whether the GPU (or whatever writes the payload) has finished writing buffer `buffer`'s
    /// previous message, so it can be written again.
    fn written(&mut self, _map: &MappedRing, _buffer: usize) -> Result<bool, Fault> {
        Ok(true)
    }

    /// Whether the consumers that read message `prev` in buffer `buffer` are done reading it
    /// (on their GPUs): asked once the buffer is claimed. A host consumer's reads end with its
    /// release, which the claim already waited for.
    fn readers_done(
        &mut self,
        _map: &MappedRing,
        _buffer: usize,
        _prev: u64,
    ) -> Result<Readers, Fault> {
        Ok(Readers::Done)
    }

    /// Drops what the producer opened of consumer entry `entry` (generation `generation`).
    fn forget(&mut self, _entry: usize, _generation: u32) {}

    /// Records what consumers need to read message `seq` in buffer `buffer` (at `at`, a pool
    /// and an offset; `None`: the buffer's own region), written on `stream` (or the producer's
    /// own): the fence, the descriptor. The ring's publish follows.
    fn publish(
        &mut self,
        map: &MappedRing,
        buffer: usize,
        seq: u64,
        at: Option<(u32, u64)>,
        stream: Option<&Self::Stream>,
    ) -> Result<(), PublishError>;

    /// Where buffer `buffer`'s bytes are: a host address in this process, or a device address.
    fn buffer_addr(&self, map: &MappedRing, buffer: usize) -> u64;

    /// How long a closing producer waits for its consumers to leave before
    /// [`close`](Self::close); `None`: it does not wait (nothing of the kind outlives the
    /// segment).
    fn linger(&self) -> Option<Duration> {
        None
    }

    /// Lets go of the kind's memory once the ring is closed and the linger time is over
    /// (`all_left`: every consumer left in it): waits for its own writes, drops what it opened
    /// of consumers, and frees the memory unless someone may still use it.
    fn close(&mut self, _map: &MappedRing, _all_left: bool) -> Closed {
        Closed::Freed
    }
}

/// What a memory kind adds to a consumer: it answers, the consumer acts (pins, releases,
/// leaves). `Send + Sync`, as the consumer is: its `&self` methods may run on several threads
/// at once.
pub(crate) trait ConsumerSide: Sized + Send + Sync + 'static {
    /// The stream a message is read on (`()` for host memory).
    type Stream: Send + Sync + 'static;

    /// Whether a consumer maps memory of the producer's that the producer frees when it closes
    /// (CUDA), so that one must not join a ring that closed while it claimed its entry. True
    /// unless a kind says otherwise, which fails safe: a host consumer that joins such a ring
    /// drains what was published and is then disconnected.
    const MAPS_PRODUCER_MEMORY: bool = true;

    /// Opens what the consumer of claimed entry `member` needs, before it becomes active.
    fn join(settings: &RxSettings, map: &MappedRing, member: Member)
        -> Result<Self, OpenErrorKind>;

    /// Finds pinned message `m` and orders the next work on `stream` (or the kind's own) after
    /// its writer's. Returns where its bytes are: a host address in this process, or a device
    /// address.
    fn place(
        &self,
        map: &MappedRing,
        m: &Pinned,
        stream: Option<&Self::Stream>,
    ) -> Result<u64, Fault>;

    /// Records that the reads of `m` queued so far on `stream` (or the kind's own) are the
    /// last; the ring release follows.
    fn release(
        &self,
        _map: &MappedRing,
        _member: Member,
        _m: &Pinned,
        _stream: Option<&Self::Stream>,
    ) -> Result<(), Fault> {
        Ok(())
    }

    /// The consumer leaves: ends the kind's own work and closes what it opened of the producer,
    /// polling as `wait` says and asking `producer_alive` while it waits, and says how the
    /// entry goes.
    fn quiesce(
        &mut self,
        _map: &MappedRing,
        _member: Member,
        _wait: WaitConfig,
        _producer_alive: &dyn Fn() -> bool,
    ) -> Quiesced {
        Quiesced::Free
    }

    /// After [`Quiesced::Retire`]: whether the producer let go of the entry (`let_go`), so that
    /// what it held of ours may be destroyed; if not, it is left to process exit.
    fn retired(&mut self, _map: &MappedRing, _member: Member, _let_go: bool) {}
}
