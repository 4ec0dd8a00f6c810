//! The consumer's async receive.

use std::cell::OnceCell;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};

use futures_core::Stream;

use super::{ring_or_nap, Parked};
use crate::error::{Corruption, RecvError, TryRecvError};
use crate::ring::Pinned;
use crate::shm::doorbell::{consumer_address, new_token, Doorbell};
use crate::{Consumer, ReadSlot};

/// A consumer's doorbell, made by its first async wait.
#[derive(Default)]
pub(crate) struct BellCell {
    /// `None` if no doorbell could be bound: waits then fall back to the timer.
    bell: OnceCell<Option<Doorbell>>,
}

impl BellCell {
    /// The doorbell, bound on first use at the address named by a fresh token, which is then
    /// published in the consumer's entry for the producer to find.
    fn get(&self, consumer: &Consumer) -> Option<&Doorbell> {
        self.bell
            .get_or_init(|| {
                let token = new_token().ok()?;
                let at = consumer_address(consumer.name(), consumer.epoch(), token).ok()?;
                let bell = match Doorbell::bind(&at) {
                    Ok(bell) => bell,
                    Err(e) => {
                        tracing::warn!(ring = %consumer.name(), error = %e, "no doorbell: async receive polls on a timer");
                        return None;
                    }
                };
                let ring = consumer.map().ring();
                // Relaxed: the producer reads it only after seeing us parked, and `park`'s
                // SeqCst fence comes after this store.
                ring.consumers[consumer.entry()].bell.store(token, Ordering::Relaxed);
                Some(bell)
            })
            .as_ref()
    }
}

impl Consumer {
    /// Receives the next message, awaiting it without blocking the thread: the task parks, and
    /// the producer's publish (or close) rings this consumer's doorbell. Returns `Disconnected`
    /// once the producer has closed or died and everything it published was received.
    ///
    /// Cancel-safe: dropping the future before it completes loses no message. Needs a tokio
    /// runtime with IO and time enabled. The future borrows the consumer, so it is `!Send`.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let rx = gpuring::Consumer::open("frames")?;
    /// while let Ok(msg) = rx.recv_async().await {
    ///     println!("message {} of {} bytes", msg.seq(), msg.len());
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn recv_async(&self) -> Result<ReadSlot<'_>, RecvError> {
        let m = self.pin_async().await?;
        Ok(ReadSlot::new(self, m))
    }

    /// The messages as a [`Stream`]: each item is a received message, or the damage that ended
    /// the stream. It ends when the producer disconnects. Items borrow the consumer; several
    /// may be held at once, as with [`recv`](Self::recv).
    ///
    /// ```no_run
    /// use futures_util::StreamExt;
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let rx = gpuring::Consumer::open("frames")?;
    /// let mut messages = rx.stream();
    /// while let Some(msg) = messages.next().await {
    ///     let msg = msg?;
    ///     println!("{} bytes", msg.len());
    /// }
    /// # Ok(()) }
    /// ```
    pub fn stream(&self) -> Messages<'_> {
        Messages { consumer: self, next: None, done: false }
    }

    /// Pins the next message, awaiting it.
    pub(crate) async fn pin_async(&self) -> Result<Pinned, RecvError> {
        let ring = self.map().ring();
        let flag = &ring.consumers[self.entry()].parked;
        loop {
            if let Some(r) = self.poll_once() {
                return r.map_err(recv_error);
            }
            let bell = self.bell.get(self);
            {
                let _parked = Parked::new(ring.consumer_wake, Some(flag));
                if let Some(r) = self.poll_once() {
                    return r.map_err(recv_error);
                }
                ring_or_nap(bell, self.liveness_tick()).await;
            }
            if self.liveness_due() {
                self.check_producer();
            }
        }
    }
}

fn recv_error(e: TryRecvError) -> RecvError {
    match e {
        TryRecvError::Corrupt(c) => RecvError::Corrupt(c),
        TryRecvError::Disconnected | TryRecvError::Empty => RecvError::Disconnected,
    }
}

/// A receive in progress, boxed so that the stream need not name its type.
type Receiving<'a> = Pin<Box<dyn Future<Output = Result<Pinned, RecvError>> + 'a>>;

/// The stream of a consumer's messages; see [`Consumer::stream`].
///
/// ```
/// use futures_util::StreamExt;
/// # let mut tx = gpuring::Producer::builder("doc-asynch-messages").create()?;
/// # let rx = gpuring::Consumer::open("doc-asynch-messages")?;
/// # tx.send(b"hello", b"")?;
/// # drop(tx); // the producer closes the ring, so the stream ends
/// # let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
/// # rt.block_on(async {
/// let mut messages = rx.stream();
/// while let Some(msg) = messages.next().await {
///     let msg = msg?;
///     println!("message {}: {} bytes", msg.seq(), msg.len());
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # })?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Messages<'a> {
    consumer: &'a Consumer,
    /// The receive in progress.
    next: Option<Receiving<'a>>,
    /// Set once the stream has ended.
    done: bool,
}

impl<'a> Stream for Messages<'a> {
    type Item = Result<ReadSlot<'a>, Corruption>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if this.done {
            return Poll::Ready(None);
        }
        let consumer = this.consumer;
        let next = this.next.get_or_insert_with(|| Box::pin(consumer.pin_async()));
        let r = std::task::ready!(next.as_mut().poll(cx));
        this.next = None;
        Poll::Ready(match r {
            Ok(m) => Some(Ok(ReadSlot::new(consumer, m))),
            Err(RecvError::Disconnected) => {
                this.done = true;
                None
            }
            Err(RecvError::Corrupt(c)) => {
                this.done = true;
                Some(Err(c))
            }
        })
    }
}
