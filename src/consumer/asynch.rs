//! The consumer's async receive.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use futures_core::Stream;

use crate::consumer::{Attempt, Consumer, ConsumerBuilder, ReadSlot};
use crate::error::Fault;
use crate::error::{OpenError, RecvError};
use crate::memory::Memory;
use crate::ring::Pinned;

impl ConsumerBuilder {
    /// Opens the ring, waiting up to `timeout` for it to appear and be ready, and ends the
    /// builder, as [`open_timeout`](ConsumerBuilder::open_timeout) does, without blocking the
    /// thread: the waits between tries are tokio sleeps (feature `tokio`). For a host ring; see
    /// [`open_in_async`](Self::open_in_async) for either memory kind.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// use gpuring::{Consumer, Producer};
    ///
    /// // The producer comes 50 ms later (another process, usually).
    /// let producing = tokio::spawn(async {
    ///     tokio::time::sleep(Duration::from_millis(50)).await;
    ///     Producer::builder("doc-consumer-open-async").create()
    /// });
    /// let b = Consumer::builder("doc-consumer-open-async");
    /// let rx = b.open_async(Duration::from_secs(5)).await?; // waits without a thread
    /// let mut tx = producing.await??;
    /// tx.send(b"hi", b"")?;
    /// assert_eq!(&*rx.recv_async().await?, b"hi");
    /// # Ok(())
    /// # }
    /// ```
    pub async fn open_async(self, timeout: Duration) -> Result<Consumer, OpenError> {
        self.open_in_async(timeout).await
    }

    /// [`open_async`](Self::open_async) for a ring of memory kind `M`.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// use gpuring::{Consumer, Host, OpenErrorKind};
    ///
    /// let absent = Consumer::builder("doc-consumer-open-in-async-absent");
    /// let r = absent.open_in_async::<Host>(Duration::from_millis(20)).await;
    /// assert!(matches!(r.err().unwrap().kind(), OpenErrorKind::NotFound));
    /// # Ok(())
    /// # }
    /// ```
    pub async fn open_in_async<M: Memory>(
        self,
        timeout: Duration,
    ) -> Result<Consumer<M>, OpenError> {
        // None: a timeout past the clock's range waits as long as it takes.
        let deadline = tokio::time::Instant::now().checked_add(timeout);
        loop {
            let not_yet = match self.try_open_once::<M>(None) {
                Ok(c) => return Ok(c),
                Err(Attempt::Failed(e)) => return Err(self.failed(e)),
                Err(Attempt::NotYet(why)) => why,
            };
            if deadline.is_some_and(|d| tokio::time::Instant::now() >= d) {
                return Err(self.failed(not_yet));
            }
            tokio::time::sleep(crate::consumer::OPEN_RETRY).await;
        }
    }
}

impl<M: Memory> Consumer<M> {
    /// Receives the next message, awaiting it without blocking the thread: the task parks, and
    /// the producer's publish (or close) rings this consumer's doorbell. Returns `Disconnected`
    /// once the producer has closed or died and everything it published was received. In a
    /// CUDA ring the message's stream waits for the producer's writes, as with `recv`.
    ///
    /// Cancel-safe: dropping the future before it completes loses no message. Needs a tokio
    /// runtime with IO and time enabled. The future and the message are `Send`, so the usual
    /// pattern works: move the consumer into a spawned task and hold messages across
    /// `.await`s there.
    ///
    /// ```
    /// # #[tokio::main]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let mut tx = gpuring::Producer::builder("doc-asynch-spawn").create()?;
    /// let rx = gpuring::Consumer::open("doc-asynch-spawn")?;
    /// let task = tokio::spawn(async move {
    ///     let mut bytes = 0;
    ///     while let Ok(msg) = rx.recv_async().await {
    ///         tokio::task::yield_now().await; // the message is held across an await
    ///         bytes += msg.len();
    ///     }
    ///     bytes // `Disconnected`: the producer closed the ring
    /// });
    /// # tx.send(b"hello", b"")?;
    /// # drop(tx);
    /// assert_eq!(task.await?, 5);
    /// # Ok(()) }
    /// ```
    pub async fn recv_async(&self) -> Result<ReadSlot<'_, M>, RecvError> {
        crate::error::check_context()?;
        let m = self.ring().pin_async().await?;
        Ok(self.placed(m, None)?)
    }

    /// The messages as a [`Stream`]: each item is a received message, or the error that ended
    /// the stream (`Corrupt`, or `Cuda` in a CUDA ring). It ends when the producer disconnects.
    /// Items borrow the consumer; several may be held at once, as with [`recv`](Self::recv).
    ///
    /// ```no_run
    /// use futures_util::StreamExt;
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let rx = gpuring::Consumer::open("frames")?;
    /// let mut messages = rx.messages();
    /// while let Some(msg) = messages.next().await {
    ///     let msg = msg?;
    ///     println!("{} bytes", msg.len());
    /// }
    /// # Ok(()) }
    /// ```
    pub fn messages(&self) -> Messages<'_, M> {
        Messages { consumer: self, next: None, done: false }
    }
}

type Receiving<'a> = Pin<Box<dyn Future<Output = Result<Pinned, Fault>> + Send + 'a>>;

/// The stream of a consumer's messages; see [`Consumer::messages`]. `Send`, as its items are.
///
/// ```
/// use futures_util::StreamExt;
/// # let mut tx = gpuring::Producer::builder("doc-asynch-messages").create()?;
/// # let rx = gpuring::Consumer::open("doc-asynch-messages")?;
/// # tx.send(b"hello", b"")?;
/// # drop(tx); // the producer closes the ring, so the stream ends
/// # let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
/// # rt.block_on(async {
/// let mut messages = rx.messages();
/// while let Some(msg) = messages.next().await {
///     let msg = msg?;
///     println!("message {}: {} bytes", msg.seq(), msg.len());
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # })?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Messages<'a, M: Memory = crate::Host> {
    consumer: &'a Consumer<M>,
    /// The receive in progress.
    next: Option<Receiving<'a>>,
    /// Set once the stream has ended.
    done: bool,
}

impl<'a, M: Memory> Stream for Messages<'a, M> {
    type Item = Result<ReadSlot<'a, M>, RecvError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if this.done {
            return Poll::Ready(None);
        }
        let consumer = this.consumer;
        let next = this.next.get_or_insert_with(|| Box::pin(consumer.ring().pin_async()));
        let r = std::task::ready!(next.as_mut().poll(cx));
        this.next = None;
        let r = r.and_then(|m| consumer.placed(m, None)).map_err(RecvError::from);
        if r.is_err() {
            this.done = true;
        }
        Poll::Ready(match r {
            Ok(slot) => Some(Ok(slot)),
            Err(RecvError::Disconnected) => None,
            Err(e) => Some(Err(e)),
        })
    }
}

/// A task that owns a consumer can be spawned: its receive futures and streams are `Send`.
const _: () = {
    fn sendable<T: Send>(_: &T) {}
    fn check<M: Memory>(rx: &Consumer<M>) {
        sendable(&rx.recv_async());
        sendable(&rx.messages());
    }
    let _ = check::<crate::Host>;
};
