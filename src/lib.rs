//! gpuring: a broadcast ring of buffers from one producer process to many consumer processes.
//!
//! A POSIX shared-memory segment holds a lock-free ring of slots. The producer fills a slot and
//! publishes it; every consumer receives it, in its own process, without a copy. With CUDA
//! memory (`GpuProducer`, `GpuConsumer`; feature `cuda`, on by default) the slots live in
//! device memory and the hand-off is fenced on the GPU with interprocess events; with host
//! memory ([`Producer`], [`Consumer`]) the payload lives in the segment itself.
//!
//! ```no_run
//! use gpuring::{Consumer, Producer};
//!
//! let mut tx = Producer::builder("demo").capacity(8).slot_size(4096).create()?;
//! // ...in another process:
//! let rx = Consumer::open("demo")?;
//!
//! tx.send(b"hello", b"")?;
//! let msg = rx.recv()?;
//! assert_eq!(&*msg, b"hello");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Where to start:
//! * [`Producer::builder`] and [`Consumer::builder`]: every setting, with its default.
//! * `create_gpu` / `open_gpu` on the same builders for CUDA rings (module `gpu`).
//! * Feature `tokio`: `Consumer::recv_async`, `Consumer::stream`, `Producer::acquire_async`
//!   wait without holding a thread.
//! * [`inspect`]: what the `gpuring` command shows (`list`, `stat`, `rm`), as a library.
//! * The guide, the protocol and the GPU notes are in the repository's `docs/`.
//!
//! Layers, each depending only on those before it: `shm` (segments, doorbells), `ring` (the
//! protocol, no OS calls), `wait` (futex sleeping), `cuda` (driver wrappers and kernels), then
//! the API: [`Producer`] and [`Consumer`], `gpu` (`GpuProducer`, `GpuConsumer`), `asynch`.
#![deny(unsafe_op_in_unsafe_fn)]
#![deny(missing_docs)]

#[cfg(all(feature = "cuda", not(loom)))]
pub mod cuda;
pub mod error;
// The segment format: public for the loom model, the fuzzer, the benches and the tests, not as
// API (docs/protocol.md documents it).
#[doc(hidden)]
pub mod format;
// The protocol and OS layers are public for the loom model, the fuzzer, the benches and the
// tests, not as API: docs/protocol.md documents them. What users need is re-exported here.
#[doc(hidden)]
pub mod ring;
#[doc(hidden)]
pub mod shm;

#[cfg(all(feature = "tokio", not(loom)))]
mod asynch;
#[cfg(not(loom))]
mod consumer;
#[cfg(not(loom))]
mod doorbells;
#[cfg(not(loom))]
#[doc(hidden)]
pub mod fuzzing;
#[cfg(all(feature = "cuda", not(loom)))]
pub mod gpu;
#[cfg(not(loom))]
pub mod inspect;
#[cfg(not(loom))]
pub mod pattern;
#[cfg(not(loom))]
mod producer;
#[cfg(not(loom))]
mod stats;
pub mod tensor;
#[cfg(not(loom))]
mod wait;

#[cfg(all(feature = "tokio", not(loom)))]
pub use asynch::Messages;
#[cfg(not(loom))]
pub use consumer::{Consumer, ConsumerBuilder, Iter, ReadSlot};
pub use error::{
    AcquireError, AcquireTimeoutError, Corruption, CreateError, NameError, OpenError, PublishError,
    RecvError, RecvTimeoutError, SendError, TryAcquireError, TryRecvError,
};
pub use format::{Layout, MemoryKind};
#[cfg(all(feature = "cuda", not(loom)))]
pub use gpu::{Fence, GpuConsumer, GpuProducer, GpuReadSlot, GpuWriteSlot};
#[cfg(not(loom))]
pub use producer::{monotonic_ns, Producer, ProducerBuilder, WriteSlot};
pub use ring::{Policy, StartAt};
pub use shm::MAX_NAME_LEN;
#[cfg(not(loom))]
pub use stats::ConsumerInfo;

/// Default for `gpu_poll` on both builders (CUDA rings): how long the CPU polls a pending
/// event (`cuEventQuery`, ~50 ns) before it hands the wait to the GPU (`cuStreamWaitEvent`).
/// See docs/performance.md for the measurements behind the value.
///
/// ```
/// use std::time::Duration;
/// assert_eq!(gpuring::DEFAULT_GPU_POLL, Duration::from_micros(30));
/// ```
pub const DEFAULT_GPU_POLL: std::time::Duration = std::time::Duration::from_micros(30);

/// The README's examples, compiled as doctests so they stay true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
