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
//! [`tx`] is the producer's side ([`CudaTx`]), [`rx`] the consumer's ([`CudaRx`]); each also
//! holds the methods only CUDA rings have (streams, pools, device pointers).

mod fence;
mod placement;
mod rx;
mod tx;
mod words;

use std::time::Duration;

pub(crate) use rx::CudaRx;
pub(crate) use tx::CudaTx;
pub use tx::{PoolId, DEFAULT_LINGER, SLOT_ALIGN};

use super::{sealed, Memory};
use crate::consumer::{Consumer, ConsumerBuilder, ReadSlot};
use crate::cuda::driver::{self, DriverError};
use crate::cuda::{Context, CudaError, Stream};
use crate::error::{CreateError, OpenError};
use crate::format::MemoryKind;
use crate::producer::{Producer, ProducerBuilder, WriteSlot};
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

/// The producer of a CUDA-memory ring: [`Producer<Cuda>`], under the name it had before the
/// producer became generic.
///
/// ```no_run
/// let tx: gpuring::GpuProducer = gpuring::Producer::builder("cam0").create_gpu(0)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub type GpuProducer = Producer<Cuda>;

/// A consumer of a CUDA-memory ring: [`Consumer<Cuda>`].
///
/// ```no_run
/// let rx: gpuring::GpuConsumer = gpuring::Consumer::open_gpu("cam0")?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub type GpuConsumer = Consumer<Cuda>;

/// A claimed slot of a CUDA-memory ring: [`WriteSlot<'a, Cuda>`].
///
/// ```no_run
/// # let mut tx = gpuring::Producer::builder("cam0").create_gpu(0)?;
/// let slot: gpuring::GpuWriteSlot<'_> = tx.acquire()?;
/// slot.publish(0, b"")?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub type GpuWriteSlot<'a> = WriteSlot<'a, Cuda>;

/// A received message of a CUDA-memory ring: [`ReadSlot<'a, Cuda>`].
///
/// ```no_run
/// # let rx = gpuring::Consumer::open_gpu("cam0")?;
/// let frame: gpuring::GpuReadSlot<'_> = rx.recv()?;
/// println!("{} bytes at {:#x}", frame.len(), frame.ptr());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub type GpuReadSlot<'a> = ReadSlot<'a, Cuda>;

/// How a CUDA ring orders the GPU work of its processes: the producer's writes before a
/// consumer's reads, and those reads before the producer rewrites the slot. Chosen by the
/// producer ([`ProducerBuilder::fence`]); consumers follow the segment. Either way a wait whose
/// work already completed is skipped, and a pending one is first polled on the CPU for
/// `gpu_poll`. docs/containers.md says which works in which container layout: events need
/// every process to see the producer's /dev/shm, memory fences only the ring directory.
///
/// ```no_run
/// use gpuring::{Fence, Producer};
///
/// assert_eq!(Fence::default(), Fence::Events);
/// let tx = Producer::builder("cam0").fence(Fence::Memory).create_gpu(0)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Fence {
    /// Interprocess CUDA events: `cuEventRecord`, then `cuStreamWaitEvent` in the other
    /// process. Works on every CUDA device that supports legacy IPC, between processes that
    /// see the same /dev/shm (the driver opens an event through a file there): a consumer in a
    /// container with its own /dev/shm cannot open them, and its open says so. Legacy sharing
    /// only.
    #[default]
    Events,
    /// Sequence words in the ring's segment, which every process page-locks for its device
    /// (`cuMemHostRegister`): `cuStreamWriteValue64` after the work, `cuStreamWaitValue64`
    /// (greater or equal) before the dependent work, and plain loads on the CPU (skipped
    /// waits, `gpu_poll`, run-ahead). No IPC event is made, so it works wherever the ring
    /// directory is shared, containers with their own /dev/shm included. Needs 64-bit stream
    /// memory operations (`CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS`). VMM sharing
    /// always fences so.
    Memory,
}

/// How a CUDA ring's memory and fences reach its consumers. Chosen by the producer
/// ([`ProducerBuilder::sharing`]); consumers follow what the segment says, and never fall
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
    /// descriptors over a unix socket, only to the peers the [`PeerPolicy`] admits (the kernel
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
/// device: 64-bit stream memory operations where the fences are memory words (`words`: with
/// `Fence::Memory`, and always with VMM sharing), and fd-shared `cuMemCreate` memory for VMM
/// sharing. The
/// producer asks it of its device at create, a consumer of the device it reads on at open.
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

