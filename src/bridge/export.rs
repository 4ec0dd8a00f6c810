//! The exporting side: a consumer of a local ring that publishes each message on a Zenoh key.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use zenoh::qos::CongestionControl;
use zenoh::Wait;

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
    tracing::info!(ring = %opts.ring, %key, mode = ?opts.mode, "exporting");
    let lossless = opts.mode == Mode::Lossless;
    let mut sent = 0u64;
    let mut last_epoch = None;
    // Relaxed (every load): a request to stop, polled each tick; nothing is published with it.
    while !stop.load(Ordering::Relaxed) {
        // A lossless export takes nothing from the ring until an importer listens: Zenoh drops
        // what nobody subscribes to.
        if lossless && !wait_for_importer(&publisher, stop)? {
            break;
        }
        let Some(rx) = join(opts, last_epoch, stop)? else { break };
        last_epoch = Some(rx.epoch());
        let geometry = Geometry {
            memory: rx.memory(),
            policy: rx.policy(),
            capacity: rx.capacity(),
            user_header_size: rx.user_header_size() as u32,
            slot_size: rx.slot_size() as u64,
        };
        tracing::info!(ring = %opts.ring, epoch = rx.epoch(), "joined the ring");
        while !stop.load(Ordering::Relaxed) {
            if lossless && !wait_for_importer(&publisher, stop)? {
                break;
            }
            let m = match rx.recv_timeout(TICK) {
                Ok(m) => m,
                Err(RecvTimeoutError::Timeout) => continue,
                Err(RecvTimeoutError::Disconnected) => {
                    tracing::info!(ring = %opts.ring, ended = ?rx.ended(), "the ring's producer is gone: waiting for the next");
                    break;
                }
                Err(e) => return Err(BridgeError::Ring(format!("ring {:?}: {e}", opts.ring))),
            };
            let header = wire::Header {
                geometry,
                epoch: rx.epoch(),
                seq: m.seq(),
                timestamp_ns: m.timestamp_ns(),
                user_header: m.header().to_vec(),
            };
            publisher
                .put(&m[..])
                .attachment(wire::encode(&header))
                .wait()
                .map_err(|e| BridgeError::Zenoh(e.to_string()))?;
            sent += 1;
        }
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

/// Joins the ring, waiting for it to exist (and, after `old_epoch`'s producer went, for a new
/// one); `None` once `stop` is set.
fn join(
    opts: &ExportOptions,
    old_epoch: Option<u64>,
    stop: &AtomicBool,
) -> Result<Option<Consumer<Host>>, BridgeError> {
    let b = Consumer::builder(&opts.ring).mode(opts.mode).start_at(opts.start);
    while !stop.load(Ordering::Relaxed) {
        match b.clone().open_in_when_ready::<Host>(old_epoch, TICK) {
            Ok(rx) => return Ok(Some(rx)),
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
