//! The consumer behind a `gpuring.Consumer` and its messages, written once over the memory
//! kind (`crate::kind`) and held as trait objects ([`Receiver`], [`Message`]), and a received
//! message kept together with the consumer it borrows ([`Held`]), so that Python objects
//! (which cannot borrow) can hold it. All of it is bound to the consumer's thread
//! (`crate::bound`).

use std::os::fd::{AsRawFd, RawFd};
use std::rc::Rc;
use std::time::Duration;

use gpuring::cuda::Stream;
use gpuring::{ConsumerBuilder, Memory, OpenError, ReadSlot, RecvTimeoutError};

use crate::kind::Kind;

/// A consumer of either memory kind.
pub trait Receiver {
    /// Receives, waiting at most `wait` (None: try once, and `Timeout` if nothing is waiting).
    fn recv(&self, wait: Option<Duration>) -> Result<Box<dyn Message + '_>, RecvTimeoutError>;
    fn capacity(&self) -> u32;
    fn mode(&self) -> gpuring::Mode;
    fn slot_size(&self) -> usize;
    fn user_header_size(&self) -> usize;
    /// The consumer's stream `S` (CUDA only).
    fn stream(&self) -> Option<&Stream>;
    /// The GPU the consumer reads on (CUDA only).
    fn device(&self) -> Option<i32>;
    /// How the stream ended, if it did.
    fn ended(&self) -> Option<gpuring::Ended>;
    /// The doorbell's descriptor, bound on first use (None: none could be bound).
    fn doorbell_fd(&self) -> Option<RawFd>;
    /// Arms the doorbell (`Consumer::arm_doorbell`).
    fn arm(&self);
    /// Disarms and empties it.
    fn disarm(&self);
    /// How often a wait should look at the producer's liveness.
    fn liveness(&self) -> Duration;
}

/// A received message of either memory kind.
pub trait Message {
    /// The message's bytes: device address (CUDA) or host address, and length.
    fn data(&self) -> (u64, usize);
    fn seq(&self) -> u64;
    fn timestamp_ns(&self) -> u64;
    fn lag(&self) -> u64;
    fn header(&self) -> &[u8];
}

/// A consumer of memory kind `K`, and what it reads on.
pub struct Reader<K: Kind> {
    rx: gpuring::Consumer<K>,
    /// The consumer's stream `S` (CUDA): the caller's, or the legacy default stream
    /// (PyTorch's default). Ready waits and releases go on it.
    on: K::Stream,
}

impl<K: Kind> Reader<K> {
    /// Opens `builder`'s ring, which must be of memory kind `K`, to be read on stream `raw`
    /// (CUDA; default the legacy default stream).
    pub fn open(builder: ConsumerBuilder, raw: Option<u64>) -> Result<Rc<dyn Receiver>, OpenError> {
        let rx = builder.open_in::<K>()?;
        let on = K::reader_stream(&rx, raw);
        Ok(Rc::new(Reader { rx, on }))
    }
}

impl<K: Kind> Receiver for Reader<K> {
    fn recv(&self, wait: Option<Duration>) -> Result<Box<dyn Message + '_>, RecvTimeoutError> {
        // No wait: one look, as `try_recv` makes.
        let got = K::recv_timeout(&self.rx, &self.on, wait.unwrap_or(Duration::ZERO))?;
        Ok(Box::new(got))
    }

    fn capacity(&self) -> u32 {
        self.rx.capacity()
    }

    fn mode(&self) -> gpuring::Mode {
        self.rx.mode()
    }

    fn slot_size(&self) -> usize {
        self.rx.slot_size()
    }

    fn user_header_size(&self) -> usize {
        self.rx.user_header_size()
    }

    fn stream(&self) -> Option<&Stream> {
        K::cuda_stream(&self.on)
    }

    fn device(&self) -> Option<i32> {
        K::device(&self.rx)
    }

    fn ended(&self) -> Option<gpuring::Ended> {
        self.rx.ended()
    }

    fn doorbell_fd(&self) -> Option<RawFd> {
        self.rx.doorbell_fd().map(|fd| fd.as_raw_fd())
    }

    fn arm(&self) {
        self.rx.arm_doorbell();
    }

    fn disarm(&self) {
        self.rx.disarm_doorbell();
    }

    fn liveness(&self) -> Duration {
        self.rx.liveness_interval()
    }
}

impl<M: Memory> Message for ReadSlot<'_, M> {
    fn data(&self) -> (u64, usize) {
        (self.ptr(), self.len())
    }

    fn seq(&self) -> u64 {
        ReadSlot::seq(self)
    }

    fn timestamp_ns(&self) -> u64 {
        ReadSlot::timestamp_ns(self)
    }

    fn lag(&self) -> u64 {
        ReadSlot::lag(self)
    }

    fn header(&self) -> &[u8] {
        ReadSlot::header(self)
    }
}

/// A received message, borrowing its consumer.
type Borrowed<'a> = Box<dyn Message + 'a>;

self_cell::self_cell!(
    /// A message and the consumer it borrows. Dropping it releases the message.
    pub struct Held {
        owner: Rc<dyn Receiver>,
        #[covariant]
        dependent: Borrowed,
    }
);

impl Held {
    /// The message.
    pub fn message(&self) -> &dyn Message {
        &**self.borrow_dependent()
    }

    /// The consumer's stream (CUDA only).
    pub fn stream(&self) -> Option<&Stream> {
        self.borrow_owner().stream()
    }
}
