//! Flow control for lossless exports: each importer acknowledges what it has handled, and a
//! lossless exporter keeps at most a window of messages unacknowledged by its slowest importer.
//!
//! Why not let Zenoh's blocking congestion control hold the exporter back by itself: an
//! importer that blocked Zenoh's receive thread (its consumers paused for a few seconds) made
//! Zenoh close the connection as dead (`wait_before_close`, 5 s), losing what was in flight
//! without trace. With the window, no importer's queue fills, so none blocks Zenoh; the
//! exporter waits instead, and the source ring waits for it.
//!
//! Acknowledgements go on `<data key>/ack`: the exporter's id (from the messages), the
//! importer's random id and how many of that exporter's messages it has handled (published, or
//! dropped). An importer counts each exporter's messages apart ([`Handled`]), so a stray
//! message on the key (another exporter, any publisher) never moves another exporter's count.
//! An exporter takes only acknowledgements that name it, and keeps each importer's credit
//! apart ([`Credit`]): the slowest importer heard from in the last [`PATIENCE`] gates the
//! window. An importer seen for the first time is counted from there (what it missed before it
//! subscribed is not its to acknowledge); one silent for [`PATIENCE`] (dead, or its link
//! closed) is dropped and stops gating. An importer that waits for its consumers keeps
//! acknowledging (the same count) at each tick, so a pause is not a loss.

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// How long an exporter goes without hearing from an importer before it takes that importer
/// for gone, and the messages it had in flight for lost.
pub(crate) const PATIENCE: Duration = Duration::from_secs(2);

/// The most importers an exporter keeps credit for (more, say ids made up by a stray
/// publisher, are ignored with a warning, so they cannot grow its memory).
pub(crate) const MAX_IMPORTERS: usize = 64;

/// The most exporters an importer counts for at once (the least recently heard goes first).
pub(crate) const MAX_EXPORTERS: usize = 16;

/// How long an importer keeps acknowledging an exporter it no longer hears from (the one it
/// heard last is kept however long: an exporter held back by a paused consumer sends nothing).
pub(crate) const FORGET_EXPORTER: Duration = Duration::from_secs(30);

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

/// The exporter's record of acknowledgements, written by the ack subscriber's callback.
#[derive(Default)]
pub(crate) struct Acks {
    /// Per importer: its latest count, and when it was last heard.
    heard: Mutex<HashMap<u64, (u64, Instant)>>,
    changed: Condvar,
}

impl Acks {
    /// Records an acknowledgement from `importer`.
    pub(crate) fn record(&self, importer: u64, handled: u64) {
        let mut heard = self.heard.lock().unwrap_or_else(PoisonError::into_inner);
        if heard.len() >= MAX_IMPORTERS && !heard.contains_key(&importer) {
            tracing::warn!(importer, "too many importers acknowledge: ignoring a new one");
            return;
        }
        heard.insert(importer, (handled, Instant::now()));
        self.changed.notify_all();
    }

    /// Waits at most `timeout` for the next acknowledgement.
    pub(crate) fn wait_change(&self, timeout: Duration) {
        let heard = self.heard.lock().unwrap_or_else(PoisonError::into_inner);
        let _ = self.changed.wait_timeout(heard, timeout);
    }
}

/// The exporter's side: messages sent, and each importer's credit.
pub(crate) struct Credit {
    acks: Arc<Acks>,
    sent: u64,
    /// Per importer heard from: `sent` minus its count when it was first seen, so that its
    /// acknowledged total is this plus its count.
    offsets: HashMap<u64, u64>,
    /// With no importer heard from, the messages in flight are those sent since this (0 at
    /// first; `sent` when the last importer went silent).
    forgiven: u64,
    window: u64,
}

impl Credit {
    /// Credit against `acks`, with `window` messages in flight at most.
    pub(crate) fn new(acks: Arc<Acks>, window: u64) -> Credit {
        Credit { acks, sent: 0, offsets: HashMap::new(), forgiven: 0, window }
    }