/// Refuses a stream of another device than `ctx`'s: the producer's, or the one a consumer reads
/// on.
fn same_device(stream: &Stream, ctx: &Context) -> Result<(), CudaError> {
    let (theirs, ours) = (stream.context().ordinal(), ctx.ordinal());
    if theirs != ours {
        return Err(CudaError::ForeignStream { stream: theirs, ring: ours });
    }
    Ok(())
}

impl ProducerBuilder {
    /// Creates a CUDA-memory ring on device `ordinal`: one device allocation holds every
    /// buffer, each with a ready fence (legacy sharing: an interprocess event; VMM: a word in
    /// the segment). Fails with [`CreateErrorKind::MemoryUnavailable`](crate::CreateErrorKind::MemoryUnavailable) where there is no usable CUDA
    /// driver or device, or the device cannot do what [`sharing`](Self::sharing) asks.
    ///
    /// ```no_run
    /// use gpuring::{CreateErrorKind, Producer};
    ///
    /// let frame = 1920 * 1080 * 4; // one 1080p RGBA frame per slot
    /// match Producer::builder("cam0").capacity(8).slot_size(frame).create_gpu(0) {
    ///     Ok(tx) => println!("ring {} is on GPU 0", tx.name()),
    ///     Err(e) if matches!(e.kind(), CreateErrorKind::MemoryUnavailable { .. }) => {
    ///         eprintln!("no GPU: {e}")
    ///     }
    ///     Err(e) => return Err(e.into()),
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn create_gpu(mut self, ordinal: i32) -> Result<Producer<Cuda>, CreateError> {
        self.kind.device = ordinal;
        self.create_in()
    }

    /// CUDA rings: the device the ring's memory is on, for
    /// [`create_in::<Cuda>`](ProducerBuilder::create_in). Default 0. (`create_gpu` takes it as
    /// its argument.)
    ///
    /// ```no_run
    /// use gpuring::{Cuda, Producer};
    ///
    /// let tx = Producer::builder("cam1").device(1).create_in::<Cuda>()?;
    /// assert_eq!(tx.context().ordinal(), 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn device(mut self, ordinal: i32) -> Self {
        self.kind.device = ordinal;
        self
    }

    /// CUDA rings: how long `acquire` spins on a pending release event of a slot's previous
    /// readers (`cuEventQuery`, ~50 ns a look) before it starts yielding the CPU and napping.
    /// Default [`DEFAULT_GPU_POLL`](crate::DEFAULT_GPU_POLL). (The producer waits for its
    /// readers on the CPU, never on the GPU: see docs/gpu.md, "Reusing a buffer".)
    ///
    /// ```no_run
    /// use std::time::Duration;
    ///
    /// // Yield at once: for a producer thread that shares its core with other work.
    /// let tx = gpuring::Producer::builder("cam0").gpu_poll(Duration::ZERO).create_gpu(0)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn gpu_poll(mut self, window: Duration) -> Self {
        self.kind.gpu_poll = window;
        self
    }

    /// CUDA rings: how GPU work is ordered across processes. Default [`Fence::Events`]; see
    /// [`Fence`], and docs/containers.md for which works where.
    ///
    /// ```no_run
    /// use gpuring::{Fence, Producer};
    ///
    /// let tx = Producer::builder("cam0").fence(Fence::Memory).create_gpu(0)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn fence(mut self, fence: Fence) -> Self {
        self.kind.memory_fence = fence == Fence::Memory;
        self
    }

    /// CUDA rings: how the memory and fences reach consumers. Default [`Sharing::Legacy`].
    /// [`Sharing::Vmm`] always fences with memory words, whatever [`fence`](Self::fence)
    /// says.
    ///
    /// ```no_run
    /// use gpuring::{PeerPolicy, Producer, Sharing};
    ///
    /// let tx = Producer::builder("cam0").sharing(Sharing::Vmm(PeerPolicy::SameUid)).create_gpu(0)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn sharing(mut self, sharing: Sharing) -> Self {
        self.kind.vmm = match sharing {
            Sharing::Legacy => None,
            Sharing::Vmm(policy) => Some(policy),
        };
        self
    }
}

