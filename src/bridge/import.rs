//! The importing side: a Zenoh subscriber that produces what it receives into a local ring.

use std::sync::atomic::{AtomicBool, Ordering};

use zenoh::Wait;

use super::export::TICK;
use super::wire::{self, Geometry};
use super::{BridgeError, ZenohOptions};
use crate::{AcquireTimeoutError, Host, MemoryKind, Producer};

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
    memory: MemoryKind,
    device: i32,
    #[cfg(feature = "cuda")]
    sharing: crate::Sharing,
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
        let (key, ring) = (key.to_owned(), ring.to_owned());
        ImportOptions {
            key,
            ring,
            consumers: 0,
            memory: MemoryKind::Host,
            device: 0,
            #[cfg(feature = "cuda")]
            sharing: crate::Sharing::Legacy,
        }
    }

    /// How a CUDA local ring shares its memory (default legacy IPC; `Sharing::Vmm` also lets
    /// consumers in the importer's own process read it).
    ///
    /// ```
    /// use gpuring::{PeerPolicy, Sharing};
    /// let o = gpuring::bridge::ImportOptions::new("k", "cam0").sharing(Sharing::Vmm(PeerPolicy::SameUid));
    /// # let _ = o;
    /// ```
    #[cfg(feature = "cuda")]
    pub fn sharing(mut self, sharing: crate::Sharing) -> Self {
        self.sharing = sharing;
        self
    }

    /// The local ring's memory: host (default) or CUDA (on GPU [`device`](Self::device),
    /// feature `cuda`), whatever the source's is. A CUDA ring is filled from page-locked
    /// buffers by asynchronous copies on each slot's stream.
    ///
    /// ```
    /// let o = gpuring::bridge::ImportOptions::new("k", "cam0").memory(gpuring::MemoryKind::Cuda);
    /// # let _ = o;
    /// ```
    pub fn memory(mut self, memory: MemoryKind) -> Self {
        self.memory = memory;
        self
    }

    /// The GPU of a CUDA local ring (default 0).
    ///
    /// ```
    /// let o = gpuring::bridge::ImportOptions::new("k", "cam0").device(1);
    /// # let _ = o;
    /// ```
    pub fn device(mut self, device: i32) -> Self {
        self.device = device;
        self
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

/// The local ring's producer, in either memory kind.
enum Tx {
    Host(Box<Producer<Host>>),
    /// With the page-locked buffers messages are copied from, used in turn.
    #[cfg(feature = "cuda")]
    Cuda(Box<Producer<crate::Cuda>>, Vec<crate::cuda::StagingBuffer>, usize),
}

/// The local ring of one source instance.
struct Local {
    tx: Tx,
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
            while !made.consumers_joined(opts.consumers) {
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
            l.declare_lost(h.seq - l.next);
        }
        l.next = h.seq + 1;
        if l.publish(&payload, &h.user_header, stop, &opts.ring)? {
            published += 1;
        }
    }
    tracing::info!(ring = %opts.ring, published, "import stopped");
    Ok(published)
}

/// The local ring for source instance `h.epoch`.
fn create(opts: &ImportOptions, h: &wire::Header) -> Result<Local, BridgeError> {
    let g = h.geometry;
    let b = Producer::builder(&opts.ring)
        .capacity(g.capacity)
        .slot_size(g.slot_size as usize)
        .user_header_size(g.user_header_size)
        .policy(g.policy);
    let tx = match opts.memory {
        MemoryKind::Host => Tx::Host(Box::new(b.create().map_err(BridgeError::Create)?)),
        #[cfg(feature = "cuda")]
        MemoryKind::Cuda => {
            let tx = b.sharing(opts.sharing.clone()).create_gpu(opts.device);
            let tx = tx.map_err(BridgeError::Create)?;
            let stage = |_| crate::cuda::StagingBuffer::new(tx.context(), g.slot_size as usize);
            let staging = (0..STAGES).map(stage).collect::<Result<Vec<_>, _>>();
            let staging =
                staging.map_err(|e| BridgeError::Ring(format!("ring {:?}: {e}", opts.ring)))?;
            Tx::Cuda(Box::new(tx), staging, 0)
        }
        #[cfg(not(feature = "cuda"))]
        MemoryKind::Cuda => {
            return Err(BridgeError::Ring("CUDA rings need gpuring's `cuda` feature".into()))
        }
    };
    let local = Local { tx, epoch: h.epoch, geometry: g, next: h.seq };
    tracing::info!(ring = %opts.ring, source_epoch = h.epoch, epoch = local.epoch(), "made the ring");
    Ok(local)
}

