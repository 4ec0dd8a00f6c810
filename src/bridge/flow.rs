//! Flow control for lossless exports: each importer acknowledges what it has handled, and a
//! lossless exporter keeps at most a window of messages unacknowledged by its slowest importer.
//!
//! Why not let Zenoh's blocking congestion control hold the exporter back by itself: an
//! importer that blocked Zenoh's receive thread (its consumers paused for a few seconds) made
//! Zenoh close the connection as dead (`wait_before_close`, 5 s), losing what was in flight
//! without trace. With the window, no importer's queue fills, so none blocks Zenoh; the
//! exporter waits instead, and the source ring waits for it.
//!
//! Every message carries its exporter's id and its index among that exporter's messages (1,
//! 2, 3, ...). Acknowledgements go on `<data key>/ack`: the exporter's id, the importer's
//! random id and the highest index of that exporter's messages it has handled (published, or
//! dropped). An acknowledgement is absolute, so none depends on another: an importer tracks
//! each exporter apart ([`Handled`]), and a stray message on the key (another exporter, any
//! publisher) never moves another exporter's count. An exporter takes only acknowledgements
//! that name it and keeps each importer's apart ([`Credit`]): what is in flight to an importer
//! is the messages sent after the index it acknowledged, and the slowest importer heard from in
//! the last [`PATIENCE`] gates the window. An importer acknowledges an exporter's first message
//! at once, so one that joins mid-stream gates from then. One silent for [`PATIENCE`] (dead, or
//! its link closed) stops gating; if it speaks again, it gates again from its exact index. An
//! importer that waits for its consumers keeps acknowledging (the same index) at each tick, so
//! a pause is not a loss.

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// How long an exporter goes without hearing from an importer before it takes that importer
/// for gone, and the messages it had in flight for lost.
pub(crate) const PATIENCE: Duration = Duration::from_secs(2);

/// The most importers an exporter keeps credit for (a new one beyond takes the place of the
/// one heard from longest ago, so ids made up by a stray publisher cannot grow its memory).
pub(crate) const MAX_IMPORTERS: usize = 64;

/// How long an exporter remembers an importer it no longer hears from: one that speaks again
/// within this gates again from its exact acknowledgement, with nothing forgiven twice.
pub(crate) const FORGET_IMPORTER: Duration = Duration::from_secs(60);

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
    /// Per importer: the highest message index it acknowledged, and when it was last heard.
    /// At most [`MAX_IMPORTERS`].
    heard: Mutex<HashMap<u64, (u64, Instant)>>,
    changed: Condvar,
}

impl Acks {
    /// Records `importer`'s acknowledgement of every message up to index `handled`. With the
    /// table full, a new importer takes the place of the one heard from longest ago.
    pub(crate) fn record(&self, importer: u64, handled: u64) {
        let mut heard = self.heard.lock().unwrap_or_else(PoisonError::into_inner);
        if heard.len() >= MAX_IMPORTERS && !heard.contains_key(&importer) {
            let oldest = heard.iter().min_by_key(|(_, &(_, when))| when).map(|(&id, _)| id);
            heard.remove(&oldest.expect("full"));
        }
        let now = Instant::now();
        let e = heard.entry(importer).or_insert((handled, now));
        // Indexes only grow (an acknowledgement overtaken by a later one says less).
        *e = (e.0.max(handled), now);
        self.changed.notify_all();
    }

    /// Waits at most `timeout` for the next acknowledgement.
    pub(crate) fn wait_change(&self, timeout: Duration) {
        let heard = self.heard.lock().unwrap_or_else(PoisonError::into_inner);
        let _ = self.changed.wait_timeout(heard, timeout);
    }
}

/// The exporter's side: messages sent (each message carries its index, `sent` after it is
/// counted), and what each importer acknowledged.
pub(crate) struct Credit {
    acks: Arc<Acks>,
    sent: u64,
    /// The importers that gated the window at the last look (heard within [`PATIENCE`]).
    gating: Vec<u64>,
    /// With no importer gating, the messages in flight are those sent since this: 0 at first
    /// (nothing goes out beyond a window until an importer answers), `sent` when the last
    /// importer went silent.
    forgiven: u64,
    window: u64,
}

