//! The exporting side: a consumer of a local ring that publishes each message on a Zenoh key.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use zenoh::qos::CongestionControl;
use zenoh::Wait;

use super::flow;
use super::wire::{self, Geometry};
use super::{BridgeError, ZenohOptions};
use crate::{Consumer, Host, Mode, OpenErrorKind, RecvTimeoutError, StartAt};

/// How often a bridge looks at its stop flag while it waits.
pub(crate) const TICK: Duration = Duration::from_millis(50);

/// What to export, and how.
///
/// ```
/// use gpuring::bridge::ExportOptions;
/// use gpuring::Mode;
///
/// let o = ExportOptions::new("cam0").mode(Mode::Lossless).key("site/a/cam0");
/// assert_eq!(o.key_or_default(), "site/a/cam0");
/// ```
#[derive(Clone, Debug)]
pub struct ExportOptions {
    ring: String,
    /// The ring directory; `None`: the library's default.
    dir: Option<PathBuf>,
    key: Option<String>,
    mode: Mode,
    start: StartAt,
}

impl ExportOptions {
    /// Exports ring `ring` on its [default key](super::default_key), as a `Latest` consumer
    /// (live video: the newest frame each time) starting at the newest message.
    ///
    /// ```
    /// let o = gpuring::bridge::ExportOptions::new("cam0");
    /// assert!(o.key_or_default().ends_with("/cam0"));
    /// ```
    pub fn new(ring: &str) -> ExportOptions {
        ExportOptions {
            ring: ring.to_owned(),
            dir: None,
            key: None,
            mode: Mode::Latest,
            start: StartAt::Newest,
        }
    }

    /// The Zenoh key to publish on.
    ///
    /// ```
    /// let o = gpuring::bridge::ExportOptions::new("cam0").key("lab/cam0");
    /// assert_eq!(o.key_or_default(), "lab/cam0");
    /// ```
    pub fn key(mut self, key: &str) -> Self {
        self.key = Some(key.to_owned());
        self
    }

    /// The exporter's delivery mode: `Latest` (default) for live streams, `Lossless` for a
    /// recording (nothing is lost end to end: a slow importer holds the source ring back),
    /// `Queue` for every message while the network keeps up.
    ///
    /// ```
    /// let o = gpuring::bridge::ExportOptions::new("cam0").mode(gpuring::Mode::Queue);
    /// # let _ = o;
    /// ```
    pub fn mode(mut self, mode: Mode) -> Self {
        self.mode = mode;
        self
    }

    /// Where to start in the ring when joining it (default: the newest message).
    ///
    /// ```
    /// let o = gpuring::bridge::ExportOptions::new("log").start_at(gpuring::StartAt::Oldest);
    /// # let _ = o;
    /// ```
    pub fn start_at(mut self, start: StartAt) -> Self {
        self.start = start;
        self
    }

    /// The ring directory to find the ring in, as this process sees its producer's
    /// ([`ConsumerBuilder::dir`](crate::ConsumerBuilder::dir)). Default: the directory the
    /// environment variable `GPURING_DIR` names, else `/dev/shm`. The key does not depend on
    /// it: give rings of one name in two directories of a host their own keys.
    ///
    /// ```
    /// let o = gpuring::bridge::ExportOptions::new("cam0").dir("/rings");
    /// assert_eq!(o.dir_or_default(), std::path::Path::new("/rings"));
    /// ```
    pub fn dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.dir = Some(dir.into());
        self
    }

    /// The ring directory it looks in: the one given, or the default (`GPURING_DIR`, else
    /// `/dev/shm`).
    ///
    /// ```
    /// let o = gpuring::bridge::ExportOptions::new("cam0");
    /// assert_eq!(o.dir_or_default(), gpuring::shm::default_dir());
    /// ```
    pub fn dir_or_default(&self) -> PathBuf {
        self.dir.clone().unwrap_or_else(crate::shm::default_dir)
    }

    /// The key it publishes on: the one given, or the default.
    ///
    /// ```
    /// let o = gpuring::bridge::ExportOptions::new("cam0");
    /// assert_eq!(o.key_or_default(), gpuring::bridge::default_key("cam0"));
    /// ```
    pub fn key_or_default(&self) -> String {
        self.key.clone().unwrap_or_else(|| super::default_key(&self.ring))
    }
}