impl ConsumerBuilder {
    /// Opens a CUDA-memory ring and joins it, on the device the producer uses (or on the
    /// device [`device`](ConsumerBuilder::device) names, which may be another GPU with peer
    /// access to the ring's).
    /// Maps the producer's pools (legacy: from their IPC handles; VMM: from the fds the
    /// producer's server sends, if its peer policy admits this process, else
    /// [`OpenErrorKind::PeerRefused`](crate::OpenErrorKind::PeerRefused)) and opens the buffers' fences once, here.
    ///
    /// ```no_run
    /// # fn infer(_src: u64, _len: usize, _stream: &gpuring::cuda::Stream) {}
    /// let rx = gpuring::Consumer::builder("cam0").open_gpu()?;
    /// let frame = rx.recv()?; // frame.stream() already waits for the producer's writes
    /// infer(frame.ptr(), frame.len(), frame.stream());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn open_gpu(self) -> Result<Consumer<Cuda>, OpenError> {
        self.open_in()
    }

    /// Opens a CUDA ring, waiting up to `timeout` for an instance other than `not_epoch` to
    /// appear and be ready, and ends the builder: [`open_when_ready`](Self::open_when_ready),
    /// then [`open_gpu`](Self::open_gpu). (`open_in_timeout::<Cuda>(timeout)` is the plain wait.)
    ///
    /// ```no_run
    /// use std::time::Duration;
    ///
    /// // The producer may start after us: wait up to 10 s for it to create the ring.
    /// let builder = gpuring::Consumer::builder("cam0");
    /// let rx = builder.open_gpu_when_ready(None, Duration::from_secs(10))?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn open_gpu_when_ready(
        self,
        not_epoch: Option<u64>,
        timeout: Duration,
    ) -> Result<Consumer<Cuda>, OpenError> {
        self.open_in_when_ready(not_epoch, timeout)
    }

    /// The device to read on (CUDA rings). Default: the ring's device, found by UUID.
    ///
    /// Another GPU than the ring's reads its memory across the link between them (NVLink or
    /// PCIe), with no copy; it needs peer access to the ring's GPU, or the open fails with
    /// [`OpenErrorKind::NoPeerAccess`](crate::OpenErrorKind::NoPeerAccess), naming both.
    /// Both sharing modes and both fences work so; docs/scaling.md says when copying each
    /// message once to the other GPU is the better plan.
    ///
    /// ```no_run
    /// // The ring's memory is on GPU 0; this consumer's kernels run on GPU 1.
    /// let rx = gpuring::Consumer::builder("cam0").device(1).open_gpu()?;
    /// assert_eq!(rx.context().ordinal(), 1);
    /// let frame = rx.recv()?; // frame.stream() is a GPU 1 stream; frame.ptr() maps GPU 0's memory
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// Where several consumers on GPU 1 would each read every frame across the link, copy each
    /// frame once into a ring on GPU 1 instead, and let them read that one (docs/scaling.md).
    /// This relay never syncs on the CPU: the copy runs on the new slot's stream, which waits
    /// for the frame first, and the frame's release is queued after the copy.
    ///
    /// ```no_run
    /// use gpuring::{Consumer, Producer, RecvError};
    ///
    /// let rx = Consumer::builder("cam0").device(1).open_gpu()?; // memory on GPU 0
    /// let mut tx = Producer::builder("cam0-gpu1")
    ///     .slot_size(rx.slot_size())
    ///     .user_header_size(rx.user_header_size() as u32)
    ///     .create_gpu(1)?;
    /// loop {
    ///     let slot = tx.acquire()?;
    ///     let frame = match rx.recv_on(slot.stream()) {
    ///         Ok(frame) => frame,
    ///         Err(RecvError::Disconnected) => break, // the upstream producer closed or died
    ///         Err(e) => return Err(e.into()),
    ///     };
    ///     // SAFETY: the frame's bytes stay readable on the slot's stream, which waits for
    ///     // them, until its release, queued on that stream after the copy when `frame` drops.
    ///     unsafe { slot.copy_from(frame.ptr(), frame.len()) }?;
    ///     let (len, header) = (frame.len(), frame.header().to_vec());
    ///     drop(frame);
    ///     slot.publish(len, &header)?;
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn device(mut self, ordinal: i32) -> Self {
        self.kind.device = Some(ordinal);
        self
    }

    /// CUDA rings: how long `recv` polls a frame's ready event on the CPU (`cuEventQuery`)
    /// before it makes the stream wait for it on the GPU instead. A frame that completes within
    /// the window is read with no GPU-side wait at all. Default
    /// [`DEFAULT_GPU_POLL`](crate::DEFAULT_GPU_POLL).
    ///
    /// ```no_run
    /// use std::time::Duration;
    ///
    /// // Hand every pending wait to the GPU at once: lowest latency for a mostly idle ring.
    /// let rx = gpuring::Consumer::builder("cam0").gpu_poll(Duration::ZERO).open_gpu()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn gpu_poll(mut self, window: Duration) -> Self {
        self.kind.gpu_poll = window;
        self
    }
}
