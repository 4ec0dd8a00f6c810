//! The importing side: a Zenoh subscriber that produces what it receives into a local ring.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use zenoh::Wait;

use super::export::TICK;
use super::flow;
use super::wire::{self, Geometry};
use super::{BridgeError, ZenohOptions};
use crate::{AcquireTimeoutError, Host, MemoryKind, Producer};

/// The default [`ImportOptions::max_ring_bytes`]: 4 GiB.
///
/// ```
/// assert_eq!(gpuring::bridge::DEFAULT_MAX_RING_BYTES, 4 << 30);
/// ```
pub const DEFAULT_MAX_RING_BYTES: u64 = 4 << 30;

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
    /// The local ring's directory; `None`: the library's default.
    dir: Option<PathBuf>,
    consumers: usize,
    memory: MemoryKind,
    device: i32,
    max_ring_bytes: u64,
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
            dir: None,
            consumers: 0,
            memory: MemoryKind::Host,
            device: 0,
            max_ring_bytes: DEFAULT_MAX_RING_BYTES,
            #[cfg(feature = "cuda")]
            sharing: crate::Sharing::Legacy,
        }
    }

    /// The directory the local ring is made in
    /// ([`ProducerBuilder::dir`](crate::ProducerBuilder::dir)): one its consumers share, a
    /// volume of their containers, say. Default: the directory the environment variable
    /// `GPURING_DIR` names, else `/dev/shm`.
    ///
    /// ```
    /// let o = gpuring::bridge::ImportOptions::new("gpuring/hostA/cam0", "cam0").dir("/rings");
    /// assert_eq!(o.dir_or_default(), std::path::Path::new("/rings"));
    /// ```
    pub fn dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.dir = Some(dir.into());
        self
    }

    /// The directory the local ring is made in: the one given, or the default
    /// (`GPURING_DIR`, else `/dev/shm`).
    ///
    /// ```
    /// let o = gpuring::bridge::ImportOptions::new("gpuring/hostA/cam0", "cam0");
    /// assert_eq!(o.dir_or_default(), gpuring::shm::default_dir());
    /// ```
    pub fn dir_or_default(&self) -> PathBuf {
        self.dir.clone().unwrap_or_else(crate::shm::default_dir)
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

    /// The most memory it allocates for the local ring, in bytes: the shared file (buffers of
    /// a host ring, and every table and user header) and, for a CUDA ring, its device buffers
    /// and page-locked staging buffers. A source's geometry comes from the network, so one that
    /// needs more is refused (its messages dropped, with a warning). Default
    /// [`DEFAULT_MAX_RING_BYTES`].
    ///
    /// ```
    /// let o = gpuring::bridge::ImportOptions::new("k", "cam0").max_ring_bytes(1 << 30);
    /// # let _ = o;
    /// ```
    pub fn max_ring_bytes(mut self, bytes: u64) -> Self {
        self.max_ring_bytes = bytes;
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
    /// Messages in a row from before `next`.
    behind: u32,
    /// When a message of this source last came.
    last_seen: Instant,
    /// Other sources seen on the key (warned about once each).
    strangers: Vec<u64>,
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
    // A ring channel: when full it drops the oldest message (declared lost through the gap
    // it leaves) rather than block Zenoh's receive thread, which Zenoh would take for a dead
    // peer. A lossless exporter's window keeps it from filling (`flow`).
    let subscriber = session
        .declare_subscriber(opts.key.clone())
        .with(zenoh::handlers::RingChannel::new(flow::QUEUE))
        .wait()
        .map_err(|e| BridgeError::Zenoh(e.to_string()))?;
    let dir = opts.dir_or_default();
    tracing::info!(key = %opts.key, ring = %opts.ring, dir = %dir.display(), "importing");
    let acks = Acker::new(&opts.key);
    // Acknowledgements go out from their own thread at every tick, so that an importer busy
    // making a ring or waiting for its consumers is never silent (`flow`): silence means dead.
    let done = AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| acks.beat(&session, &done));
        // Ends the heartbeats however `receive` ends (a panic included: the scope joins the
        // thread before it passes the panic on).
        let _done = Done(&done);
        receive(opts, &subscriber, &session, &acks, stop)
    })
}

/// Sets its flag when dropped.
struct Done<'a>(&'a AtomicBool);

