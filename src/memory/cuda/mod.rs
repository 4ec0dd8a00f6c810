//! CUDA memory: the payload lives in device memory, shared with consumers by legacy IPC
//! handles or, with [`Sharing::Vmm`], as file descriptors; the hand-off is fenced on the GPU.
//!
//! The ring protocol is the host one; what differs is where the bytes live and how reuse is
//! fenced. Each slot is a region of a device allocation, shared once per consumer. Publishing
//! queues the buffer's ready fence on the producer's stream (event fences: its ready event;
//! memory fences: a write of its ready word in the segment); a consumer's stream waits on it
//! before its kernels read. Releasing queues the consumer's own release fence; the producer polls those (on the
//! CPU, a lap later) before it rewrites the buffer, so its stream never depends on work another
//! process may never run. Consumers never wait for the GPU on the CPU. See `docs/gpu.md`.
//! `words` holds the memory fence words, `fence` the one ordering step both sides take.
//!
//! `tx` is the producer's side (`CudaTx`), `rx` the consumer's (`CudaRx`): they answer the
//! producer's and the consumer's questions (`crate::memory::{ProducerSide, ConsumerSide}`).
//! What only CUDA producers and consumers have as API (streams, pools, device pointers) is in
//! `crate::producer::cuda` and `crate::consumer::cuda`, over these sides.

mod fence;
mod placement;
mod rx;
mod tx;
mod words;

use std::mem::ManuallyDrop;
use std::ops::{Deref, DerefMut};

pub(crate) use rx::CudaRx;
pub(crate) use tx::CudaTx;
pub use tx::{PoolId, DEFAULT_LINGER, SLOT_ALIGN};

use super::{sealed, Memory};
use crate::cuda::driver::{self, DriverError};
use crate::cuda::{Context, CudaError, Stream};
use crate::format::MemoryKind;
use crate::shm::fdpass::PeerPolicy;

/// CUDA device memory: the payload lives on a GPU and never crosses PCIe. Feature `cuda`.
///
/// ```no_run
/// use gpuring::{Consumer, Cuda, Producer};
///
/// let tx: Producer<Cuda> = Producer::builder("cam0").slot_size(1 << 20).create_gpu(0)?;
/// // ...in another process:
/// let rx: Consumer<Cuda> = Consumer::open_gpu("cam0")?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Cuda;

impl sealed::Sealed for Cuda {}

impl Memory for Cuda {
    const KIND: MemoryKind = MemoryKind::Cuda;
    type Tx = CudaTx;
    type Rx = CudaRx;
}

/// How a CUDA ring orders the GPU work of its processes: the producer's writes before a
/// consumer's reads, and those reads before the producer rewrites the slot. Chosen by the
/// producer ([`ProducerBuilder::fence`](crate::ProducerBuilder::fence)); consumers follow the
/// segment. Either way a wait whose work already completed is skipped, and a pending one is
/// first polled on the CPU (see [`DEFAULT_GPU_POLL`](crate::DEFAULT_GPU_POLL)).
/// docs/containers.md says which works in which container layout: events need every process
/// to see the producer's /dev/shm, memory fences only the ring directory.
///
/// ```no_run
/// use gpuring::{Fence, Producer};
///
/// assert_eq!(Fence::default(), Fence::Auto);
/// let tx = Producer::builder("cam0").fence(Fence::Events).create_gpu(0)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Fence {
    /// [`Memory`](Self::Memory) where the producer's device can use 64-bit stream memory
    /// operations (every GPU of compute capability 7.0 or later on a current driver), else
    /// [`Events`](Self::Events). Memory words hand a frame over in fewer GPU operations, make
    /// no interprocess event, and work in every container layout that shares the ring
    /// directory; docs/performance.md has the measurements behind the choice.
    #[default]
    Auto,
    /// Interprocess CUDA events: `cuEventRecord`, then `cuStreamWaitEvent` in the other
    /// process. Works on every CUDA device that supports legacy IPC, between processes that
    /// see the same /dev/shm (the driver opens an event through a file there): a consumer in a
    /// container with its own /dev/shm cannot open them, and its open says so. Legacy sharing
    /// only.
    Events,
    /// Sequence words in the ring's segment, which every process page-locks for its device
    /// (`cuMemHostRegister`): `cuStreamWriteValue64` after the work, `cuStreamWaitValue64`
    /// (greater or equal) before the dependent work, and plain loads on the CPU (skipped
    /// waits, `gpu_poll`, run-ahead). No IPC event is made, so it works wherever the ring
    /// directory is shared, containers with their own /dev/shm included. Needs 64-bit stream
    /// memory operations (`CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS`) on every
    /// process's device. VMM sharing always fences so.
    Memory,
}

impl Fence {
    /// The fence named `name` on command lines and in the Python and C bindings: "auto",
    /// "events" or "memory".
    ///
    /// ```
    /// use gpuring::Fence;
    ///
    /// assert_eq!(Fence::from_name("memory"), Some(Fence::Memory));
    /// assert_eq!(Fence::from_name("event"), None);
    /// ```
    pub fn from_name(name: &str) -> Option<Fence> {
        match name {
            "auto" => Some(Fence::Auto),
            "events" => Some(Fence::Events),
            "memory" => Some(Fence::Memory),
            _ => None,
        }
    }
}

