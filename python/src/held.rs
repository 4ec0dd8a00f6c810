//! A received message kept together with the consumer it borrows, so that Python objects
//! (which cannot borrow) can hold it; and the queue that brings releases made on other threads
//! back to the consumer's thread.
//!
//! Threads: a consumer, its slots and what refers to them belong to the thread that opened
//! the consumer (their classes are `unsendable`; `Rc` counts them). The one thing that may
//! happen elsewhere is the end of an exported tensor: PyTorch calls the DLPack deleter on
//! whichever thread frees the tensor. A deleter on a foreign thread does not touch the `Rc`:
//! it queues the export in [`Orphans`], and the consumer's thread drops it at its next call.

use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::thread::ThreadId;

use gpuring::cuda::Stream;
use gpuring::{Consumer, GpuConsumer, GpuReadSlot, ReadSlot};

/// The consumer behind a `gpuring.Consumer` and its slots.
pub struct Shared {
    pub rx: Rx,
    pub orphans: Arc<Orphans>,
    /// The thread that opened the consumer: the only one that may touch this.
    pub owner: ThreadId,
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

/// Something that must be dropped on the consumer's thread, queued by another thread.
pub struct Orphan(pub Box<dyn FnOnce()>);

// SAFETY: an orphan is only created on a foreign thread from a value that thread never
// touched except to move it (see `Orphans::adopt_or_drop`), and it is run (and dropped) only
// on the owner thread, in `Orphans::drain`.
unsafe impl Send for Orphan {}

/// Exports whose end was reported on another thread than the consumer's.
#[derive(Default)]
pub struct Orphans {
    queue: Mutex<Vec<Orphan>>,
}

impl Orphans {
    /// Drops `value` now if this is `owner`'s thread, else queues it for `owner`'s next call.
    pub fn adopt_or_drop<T: 'static>(&self, owner: ThreadId, value: T) {
        if std::thread::current().id() == owner {
            drop(value);
        } else {
            let orphan = Orphan(Box::new(move || drop(value)));
            self.queue.lock().unwrap_or_else(|p| p.into_inner()).push(orphan);
        }
    }

    /// Drops what other threads queued. Call on the owner thread only.
    pub fn drain(&self) {
        let queued = std::mem::take(&mut *self.queue.lock().unwrap_or_else(|p| p.into_inner()));
        for Orphan(drop_it) in queued {
            drop_it();
        }
    }
}

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
