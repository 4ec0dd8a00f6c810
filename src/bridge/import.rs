//! The importing side: a Zenoh subscriber that produces what it receives into a local ring.

use std::sync::atomic::{AtomicBool, Ordering};

use zenoh::Wait;

use super::export::TICK;
use super::wire::{self, Geometry};
use super::{BridgeError, ZenohOptions};
use crate::{AcquireTimeoutError, Host, Producer};

/// What to import, and into which ring.
///
/// ```
/// let o = gpuring::bridge::ImportOptions::new("gpuring/hostA/cam0", "cam0");
/// # let _ = o;
/// ```
#[derive(Clone, Debug)]
pub struct ImportOptions {
    key: String,
    ring: String,
    consumers: usize,
}

impl ImportOptions {
    /// Subscribes to `key` and produces into a local host-memory ring named `ring`, of the
    /// source ring's capacity, slot size, user header size and policy.
    ///
    /// ```
    /// let o = gpuring::bridge::ImportOptions::new("gpuring/*/cam0", "cam0-remote");
    /// # let _ = o;
    /// ```
    pub fn new(key: &str, ring: &str) -> ImportOptions {
        ImportOptions { key: key.to_owned(), ring: ring.to_owned(), consumers: 0 }
    }

    /// Each time it makes the ring, waits for `n` consumers to join before it publishes (with
    /// a `Lossless` export, the exporter waits meanwhile, through Zenoh): a lossless chain's
    /// local consumers then miss nothing. Default 0.
    ///
    /// ```
    /// let o = gpuring::bridge::ImportOptions::new("gpuring/hostA/log", "log").wait_for_consumers(1);
    /// # let _ = o;
    /// ```
    pub fn wait_for_consumers(mut self, n: usize) -> Self {
        self.consumers = n;
        self
    }
}

/// The local ring of one source instance.
struct Local {
    tx: Producer<Host>,
    /// The source ring's epoch and shape.
    epoch: u64,
    geometry: Geometry,
    /// The source sequence number expected next.
    next: u64,
}

/// Imports a key until `stop` is set: creates the local ring at the first message, publishes
/// each message into it, declares every gap in the source's sequence numbers as lost
/// ([`Producer::declare_lost`]), and makes the ring again (a new epoch) when the source ring
/// restarted or changed shape. Returns the messages published. Messages whose attachment is
/// not a valid bridge header are dropped with a warning.
///
/// ```no_run
/// use std::sync::atomic::AtomicBool;
/// use gpuring::bridge::{import, ImportOptions, ZenohOptions};
///
/// let zenoh = ZenohOptions { connect: vec!["tcp/10.0.0.5:7447".into()], ..Default::default() };
/// let stop = AtomicBool::new(false);
/// import(&ImportOptions::new("gpuring/hostA/cam0", "cam0"), &zenoh, &stop)?;
/// # Ok::<(), gpuring::bridge::BridgeError>(())
/// ```
pub fn import(
    opts: &ImportOptions,
    zenoh: &ZenohOptions,
    stop: &AtomicBool,
) -> Result<u64, BridgeError> {
    let session = zenoh.open()?;
    let subscriber = session
        .declare_subscriber(opts.key.clone())
        .wait()
        .map_err(|e| BridgeError::Zenoh(e.to_string()))?;
    tracing::info!(key = %opts.key, ring = %opts.ring, "importing");
    let mut local: Option<Local> = None;
    let mut published = 0u64;
    // Relaxed (every load): a request to stop, polled each tick; nothing is published with it.
    while !stop.load(Ordering::Relaxed) {
        let sample = match subscriber.recv_timeout(TICK) {
            Ok(Some(sample)) => sample,
            Ok(None) => continue,
            Err(e) => return Err(BridgeError::Zenoh(e.to_string())),
        };
        let payload = sample.payload().to_bytes();
        let attachment = sample.attachment().map(|a| a.to_bytes()).unwrap_or_default();
        let h = match wire::decode(&attachment, payload.len()) {
            Ok(h) => h,
            Err(e) => {
                tracing::warn!(key = %sample.key_expr(), error = %e, "dropped a message");
                continue;
            }
        };
        let same = local.as_ref().is_some_and(|l| l.epoch == h.epoch && l.geometry == h.geometry);
        if !same {
            if let Some(old) = local.take() {
                tracing::info!(ring = %opts.ring, old_epoch = old.epoch, epoch = h.epoch, "the source ring restarted: making the ring again");
            }
            let mut made = create(opts, &h)?;
            while made.tx.wait_for_consumers(opts.consumers, TICK).is_err() {
                if stop.load(Ordering::Relaxed) {
                    return Ok(published);
                }
            }
            local = Some(made);
        }
        let l = local.as_mut().expect("made above");
        if h.seq < l.next {
            continue; // a message from before a gap we already declared (reordering)
        }
        if h.seq > l.next {
            l.tx.declare_lost(h.seq - l.next);
        }
        l.next = h.seq + 1;
        // Wait for a slot as long as the local consumers hold the ring (a `Lossless` chain
        // holds the exporter back through Zenoh meanwhile).
        while !stop.load(Ordering::Relaxed) {
            let mut slot = match l.tx.acquire_timeout(TICK) {
                Ok(slot) => slot,
                Err(AcquireTimeoutError::Timeout) => continue,
                Err(e) => return Err(BridgeError::Ring(format!("ring {:?}: {e}", opts.ring))),
            };
            slot[..payload.len()].copy_from_slice(&payload);
            slot.publish(payload.len(), &h.user_header)
                .map_err(|e| BridgeError::Ring(format!("ring {:?}: {e}", opts.ring)))?;
            published += 1;
            break;
        }
    }
    tracing::info!(ring = %opts.ring, published, "import stopped");
    Ok(published)
}

/// The local ring for source instance `h.epoch`.
fn create(opts: &ImportOptions, h: &wire::Header) -> Result<Local, BridgeError> {
    let g = h.geometry;
    let tx = Producer::builder(&opts.ring)
        .capacity(g.capacity)
        .slot_size(g.slot_size as usize)
        .user_header_size(g.user_header_size)
        .policy(g.policy)
        .create()
        .map_err(BridgeError::Create)?;
    tracing::info!(ring = %opts.ring, source_epoch = h.epoch, epoch = tx.epoch(), "made the ring");
    Ok(Local { tx, epoch: h.epoch, geometry: g, next: h.seq })
}