/// Page-locked buffers a CUDA import fills in turn: one being copied to the GPU while the next
/// message is written into another.
#[cfg(feature = "cuda")]
const STAGES: usize = 3;

impl Local {
    fn epoch(&self) -> u64 {
        match &self.tx {
            Tx::Host(tx) => tx.epoch(),
            #[cfg(feature = "cuda")]
            Tx::Cuda(tx, ..) => tx.epoch(),
        }
    }

    /// Waits up to a tick for `n` consumers; whether they joined.
    fn consumers_joined(&mut self, n: usize) -> bool {
        match &mut self.tx {
            Tx::Host(tx) => tx.wait_for_consumers(n, TICK).is_ok(),
            #[cfg(feature = "cuda")]
            Tx::Cuda(tx, ..) => tx.wait_for_consumers(n, TICK).is_ok(),
        }
    }

    fn declare_lost(&mut self, n: u64) {
        match &mut self.tx {
            Tx::Host(tx) => tx.declare_lost(n),
            #[cfg(feature = "cuda")]
            Tx::Cuda(tx, ..) => tx.declare_lost(n),
        }
    }

    /// Publishes one message, waiting for a slot as long as the local consumers hold the ring
    /// (a `Lossless` chain holds the exporter back through Zenoh meanwhile). False if `stop`
    /// was set first.
    fn publish(
        &mut self,
        payload: &[u8],
        header: &[u8],
        stop: &AtomicBool,
        ring: &str,
    ) -> Result<bool, BridgeError> {
        let failed = |e: &dyn std::fmt::Display| BridgeError::Ring(format!("ring {ring:?}: {e}"));
        // Relaxed (every load): a request to stop, polled each tick.
        while !stop.load(Ordering::Relaxed) {
            match &mut self.tx {
                Tx::Host(tx) => {
                    let mut slot = match tx.acquire_timeout(TICK) {
                        Ok(slot) => slot,
                        Err(AcquireTimeoutError::Timeout) => continue,
                        Err(e) => return Err(failed(&e)),
                    };
                    slot[..payload.len()].copy_from_slice(payload);
                    slot.publish(payload.len(), header).map_err(|e| failed(&e))?;
                }
                #[cfg(feature = "cuda")]
                Tx::Cuda(tx, staging, turn) => {
                    let buf = &mut staging[*turn];
                    // Its last copy to the GPU must have run before it is written again.
                    buf.wait().map_err(|e| failed(&e))?;
                    buf.host_mut()[..payload.len()].copy_from_slice(payload);
                    let slot = match tx.acquire_timeout(TICK) {
                        Ok(slot) => slot,
                        Err(AcquireTimeoutError::Timeout) => continue,
                        Err(e) => return Err(failed(&e)),
                    };
                    // SAFETY: the buffer's device-mapped bytes are device memory of this
                    // context, written above by the CPU before the copy is queued, and not
                    // written again before `wait` says the copy (recorded next) has run.
                    unsafe { slot.copy_from(buf.device_ptr(), payload.len()) }
                        .map_err(|e| failed(&e))?;
                    buf.record(slot.stream()).map_err(|e| failed(&e))?;
                    slot.publish(payload.len(), header).map_err(|e| failed(&e))?;
                    *turn = (*turn + 1) % staging.len();
                }
            }
            return Ok(true);
        }
        Ok(false)
    }
}
