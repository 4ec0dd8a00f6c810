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
//! 2, 3, ...). Acknowledgements go on `<data key>/ack` ([`Ack`]): the exporter's id, the
//! importer's random id, the highest index of that exporter's messages it has handled
//! (published, or dropped) and flags. An acknowledgement is absolute, so none depends on
//! another: an importer tracks each exporter apart ([`Handled`]), and a stray message on the
//! key (another exporter, any publisher) never moves another exporter's index. An exporter
//! takes only acknowledgements that name it and keeps each importer's apart ([`Credit`]): what
//! is in flight to an importer is what was sent after the index it acknowledged, and the
//! slowest importer heard from in the last [`PATIENCE`] gates the window.
//!
//! - An importer acknowledges from a thread of its own at every tick (and at an exporter's
//!   first message, and every 8), so it is never silent while it lives, whatever its receive
//!   loop is doing (making a large ring, waiting for its consumers, for a slot). Silence for
//!   [`PATIENCE`] means dead or cut off: the importer stops gating; if it speaks again, it
//!   gates again from its exact index.
//! - At every tick it also says [`HELLO`] to any exporter on the key: an importer that has
//!   received nothing yet (the window shut while nobody listened) is counted from then, so it
//!   opens the window.
//! - [`IDLE`] says its queue was empty: everything that reached it is handled. Idle at one
//!   index for [`LOST_AFTER`] while more was sent, what was sent before it first said so is not
//!   coming (its link lost it, say a connection that closed and came back): counted lost, so
//!   the window opens again. An importer waiting for its consumers is not idle: a pause is not
//!   a loss.

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// How long an exporter goes without hearing from an importer before it takes that importer
/// for gone, and the messages it had in flight for lost.
pub(crate) const PATIENCE: Duration = Duration::from_secs(2);

/// The most importers an exporter keeps credit for (a new one beyond takes the place of the
/// one heard from longest ago, so ids made up by a stray publisher cannot grow its memory).
pub(crate) const MAX_IMPORTERS: usize = 64;

/// How long an importer may say its queue is empty at one index, with more sent than that,
/// before the exporter counts what was sent before it first said so as lost on its link (not
/// coming). Longer than a message's transit, so a slow link is not taken for a lossy one.
pub(crate) const LOST_AFTER: Duration = Duration::from_secs(5);

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

/// An acknowledgement's flag: the importer's queue was empty when it was sent (it has handled
/// everything that reached it).
pub(crate) const IDLE: u64 = 1;
/// An acknowledgement's flag: an importer announcing itself to every exporter on the key
/// (`exporter` 0, no index), so that one that has not reached it yet counts it from now.
pub(crate) const HELLO: u64 = 2;

/// An acknowledgement.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Ack {
    /// The exporter it is for (0 in a hello: any).
    pub(crate) exporter: u64,
    /// The importer's random id.
    pub(crate) importer: u64,
    /// The highest index of that exporter's messages the importer handled.
    pub(crate) handled: u64,
    /// [`IDLE`], [`HELLO`].
    pub(crate) flags: u64,
}

/// An acknowledgement's bytes: its four words, little-endian.
pub(crate) fn encode(a: &Ack) -> [u8; 32] {
    let mut b = [0u8; 32];
    for (i, w) in [a.exporter, a.importer, a.handled, a.flags].into_iter().enumerate() {
        b[i * 8..i * 8 + 8].copy_from_slice(&w.to_le_bytes());
    }
    b
}

