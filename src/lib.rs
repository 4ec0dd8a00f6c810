//! gpuring: a broadcast ring of buffers from one producer process to many consumer processes.
//!
//! A POSIX shared-memory segment holds a lock-free ring of slots. The producer fills a slot and
//! publishes it; every consumer receives it, in its own process, without a copy. With CUDA
//! memory ([`Cuda`]; feature `cuda`, on by default) the slots live in device memory and the
//! hand-off is fenced on the GPU with interprocess events; with host memory ([`Host`], the
//! default) the payload lives in the segment itself.
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
//! * `create_gpu` / `open_gpu` on the same builders for CUDA rings: a [`Producer<Cuda>`] and a
//!   [`Consumer<Cuda>`] are the same types as the host ones, with device pointers and streams
//!   added ([`memory`]).
//! * Feature `tokio`: `Consumer::recv_async`, `Consumer::messages`, `Producer::acquire_async`
//!   wait without holding a thread.
//! * [`any`]: one producer and one consumer type for either memory kind, for bindings.
//! * [`batch`]: a batcher that turns K camera rings into one ring of `[K, frame…]` tensors.
//! * [`inspect`]: what the `gpuring` command shows (`list`, `stat`, `rm`), as a library.
//! * [`service`]: stopping on SIGTERM without faulting the GPU's other processes, and the exit
//!   status a supervisor restarts on when the GPU context is lost ([`ContextLost`]).
//! * The guide, the protocol and the GPU notes are in the repository's `docs/`.
//!
//! Layers, each depending only on those before it (docs/protocol.md, "Code layout"):
//! * `ring` (the protocol: pure atomics, no OS or CUDA calls, loom-checked) and `cuda` (the
//!   driver), which use nothing else of the crate;
//! * [`error`] (one error type per operation), then `format` (the segment: header, CUDA tables);
//! * `shm` (the OS: segments, processes, doorbells, typed views of a mapped segment, the
//!   blocking and async waits);
//! * [`memory`]: what each memory kind adds, behind one sealed trait; a kind answers the
//!   producer's and the consumer's questions and never sees their rings;
//! * the API: [`Producer<M>`] and [`Consumer<M>`], generic over the memory kind, written once
//!   for blocking and async waits;
//! * `any`: the bindings' facade over the API; [`batch`]: many camera rings into one ring of
//!   batch tensors, over the API too.
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

#[cfg(not(loom))]
pub mod any;
#[cfg(all(feature = "zenoh", not(loom)))]
pub mod bridge;
#[cfg(not(loom))]
mod consumer;
#[cfg(not(loom))]
mod doorbells;
pub mod frame;
#[cfg(not(loom))]
pub mod inspect;
#[cfg(not(loom))]
pub mod memory;
#[cfg(all(feature = "metrics", not(loom)))]
pub mod metrics;
#[cfg(not(loom))]
mod producer;
#[cfg(not(loom))]
pub mod service;
#[cfg(not(loom))]
mod stats;
pub mod tensor;

#[cfg(not(loom))]
pub mod batch;
#[cfg(all(feature = "test-support", not(loom)))]
#[doc(hidden)]
pub mod testing;

#[cfg(all(feature = "tokio", not(loom)))]
pub use consumer::Messages;
#[cfg(not(loom))]
pub use consumer::{Consumer, ConsumerBuilder, Iter, ReadSlot};
#[cfg(all(feature = "test-support", not(loom)))]
pub use error::lose_context_after;
pub use error::{
    context_lost, exit_status, is_context_lost, AcquireError, AcquireTimeoutError,
    ConsumersTimeout, ContextLost, Corruption, CreateError, CreateErrorKind, EndLoanError, Ended,
    LendError, NameError, OpenError, OpenErrorKind, PublishError, PublishLoanError, RecvError,
    RecvTimeoutError, SendError, TryAcquireError, TryRecvError, WaitForConsumersError,
    EXIT_CONTEXT_LOST,
};
#[cfg(all(feature = "cuda", not(loom)))]
pub use error::{RegisterError, ReleaseError};
pub use format::{Layout, MemoryKind};
#[cfg(all(feature = "cuda", not(loom)))]
pub use memory::{
    Cuda, Fence, GpuConsumer, GpuProducer, GpuReadSlot, GpuWriteSlot, PoolId, Sharing,
};
#[cfg(not(loom))]
pub use memory::{Host, Memory, DEFAULT_GPU_POLL};
#[cfg(not(loom))]
pub use producer::{monotonic_ns, Loan, Producer, ProducerBuilder, WriteSlot, DEFAULT_SPARES};
pub use ring::{Mode, Policy, StartAt};
#[cfg(not(loom))]
pub use shm::fdpass::PeerPolicy;
pub use shm::MAX_NAME_LEN;
#[cfg(not(loom))]
pub use stats::ConsumerInfo;

/// The README's examples, compiled as doctests so they stay true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
