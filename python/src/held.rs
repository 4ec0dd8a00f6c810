//! The consumer behind a `gpuring.Consumer` ([`Reader`]: a consumer of either memory kind,
//! `gpuring::any`, and the stream it reads on), and a received message kept together with the
//! consumer it borrows ([`Held`]), so that Python objects (which cannot borrow) can hold it.
//! All of it is bound to the consumer's thread (`crate::bound`). The consumer also keeps the
//! layout its messages were last viewed in ([`LayoutCache`]).

use std::rc::Rc;
use std::time::Duration;

use gpuring::any::{AnyConsumer, AnyReadSlot};
use gpuring::cuda::Stream;
use gpuring::{ConsumerBuilder, OpenError, RecvTimeoutError};

use crate::layout::LayoutCache;

/// A consumer, and what it reads on.
pub struct Reader {
    rx: AnyConsumer,
    /// CUDA rings: the consumer's stream `S`, the caller's or the legacy default stream
    /// (PyTorch's default). Ready waits and releases go on it. None for host rings.
    on: Option<Stream>,
    /// The last layout its slots resolved (they mostly share one).
    layouts: LayoutCache,
}

impl Reader {
    /// Opens `builder`'s ring, in whatever memory it holds, to be read on stream `raw` (CUDA;
    /// default the legacy default stream).
    pub fn open(builder: ConsumerBuilder, raw: Option<u64>) -> Result<Rc<Reader>, OpenError> {
        let rx = AnyConsumer::open(builder)?;
        let raw = raw.unwrap_or(0) as usize as gpuring::cuda::driver::CUstream;
        // SAFETY: the caller's stream (a live stream of the consumer's device, kept alive
        // while the consumer is used, as documented), or the null stream.
        let on = rx.context().map(|ctx| unsafe { Stream::from_raw(ctx, raw) });
        Ok(Rc::new(Reader { rx, on, layouts: LayoutCache::default() }))
    }

    /// Receives, waiting at most `wait` (None: try once, and `Timeout` if nothing is waiting).
    pub fn recv(&self, wait: Option<Duration>) -> Result<AnyReadSlot<'_>, RecvTimeoutError> {
        // No wait: one look, as `try_recv` makes.
        let wait = wait.unwrap_or(Duration::ZERO);
        match &self.on {
            Some(on) => self.rx.recv_on_timeout(on, wait),
            None => self.rx.recv_timeout(wait),
        }
    }

    /// The consumer.
    pub fn consumer(&self) -> &AnyConsumer {
        &self.rx
    }

    /// The consumer's stream `S` (CUDA only).
    pub fn stream(&self) -> Option<&Stream> {
        self.on.as_ref()
    }
}

self_cell::self_cell!(
    /// A message and the consumer it borrows. Dropping it releases the message.
    pub struct Held {
        owner: Rc<Reader>,
        #[covariant]
        dependent: AnyReadSlot,
    }
);

impl Held {
    /// The message.
    pub fn message(&self) -> &AnyReadSlot<'_> {
        self.borrow_dependent()
    }

    /// The consumer's stream (CUDA only).
    pub fn stream(&self) -> Option<&Stream> {
        self.borrow_owner().stream()
    }

    /// The consumer's layout cache.
    pub fn layouts(&self) -> &LayoutCache {
        &self.borrow_owner().layouts
    }
}