/// Exports a ring until `stop` is set: joins it (waiting for it to exist), publishes every
/// message it receives on the key, and when its producer goes, waits for the next one and
/// joins again. Returns the messages published.
///
/// ```no_run
/// use std::sync::atomic::AtomicBool;
/// use gpuring::bridge::{export, ExportOptions, ZenohOptions};
///
/// let zenoh = ZenohOptions { listen: vec!["tcp/0.0.0.0:7447".into()], ..Default::default() };
/// let stop = AtomicBool::new(false); // set it from a signal handler to stop
/// export(&ExportOptions::new("cam0"), &zenoh, &stop)?;
/// # Ok::<(), gpuring::bridge::BridgeError>(())
/// ```
pub fn export(
    opts: &ExportOptions,
    zenoh: &ZenohOptions,
    stop: &AtomicBool,
) -> Result<u64, BridgeError> {
    let session = zenoh.open()?;
    let key = opts.key_or_default();
    let congestion = match opts.mode {
        Mode::Lossless => CongestionControl::Block,
        _ => CongestionControl::Drop,
    };
    let publisher = session
        .declare_publisher(key.clone())
        .congestion_control(congestion)
        .wait()
        .map_err(|e| BridgeError::Zenoh(e.to_string()))?;
    let exporter = flow::new_id();
    let dir = opts.dir_or_default();
    tracing::info!(ring = %opts.ring, dir = %dir.display(), %key, mode = ?opts.mode, exporter, "exporting");
    let lossless = opts.mode == Mode::Lossless;
    // A lossless export keeps at most a window of messages unacknowledged (`flow`).
    let acks = Arc::new(flow::Acks::default());
    let _ack_subscriber = if lossless {
        let acks = acks.clone();
        let s = session.declare_subscriber(format!("{key}/ack")).callback(move |sample| {
            let bytes = sample.payload().to_bytes();
            // Ours, or a hello to every exporter on the key.
            if let Some(ack) = flow::decode(&bytes)
                .filter(|a| a.exporter == exporter || a.flags & flow::HELLO != 0)
            {
                acks.record(ack);
            }
        });
        Some(s.wait().map_err(|e| BridgeError::Zenoh(e.to_string()))?)
    } else {
        None
    };
    let credit = lossless.then(|| Mutex::new(flow::Credit::new(acks.clone(), 2)));
    // Messages put so far, over every ring instance joined: each message's index (`flow`).
    let index = AtomicU64::new(0);
    let mut sent = 0u64;
    let mut last_epoch = None;
    // Relaxed (every load): a request to stop, polled each tick; nothing is published with it.
    while !stop.load(Ordering::Relaxed) {
        // A lossless export takes nothing from the ring until an importer listens: Zenoh drops
        // what nobody subscribes to.
        if lossless && !wait_for_importer(&publisher, stop)? {
            break;
        }
        let Some(source) = join(opts, last_epoch, stop)? else { break };
        let out = Out {
            publisher: &publisher,
            lossless,
            stop,
            ring: &opts.ring,
            exporter,
            credit: credit.as_ref(),
            acks: &acks,
            index: &index,
        };
        last_epoch = Some(match &source {
            Source::Host(rx) => {
                sent += out.host(rx)?;
                rx.epoch()
            }
            #[cfg(feature = "cuda")]
            Source::Cuda(rx) => {
                sent += out.cuda(rx)?;
                rx.epoch()
            }
        });
    }
    tracing::info!(ring = %opts.ring, sent, "export stopped");
    Ok(sent)
}

/// Waits until a subscriber matches the key; false once `stop` is set.
fn wait_for_importer(
    publisher: &zenoh::pubsub::Publisher<'_>,
    stop: &AtomicBool,
) -> Result<bool, BridgeError> {
    let mut waited = false;
    while !stop.load(Ordering::Relaxed) {
        let status = publisher.matching_status().wait();
        if status.map_err(|e| BridgeError::Zenoh(e.to_string()))?.matching() {
            if waited {
                tracing::info!(key = %publisher.key_expr(), "an importer listens");
            }
            return Ok(true);
        }
        if !waited {
            tracing::info!(key = %publisher.key_expr(), "waiting for an importer");
            waited = true;
        }
        std::thread::sleep(TICK);
    }
    Ok(false)
}