/// How a CUDA ring's memory and fences reach its consumers. Chosen by the producer
/// ([`ProducerBuilder::sharing`](crate::ProducerBuilder::sharing)); consumers follow what the segment says, and never fall
/// back from one to the other. docs/gpu.md ("Sharing modes") says when to pick which, and
/// docs/security.md what each exposes to whom.
///
/// ```no_run
/// use gpuring::{PeerPolicy, Producer, Sharing};
///
/// assert_eq!(Sharing::default(), Sharing::Legacy);
/// // Memory handed out by file descriptor, to processes of our uid or of group 44 only.
/// let policy = PeerPolicy::Allow { uids: vec![], gids: vec![44] };
/// let tx = Producer::builder("cam0").sharing(Sharing::Vmm(policy)).create_gpu(0)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Sharing {
    /// Legacy CUDA IPC: each pool's 64-byte `cuIpcGetMemHandle` handle and each buffer's
    /// interprocess event handle are in the segment, so any process that can read the segment
    /// can map the memory. Works on every device and driver with legacy IPC; the fastest
    /// measured path.
    #[default]
    Legacy,
    /// Virtual memory management: pools from `cuMemCreate`, handed to each consumer as file
    /// descriptors over a unix socket, only to the peers the [`PeerPolicy`](crate::PeerPolicy) admits (the kernel
    /// reports their uid and groups). Fences are always [`Fence::Memory`]'s words in the
    /// segment: no IPC handle of any kind is made. Memory stays valid for a consumer after the producer exits. Needs a
    /// device with VMM and POSIX-fd handle support, and 64-bit stream memory operations.
    Vmm(PeerPolicy),
}

impl Sharing {
    /// `"legacy"` or `"vmm"`: the name the CLI, Python and `gpuring stat` use.
    ///
    /// ```
    /// assert_eq!(gpuring::Sharing::Legacy.name(), "legacy");
    /// assert_eq!(gpuring::Sharing::Vmm(Default::default()).name(), "vmm");
    /// ```
    pub fn name(&self) -> &'static str {
        match self {
            Sharing::Legacy => "legacy",
            Sharing::Vmm(_) => "vmm",
        }
    }

    /// Parses a name as [`name`](Self::name) gives it, with the default peer policy for VMM
    /// (same uid).
    ///
    /// ```
    /// use gpuring::{PeerPolicy, Sharing};
    ///
    /// assert_eq!(Sharing::from_name("vmm"), Some(Sharing::Vmm(PeerPolicy::SameUid)));
    /// assert_eq!(Sharing::from_name("ipc"), None);
    /// ```
    pub fn from_name(name: &str) -> Option<Sharing> {
        match name {
            "legacy" => Some(Sharing::Legacy),
            "vmm" => Some(Sharing::Vmm(PeerPolicy::default())),
            _ => None,
        }
    }
}

/// What device `ordinal` lacks, if anything, of what every process using a ring needs of its
/// device: 64-bit stream memory operations where the fences are memory words (`words`), and
/// fd-shared `cuMemCreate` memory for VMM sharing. The producer asks it of its device at
/// create, a consumer of the device it reads on at open.
fn lacks(ordinal: i32, vmm: bool, words: bool) -> Result<Option<&'static str>, DriverError> {
    let dev = driver::device(ordinal)?;
    if words && !driver::can_use_64_bit_stream_mem_ops(dev)? {
        return Ok(Some("64-bit stream memory operations (the fences are memory words)"));
    }
    if vmm && !driver::vmm_supported(dev)? {
        return Ok(Some("cuMemCreate memory shared by POSIX file descriptor"));
    }
    Ok(None)
}

/// `reason` (why CUDA did not start), with what is wrong if this process's /proc is another
/// pid namespace's: the driver does not start then (`cuInit` fails with
/// `CUDA_ERROR_OPERATING_SYSTEM`).
fn with_proc_hint(reason: String) -> String {
    if !crate::shm::ns::foreign_proc() {
        return reason;
    }
    format!(
        "{reason}; this process's /proc belongs to another pid namespace than its own (started \
         with `unshare --pid` but no `--mount-proc`?): CUDA needs a /proc of its own pid \
         namespace, as every container has"
    )
}

/// What a side owns of the GPU that someone else may still use after it is done: freed when
/// dropped, unless [`leak`](Self::leak) gave it up to process exit (a peer may still map the
/// memory or wait on the fences, or our own unfinished GPU work may still use them). The one
/// way either side leaks.
pub(crate) struct Leakable<T> {
    /// Invariant: dropped exactly once, by our `Drop`, unless `leaked`.
    value: ManuallyDrop<T>,
    leaked: bool,
}

impl<T> Leakable<T> {
    pub(crate) fn new(value: T) -> Leakable<T> {
        Leakable { value: ManuallyDrop::new(value), leaked: false }
    }

    /// Never frees it: it stays until the process exits.
    pub(crate) fn leak(&mut self) {
        self.leaked = true;
    }
}

impl<T> Deref for Leakable<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.value
    }
}

impl<T> DerefMut for Leakable<T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.value
    }
}

impl<T> Drop for Leakable<T> {
    fn drop(&mut self) {
        if !self.leaked {
            // SAFETY: dropped only here, once, and never used again (we are being dropped).
            unsafe { ManuallyDrop::drop(&mut self.value) }
        }
    }
}

/// Refuses a stream of another device than `ctx`'s: the producer's, or the one a consumer reads
/// on.
pub(crate) fn same_device(stream: &Stream, ctx: &Context) -> Result<(), CudaError> {
    let (theirs, ours) = (stream.context().ordinal(), ctx.ordinal());
    if theirs != ours {
        return Err(CudaError::ForeignStream { stream: theirs, ring: ours });
    }
    Ok(())
}
