//! Single-threaded tests of the protocol, and property tests against a `VecDeque` model.

use std::collections::VecDeque;

use proptest::prelude::*;

use super::atomic::Ordering;
use super::producer::{Blocked, ClaimError};
use super::*;

fn publish(p: &mut ProducerCore, ring: &Ring<'_>, payload: &mut [u64]) -> Result<u64, ClaimError> {
    let slot = p.try_claim(ring)?;
    let seq = p.next_seq();
    payload[slot] = seq;
    Ok(p.publish(ring, seq * 10, seq).0)
}

#[test]
fn block_gates_on_slowest_consumer() {
    let heap = HeapRing::new(4, 2, Policy::Block);
    let ring = heap.ring();
    let mut p = ProducerCore::new();
    let mut payload = [u64::MAX; 4];
    let a = ConsumerCore::join(&ring, StartAt::Next, 1, 1).unwrap();
    for s in 0..4 {
        assert_eq!(publish(&mut p, &ring, &mut payload), Ok(s));
    }
    assert_eq!(publish(&mut p, &ring, &mut payload), Err(ClaimError::Blocked(Blocked::Consumers)));
    let (m, _) = a.try_pin(&ring).unwrap().unwrap();
    assert_eq!((m.seq, m.len, m.lag), (0, 0, 0));
    // Received but still held: the slot is not free.
    assert_eq!(publish(&mut p, &ring, &mut payload), Err(ClaimError::Blocked(Blocked::Held)));
    a.release(&ring, m.slot).unwrap();
    assert_eq!(publish(&mut p, &ring, &mut payload), Ok(4));
    // Leaving ungates the producer.
    assert!(!a.leave(&ring));
    for s in 5..20 {
        assert_eq!(publish(&mut p, &ring, &mut payload), Ok(s));
    }
}

#[test]
fn overwrite_reports_lag_and_spares_held_slots() {
    let heap = HeapRing::new(4, 2, Policy::Overwrite);
    let ring = heap.ring();
    let mut p = ProducerCore::new();
    let mut payload = [u64::MAX; 4];
    let a = ConsumerCore::join(&ring, StartAt::Next, 1, 1).unwrap();
    publish(&mut p, &ring, &mut payload).unwrap();
    let (held, _) = a.try_pin(&ring).unwrap().unwrap();
    assert_eq!(held.seq, 0);
    for s in 1..4 {
        assert_eq!(publish(&mut p, &ring, &mut payload), Ok(s));
    }
    // Slot 0 is held: no overwrite.
    assert_eq!(publish(&mut p, &ring, &mut payload), Err(ClaimError::Blocked(Blocked::Held)));
    a.release(&ring, held.slot).unwrap();
    for s in 4..11 {
        assert_eq!(publish(&mut p, &ring, &mut payload), Ok(s));
    }
    // Head is 11; 7..=10 remain. The consumer was at 1.
    let (m, _) = a.try_pin(&ring).unwrap().unwrap();
    assert_eq!((m.seq, m.lag), (7, 6));
    assert_eq!(payload[m.slot], 7);
}

#[test]
fn start_positions() {
    let heap = HeapRing::new(4, 4, Policy::Overwrite);
    let ring = heap.ring();
    let mut p = ProducerCore::new();
    let mut payload = [0; 4];
    for _ in 0..6 {
        publish(&mut p, &ring, &mut payload).unwrap();
    }
    let newest = ConsumerCore::join(&ring, StartAt::Newest, 1, 1).unwrap();
    let next = ConsumerCore::join(&ring, StartAt::Next, 1, 1).unwrap();
    let oldest = ConsumerCore::join(&ring, StartAt::Oldest, 1, 1).unwrap();
    assert_eq!(newest.try_pin(&ring).unwrap().unwrap().0.seq, 5);
    assert_eq!(next.try_pin(&ring).unwrap(), None);
    assert_eq!(oldest.try_pin(&ring).unwrap().unwrap().0.seq, 2);
}