/// Reads an acknowledgement, `None` if it is not one.
pub(crate) fn decode(b: &[u8]) -> Option<Ack> {
    let b: &[u8; 32] = b.try_into().ok()?;
    let word = |i: usize| u64::from_le_bytes(b[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
    Some(Ack { exporter: word(0), importer: word(1), handled: word(2), flags: word(3) })
}

/// A random id (an exporter's or an importer's), never 0.
pub(crate) fn new_id() -> u64 {
    let mut b = [0u8; 8];
    let _ = rustix::rand::getrandom(&mut b, rustix::rand::GetRandomFlags::empty());
    u64::from_ne_bytes(b).max(1)
}

/// What an exporter knows of one importer.
struct Importer {
    /// The highest index it acknowledged, or that the exporter counts as handled for it.
    handled: u64,
    /// When it was last heard from.
    heard: Instant,
    /// Since when (`.2`) it has said, each time, that its queue is empty at index `.0` (the
    /// index it reports), and how many messages had been sent then (`.1`): those it has not
    /// handled by [`LOST_AFTER`] never reached it (its link lost them).
    idle: Option<(u64, u64, Instant)>,
}

/// The exporter's record of messages sent and of each importer's acknowledgements (written by
/// the ack subscriber's callback and by the exporter's thread).
#[derive(Default)]
pub(crate) struct Acks {
    state: Mutex<State>,
    changed: Condvar,
}

#[derive(Default)]
struct State {
    /// Messages sent: the last one's index.
    sent: u64,
    /// At most [`MAX_IMPORTERS`].
    importers: HashMap<u64, Importer>,
}

impl Acks {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records acknowledgement `a` (one for this exporter, or a hello). A new importer is
    /// counted from its index, or from now for a hello; an index beyond what was sent is not
    /// one of ours (stale or forged) and is ignored. With the table full, a new importer takes
    /// the place of the one heard from longest ago.
    pub(crate) fn record(&self, a: Ack) {
        let mut st = self.state();
        let (sent, now) = (st.sent, Instant::now());
        let hello = a.flags & HELLO != 0;
        if !hello && a.handled > sent {
            return;
        }
        let importers = &mut st.importers;
        if importers.len() >= MAX_IMPORTERS && !importers.contains_key(&a.importer) {
            let oldest = importers.iter().min_by_key(|(_, i)| i.heard).map(|(&id, _)| id);
            importers.remove(&oldest.expect("full"));
        }
        let start = if hello { sent } else { a.handled };
        let i = importers.entry(a.importer).or_insert(Importer {
            handled: start,
            heard: now,
            idle: None,
        });
        i.heard = now;
        if !hello {
            // Indexes only grow (an acknowledgement overtaken by a later one says less).
            i.handled = i.handled.max(a.handled);
            // Idleness counts while the importer reports one index with more sent than that;
            // any other report starts it again.
            i.idle = match i.idle {
                _ if a.flags & IDLE == 0 => None,
                Some(idle) if idle.0 == a.handled && idle.1 > idle.0 => Some(idle),
                _ => Some((a.handled, sent, now)),
            };
        }
        self.changed.notify_all();
    }

    /// Waits at most `timeout` for the next acknowledgement.
    pub(crate) fn wait_change(&self, timeout: Duration) {
        let st = self.state();
        let _ = self.changed.wait_timeout(st, timeout);
    }
}

/// The exporter's side: what each importer has in flight, and the window.
pub(crate) struct Credit {
    acks: Arc<Acks>,
    /// The importers that gated the window at the last look (heard within [`PATIENCE`]).
    gating: Vec<u64>,
    /// With no importer gating, the messages in flight are those sent since this: 0 at first
    /// (nothing goes out beyond a window until an importer answers), the count sent when the
    /// last importer went silent.
    forgiven: u64,
    window: u64,
}

impl Credit {
    /// Credit against `acks`, with `window` messages in flight at most.
    pub(crate) fn new(acks: Arc<Acks>, window: u64) -> Credit {
        Credit { acks, gating: Vec::new(), forgiven: 0, window }
    }

    /// Messages sent and not yet acknowledged by the slowest importer heard from lately.
    pub(crate) fn in_flight(&mut self) -> u64 {
        let acks = self.acks.clone();
        let mut st = acks.state();
        let sent = st.sent;
        // Importers silent for long are forgotten; one silent for less, if it speaks again,
        // gates again from its exact acknowledgement.
        st.importers.retain(|_, i| i.heard.elapsed() < FORGET_IMPORTER);
        let mut slowest: Option<u64> = None;
        let mut gating = Vec::with_capacity(st.importers.len());
        for (&id, i) in st.importers.iter_mut() {
            if i.heard.elapsed() >= PATIENCE {
                continue;
            }
            if let Some((_, sent_then, since)) = i.idle {
                if sent_then > i.handled && since.elapsed() >= LOST_AFTER {
                    // Idle all along at one index: what was sent before it first said so is
                    // not coming (its link lost it). Count it handled, and lost.
                    let lost = sent_then - i.handled;
                    tracing::warn!(
                        importer = id,
                        lost,
                        "an importer's link lost messages: counting them lost"
                    );
                    i.handled = sent_then;
                    i.idle = None;
                }
            }
            let behind = sent.saturating_sub(i.handled);
            slowest = Some(slowest.map_or(behind, |s| s.max(behind)));
            gating.push(id);
        }
        for gone in self.gating.iter().filter(|i| !gating.contains(i)) {
            // Silence: it died, or its link closed; what it had in flight is lost to it.
            let lost = st.importers.get(gone).map_or(0, |i| sent.saturating_sub(i.handled));
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

    /// Counts one message sent; returns its index (1 for the first).
    pub(crate) fn sent(&mut self) -> u64 {
        let mut st = self.acks.state();
        st.sent += 1;
        st.sent
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

    fn ack(importer: u64, handled: u64) -> Ack {
        Ack { exporter: 1, importer, handled, flags: 0 }
    }

    fn idle(importer: u64, handled: u64) -> Ack {
        Ack { flags: IDLE, ..ack(importer, handled) }
    }

    fn hello(importer: u64) -> Ack {
        Ack { exporter: 0, importer, handled: 0, flags: HELLO }
    }

    /// Makes an importer's last acknowledgement (and its idleness) look `ago` older.
    fn age(acks: &Acks, importer: u64, ago: Duration) {
        let mut st = acks.state();
        let i = st.importers.get_mut(&importer).unwrap();
        i.heard = i.heard.checked_sub(ago).unwrap();
        if let Some(idle) = &mut i.idle {
            idle.2 = idle.2.checked_sub(ago).unwrap();
        }
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
        for index in 1..=3 {
            assert!(c.open());
            assert_eq!(c.sent(), index);
        }
        assert!(!c.open(), "three in flight, none acknowledged");
        acks.record(ack(7, 1));
        assert_eq!(c.in_flight(), 2);
        acks.record(ack(7, 3));
        assert_eq!(c.in_flight(), 0);
        acks.record(ack(7, 2)); // overtaken by a later one: says less, changes nothing
        assert_eq!(c.in_flight(), 0);
        acks.record(ack(8, 99)); // beyond what was sent: not ours
        assert_eq!(acks.state().importers.len(), 1);
        let a = Ack { exporter: 5, importer: 9, handled: 1, flags: IDLE };
        assert_eq!(decode(&encode(&a)), Some(a));
        assert_eq!(decode(b"short"), None);
    }

    #[test]
    fn the_slowest_importer_gates_until_it_goes_silent_and_again_if_it_returns() {
        let acks = Arc::new(Acks::default());
        let mut c = Credit::new(acks.clone(), 4);
        acks.record(ack(1, 0));
        acks.record(ack(2, 0));
        send(&mut c, 4);
        // Importer 1 keeps up; importer 2 pauses (its heartbeats repeat its index).
        acks.record(ack(1, 4));
        acks.record(ack(2, 0));
        assert_eq!(c.in_flight(), 4, "the paused importer gates");
        assert!(!c.open());
        acks.record(ack(2, 3));
        assert_eq!(c.in_flight(), 1);
        // Importer 2 goes silent: once silent for the patience, it stops gating.
        send(&mut c, 2);
        acks.record(ack(1, 6));
        age(&acks, 2, PATIENCE);
        assert_eq!(c.in_flight(), 0, "only importer 1 gates, and it has everything");
        // It speaks again: it gates from its exact index (nothing it holds is forgiven).
        acks.record(ack(2, 4));
        assert_eq!(c.in_flight(), 2);
        // A third importer joins mid-stream: it gates from its first acknowledgement.
        send(&mut c, 1);
        acks.record(ack(3, 5));
        acks.record(ack(2, 7));
        acks.record(ack(1, 7));
        assert_eq!(c.in_flight(), 2, "importer 3 holds 6 and 7");
    }

    #[test]
    fn a_new_importer_opens_a_window_that_shut_with_nobody_listening() {
        let acks = Arc::new(Acks::default());
        let mut c = Credit::new(acks.clone(), 2);
        acks.record(ack(1, 0));
        send(&mut c, 2);
        assert!(!c.open());
        // Importer 1 dies: the window reopens once, then shuts with nobody to receive.
        age(&acks, 1, PATIENCE);
        assert_eq!(c.in_flight(), 0);
        send(&mut c, 2);
        assert!(!c.open());
        // A new importer has received nothing, so it has no index to give: its hello counts
        // it from now, and the window opens.
        acks.record(hello(2));
        assert_eq!(c.in_flight(), 0);
        send(&mut c, 1);
        assert_eq!(c.in_flight(), 1);
        // A hello from a known importer only says it is alive.
        acks.record(hello(2));
        assert_eq!(c.in_flight(), 1);
    }

    #[test]
    fn what_an_idle_importers_link_lost_is_counted_lost_after_a_while() {
        let acks = Arc::new(Acks::default());
        let mut c = Credit::new(acks.clone(), 4);
        acks.record(ack(1, 0));
        send(&mut c, 4);
        acks.record(ack(1, 2));
        // Its link lost 3 and 4: it keeps saying its queue is empty at 2.
        acks.record(idle(1, 2));
        send(&mut c, 0);
        assert_eq!(c.in_flight(), 2, "maybe still on the way");
        acks.record(idle(1, 2));
        age(&acks, 1, LOST_AFTER);
        acks.record(idle(1, 2)); // still heard from
        assert_eq!(c.in_flight(), 0, "not coming: counted lost");
        // Idle at a moving index is not a loss.
        send(&mut c, 2);
        acks.record(idle(1, 5));
        age(&acks, 1, LOST_AFTER);
        acks.record(idle(1, 6));
        assert_eq!(c.in_flight(), 0);
        send(&mut c, 1);
        acks.record(idle(1, 6));
        assert_eq!(c.in_flight(), 1);
        // Caught up when it fell idle, then its link lost what came next (the common case: a
        // light stream): the record starts once something is outstanding.
        acks.record(idle(1, 7));
        send(&mut c, 2);
        acks.record(idle(1, 7));
        age(&acks, 1, LOST_AFTER);
        acks.record(idle(1, 7));
        assert_eq!(c.in_flight(), 0, "8 and 9 counted lost");
        // Counted lost above its report, it reports the same index again: only what was sent
        // since counts, after a while of its own.
        send(&mut c, 1);
        acks.record(idle(1, 7));
        assert_eq!(c.in_flight(), 1);
        // Busy (not idle) at one index for long is a paused consumer, not a loss.
        acks.record(ack(1, 6));
        age(&acks, 1, LOST_AFTER);
        acks.record(ack(1, 6));
        assert_eq!(c.in_flight(), 1);
    }

    #[test]
    fn a_full_table_makes_room_for_a_new_importer() {
        let acks = Arc::new(Acks::default());
        for id in 1..=MAX_IMPORTERS as u64 {
            acks.record(ack(id, 0));
        }
        age(&acks, 5, Duration::from_secs(1));
        acks.record(ack(1_000, 0));
        let st = acks.state();
        assert_eq!(st.importers.len(), MAX_IMPORTERS);
        assert!(st.importers.contains_key(&1_000) && !st.importers.contains_key(&5));
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