/// The ring exported, in either memory kind. One per export, made once: the variants' sizes
/// (a CUDA consumer is some 200 bytes larger) cost nothing worth a box.
#[allow(clippy::large_enum_variant)]
enum Source {
    Host(Consumer<Host>),
    #[cfg(feature = "cuda")]
    Cuda(Consumer<crate::Cuda>),
}

/// Joins the ring, waiting for it to exist (and, after `old_epoch`'s producer went, for a new
/// one); `None` once `stop` is set.
fn join(
    opts: &ExportOptions,
    old_epoch: Option<u64>,
    stop: &AtomicBool,
) -> Result<Option<Source>, BridgeError> {
    let b = Consumer::builder(&opts.ring).dir(opts.dir_or_default());
    let b = b.mode(opts.mode).start_at(opts.start);
    while !stop.load(Ordering::Relaxed) {
        let opened = match b.clone().open_in_when_ready::<Host>(old_epoch, TICK) {
            #[cfg(feature = "cuda")]
            Err(e) if matches!(e.kind(), OpenErrorKind::WrongMemory { .. }) => {
                b.clone().open_in_when_ready::<crate::Cuda>(old_epoch, TICK).map(Source::Cuda)
            }
            other => other.map(Source::Host),
        };
        match opened {
            Ok(source) => return Ok(Some(source)),
            Err(e)
                if matches!(
                    e.kind(),
                    OpenErrorKind::NotFound | OpenErrorKind::Disconnected | OpenErrorKind::TimedOut
                ) => {}
            Err(e) => return Err(BridgeError::Open(e)),
        }
    }
    Ok(None)
}

/// Where one joined ring's messages go.
struct Out<'a> {
    publisher: &'a zenoh::pubsub::Publisher<'a>,
    lossless: bool,
    stop: &'a AtomicBool,
    ring: &'a str,
    /// This exporter's id, in every message (acknowledgements name it).
    exporter: u64,
    /// A lossless export's window.
    credit: Option<&'a Mutex<flow::Credit>>,
    acks: &'a flow::Acks,
    /// Messages this exporter put so far; the next one's index is one more.
    index: &'a AtomicU64,
}