impl Drop for Done<'_> {
    fn drop(&mut self) {
        // Relaxed: the heartbeat thread polls it; the scope joins it.
        self.0.store(true, Ordering::Relaxed);
    }
}

/// The receive loop of [`import`]: publishes what `subscriber` gets until `stop` is set.
fn receive(
    opts: &ImportOptions,
    subscriber: &zenoh::pubsub::Subscriber<
        zenoh::handlers::RingChannelHandler<zenoh::sample::Sample>,
    >,
    session: &zenoh::Session,
    acks: &Acker,
    stop: &AtomicBool,
) -> Result<u64, BridgeError> {
    let mut local: Option<Local> = None;
    let mut published = 0u64;
    // Relaxed (every load): a request to stop, polled each tick; nothing is published with it.
    while !stop.load(Ordering::Relaxed) {
        let sample = match subscriber.recv_timeout(TICK) {
            Ok(Some(sample)) => sample,
            Ok(None) => {
                // Relaxed: a hint the heartbeat thread sends along; it orders nothing.
                acks.idle.store(true, Ordering::Relaxed);
                // Idle, it makes no GPU call: it must still learn that its context was lost
                // (see `crate::context_lost`).
                if let Some(lost) = crate::context_lost() {
                    return Err(BridgeError::Ring(lost.to_string()));
                }
                continue;
            }
            Err(e) => return Err(BridgeError::Zenoh(e.to_string())),
        };
        acks.idle.store(false, Ordering::Relaxed);
        // Nothing is materialised before it is checked: the attachment's length first, the
        // payload's once its geometry passed (`make`) or is that of the ring made.
        let long = sample.attachment().map_or(0, |a| a.len());
        if long > wire::MAX_LEN {
            tracing::warn!(key = %sample.key_expr(), bytes = long, "dropped a message: its attachment is too long to be a bridge header");
            continue;
        }
        let attachment = sample.attachment().map(|a| a.to_bytes()).unwrap_or_default();
        let h = match wire::decode(&attachment, sample.payload().len()) {
            Ok(h) => h,
            Err(e) => {
                tracing::warn!(key = %sample.key_expr(), error = %e, "dropped a message");
                continue;
            }
        };
        acks.handled(session, &h, sample.key_expr().as_str());
        let current = local.as_ref().map(|l| (l.epoch, l.geometry, l.last_seen));
        match current {
            Some((epoch, geometry, _)) if epoch == h.epoch && geometry == h.geometry => {}
            // Another source on the key while ours is live: keep ours (a key is one source).
            Some((epoch, _, seen)) if seen.elapsed() < SWITCH_QUIET => {
                if local.as_mut().is_some_and(|l| l.note_stranger(h.epoch)) {
                    tracing::warn!(ring = %opts.ring, epoch, stranger = h.epoch, "another source publishes on the key: ignoring it while ours is live");
                }
                continue;
            }
            _ => {
                if let Some(old) = local.take() {
                    tracing::info!(ring = %opts.ring, old_epoch = old.epoch, epoch = h.epoch, "the source ring restarted: making the ring again");
                }
                let Some(mut made) = create(opts, &h) else {
                    // A ring that cannot be made because the GPU context is lost never will
                    // be: exit, rather than linger as a faulted MPS client.
                    if let Some(lost) = crate::context_lost() {
                        return Err(BridgeError::Ring(lost.to_string()));
                    }
                    continue;
                };
                while !made.consumers_joined(opts.consumers)? {
                    if stop.load(Ordering::Relaxed) {
                        return Ok(published);
                    }
                }
                local = Some(made);
            }
        }
        let l = local.as_mut().expect("made above");
        l.last_seen = Instant::now();
        if h.seq < l.next {
            // From before a gap already declared (reordering), or our `next` came from a
            // message that was not the source's: after a run of them, follow the source.
            l.behind += 1;
            if l.behind < RESYNC {
                continue;
            }
            tracing::warn!(ring = %opts.ring, next = l.next, seq = h.seq, "the source's sequence numbers went back: following them");
            l.next = h.seq;
        }
        l.behind = 0;
        if h.seq > l.next {
            l.declare_lost(h.seq - l.next);
        }
        l.next = h.seq + 1; // `decode` refuses u64::MAX
        let payload = sample.payload().to_bytes();
        if l.publish(&payload, &h.user_header, stop, &opts.ring)? {
            published += 1;
        }
    }
    tracing::info!(ring = %opts.ring, published, "import stopped");
    Ok(published)
}