    /// Messages sent and not yet acknowledged by the slowest importer heard from lately.
    pub(crate) fn in_flight(&mut self) -> u64 {
        let acks = self.acks.clone();
        let mut heard = acks.heard.lock().unwrap_or_else(PoisonError::into_inner);
        let (sent, offsets) = (self.sent, &mut self.offsets);
        let (mut slowest, mut dropped): (Option<u64>, bool) = (None, false);
        heard.retain(|&importer, &mut (handled, when)| {
            // A new importer: counted from here (what it missed is not its to acknowledge).
            let offset = *offsets.entry(importer).or_insert(sent.saturating_sub(handled));
            let behind = sent.saturating_sub(offset.saturating_add(handled));
            if when.elapsed() >= PATIENCE {
                // Silence: it died, or its link closed; what it had in flight is lost to it.
                if behind > 0 {
                    tracing::warn!(
                        importer,
                        lost = behind,
                        "an importer went silent: counting its messages in flight lost"
                    );
                }
                offsets.remove(&importer);
                dropped = true;
                return false;
            }
            slowest = Some(slowest.map_or(behind, |s| s.max(behind)));
            true
        });
        // Offsets of importers no longer heard (dropped above, or never recorded).
        offsets.retain(|importer, _| heard.contains_key(importer));
        if slowest.is_none() && dropped {
            self.forgiven = sent; // the last importer went: wait for the next from here
        }
        slowest.unwrap_or(sent - self.forgiven)
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

/// The importer's count of each exporter's messages handled, to acknowledge to each.
pub(crate) struct Handled {
    /// Per exporter: its id, its count, when its last message came, and the key to answer it
    /// on. At most [`MAX_EXPORTERS`].
    exporters: Vec<(u64, u64, Instant, String)>,
}

impl Handled {
    pub(crate) fn new() -> Handled {
        Handled { exporters: Vec::new() }
    }

    /// Counts one message of `exporter`, which came on `key`; returns its count.
    pub(crate) fn count(&mut self, exporter: u64, key: &str) -> u64 {
        let now = Instant::now();
        if let Some(e) = self.exporters.iter_mut().find(|e| e.0 == exporter) {
            e.1 += 1;
            e.2 = now;
            return e.1;
        }
        if self.exporters.len() >= MAX_EXPORTERS {
            let oldest = (0..self.exporters.len()).min_by_key(|&i| self.exporters[i].2);
            self.exporters.swap_remove(oldest.expect("not empty"));
        }
        self.exporters.push((exporter, 1, now, format!("{key}/ack")));
        1
    }

    /// The acknowledgements to send now, as (exporter, count, key to send it on): one to every
    /// exporter heard from in the last [`FORGET_EXPORTER`], and to the one heard last whenever
    /// that was (the others are forgotten).
    pub(crate) fn current(&mut self) -> impl Iterator<Item = (u64, u64, &str)> + '_ {
        let last = self.exporters.iter().map(|e| e.2).max();
        self.exporters.retain(|e| Some(e.2) == last || e.2.elapsed() < FORGET_EXPORTER);
        self.exporters.iter().map(|e| (e.0, e.1, e.3.as_str()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Makes an importer's last acknowledgement look `ago` old.
    fn age(acks: &Acks, importer: u64, ago: Duration) {
        let mut heard = acks.heard.lock().unwrap();
        let e = heard.get_mut(&importer).unwrap();
        e.1 = Instant::now().checked_sub(ago).unwrap();
    }

    #[test]
    fn the_window_follows_acknowledgements_and_counts_a_new_importer_from_its_start() {
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
        assert_eq!(decode(&encode(5, 9, 1)), Some((5, 9, 1)));
        assert_eq!(decode(b"short"), None);
    }

    #[test]
    fn the_slowest_importer_gates_the_window_until_it_goes_silent() {
        let acks = Arc::new(Acks::default());
        let mut c = Credit::new(acks.clone(), 4);
        acks.record(1, 0);
        acks.record(2, 0);
        for _ in 0..4 {
            assert!(c.open());
            c.sent();
        }
        // Importer 1 keeps up; importer 2 pauses (its heartbeats repeat its count).
        acks.record(1, 4);
        acks.record(2, 0);
        assert_eq!(c.in_flight(), 4, "the paused importer gates");
        assert!(!c.open());
        acks.record(2, 3);
        assert_eq!(c.in_flight(), 1);
        // Importer 2 dies: once silent for the patience, it stops gating.
        c.sent();
        c.sent();
        acks.record(1, 6);
        age(&acks, 2, PATIENCE);
        assert_eq!(c.in_flight(), 0, "only importer 1 is left, and it has everything");
        // A third importer joins mid-stream: counted from its first acknowledgement.
        acks.record(3, 2);
        c.sent();
        assert_eq!(c.in_flight(), 1);
    }

    #[test]
    fn a_silent_last_importer_forgives_what_it_had_in_flight() {
        let acks = Arc::new(Acks::default());
        let mut c = Credit::new(acks.clone(), 2);
        acks.record(1, 0);
        assert_eq!(c.in_flight(), 0);
        c.sent();
        c.sent();
        assert!(!c.open());
        age(&acks, 1, PATIENCE);
        assert_eq!(c.in_flight(), 0);
        c.sent();
        assert_eq!(c.in_flight(), 1, "counted again until an importer answers");
        c.sent();
        assert!(!c.open());
    }

    #[test]
    fn too_many_importers_are_ignored() {
        let acks = Arc::new(Acks::default());
        for id in 0..MAX_IMPORTERS as u64 + 10 {
            acks.record(id + 1, 0);
        }
        assert_eq!(acks.heard.lock().unwrap().len(), MAX_IMPORTERS);
    }

    #[test]
    fn an_importer_counts_each_exporter_apart() {
        let mut h = Handled::new();
        for _ in 0..1000 {
            h.count(5, "k");
        }
        assert_eq!(h.count(99, "k"), 1, "a stray exporter gets its own count");
        assert_eq!(h.count(5, "k"), 1001, "and leaves the real one's alone");
        let mut now: Vec<_> = h.current().collect();
        now.sort();
        assert_eq!(now, [(5, 1001, "k/ack"), (99, 1, "k/ack")]);
        for id in 0..MAX_EXPORTERS as u64 * 2 {
            h.count(1000 + id, "k");
        }
        assert_eq!(h.current().count(), MAX_EXPORTERS);
    }
}