#[test]
fn table_full() {
    let heap = HeapRing::new(2, 1, Policy::Block);
    let ring = heap.ring();
    let a = ConsumerCore::join(&ring, StartAt::Next, 1, 1).unwrap();
    assert_eq!(ConsumerCore::join(&ring, StartAt::Next, 1, 1).unwrap_err(), JoinError::Full);
    a.leave(&ring);
    assert!(ConsumerCore::join(&ring, StartAt::Next, 1, 1).is_ok());
}

#[test]
fn corrupt_stamps_are_reported() {
    let heap = HeapRing::new(2, 2, Policy::Overwrite);
    let ring = heap.ring();
    let mut p = ProducerCore::new();
    let c = ConsumerCore::join(&ring, StartAt::Next, 1, 1).unwrap();
    // A held count larger than the table.
    ring.slots[0].stamp.store(stamp::ready(0, 9), atomic::Ordering::Relaxed);
    assert!(matches!(c.try_pin(&ring), Err(RingCorrupt::HeldCount { slot: 0, held: 9 })));
    // A tag the producer never wrote there.
    ring.slots[0].stamp.store(stamp::ready(77, 0), atomic::Ordering::Relaxed);
    assert_eq!(p.try_claim(&ring), Err(ClaimError::Corrupt(RingCorrupt::SlotTag { slot: 0 })));
    // Releasing a slot no one holds.
    ring.slots[1].stamp.store(stamp::ready(1, 0), atomic::Ordering::Relaxed);
    assert_eq!(c.release(&ring, 1), Err(RingCorrupt::ReleaseUnderflow { slot: 1 }));
    assert_eq!(ring.slots[1].stamp.load(atomic::Ordering::Relaxed), stamp::ready(1, 0));
}

#[test]
fn sleepers_are_woken() {
    let heap = HeapRing::new(2, 1, Policy::Block);
    let ring = heap.ring();
    let mut p = ProducerCore::new();
    ring.consumer_wake.sleepers.store(1, atomic::Ordering::Relaxed);
    let w0 = ring.consumer_wake.word.load(atomic::Ordering::Relaxed);
    p.try_claim(&ring).unwrap();
    assert!(p.publish(&ring, 0, 0).1);
    assert_eq!(ring.consumer_wake.word.load(atomic::Ordering::Relaxed), w0 + 1);
}

// ---- Model-based property test -------------------------------------------------------------

#[derive(Clone, Debug)]
enum Op {
    Publish,
    Recv(usize),
    Release(usize, usize),
    Join(usize, u8),
    Leave(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => Just(Op::Publish),
        4 => (0..3usize).prop_map(Op::Recv),
        3 => (0..3usize, 0..4usize).prop_map(|(c, i)| Op::Release(c, i)),
        1 => (0..3usize, 0..3u8).prop_map(|(c, s)| Op::Join(c, s)),
        1 => (0..3usize).prop_map(Op::Leave),
    ]
}

/// The model: the retained messages as a `VecDeque` of sequence numbers, and per consumer a
/// cursor and the messages it holds.
struct Model {
    cap: u64,
    retained: VecDeque<u64>,
    head: u64,
    consumers: Vec<Option<ModelConsumer>>,
}

struct ModelConsumer {
    cursor: u64,
    held: Vec<u64>,
}

impl Model {
    fn held_by_anyone(&self, seq: u64) -> bool {
        self.consumers.iter().flatten().any(|c| c.held.contains(&seq))
    }

    /// What a publish should do: Ok(seq) or which wait.
    fn publish(&mut self, policy: Policy) -> Result<u64, Blocked> {
        let s = self.head;
        if s >= self.cap {
            let prev = s - self.cap;
            if policy == Policy::Block && self.consumers.iter().flatten().any(|c| c.cursor <= prev)
            {
                return Err(Blocked::Consumers);
            }
            if self.held_by_anyone(prev) {
                return Err(Blocked::Held);
            }
            self.retained.pop_front();
        }
        self.retained.push_back(s);
        self.head += 1;
        Ok(s)
    }

