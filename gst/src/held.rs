//! The source's consumer ([`Shared`], either memory kind), and host-memory messages lent to
//! GStreamer without a copy: a received slot stays held while a `GstMemory` wraps its bytes,
//! and is released when GStreamer frees that memory, on whatever thread that happens. A
//! consumer is `Sync` and its messages are `Send`, so a lent message simply owns a share of
//! the consumer and is dropped where GStreamer drops it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use gpuring::any::{AnyConsumer, AnyReadSlot};
use gpuring::RecvTimeoutError;

self_cell::self_cell!(
    /// A received slot and the consumer it borrows. Dropping it releases the slot.
    struct Held {
        owner: Arc<AnyConsumer>,
        #[covariant]
        dependent: AnyReadSlot,
    }
);

/// A ring's consumer, shared by the source and the slots it has lent.
pub struct Shared {
    rx: Arc<AnyConsumer>,
    /// Slots lent now. Relaxed (every access): a count for the lending limit, nothing is
    /// published with it.
    lent: AtomicUsize,
    /// The ring's spare buffers (what consumers may hold in all without stalling it).
    spares: u32,
    epoch: u64,
}

impl Shared {
    /// Shares `rx`.
    pub fn new(rx: AnyConsumer) -> Arc<Shared> {
        let (epoch, spares) = (rx.epoch(), rx.spare_buffers());
        Arc::new(Shared { rx: Arc::new(rx), lent: AtomicUsize::new(0), spares, epoch })
    }

    /// The consumer.
    pub fn consumer(&self) -> &AnyConsumer {
        &self.rx
    }

    /// The ring's spare buffers.
    pub fn spares(&self) -> u32 {
        self.spares
    }

    /// The ring's epoch.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Slots lent now (held for buffers GStreamer has not freed yet).
    pub fn lent(&self) -> usize {
        self.lent.load(Ordering::Relaxed)
    }

    /// Receives the next message of a host ring, waiting at most `wait`, and lends it. (CUDA
    /// messages are copied out, never lent.)
    pub fn recv(self: &Arc<Self>, wait: Duration) -> Result<SlotBytes, RecvTimeoutError> {
        let held = Held::try_new(self.rx.clone(), |rx| rx.recv_timeout(wait))?;
        self.lent.fetch_add(1, Ordering::Relaxed);
        let slot = held.borrow_dependent();
        let (seq, lag, header) = (slot.seq(), slot.lag(), slot.header().to_vec());
        Ok(SlotBytes { held, _lent: Lent(self.clone()), seq, lag, header })
    }
}

/// The bytes of a lent slot: what a `GstMemory` wraps. Dropping it releases the slot.
pub struct SlotBytes {
    /// Dropped first (field order), so the slot is released before it stops counting as lent.
    held: Held,
    _lent: Lent,
    seq: u64,
    lag: u64,
    header: Vec<u8>,
}

impl SlotBytes {
    /// The message's sequence number.
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// Messages lost before this one.
    pub fn lag(&self) -> u64 {
        self.lag
    }

    /// The message's user header.
    pub fn header(&self) -> &[u8] {
        &self.header
    }
}

impl AsRef<[u8]> for SlotBytes {
    fn as_ref(&self) -> &[u8] {
        let bytes = self.held.borrow_dependent().bytes();
        bytes.expect("only host rings lend their slots (`Shared::recv`)")
    }
}

/// One count of [`Shared::lent`], given back on drop.
struct Lent(Arc<Shared>);

impl Drop for Lent {
    fn drop(&mut self) {
        self.0.lent.fetch_sub(1, Ordering::Relaxed);
    }
}