/// The importer's acknowledgements (`flow`): its id, and the highest index of each exporter's
/// messages it handled, sent on `<key>/ack` at an exporter's first message, every 8 messages,
/// and at every tick from a thread of their own ([`beat`](Self::beat)), with a hello to any
/// exporter on the key.
struct Acker {
    id: u64,
    handled: Mutex<flow::Handled>,
    /// Set while the receive loop finds the queue empty (everything that reached us is
    /// handled): sent along as [`flow::IDLE`].
    idle: AtomicBool,
    /// Where hellos go: `<key>/ack` (a wildcard key reaches every exporter it matches).
    hello: String,
}

impl Acker {
    fn new(key: &str) -> Acker {
        Acker {
            id: flow::new_id(),
            handled: Mutex::new(flow::Handled::new()),
            idle: AtomicBool::new(false),
            hello: format!("{key}/ack"),
        }
    }

    fn handled_table(&self) -> std::sync::MutexGuard<'_, flow::Handled> {
        self.handled.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Notes message `h` as handled (published or not: the exporter's window counts what
    /// arrived), for the exporter that sent it only, and acknowledges it if one is due.
    fn handled(&self, session: &zenoh::Session, h: &wire::Header, key: &str) {
        let due = self.handled_table().note(h.exporter, h.index, key);
        if let Some((exporter, handled)) = due {
            let ack = flow::Ack { exporter, importer: self.id, handled, flags: 0 };
            send_ack(session, &format!("{key}/ack"), &ack);
        }
    }

    /// Sends each current exporter its index, and a hello, at every tick until `done`.
    fn beat(&self, session: &zenoh::Session, done: &AtomicBool) {
        // Relaxed (both loads): hints, polled each tick.
        while !done.load(Ordering::Relaxed) {
            let flags = if self.idle.load(Ordering::Relaxed) { flow::IDLE } else { 0 };
            let due: Vec<(flow::Ack, String)> = self
                .handled_table()
                .current()
                .map(|(exporter, handled, key)| {
                    (flow::Ack { exporter, importer: self.id, handled, flags }, key.to_owned())
                })
                .collect();
            for (ack, key) in &due {
                send_ack(session, key, ack);
            }
            let hello =
                flow::Ack { exporter: 0, importer: self.id, handled: 0, flags: flow::HELLO };
            send_ack(session, &self.hello, &hello);
            std::thread::sleep(TICK);
        }
    }
}

fn send_ack(session: &zenoh::Session, key: &str, ack: &flow::Ack) {
    if let Err(e) = session.put(key, flow::encode(ack).to_vec()).wait() {
        tracing::debug!(error = %e, "an acknowledgement was not sent");
    }
}

/// The local ring for source instance `h.epoch`, or `None` (with a warning) if it is larger
/// than allowed or cannot be made: the message is dropped, and the next one tries again.
fn create(opts: &ImportOptions, h: &wire::Header) -> Option<Local> {
    let made = make(opts, h);
    if let Err(e) = &made {
        // At most one warning a second: every message of a refused source comes here.
        static LAST: Mutex<Option<Instant>> = Mutex::new(None);
        let mut last = LAST.lock().unwrap_or_else(PoisonError::into_inner);
        if last.is_none_or(|t| t.elapsed() >= Duration::from_secs(1)) {
            tracing::warn!(ring = %opts.ring, error = %e, "cannot make the ring: dropping messages");
            *last = Some(Instant::now());
        }
    }
    made.ok()
}

fn make(opts: &ImportOptions, h: &wire::Header) -> Result<Local, BridgeError> {
    let g = h.geometry;
    let bytes = allocation(&g, opts.memory)?;
    if bytes > opts.max_ring_bytes {
        return Err(BridgeError::Ring(format!(
            "ring {:?}: the source's ring ({} slots of {} bytes, {} bytes of user header) needs \
             {bytes} bytes here, more than the {} allowed (ImportOptions::max_ring_bytes, \
             --max-ring-bytes)",
            opts.ring, g.capacity, g.slot_size, g.user_header_size, opts.max_ring_bytes
        )));
    }
    let b = builder(&opts.ring, &g).dir(opts.dir_or_default());
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
    let local = Local {
        tx,
        epoch: h.epoch,
        geometry: g,
        next: h.seq,
        behind: 0,
        last_seen: Instant::now(),
        strangers: Vec::new(),
    };
    tracing::info!(ring = %opts.ring, source_epoch = h.epoch, epoch = local.epoch(), "made the ring");
    Ok(local)
}

/// Makes the local ring for `h` and drops it (for tests: whether it would be made).
#[cfg(test)]
pub(super) fn try_make(opts: &ImportOptions, h: &wire::Header) -> Result<(), BridgeError> {
    make(opts, h).map(drop)
}

/// The local ring's builder for a source of geometry `g` (its directory aside).
fn builder(ring: &str, g: &Geometry) -> crate::ProducerBuilder {
    Producer::builder(ring)
        .capacity(g.capacity)
        .slot_size(g.slot_size as usize)
        .user_header_size(g.user_header_size)
        .policy(g.policy)
}

/// Everything a local ring of `memory` for a source of geometry `g` allocates, in bytes: its
/// shared file (every table and user header as well as host buffers) and, for a CUDA ring, its
/// device buffers and the page-locked buffers messages are staged in. Pure arithmetic on what
/// came from the network; an error if the ring format refuses the geometry.
pub(crate) fn allocation(g: &Geometry, memory: MemoryKind) -> Result<u64, BridgeError> {
    let params = builder("import", g).params(memory);
    let params = params.map_err(|e| BridgeError::Ring(format!("the source's geometry: {e}")))?;
    let file = crate::format::Layout::of(&params).total as u64;
    // What the device and the driver round up to: a slot's alignment in its pool
    // (`memory::SLOT_ALIGN`), allocations (2 MiB granules), page-locked memory (pages).
    const ALIGN: u64 = 256;
    const GRANULE: u64 = 2 << 20;
    const PAGE: u64 = 4096;
    let up = |x: u64, to: u64| x.div_ceil(to).saturating_mul(to);
    let gpu = match memory {
        MemoryKind::Host => 0,
        // The buffers' pool and the staging buffers. (Fences are events or words in the file.)
        MemoryKind::Cuda => {
            let buffers = params.buffers() as u64;
            let pool = up(up(g.slot_size, ALIGN).saturating_mul(buffers), GRANULE);
            pool.saturating_add(up(g.slot_size, PAGE) * STAGES as u64)
        }
    };
    Ok(file.saturating_add(gpu))
}

/// Page-locked buffers a CUDA import fills in turn: one being copied to the GPU while the next
/// message is written into another.
const STAGES: usize = 3;

/// How long the current source must be quiet before messages of another epoch replace it.
const SWITCH_QUIET: Duration = Duration::from_secs(1);

/// Messages in a row from before the expected sequence number after which the importer
/// follows the source's numbers again.
const RESYNC: u32 = 64;

impl Local {
    /// Notes another source's epoch; whether it is new.
    fn note_stranger(&mut self, epoch: u64) -> bool {
        let new = !self.strangers.contains(&epoch) && self.strangers.len() < 64;
        if new {
            self.strangers.push(epoch);
        }
        new
    }

