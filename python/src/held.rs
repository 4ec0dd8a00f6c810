//! A received message kept together with the consumer it borrows, so that Python objects
//! (which cannot borrow) can hold it; and how objects bound to one thread are dropped when
//! Python frees them on another.
//!
//! Threads: a consumer and the messages it holds belong to the thread that opened it: the
//! ring's consumer is not `Sync`, and the objects count references with `Rc`. Python objects
//! that hold them wrap them in [`ThreadBound`]: used on another thread they raise
//! `RuntimeError`, and freed on another thread (a tensor, array or slot dropped in a worker
//! thread) they are queued, untouched, and dropped on their own thread at its next gpuring
//! call ([`drain`]).

use std::mem::ManuallyDrop;
use std::rc::Rc;
use std::sync::Mutex;
use std::thread::ThreadId;

use gpuring::cuda::Stream;
use gpuring::{Consumer, GpuConsumer, GpuReadSlot, ReadSlot};
use pyo3::exceptions::PyRuntimeError;
use pyo3::PyResult;

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

/// A value to drop on another thread than the one that let go of it.
struct Owed(Box<dyn FnOnce()>);

// SAFETY: an `Owed` value is moved (never touched) by the thread that queues it, and run and
// dropped only on the thread it is owed to (`drain` filters by thread).
unsafe impl Send for Owed {}

/// Values owed to each thread, dropped at that thread's next `drain`.
static OWED: Mutex<Vec<(ThreadId, Owed)>> = Mutex::new(Vec::new());

/// Drops `value` now if this is thread `owner`, else queues it for `owner`'s next [`drain`].
pub fn drop_on<T: 'static>(owner: ThreadId, value: T) {
    if std::thread::current().id() == owner {
        drop(value);
    } else {
        let owed = Owed(Box::new(move || drop(value)));
        OWED.lock().unwrap_or_else(|p| p.into_inner()).push((owner, owed));
    }
}

/// Drops what other threads let go of on this thread's behalf. Every gpuring call that a
/// consumer's thread makes runs this first.
pub fn drain() {
    let me = std::thread::current().id();
    let mine: Vec<Owed> = {
        let mut owed = OWED.lock().unwrap_or_else(|p| p.into_inner());
        if owed.is_empty() {
            return;
        }
        let (mine, others) = std::mem::take(&mut *owed).into_iter().partition(|(t, _)| *t == me);
        *owed = others;
        mine.into_iter().map(|(_, o)| o).collect()
    };
    for Owed(drop_it) in mine {
        drop_it();
    }
}

/// A value usable only on the thread that made it; dropped there even when the wrapper is
/// dropped elsewhere.
pub struct ThreadBound<T: 'static> {
    /// Invariant: only touched on `owner`, except to be moved into `drop_on` by `Drop`.
    value: ManuallyDrop<T>,
    owner: ThreadId,
}

// SAFETY: other threads never reach `value`: `get`/`get_mut` check the thread, and `Drop`
// moves it to `drop_on` without touching it.
unsafe impl<T: 'static> Send for ThreadBound<T> {}
// SAFETY: as above; `&ThreadBound` gives other threads nothing but `owner`.
unsafe impl<T: 'static> Sync for ThreadBound<T> {}

impl<T: 'static> ThreadBound<T> {
    /// Binds `value` to this thread.
    pub fn new(value: T) -> Self {
        ThreadBound { value: ManuallyDrop::new(value), owner: std::thread::current().id() }
    }

    /// The value, on its own thread; `RuntimeError` elsewhere.
    pub fn get(&self) -> PyResult<&T> {
        self.check()?;
        Ok(&self.value)
    }

    /// The value, on its own thread; `RuntimeError` elsewhere.
    pub fn get_mut(&mut self) -> PyResult<&mut T> {
        self.check()?;
        Ok(&mut self.value)
    }

    /// Replaces the value from any thread; the old one is dropped on its own thread.
    pub fn replace(&mut self, new: T) {
        let old = std::mem::replace(&mut *self.value, new);
        drop_on(self.owner, old);
    }

    fn check(&self) -> PyResult<()> {
        if std::thread::current().id() == self.owner {
            drain();
            return Ok(());
        }
        Err(PyRuntimeError::new_err(
            "gpuring consumers, producers and their slots are used on the thread that made them",
        ))
    }
}

impl<T: 'static> Drop for ThreadBound<T> {
    fn drop(&mut self) {
        // SAFETY: taken once, here, and never used again.
        let value = unsafe { ManuallyDrop::take(&mut self.value) };
        drop_on(self.owner, value);
    }
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
