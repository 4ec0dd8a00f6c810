//! The producer's async acquire.

use crate::error::{AcquireError, Fault, SendError};
use crate::memory::{Host, Memory};
use crate::producer::{Producer, WriteSlot};
use crate::shm::waiter::Waiter;

impl<M: Memory> Producer<M> {
    /// A slot for the next message, awaiting one without blocking the thread: under
    /// [`Policy::Block`](crate::Policy::Block) for the slowest consumer, under both policies
    /// for consumers that hold the slot, and in a CUDA ring for the slot's last write and its
    /// readers' GPU reads. The task parks, and a consumer's release knocks on the producer's
    /// doorbell; the waits for the GPU yield to the runtime while they poll, then sleep 100 µs
    /// at a time. Dead consumers are reaped every liveness interval, as `acquire` does.
    ///
    /// Cancel-safe: dropping the future leaves at most the slot claimed, and the next acquire
    /// picks up where it stopped. Needs a tokio runtime with IO and time enabled.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let mut tx = gpuring::Producer::builder("frames").create()?;
    /// let mut slot = tx.acquire_async().await?;
    /// slot[..5].copy_from_slice(b"hello");
    /// slot.publish(5, b"")?;
    /// # Ok(()) }
    /// ```
    pub async fn acquire_async(&mut self) -> Result<WriteSlot<'_, M>, AcquireError> {
        Ok(self.acquire_async_slot().await?)
    }

    /// `acquire_async`, failing with the internal [`Fault`] that `send_async` converts too:
    /// the one acquire, parked.
    async fn acquire_async_slot(&mut self) -> Result<WriteSlot<'_, M>, Fault> {
        let buffer = self.acquire_with(Waiter::Parked).await?;
        Ok(WriteSlot::new(self, buffer, None))
    }
}

impl Producer<Host> {
    /// [`send`](Self::send), awaiting a slot as [`acquire_async`](Self::acquire_async) does.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let mut tx = gpuring::Producer::builder("events").create()?;
    /// tx.send_async(b"{\"kind\":\"start\"}", b"json").await?;
    /// # Ok(()) }
    /// ```
    pub async fn send_async(&mut self, data: &[u8], header: &[u8]) -> Result<u64, SendError> {
        self.check_fits(data)?;
        let slot = self.acquire_async_slot().await.map_err(SendError::from)?;
        slot.send(data, header)
    }
}
