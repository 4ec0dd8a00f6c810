//! Flow control for lossless exports: the importer acknowledges what it has handled, and a
//! lossless exporter keeps at most a window of messages unacknowledged.
//!
//! Why not let Zenoh's blocking congestion control hold the exporter back by itself: an
//! importer that blocked Zenoh's receive thread (its consumers paused for a few seconds) made
//! Zenoh close the connection as dead (`wait_before_close`, 5 s), losing what was in flight
//! without trace. With the window, the importer's queue never fills, so it never blocks Zenoh;
//! the exporter waits instead, and the source ring waits for it.
//!
//! Acknowledgements go on `<data key>/ack`: the exporter's id (from the message), the
//! importer's random id and how many of that exporter's messages it has handled (published, or
//! dropped). An exporter takes only its own. When it sees a new importer id (an importer that
//! started, or restarted), it counts from there, forgiving what was in flight (so at most two
//! windows are in flight for a moment); when it hears nothing for [`PATIENCE`], it forgives what
//! is in flight too (messages lost with a connection that closed). An importer that waits for
//! its consumers keeps acknowledging (the same count) at each tick, so a pause is not a loss.

use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// How long an exporter goes without hearing from its importer before it takes the messages in
/// flight as lost.
pub(crate) const PATIENCE: Duration = Duration::from_secs(2);

/// The most messages a lossless exporter has unacknowledged: enough to keep the link busy,
/// few enough that an importer's queue ([`QUEUE`]) never fills, and at most 256 MiB of them.
pub(crate) fn window(slot_size: u64) -> u64 {
    (256 << 20) / slot_size.max(1)
}

/// The importer's queue of received messages (Zenoh's ring channel: when full, it drops the
/// oldest rather than block Zenoh; a gap is declared for what it dropped).
pub(crate) const QUEUE: usize = 256;

/// The window, capped by the queue.
pub(crate) fn window_for(slot_size: u64) -> u64 {
    window(slot_size).clamp(2, QUEUE as u64 / 2)
}

/// An acknowledgement to exporter `exporter`: the importer's id and its count of that
/// exporter's messages handled.
pub(crate) fn encode(exporter: u64, importer: u64, handled: u64) -> [u8; 24] {
    let mut b = [0u8; 24];
    b[..8].copy_from_slice(&exporter.to_le_bytes());
    b[8..16].copy_from_slice(&importer.to_le_bytes());
    b[16..].copy_from_slice(&handled.to_le_bytes());
    b
}

/// Reads an acknowledgement: (exporter, importer, handled), `None` if it is not one.
pub(crate) fn decode(b: &[u8]) -> Option<(u64, u64, u64)> {
    let b: &[u8; 24] = b.try_into().ok()?;
    let word = |i: usize| u64::from_le_bytes(b[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
    Some((word(0), word(1), word(2)))
}

/// A random id (an exporter's or an importer's), never 0.
pub(crate) fn new_id() -> u64 {
    let mut b = [0u8; 8];
    let _ = rustix::rand::getrandom(&mut b, rustix::rand::GetRandomFlags::empty());
    u64::from_ne_bytes(b).max(1)
}

/// The latest acknowledgement, written by the ack subscriber's callback.
#[derive(Default)]
pub(crate) struct Acks {
    /// The importer, its count, and how many acknowledgements came in all.
    latest: Mutex<Option<(u64, u64, u64)>>,
    changed: Condvar,
}

impl Acks {
    /// Records an acknowledgement.
    pub(crate) fn record(&self, importer: u64, handled: u64) {
        let mut latest = self.latest.lock().unwrap_or_else(PoisonError::into_inner);
        let heard = latest.map_or(1, |(.., n)| n + 1);
        *latest = Some((importer, handled, heard));
        self.changed.notify_all();
    }

    /// Waits at most `timeout` for the next acknowledgement.
    pub(crate) fn wait_change(&self, timeout: Duration) {
        let latest = self.latest.lock().unwrap_or_else(PoisonError::into_inner);
        let _ = self.changed.wait_timeout(latest, timeout);
    }

    fn latest(&self) -> Option<(u64, u64, u64)> {
        *self.latest.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The exporter's side: messages sent, and what the current importer acknowledged.
pub(crate) struct Credit {
    acks: Arc<Acks>,
    sent: u64,
    /// The importer counted against, and `sent` minus its count when it was first seen.
    importer: Option<(u64, u64)>,
    /// The acknowledgements heard so far, and when that count last moved, for [`PATIENCE`].
    heard: (u64, Instant),
    window: u64,
}

impl Credit {
    /// Credit against `acks`, with `window` messages in flight at most.
    pub(crate) fn new(acks: Arc<Acks>, window: u64) -> Credit {
        Credit { acks, sent: 0, importer: None, heard: (0, Instant::now()), window }
    }

    /// Messages sent and not yet acknowledged by the current importer.
    pub(crate) fn in_flight(&mut self) -> u64 {
        let Some((id, handled, heard)) = self.acks.latest() else {
            return self.sent; // no importer has acknowledged anything yet
        };
        let offset = match self.importer {
            Some((known, offset)) if known == id => offset,
            _ => {
                // A new importer: what the old one had in flight is lost; count from here.
                let offset = self.sent.saturating_sub(handled);
                self.importer = Some((id, offset));
                offset
            }
        };
        let acked = offset.saturating_add(handled);
        if heard != self.heard.0 {
            self.heard = (heard, Instant::now());
        } else if self.sent > acked && self.heard.1.elapsed() >= PATIENCE {
            // Silence: what is in flight was lost (the importer died, or its link closed).
            tracing::warn!(
                lost = self.sent - acked,
                "the importer went silent: counting the messages in flight lost"
            );
            self.importer = Some((id, self.sent.saturating_sub(handled)));
            self.heard.1 = Instant::now();
            return 0;
        }
        self.sent.saturating_sub(acked)
    }

    /// Sets the window (it follows the slot size of the ring exported).
    pub(crate) fn set_window(&mut self, window: u64) {
        self.window = window;
    }

    /// Whether one more message may be sent now.
    pub(crate) fn open(&mut self) -> bool {
        self.in_flight() < self.window
    }

    /// Counts one message sent.
    pub(crate) fn sent(&mut self) {
        self.sent += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_window_follows_acknowledgements_and_forgives_a_new_importer() {
        let acks = Arc::new(Acks::default());
        let mut c = Credit::new(acks.clone(), 3);
        for _ in 0..3 {
            assert!(c.open());
            c.sent();
        }
        assert!(!c.open(), "three in flight, none acknowledged");
        // The first importer seen: counted from here (what was in flight is forgiven).
        acks.record(7, 1);
        assert_eq!(c.in_flight(), 0);
        for _ in 0..3 {
            c.sent();
        }
        assert!(!c.open());
        acks.record(7, 2);
        assert_eq!(c.in_flight(), 2);
        assert!(c.open());
        // A restarted importer: its count starts again.
        acks.record(9, 0);
        assert_eq!(c.in_flight(), 0);
        c.sent();
        assert_eq!(c.in_flight(), 1);
        acks.record(9, 1);
        assert_eq!(c.in_flight(), 0);
        assert_eq!(decode(&encode(5, 9, 1)), Some((5, 9, 1)));
        assert_eq!(decode(b"short"), None);
    }
}
