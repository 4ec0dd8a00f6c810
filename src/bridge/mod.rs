//! Carrying a ring to other hosts over Zenoh (feature `zenoh`; docs/bridge.md).
//!
//! A ring serves one host. [`export`] joins a ring as a consumer and publishes each message on
//! a Zenoh key; [`import`] subscribes to that key and produces into a local ring of the same
//! geometry, so consumers on the far host use the ordinary API. Zenoh carries it (TCP or UDP,
//! peer-to-peer or through routers, with discovery): no socket code is written here.
//!
//! - **Loss is accounted end to end.** Each message carries its sequence number in the source
//!   ring (the wire format is in docs/bridge.md). The importer declares every gap it sees
//!   ([`Producer::declare_lost`](crate::Producer::declare_lost)), so a consumer behind the
//!   import sees in `lag()` what was lost anywhere on the way: in the source ring (a `Latest`
//!   exporter skips), in the bridge, or on the network.
//! - **Restarts.** Either side may restart. An exporter joins again when its ring comes back
//!   (a new producer: a new epoch). An importer that sees a new source epoch, or a new
//!   geometry, closes its ring and creates it again, so its consumers reconnect as they do to
//!   any restarted producer. A restarted importer creates its ring on the first message.
//! - **Flow.** A `Lossless` export publishes with Zenoh's blocking congestion control, so a
//!   slow importer holds the exporter back, which holds the source ring back: nothing is lost
//!   end to end. Other modes publish with `Drop`: a slow network loses messages (counted).

mod wire;

mod export;
mod flow;
mod import;
mod session;
#[cfg(test)]
mod tests;

/// What an importer does with a received message's attachment and payload length before it
/// allocates anything, over arbitrary bytes (for the fuzz targets, `crate::testing::fuzzing`):
/// bytes 0..4 the payload length, 4.. the attachment, also read as an acknowledgement.
#[cfg(feature = "test-support")]
pub(crate) fn fuzz_message(data: &[u8]) {
    let Some((len, attachment)) = data.split_first_chunk::<4>() else { return };
    std::hint::black_box(flow::decode(attachment));
    let Ok(h) = wire::decode(attachment, u32::from_le_bytes(*len) as usize) else { return };
    assert_eq!(wire::encode(&h), attachment, "a header that decodes encodes to its bytes");
    for memory in [crate::MemoryKind::Host, crate::MemoryKind::Cuda] {
        if let Ok(bytes) = import::allocation(&h.geometry, memory) {
            assert!(bytes >= h.geometry.slot_size, "the allocation holds a slot at least");
        }
    }
}

pub use export::{export, ExportOptions};
pub use import::{import, ImportOptions, DEFAULT_MAX_RING_BYTES};
pub use session::{ZenohMode, ZenohOptions};

use std::fmt;

/// Why a bridge stopped.
///
/// ```
/// use gpuring::bridge::{BridgeError, ZenohOptions};
///
/// let bad = ZenohOptions { connect: vec!["nonsense".into()], ..Default::default() };
/// let stop = std::sync::atomic::AtomicBool::new(true);
/// let e = gpuring::bridge::export(&gpuring::bridge::ExportOptions::new("x"), &bad, &stop);
/// assert!(matches!(e, Err(BridgeError::Zenoh(_))));
/// ```
#[derive(Debug)]
pub enum BridgeError {
    /// Zenoh refused the configuration, or the session or a declaration failed.
    Zenoh(String),
    /// The ring could not be opened (export) or created (import).
    Open(crate::OpenError),
    /// The local ring could not be created.
    Create(crate::CreateError),
    /// The ring is damaged or a CUDA call failed while bridging.
    Ring(String),
}

impl fmt::Display for BridgeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BridgeError::Zenoh(e) => write!(f, "zenoh: {e}"),
            BridgeError::Open(e) => e.fmt(f),
            BridgeError::Create(e) => e.fmt(f),
            BridgeError::Ring(e) => f.write_str(e),
        }
    }
}

impl std::error::Error for BridgeError {}

/// The default key of ring `ring` exported from this host: `gpuring/<host>/<ring>`.
///
/// ```
/// let key = gpuring::bridge::default_key("cam0");
/// assert!(key.starts_with("gpuring/") && key.ends_with("/cam0"));
/// ```
pub fn default_key(ring: &str) -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname");
    let host = host.as_deref().map(str::trim).unwrap_or("localhost");
    format!("gpuring/{host}/{ring}")
}