impl Credit {
    /// Credit against `acks`, with `window` messages in flight at most.
    pub(crate) fn new(acks: Arc<Acks>, window: u64) -> Credit {
        Credit { acks, sent: 0, gating: Vec::new(), forgiven: 0, window }
    }

    /// Messages sent and not yet acknowledged by the slowest importer heard from lately.
    pub(crate) fn in_flight(&mut self) -> u64 {
        let mut heard = self.acks.heard.lock().unwrap_or_else(PoisonError::into_inner);
        // Importers silent for long are forgotten; one silent for less, if it speaks again,
        // gates again from its exact acknowledgement.
        heard.retain(|_, &mut (_, when)| when.elapsed() < FORGET_IMPORTER);
        let sent = self.sent;
        let mut slowest: Option<u64> = None;
        let mut gating = Vec::with_capacity(heard.len());
        for (&importer, &(handled, when)) in heard.iter() {
            if when.elapsed() < PATIENCE {
                let behind = sent.saturating_sub(handled);
                slowest = Some(slowest.map_or(behind, |s| s.max(behind)));
                gating.push(importer);
            }
        }
        for gone in self.gating.iter().filter(|i| !gating.contains(i)) {
            // Silence: it died, or its link closed; what it had in flight is lost to it.
            let lost = heard.get(gone).map_or(0, |&(handled, _)| sent.saturating_sub(handled));
            tracing::warn!(
                importer = gone,
                lost,
                "an importer went silent: counting its messages in flight lost"
            );
        }
        if slowest.is_none() && !self.gating.is_empty() {
            self.forgiven = sent; // the last importer went: wait for the next from here
        }
        self.gating = gating;
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

    /// Counts one message sent (its index is this count).
    pub(crate) fn sent(&mut self) {
        self.sent += 1;
    }
}

/// The importer's record of each exporter's messages, to acknowledge to each the highest index
/// it handled.
pub(crate) struct Handled {
    /// Per exporter: its id, the highest index handled, the messages handled, when its last
    /// message came, and the key to answer it on. At most [`MAX_EXPORTERS`].
    exporters: Vec<(u64, u64, u64, Instant, String)>,
}

impl Handled {
    pub(crate) fn new() -> Handled {
        Handled { exporters: Vec::new() }
    }

    /// Notes message `index` of `exporter`, which came on `key`; returns the acknowledgement to
    /// send now, if one is due: at an exporter's first message (so that it counts this
    /// importer at once) and every 8 messages.
    pub(crate) fn note(&mut self, exporter: u64, index: u64, key: &str) -> Option<(u64, u64)> {
        let now = Instant::now();
        if let Some(e) = self.exporters.iter_mut().find(|e| e.0 == exporter) {
            e.1 = e.1.max(index);
            e.2 += 1;
            e.3 = now;
            return (e.2 % 8 == 0).then_some((exporter, e.1));
        }
        if self.exporters.len() >= MAX_EXPORTERS {
            let oldest = (0..self.exporters.len()).min_by_key(|&i| self.exporters[i].3);
            self.exporters.swap_remove(oldest.expect("not empty"));
        }
        self.exporters.push((exporter, index, 1, now, format!("{key}/ack")));
        Some((exporter, index))
    }

