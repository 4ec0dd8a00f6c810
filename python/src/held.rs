//! A received message kept together with the consumer it borrows, so that Python objects
//! (which cannot borrow) can hold it. All of it is bound to the consumer's thread
//! (`crate::bound`).

use std::rc::Rc;

use gpuring::cuda::Stream;
use gpuring::{Consumer, GpuConsumer, GpuReadSlot, ReadSlot};

/// The consumer behind a `gpuring.Consumer` and its slots.
pub struct Shared {
    pub rx: Rx,
}

/// A consumer of either memory kind.
pub enum Rx {
    Host(Consumer),
    /// `stream` is the consumer's stream `S`: the caller's, or the legacy default stream
    /// (PyTorch's default). Ready waits and releases go on it.
    Gpu {
        rx: GpuConsumer,
        stream: Stream,
    },
}

/// A received message.
pub enum Message<'a> {
    Host(ReadSlot<'a>),
    Gpu(GpuReadSlot<'a>),
}

self_cell::self_cell!(
    /// A message and the consumer it borrows. Dropping it releases the message.
    pub struct Held {
        owner: Rc<Shared>,
        #[covariant]
        dependent: Message,
    }
);

impl Held {
    /// The message's bytes: device address (CUDA) or host address, and length.
    pub fn data(&self) -> (u64, usize) {
        match self.borrow_dependent() {
            Message::Host(m) => (m.as_ptr() as u64, m.len()),
            Message::Gpu(m) => (m.ptr(), m.len()),
        }
    }

    pub fn seq(&self) -> u64 {
        match self.borrow_dependent() {
            Message::Host(m) => m.seq(),
            Message::Gpu(m) => m.seq(),
        }
    }

    pub fn timestamp_ns(&self) -> u64 {
        match self.borrow_dependent() {
            Message::Host(m) => m.timestamp_ns(),
            Message::Gpu(m) => m.timestamp_ns(),
        }
    }

    pub fn lag(&self) -> u64 {
        match self.borrow_dependent() {
            Message::Host(m) => m.lag(),
            Message::Gpu(m) => m.lag(),
        }
    }

    pub fn header(&self) -> &[u8] {
        match self.borrow_dependent() {
            Message::Host(m) => m.header(),
            Message::Gpu(m) => m.header(),
        }
    }

    /// The consumer's stream (CUDA only).
    pub fn stream(&self) -> Option<&Stream> {
        match &self.borrow_owner().rx {
            Rx::Host(_) => None,
            Rx::Gpu { stream, .. } => Some(stream),
        }
    }

    pub fn shared(&self) -> &Rc<Shared> {
        self.borrow_owner()
    }
}
