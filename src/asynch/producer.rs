//! The producer's async acquire.

use std::time::Instant;

use super::{ring_or_nap, Parked};
use crate::error::{AcquireError, PublishError, SendError, TryAcquireError};
use crate::ring::producer::ClaimError;
use crate::{Producer, WriteSlot};

impl Producer {
    /// A slot for the next message, awaiting one without blocking the thread: under
    /// [`Policy::Block`](crate::Policy::Block) for the slowest consumer, under both policies
    /// for consumers that hold the slot. The task parks, and a consumer's release knocks on
    /// the producer's doorbell. Dead consumers are reaped every liveness interval, as `acquire`
    /// does.
    ///
    /// Cancel-safe: dropping the future claims nothing. Needs a tokio runtime with IO and time
    /// enabled.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let mut tx = gpuring::Producer::builder("frames").create()?;
    /// let mut slot = tx.acquire_async().await?;
    /// slot[..5].copy_from_slice(b"hello");
    /// slot.publish(5, b"")?;
    /// # Ok(()) }
    /// ```
    pub async fn acquire_async(&mut self) -> Result<WriteSlot<'_>, AcquireError> {
        let slot = self.claim_async(&mut crate::producer::no_hook()).await?;
        Ok(WriteSlot::new(self, slot))
    }

    /// [`send`](Self::send), awaiting a slot as [`acquire_async`](Self::acquire_async) does.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let mut tx = gpuring::Producer::builder("events").create()?;
    /// tx.send_async(b"{\"kind\":\"start\"}", b"json").await?;
    /// # Ok(()) }
    /// ```
    pub async fn send_async(&mut self, data: &[u8], header: &[u8]) -> Result<u64, SendError> {
        if data.len() > self.slot_size() {
            let e = PublishError::TooLong { len: data.len(), slot_size: self.slot_size() };
            return Err(SendError::Publish(e));
        }
        let mut slot =
            self.acquire_async().await.map_err(|AcquireError::Corrupt(c)| SendError::Corrupt(c))?;
        slot[..data.len()].copy_from_slice(data);
        slot.publish(data.len(), header).map_err(SendError::Publish)
    }

    /// Claims the next slot, awaiting it. Returns its index.
    pub(crate) async fn claim_async(
        &mut self,
        on_free: crate::producer::OnFree<'_>,
    ) -> Result<usize, AcquireError> {
        let started = Instant::now();
        let mut last_reap = started;
        let mut waited = false;
        let claimed = loop {
            match self.try_claim(on_free) {
                Ok(slot) => break Ok(slot),
                Err(TryAcquireError::Full) => {}
                Err(TryAcquireError::Corrupt(c)) => break Err(AcquireError::Corrupt(c)),
            }
            waited = true;
            let tick = self.liveness_tick();
            let (map, core, bells) = self.async_parts();
            let ring = map.ring();
            let parked = Parked::new(ring.producer_wake, None);
            match core.try_claim(&ring) {
                Ok(slot) => break Ok(slot),
                Err(ClaimError::Corrupt(c)) => break Err(AcquireError::Corrupt(c.into())),
                Err(ClaimError::Blocked(_)) => ring_or_nap(bells.own(), tick).await,
            };
            drop(parked);
            if last_reap.elapsed() >= tick {
                last_reap = Instant::now();
                if let Err(c) = self.reap_with(on_free) {
                    break Err(AcquireError::Corrupt(c));
                }
            }
        };
        if waited && claimed.is_ok() {
            self.add_blocked(started);
        }
        claimed
    }
}