    /// What a receive should give: Some((seq, lag)).
    fn recv(&mut self, k: usize) -> Option<(u64, u64)> {
        let oldest = self.retained.front().copied().unwrap_or(0);
        let c = self.consumers[k].as_mut().unwrap();
        let mut lag = 0;
        if c.cursor < oldest {
            lag = oldest - c.cursor;
            c.cursor = oldest;
        }
        if c.cursor >= self.head {
            return None;
        }
        let seq = c.cursor;
        c.cursor += 1;
        c.held.push(seq);
        Some((seq, lag))
    }
}

fn run_model(policy: Policy, cap: u32, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let heap = HeapRing::new(cap, 3, policy);
    let ring = heap.ring();
    let mut p = ProducerCore::new();
    let mut payload = vec![u64::MAX; cap as usize];
    let mut real: Vec<Option<(ConsumerCore, Vec<Pinned>)>> = vec![None, None, None];
    let mut model = Model {
        cap: cap as u64,
        retained: VecDeque::new(),
        head: 0,
        consumers: vec![None, None, None],
    };
    for op in ops {
        match op {
            Op::Publish => {
                let want = model.publish(policy);
                let got = publish(&mut p, &ring, &mut payload);
                prop_assert_eq!(got, want.map_err(ClaimError::Blocked));
            }
            Op::Recv(k) => {
                let Some((core, pins)) = real[k].as_mut() else {
                    continue;
                };
                let want = model.recv(k);
                let got = core.try_pin(&ring).unwrap().map(|(m, _)| m);
                match (got, want) {
                    (None, None) => {}
                    (Some(m), Some((seq, lag))) => {
                        prop_assert_eq!(m.seq, seq);
                        prop_assert_eq!(m.lag, lag);
                        prop_assert_eq!(payload[m.slot], seq, "pinned a slot with other data");
                        prop_assert_eq!(m.len, seq * 10);
                        if policy == Policy::Block {
                            prop_assert_eq!(m.lag, 0, "Block lost a message");
                        }
                        pins.push(m);
                    }
                    (got, want) => prop_assert!(false, "got {:?}, model {:?}", got, want),
                }
            }
            Op::Release(k, i) => {
                let Some((core, pins)) = real[k].as_mut() else {
                    continue;
                };
                if pins.is_empty() {
                    continue;
                }
                let m = pins.remove(i % pins.len());
                prop_assert_eq!(payload[m.slot], m.seq, "held slot was overwritten");
                core.release(&ring, m.slot).unwrap();
                let mc = model.consumers[k].as_mut().unwrap();
                mc.held.retain(|&s| s != m.seq);
            }
            Op::Join(k, start) => {
                if real[k].is_some() {
                    continue;
                }
                let start = [StartAt::Next, StartAt::Newest, StartAt::Oldest][start as usize];
                let core = ConsumerCore::join(&ring, start, 1, 1).unwrap();
                let mut cursor = match start {
                    StartAt::Next => model.head,
                    StartAt::Newest => model.head.saturating_sub(1),
                    StartAt::Oldest => model.retained.front().copied().unwrap_or(model.head),
                };
                if policy == Policy::Block {
                    cursor = cursor.max((model.head + 1).saturating_sub(model.cap));
                }
                prop_assert_eq!(core.cursor(), cursor);
                model.consumers[k] = Some(ModelConsumer { cursor, held: vec![] });
                real[k] = Some((core, vec![]));
            }
            Op::Leave(k) => {
                if real[k].as_ref().is_some_and(|(_, pins)| pins.is_empty()) {
                    let (core, _) = real[k].take().unwrap();
                    core.leave(&ring);
                    model.consumers[k] = None;
                }
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn block_matches_model(cap in 1u32..6, ops in proptest::collection::vec(op(), 1..200)) {
        run_model(Policy::Block, cap, ops)?;
    }

    #[test]
    fn overwrite_matches_model(cap in 1u32..6, ops in proptest::collection::vec(op(), 1..200)) {
        run_model(Policy::Overwrite, cap, ops)?;
    }
}

#[test]
fn hostile_head_does_not_panic() {
    for policy in [Policy::Block, Policy::Overwrite] {
        let heap = HeapRing::new(2, 2, policy);
        let ring = heap.ring();
        ring.producer.head.store(u64::MAX, atomic::Ordering::Relaxed);
        for start in [StartAt::Newest, StartAt::Next, StartAt::Oldest] {
            let c = ConsumerCore::join(&ring, start, 1, 1).unwrap();
            // Whatever the cursor became, pinning must not panic (overflow checks are on here).
            for _ in 0..4 {
                if let Ok(Some((m, _))) = c.try_pin(&ring) {
                    let _ = c.release(&ring, m.slot);
                }
            }
            c.leave(&ring);
        }
        // A consumer at 0 whose slot shows a newer message takes the lag path with head MAX.
        ring.producer.head.store(0, atomic::Ordering::Relaxed);
        let c = ConsumerCore::join(&ring, StartAt::Next, 1, 1).unwrap();
        ring.slots[0].stamp.store(stamp::ready(5, 0), atomic::Ordering::Relaxed);
        ring.producer.head.store(u64::MAX, atomic::Ordering::Relaxed);
        for _ in 0..4 {
            let _ = c.try_pin(&ring);
        }
    }
}

#[test]
fn joining_entries_do_not_gate_and_can_be_abandoned() {
    let heap = HeapRing::new(2, 1, Policy::Block);
    let ring = heap.ring();
    let mut p = ProducerCore::new();
    let mut payload = [0; 2];
    let joining = ConsumerCore::claim(&ring, 1, 1).unwrap();
    assert_eq!(joining.index(), 0);
    // Claimed but not active: the table is full, yet the producer is not gated.
    assert_eq!(ConsumerCore::join(&ring, StartAt::Next, 1, 1).unwrap_err(), JoinError::Full);
    for s in 0..5 {
        assert_eq!(publish(&mut p, &ring, &mut payload), Ok(s));
    }
    joining.abandon(&ring);
    let c = ConsumerCore::join(&ring, StartAt::Next, 1, 1).unwrap();
    assert_eq!(c.cursor(), 5);
}

/// A consumer that dies holding a slot: reclaiming it ungates the producer under both
/// policies, gives the slot back and leaves a live consumer's hold alone.
#[test]
fn reclaim_gives_back_a_dead_consumers_holds() {
    for policy in [Policy::Block, Policy::Overwrite] {
        let heap = HeapRing::new(2, 3, policy);
        let ring = heap.ring();
        let mut p = ProducerCore::new();
        let mut payload = [u64::MAX; 2];
        let dead = ConsumerCore::join(&ring, StartAt::Next, 1, 1).unwrap();
        let live = ConsumerCore::join(&ring, StartAt::Next, 2, 2).unwrap();
        publish(&mut p, &ring, &mut payload).unwrap();
        publish(&mut p, &ring, &mut payload).unwrap();
        let (d0, _) = dead.try_pin(&ring).unwrap().unwrap();
        let (l0, _) = live.try_pin(&ring).unwrap().unwrap();
        assert_eq!((d0.slot, l0.slot), (0, 0));
        assert_eq!(stamp::held(ring.slots[0].stamp.load(Ordering::Relaxed)), 2);
        live.release(&ring, l0.slot).unwrap();
        // `dead` dies holding slot 0 (and at cursor 1): the producer is stuck.
        assert!(publish(&mut p, &ring, &mut payload).is_err());
        assert_eq!(reclaim(&ring, dead.index()), Ok(Reclaim::Done { slots: 1 }));
        assert_eq!(ring.consumers[dead.index()].state.load(Ordering::Relaxed), 0);
        let (l1, _) = live.try_pin(&ring).unwrap().unwrap();
        assert_eq!(l1.seq, 1);
        assert_eq!(publish(&mut p, &ring, &mut payload), Ok(2));
        // The live consumer's hold of slot 1 survives a second (idempotent) reclaim.
        assert_eq!(reclaim(&ring, dead.index()), Ok(Reclaim::Done { slots: 0 }));
        assert_eq!(publish(&mut p, &ring, &mut payload), Err(ClaimError::Blocked(Blocked::Held)));
        live.release(&ring, l1.slot).unwrap();
        assert_eq!(publish(&mut p, &ring, &mut payload), Ok(3));
    }
}

/// Death at every step of pin and release: the recount from live records is right whether or
/// not the dead consumer's CAS happened.
#[test]
fn reclaim_handles_death_between_record_and_cas() {
    use super::hold::{record, HELD, PINNING, RELEASING};
    // (record the dead one leaves, whether its CAS on the stamp happened)
    let cases = [(PINNING, false), (PINNING, true), (HELD, true), (RELEASING, true)];
    for (state, cas_done) in cases {
        let heap = HeapRing::new(1, 2, Policy::Overwrite);
        let ring = heap.ring();
        let mut p = ProducerCore::new();
        let mut payload = [u64::MAX; 1];
        let dead = ConsumerCore::join(&ring, StartAt::Next, 1, 1).unwrap();
        publish(&mut p, &ring, &mut payload).unwrap();
        let line = &ring.slots[0].stamp;
        let st = line.load(Ordering::Relaxed);
        // Forge the dead consumer's last steps by hand.
        ring.hold(dead.index(), 0).store(record(0, state), Ordering::Relaxed);
        let holds_it = cas_done && state != RELEASING;
        if holds_it {
            line.store(st + 1, Ordering::Relaxed);
        }
        assert_eq!(
            reclaim(&ring, dead.index()),
            Ok(Reclaim::Done { slots: holds_it as u32 }),
            "{state} {cas_done}"
        );
        assert_eq!(stamp::held(line.load(Ordering::Relaxed)), 0);
        assert_eq!(ring.hold(dead.index(), 0).load(Ordering::Relaxed), 0);
        assert_eq!(publish(&mut p, &ring, &mut payload), Ok(1));
    }
}

/// A live consumer caught between its record and its CAS makes the reclaim wait for it.
#[test]
fn reclaim_waits_for_a_live_consumer_mid_pin() {
    use super::hold::{record, PINNING};
    let heap = HeapRing::new(1, 2, Policy::Overwrite);
    let ring = heap.ring();
    let mut p = ProducerCore::new();
    let mut payload = [u64::MAX; 1];
    let dead = ConsumerCore::join(&ring, StartAt::Next, 1, 1).unwrap();
    let live = ConsumerCore::join(&ring, StartAt::Next, 2, 2).unwrap();
    publish(&mut p, &ring, &mut payload).unwrap();
    let (d, _) = dead.try_pin(&ring).unwrap().unwrap();
    // `live` has CASed but not yet written HELD: its record still says PINNING.
    let (l, _) = live.try_pin(&ring).unwrap().unwrap();
    ring.hold(live.index(), 0).store(record(0, PINNING), Ordering::Relaxed);
    assert_eq!(reclaim(&ring, dead.index()), Ok(Reclaim::Incomplete));
    // The dead entry no longer gates, but is not free yet.
    assert_eq!(ring.consumers[dead.index()].state.load(Ordering::Relaxed), 3);
    ring.hold(live.index(), 0).store(record(0, super::hold::HELD), Ordering::Relaxed);
    assert_eq!(reclaim(&ring, dead.index()), Ok(Reclaim::Done { slots: 1 }));
    assert_eq!(stamp::held(ring.slots[0].stamp.load(Ordering::Relaxed)), 1);
    live.release(&ring, l.slot).unwrap();
    assert_eq!(publish(&mut p, &ring, &mut payload), Ok(1));
    let _ = d;
}