impl Out<'_> {
    /// The attachment of message `m` of `rx`.
    fn header<M: crate::Memory>(
        &self,
        rx: &Consumer<M>,
        m: &crate::ReadSlot<'_, M>,
    ) -> wire::Header {
        wire::Header {
            exporter: self.exporter,
            index: 0, // set when it is put
            geometry: Geometry {
                memory: rx.memory(),
                policy: rx.policy(),
                capacity: rx.capacity(),
                user_header_size: rx.user_header_size() as u32,
                slot_size: rx.slot_size() as u64,
            },
            epoch: rx.epoch(),
            seq: m.seq(),
            timestamp_ns: m.timestamp_ns(),
            user_header: m.header().to_vec(),
        }
    }

    /// Publishes one message: for a lossless export, once the window has room (false if
    /// `stop` was set first).
    fn put(&self, payload: &[u8], header: &mut wire::Header) -> Result<bool, BridgeError> {
        if let Some(credit) = self.credit {
            let mut credit = credit.lock().unwrap_or_else(PoisonError::into_inner);
            credit.set_window(flow::window_for(header.geometry.slot_size));
            while !credit.open() {
                // Relaxed: a request to stop, polled while waiting.
                if self.stop.load(Ordering::Relaxed) {
                    return Ok(false);
                }
                self.acks.wait_change(TICK);
            }
            header.index = credit.sent();
        } else {
            // Relaxed: one thread puts at a time (the sender); the count orders nothing.
            header.index = self.index.fetch_add(1, Ordering::Relaxed) + 1;
        }
        self.publisher
            .put(payload)
            .attachment(wire::encode(header))
            .wait()
            .map_err(|e| BridgeError::Zenoh(e.to_string()))?;
        Ok(true)
    }

    /// The next message, or `None` when the producer is gone or `stop` is set.
    fn next<'r, M: crate::Memory>(
        &self,
        rx: &'r Consumer<M>,
        recv: impl Fn(&'r Consumer<M>) -> Result<crate::ReadSlot<'r, M>, RecvTimeoutError>,
    ) -> Result<Option<crate::ReadSlot<'r, M>>, BridgeError> {
        // Relaxed (every load): a request to stop, polled each tick.
        while !self.stop.load(Ordering::Relaxed) {
            if self.lossless && !wait_for_importer(self.publisher, self.stop)? {
                break;
            }
            match recv(rx) {
                Ok(m) => return Ok(Some(m)),
                Err(RecvTimeoutError::Timeout) => continue,
                Err(RecvTimeoutError::Disconnected) => {
                    tracing::info!(ring = %self.ring, ended = ?rx.ended(), "the ring's producer is gone: waiting for the next");
                    break;
                }
                Err(e) => return Err(BridgeError::Ring(format!("ring {:?}: {e}", self.ring))),
            }
        }
        Ok(None)
    }

    /// Publishes a host ring's messages until its producer goes or `stop` is set.
    fn host(&self, rx: &Consumer<Host>) -> Result<u64, BridgeError> {
        tracing::info!(ring = %self.ring, epoch = rx.epoch(), "joined the ring");
        let mut sent = 0;
        while let Some(m) = self.next(rx, |rx| rx.recv_timeout(TICK))? {
            if !self.put(&m, &mut self.header(rx, &m))? {
                break;
            }
            sent += 1;
        }
        Ok(sent)
    }

    /// Publishes a CUDA ring's messages until its producer goes or `stop` is set. Each is
    /// copied on the bridge's own stream into one of [`STAGES`] page-locked buffers and released
    /// at once (the release is ordered after the copy on the GPU); another thread waits for
    /// the copy and sends it, so the copy of a message overlaps the send of the one before.
    #[cfg(feature = "cuda")]
    fn cuda(&self, rx: &Consumer<crate::Cuda>) -> Result<u64, BridgeError> {
        use crate::cuda::{StagingBuffer, Stream};
        use std::sync::mpsc;

        let cuda =
            |e: crate::cuda::CudaError| BridgeError::Ring(format!("ring {:?}: {e}", self.ring));
        tracing::info!(ring = %self.ring, epoch = rx.epoch(), "joined the ring (CUDA: staged)");
        let stream = Stream::new(rx.context()).map_err(|e| cuda(e.into()))?;
        let (free_tx, free) = mpsc::channel();
        for _ in 0..STAGES {
            free_tx.send(StagingBuffer::new(rx.context(), rx.slot_size()).map_err(cuda)?).ok();
        }
        let (work, todo) = mpsc::sync_channel::<(StagingBuffer, usize, wire::Header)>(STAGES);
        std::thread::scope(|s| {
            let sender = s.spawn(move || -> Result<u64, BridgeError> {
                let mut sent = 0;
                for (buf, len, mut header) in todo {
                    buf.wait().map_err(|e| cuda(e.into()))?;
                    if !self.put(&buf.host()[..len], &mut header)? {
                        break;
                    }
                    sent += 1;
                    let _ = free_tx.send(buf);
                }
                Ok(sent)
            });
            let staged = (|| {
                while let Some(m) = self.next(rx, |rx| rx.recv_on_timeout(&stream, TICK))? {
                    let buf = loop {
                        match free.recv_timeout(TICK) {
                            Ok(buf) => break Some(buf),
                            Err(mpsc::RecvTimeoutError::Timeout)
                                if !self.stop.load(Ordering::Relaxed) => {}
                            Err(_) => break None, // stopping, or the sender failed
                        }
                    };
                    let Some(mut buf) = buf else { break };
                    // SAFETY: the slot's `len <= slot_size` bytes are ordered before the copy
                    // (`recv_on` made `stream` wait for the producer's writes) and stay until
                    // the release, which the drop below queues on `stream` after the copy. The
                    // buffer is ours alone: the sender gave it back after waiting for it.
                    unsafe { buf.copy_from_device(m.ptr(), m.len(), &stream) }.map_err(cuda)?;
                    let (len, header) = (m.len(), self.header(rx, &m));
                    drop(m);
                    if work.send((buf, len, header)).is_err() {
                        break; // the sender failed: its error is returned below
                    }
                }
                Ok::<(), BridgeError>(())
            })();
            drop(work);
            let sent = sender.join().expect("the sender thread does not panic")?;
            staged.map(|()| sent)
        })
    }
}

/// Page-locked buffers a CUDA export stages messages through: one being copied into while
/// another is sent, and one spare.
#[cfg(feature = "cuda")]
const STAGES: usize = 3;
