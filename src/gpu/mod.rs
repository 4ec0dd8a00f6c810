//! The CUDA-memory transport's public API: [`GpuProducer`] and [`GpuConsumer`].
//!
//! The ring protocol is the host one; what differs is where the bytes live and how reuse is
//! fenced. Each slot is a region of a dedicated device allocation, shared once per consumer with
//! a legacy IPC handle. Publishing records the slot's ready event on the producer's stream; a
//! consumer's stream waits on it before its kernels read. Releasing records the consumer's own
//! release event; the producer's stream waits on those before it rewrites the slot. The CPU
//! never waits for the GPU. See `docs/gpu.md`.

mod consumer;
mod error;
mod producer;

pub use consumer::{GpuConsumer, GpuReadSlot};
pub use error::{GpuAcquireError, GpuPublishError, GpuRecvError, RegisterError};
pub use producer::{GpuProducer, GpuWriteSlot, PoolId, DEFAULT_LINGER, SLOT_ALIGN};