    fn epoch(&self) -> u64 {
        match &self.tx {
            Tx::Host(tx) => tx.epoch(),
            #[cfg(feature = "cuda")]
            Tx::Cuda(tx, ..) => tx.epoch(),
        }
    }

    /// Waits up to a tick for `n` consumers; whether they joined, or the lost GPU context.
    fn consumers_joined(&mut self, n: usize) -> Result<bool, BridgeError> {
        let r = match &mut self.tx {
            Tx::Host(tx) => tx.wait_for_consumers(n, TICK),
            #[cfg(feature = "cuda")]
            Tx::Cuda(tx, ..) => tx.wait_for_consumers(n, TICK),
        };
        match r {
            Ok(_) => Ok(true),
            Err(crate::WaitForConsumersError::ContextLost(lost)) => {
                Err(BridgeError::Ring(lost.to_string()))
            }
            Err(_) => Ok(false),
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
    /// (a `Lossless` chain holds the exporter back through Zenoh meanwhile: the heartbeat
    /// thread keeps acknowledging). False if `stop` was set first.
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
                    buf.record_or_settle(slot.stream()).map_err(|e| failed(&e))?;
                    slot.publish(payload.len(), header).map_err(|e| failed(&e))?;
                    *turn = (*turn + 1) % staging.len();
                }
            }
            return Ok(true);
        }
        Ok(false)
    }
}
