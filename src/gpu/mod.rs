//! The CUDA-memory transport's public API: [`GpuProducer`] and [`GpuConsumer`].
//!
//! The ring protocol is the host one; what differs is where the bytes live and how reuse is
//! fenced. Each slot is a region of a dedicated device allocation, shared once per consumer with
//! a legacy IPC handle. Publishing records the slot's ready event on the producer's stream; a
//! consumer's stream waits on it before its kernels read. Releasing records the consumer's own
//! release event; the producer polls those (on the CPU, a lap later) before it rewrites the
//! slot, so its stream never depends on work another process may never run. Consumers never
//! wait for the GPU on the CPU. See `docs/gpu.md`.

mod consumer;
mod error;
mod fence;
mod producer;

pub use consumer::{GpuConsumer, GpuReadSlot};

/// How a CUDA ring orders the GPU work of its processes: the producer's writes before a
/// consumer's reads, and those reads before the producer rewrites the slot. Chosen by the
/// producer ([`ProducerBuilder::fence`](crate::ProducerBuilder::fence)); consumers follow the
/// segment. Either way a wait whose work already completed is skipped, and a pending one is
/// first polled on the CPU for `gpu_poll`.
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
    /// process. Works on every CUDA device that supports legacy IPC.
    #[default]
    Events,
    /// Sequence words in a small device allocation shared like the slots:
    /// `cuStreamWriteValue64` after the work, `cuStreamWaitValue64` (greater or equal) before
    /// the dependent work. The events are still recorded, after the word, so that the CPU can
    /// see completion (skipped waits, `gpu_poll`, run-ahead). Needs 64-bit stream memory
    /// operations (`CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS`).
    Memory,
}
pub use error::{GpuAcquireError, GpuPublishError, GpuRecvError, RegisterError};
pub use producer::{GpuProducer, GpuWriteSlot, PoolId, DEFAULT_LINGER, SLOT_ALIGN};
