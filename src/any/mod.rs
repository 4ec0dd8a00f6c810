//! One producer type and one consumer type for either memory kind, for bindings.
//!
//! [`Producer<M>`](crate::Producer) and [`Consumer<M>`](crate::Consumer) are generic over the
//! memory kind, chosen at compile time. A binding (the C API, Python, GStreamer) learns the
//! kind at run time: from an option when it creates a ring, from the ring itself when it
//! opens one. [`AnyProducer`] and [`AnyConsumer`] hold either kind behind one type, and their
//! slots ([`AnyWriteSlot`], [`AnyReadSlot`]) likewise, so that each feature a binding exposes
//! is written once. What only CUDA rings have (streams, contexts, device pointers to copy
//! into) is reached through accessors that return `None` for host rings (`stream`,
//! `context`, `cuda`), never by matching on the kind.
//!
//! They are built on the public API only, and add nothing to it: a Rust program that knows
//! its memory kind uses the generic types directly.
//!
//! ```
//! use gpuring::any::{AnyConsumer, AnyProducer};
//! use gpuring::{Consumer, Producer};
//!
//! let mut tx = AnyProducer::from(Producer::builder("doc-any").create()?);
//! let rx = AnyConsumer::open(Consumer::builder("doc-any"))?; // whatever memory the ring has
//! let mut slot = tx.acquire()?;
//! slot.bytes_mut().expect("a host ring")[..5].copy_from_slice(b"hello");
//! slot.publish(5, b"")?;
//! let msg = rx.recv()?;
//! assert_eq!(msg.bytes(), Some(&b"hello"[..]));
//! assert!(!rx.is_cuda());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

/// `$body` with `$x` bound to the typed value inside enum `$kind`'s `$e`, whichever memory
/// kind it holds: the one place the variants are matched.
macro_rules! each {
    ($kind:ident, $e:expr, $x:ident => $body:expr) => {
        match $e {
            $kind::Host($x) => $body,
            #[cfg(feature = "cuda")]
            $kind::Cuda($x) => $body,
        }
    };
}

mod consumer;
mod producer;

pub use consumer::{AnyConsumer, AnyReadSlot};
pub use producer::{AnyProducer, AnyWriteSlot};

#[cfg(test)]
mod tests;