    /// The acknowledgements to send now, as (exporter, highest index handled, key to send it
    /// on): one to every exporter heard from in the last [`FORGET_EXPORTER`], and to the one
    /// heard last whenever that was (the others are forgotten).
    pub(crate) fn current(&mut self) -> impl Iterator<Item = (u64, u64, &str)> + '_ {
        let last = self.exporters.iter().map(|e| e.3).max();
        self.exporters.retain(|e| Some(e.3) == last || e.3.elapsed() < FORGET_EXPORTER);
        self.exporters.iter().map(|e| (e.0, e.1, e.4.as_str()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Makes an importer's last acknowledgement look `ago` old.
    fn age(acks: &Acks, importer: u64, ago: Duration) {
        let mut heard = acks.heard.lock().unwrap();
        heard.get_mut(&importer).unwrap().1 = Instant::now().checked_sub(ago).unwrap();
    }

    fn send(c: &mut Credit, n: u64) {
        for _ in 0..n {
            c.sent();
        }
    }

    #[test]
    fn the_window_follows_acknowledged_indexes() {
        let acks = Arc::new(Acks::default());
        let mut c = Credit::new(acks.clone(), 3);
        for _ in 1..=3 {
            assert!(c.open());
            c.sent();
        }
        assert!(!c.open(), "three in flight, none acknowledged");
        acks.record(7, 1);
        assert_eq!(c.in_flight(), 2);
        acks.record(7, 3);
        assert_eq!(c.in_flight(), 0);
        acks.record(7, 2); // overtaken by a later one: says less, changes nothing
        assert_eq!(c.in_flight(), 0);
        assert_eq!(decode(&encode(5, 9, 1)), Some((5, 9, 1)));
        assert_eq!(decode(b"short"), None);
    }

    #[test]
    fn the_slowest_importer_gates_until_it_goes_silent_and_again_if_it_returns() {
        let acks = Arc::new(Acks::default());
        let mut c = Credit::new(acks.clone(), 4);
        acks.record(1, 0);
        acks.record(2, 0);
        send(&mut c, 4);
        // Importer 1 keeps up; importer 2 pauses (its heartbeats repeat its index).
        acks.record(1, 4);
        acks.record(2, 0);
        assert_eq!(c.in_flight(), 4, "the paused importer gates");
        assert!(!c.open());
        acks.record(2, 3);
        assert_eq!(c.in_flight(), 1);
        // Importer 2 goes silent: once silent for the patience, it stops gating.
        send(&mut c, 2);
        acks.record(1, 6);
        age(&acks, 2, PATIENCE);
        assert_eq!(c.in_flight(), 0, "only importer 1 gates, and it has everything");
        // It was only slow: it speaks again, and gates from its exact index (nothing of what
        // it still holds is forgiven).
        acks.record(2, 4);
        assert_eq!(c.in_flight(), 2);
        // A third importer joins mid-stream: it gates from its first acknowledgement.
        send(&mut c, 1);
        acks.record(3, 5);
        acks.record(2, 7);
        acks.record(1, 7);
        assert_eq!(c.in_flight(), 2, "importer 3 holds 6 and 7");
    }

    #[test]
    fn a_silent_last_importer_forgives_what_it_had_in_flight() {
        let acks = Arc::new(Acks::default());
        let mut c = Credit::new(acks.clone(), 2);
        acks.record(1, 0);
        send(&mut c, 2);
        assert!(!c.open());
        age(&acks, 1, PATIENCE);
        assert_eq!(c.in_flight(), 0);
        c.sent();
        assert_eq!(c.in_flight(), 1, "counted again until an importer answers");
        c.sent();
        assert!(!c.open());
        // Long forgotten, it is not counted when it comes back only as a stale entry.
        age(&acks, 1, FORGET_IMPORTER);
        assert_eq!(c.in_flight(), 2);
    }

    #[test]
    fn a_full_table_makes_room_for_a_new_importer() {
        let acks = Arc::new(Acks::default());
        for id in 1..=MAX_IMPORTERS as u64 {
            acks.record(id, 0);
        }
        age(&acks, 5, Duration::from_secs(1));
        acks.record(1_000, 0);
        let heard = acks.heard.lock().unwrap();
        assert_eq!(heard.len(), MAX_IMPORTERS);
        assert!(heard.contains_key(&1_000) && !heard.contains_key(&5), "the oldest made room");
    }

    #[test]
    fn an_importer_acknowledges_each_exporters_own_index() {
        let mut h = Handled::new();
        assert_eq!(h.note(5, 1, "k"), Some((5, 1)), "an exporter's first message at once");
        for index in 2..=1000 {
            let due = h.note(5, index, "k");
            assert_eq!(due.is_some(), index % 8 == 0);
        }
        assert_eq!(h.note(99, 1, "k"), Some((99, 1)), "a stray exporter gets its own");
        let mut now: Vec<_> = h.current().collect();
        now.sort();
        assert_eq!(now, [(5, 1000, "k/ack"), (99, 1, "k/ack")]);
        // Evicted by many others, the real exporter's acknowledgement is still exact: its
        // next message's index is what it acknowledges.
        for id in 0..MAX_EXPORTERS as u64 * 2 {
            h.note(1000 + id, 1, "k");
        }
        assert_eq!(h.current().count(), MAX_EXPORTERS);
        assert_eq!(h.note(5, 1001, "k"), Some((5, 1001)));
    }
}
