//! Single-threaded tests of the protocol, and property tests against a `VecDeque` model.

use std::collections::VecDeque;

use proptest::prelude::*;

use super::atomic::Ordering;
use super::consumer::{give_up_retiring, retire_done};
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
    assert!(!a.leave(&ring, Leave::Free).wake);
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
    a.leave(&ring, Leave::Free);
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
                    core.leave(&ring, Leave::Free);
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
            c.leave(&ring, Leave::Free);
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

/// Reaps with consumer pid `dead` taken for dead and every other pid for alive.
fn reap_dead(ring: &Ring<'_>, dead: u32) -> Reaped {
    reap(ring, |pid, _| pid != dead, |_, _| {}, Recount::Yes).unwrap()
}

fn lease_state(ring: &Ring<'_>, entry: usize) -> u32 {
    lease::state(ring.consumers[entry].lease.load(Ordering::Relaxed))
}

/// A consumer that dies holding a slot: reaping it ungates the producer under both policies,
/// gives the slot back and leaves a live consumer's hold alone.
#[test]
fn reap_gives_back_a_dead_consumers_holds() {
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
        let r = reap_dead(&ring, 1);
        assert_eq!((r.dead, r.freed, r.slots), (1, 1, 1));
        assert_eq!(lease_state(&ring, dead.index()), lease::FREE);
        assert_eq!(ring.producer.reclaims.load(Ordering::Relaxed), 1);
        let (l1, _) = live.try_pin(&ring).unwrap().unwrap();
        assert_eq!(l1.seq, 1);
        assert_eq!(publish(&mut p, &ring, &mut payload), Ok(2));
        // The live consumer's hold of slot 1 survives a second reap.
        assert_eq!(reap_dead(&ring, 1), Reaped::default());
        assert_eq!(publish(&mut p, &ring, &mut payload), Err(ClaimError::Blocked(Blocked::Held)));
        live.release(&ring, l1.slot).unwrap();
        assert_eq!(publish(&mut p, &ring, &mut payload), Ok(3));
    }
}

/// Death at every step of pin and release: the recount from live records is right whether or
/// not the dead consumer's CAS happened.
#[test]
fn reap_handles_death_between_record_and_cas() {
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
        let r = reap_dead(&ring, 1);
        assert_eq!((r.freed, r.slots), (1, holds_it as u32), "{state} {cas_done}");
        assert_eq!(stamp::held(line.load(Ordering::Relaxed)), 0);
        assert_eq!(ring.hold(dead.index(), 0).load(Ordering::Relaxed), 0);
        assert_eq!(publish(&mut p, &ring, &mut payload), Ok(1));
    }
}

/// A live consumer caught between its record and its CAS makes the reclaim wait for it.
#[test]
fn reap_waits_for_a_live_consumer_mid_pin() {
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
    let r = reap_dead(&ring, 1);
    assert_eq!((r.dead, r.freed), (1, 0));
    // The dead entry no longer gates, but is not free yet.
    assert_eq!(lease_state(&ring, dead.index()), lease::RETIRING);
    ring.hold(live.index(), 0).store(record(0, super::hold::HELD), Ordering::Relaxed);
    let r = reap_dead(&ring, 1);
    assert_eq!((r.dead, r.freed, r.slots), (0, 1, 1));
    assert_eq!(stamp::held(ring.slots[0].stamp.load(Ordering::Relaxed)), 1);
    live.release(&ring, l.slot).unwrap();
    assert_eq!(publish(&mut p, &ring, &mut payload), Ok(1));
    let _ = d;
}

/// A joiner whose start time is not stored yet is judged by the pid in its lease: alive, it
/// keeps its entry; a reaper never takes "no start time" for "dead".
#[test]
fn reap_judges_an_unfinished_claim_by_its_pid() {
    let heap = HeapRing::new(1, 1, Policy::Block);
    let ring = heap.ring();
    let joining = ConsumerCore::claim(&ring, 7, 77).unwrap();
    // As if the reaper looked between the claim CAS and the start time store.
    ring.consumers[0].start_time.store(0, Ordering::Relaxed);
    let seen = std::cell::Cell::new(None);
    let r = reap(
        &ring,
        |pid, start| {
            seen.set(Some((pid, start)));
            pid == 7
        },
        |_, _| {},
        Recount::Yes,
    )
    .unwrap();
    assert_eq!(seen.get(), Some((7, None)));
    assert_eq!(r, Reaped::default());
    assert!(joining.activate(&ring, StartAt::Next).is_ok());
    assert_eq!(lease_state(&ring, 0), lease::ACTIVE);
}

/// A lease observed before its owner left and someone else joined is stale: reaping from it
/// must not touch the new owner, even if the old owner is dead by now.
#[test]
fn reap_acts_only_on_the_lease_it_observed() {
    let heap = HeapRing::new(1, 1, Policy::Block);
    let ring = heap.ring();
    let first = ConsumerCore::join(&ring, StartAt::Next, 3, 3).unwrap();
    let old = ring.consumers[0].lease.load(Ordering::Relaxed);
    // While a reaper probes pid 3, it leaves (and dies), and pid 2 joins the same entry.
    let reaper = reap(
        &ring,
        |pid, _| {
            if pid == 3 && lease_state(&ring, 0) == lease::ACTIVE {
                first.leave(&ring, Leave::Free);
                let _ = ConsumerCore::join(&ring, StartAt::Next, 2, 2).unwrap();
            }
            pid == 2
        },
        |_, _| {},
        Recount::Yes,
    )
    .unwrap();
    assert_eq!(reaper, Reaped::default());
    let now = ring.consumers[0].lease.load(Ordering::Relaxed);
    assert_ne!(now, old);
    assert_eq!((lease::state(now), lease::pid(now)), (lease::ACTIVE, 2));
}

/// A recount that finds more holders in the records than in the stamp (a damaged record or
/// stamp) leaves the slot READY, not frozen for ever, and is not fatal.
#[test]
fn a_recount_that_cannot_trust_the_count_unfreezes_the_slot() {
    use super::hold::{record, HELD};
    let heap = HeapRing::new(1, 3, Policy::Overwrite);
    let ring = heap.ring();
    let mut p = ProducerCore::new();
    let mut payload = [u64::MAX; 1];
    let dead = ConsumerCore::join(&ring, StartAt::Next, 1, 1).unwrap();
    let a = ConsumerCore::join(&ring, StartAt::Next, 2, 2).unwrap();
    let b = ConsumerCore::join(&ring, StartAt::Next, 2, 2).unwrap();
    publish(&mut p, &ring, &mut payload).unwrap();
    dead.try_pin(&ring).unwrap().unwrap();
    // Two live records say HELD(0), but the stamp counts only the dead one's hold.
    ring.hold(a.index(), 0).store(record(0, HELD), Ordering::Relaxed);
    ring.hold(b.index(), 0).store(record(0, HELD), Ordering::Relaxed);
    assert!(reap(&ring, |pid, _| pid != 1, |_, _| {}, Recount::Yes).is_ok());
    let st = ring.slots[0].stamp.load(Ordering::Relaxed);
    assert!(!stamp::is_writing(st), "the recount left slot 0 frozen");
    assert_eq!(stamp::held(st), 1);
}

/// Consumers that found a slot frozen by a recount may have gone to sleep: a reap that froze
/// one says to wake them, and bumps their futex word.
#[test]
fn a_reap_that_froze_a_slot_wakes_sleeping_consumers() {
    let heap = HeapRing::new(2, 2, Policy::Overwrite);
    let ring = heap.ring();
    let mut p = ProducerCore::new();
    let mut payload = [u64::MAX; 2];
    let dead = ConsumerCore::join(&ring, StartAt::Next, 1, 1).unwrap();
    publish(&mut p, &ring, &mut payload).unwrap();
    dead.try_pin(&ring).unwrap().unwrap();
    // A consumer sleeps on the consumer line.
    ring.consumer_wake.sleepers.fetch_add(1, Ordering::Relaxed);
    let word = ring.consumer_wake.word.load(Ordering::Relaxed);
    let r = reap_dead(&ring, 1);
    assert!(r.wake_consumers);
    assert_ne!(ring.consumer_wake.word.load(Ordering::Relaxed), word);
}

/// A consumer that leaks a read slot (never releases it) and then leaves gives it back: the
/// producer is not wedged.
#[test]
fn leaving_gives_back_leaked_slots() {
    for policy in [Policy::Block, Policy::Overwrite] {
        let heap = HeapRing::new(1, 1, policy);
        let ring = heap.ring();
        let mut p = ProducerCore::new();
        let mut payload = [u64::MAX; 1];
        let c = ConsumerCore::join(&ring, StartAt::Next, 1, 1).unwrap();
        publish(&mut p, &ring, &mut payload).unwrap();
        let _leaked = c.try_pin(&ring).unwrap().unwrap();
        assert_eq!(publish(&mut p, &ring, &mut payload), Err(ClaimError::Blocked(Blocked::Held)));
        let left = c.leave(&ring, Leave::Free);
        assert_eq!((left.released, left.retiring), (1, None));
        assert_eq!(lease_state(&ring, 0), lease::FREE);
        assert_eq!(publish(&mut p, &ring, &mut payload), Ok(1));
    }
}

/// An evicted consumer stops gating at once, learns it at its next receive, still owns (and
/// releases) what it holds, and its entry is freed once it lets go.
#[test]
fn an_evicted_consumer_stops_gating_and_learns_it() {
    let heap = HeapRing::new(2, 2, Policy::Block);
    let ring = heap.ring();
    let mut p = ProducerCore::new();
    let mut payload = [u64::MAX; 2];
    let bad = ConsumerCore::join(&ring, StartAt::Next, 1, 1).unwrap();
    let good = ConsumerCore::join(&ring, StartAt::Next, 2, 2).unwrap();
    publish(&mut p, &ring, &mut payload).unwrap();
    publish(&mut p, &ring, &mut payload).unwrap();
    let (m, _) = bad.try_pin(&ring).unwrap().unwrap();
    for _ in 0..2 {
        let (g, _) = good.try_pin(&ring).unwrap().unwrap();
        good.release(&ring, g.slot).unwrap();
    }
    // `bad` holds slot 0, which message 2 needs.
    assert_eq!(publish(&mut p, &ring, &mut payload), Err(ClaimError::Blocked(Blocked::Held)));
    let seen = ring.consumers[bad.index()].lease.load(Ordering::Relaxed);
    assert!(evict(&ring, bad.index(), seen, lease::evict_reason::RELEASE_EVENT));
    assert_eq!(ring.producer.evictions.load(Ordering::Relaxed), 1);
    p.forget_min_cursor();
    // Evicted, its hold of slot 0 still counts.
    assert_eq!(publish(&mut p, &ring, &mut payload), Err(ClaimError::Blocked(Blocked::Held)));
    let expect = RingCorrupt::Evicted {
        entry: bad.index() as u32,
        reason: lease::evict_reason::RELEASE_EVENT,
    };
    assert_eq!(bad.try_pin(&ring), Err(expect));
    // Its release still counts down; then message 3 overwrites message 1, which `bad` (at
    // cursor 1) has not read: it no longer gates the producer.
    bad.release(&ring, m.slot).unwrap();
    assert_eq!(publish(&mut p, &ring, &mut payload), Ok(2));
    let (g, _) = good.try_pin(&ring).unwrap().unwrap();
    good.release(&ring, g.slot).unwrap();
    assert_eq!(publish(&mut p, &ring, &mut payload), Ok(3));
    // While it lives its entry stays EVICTED; once it lets go, the producer frees it.
    assert_eq!(reap(&ring, |_, _| true, |_, _| {}, Recount::Yes).unwrap().freed, 0);
    let left = bad.leave(&ring, Leave::Free);
    assert!(left.retiring.is_some());
    let freed = std::cell::Cell::new(None);
    let r = reap(&ring, |_, _| true, |e, g| freed.set(Some((e, g))), Recount::Yes).unwrap();
    assert_eq!(r.freed, 1);
    assert_eq!(freed.get(), Some((bad.index(), bad.generation())));
    assert_eq!(lease_state(&ring, bad.index()), lease::FREE);
}

/// Eviction lands while the evicted consumer is releasing a message that another consumer
/// holds too: the count must come down by exactly that one release, never by a recount and
/// the release both (the slot would be overwritten under the other reader).
#[test]
fn eviction_and_a_release_in_flight_take_one_hold_away_not_two() {
    let heap = HeapRing::new(1, 2, Policy::Overwrite);
    let ring = heap.ring();
    let mut p = ProducerCore::new();
    let mut payload = [u64::MAX; 1];
    let evicted = ConsumerCore::join(&ring, StartAt::Next, 1, 1).unwrap();
    let reader = ConsumerCore::join(&ring, StartAt::Next, 2, 2).unwrap();
    publish(&mut p, &ring, &mut payload).unwrap();
    let (e, _) = evicted.try_pin(&ring).unwrap().unwrap();
    let (r, _) = reader.try_pin(&ring).unwrap().unwrap();
    let seen = ring.consumers[evicted.index()].lease.load(Ordering::Relaxed);
    assert!(evict(&ring, evicted.index(), seen, lease::evict_reason::RELEASE_EVENT));
    // Reaps and audits while the evicted one lives, then its release (in flight since before
    // the eviction) lands.
    reap(&ring, |_, _| true, |_, _| {}, Recount::Yes).unwrap();
    audit(&ring, 0).unwrap();
    evicted.release(&ring, e.slot).unwrap();
    reap(&ring, |_, _| true, |_, _| {}, Recount::Yes).unwrap();
    assert_eq!(stamp::held(ring.slots[0].stamp.load(Ordering::Relaxed)), 1);
    assert_eq!(publish(&mut p, &ring, &mut payload), Err(ClaimError::Blocked(Blocked::Held)));
    reader.release(&ring, r.slot).unwrap();
    assert_eq!(publish(&mut p, &ring, &mut payload), Ok(1));
}

/// A slot frozen by a recount is told apart from one the producer writes: a consumer that
/// finds the ring closed must not take its next message, published but frozen (held or not:
/// a producer killed mid-recount after every holder released leaves `WRITING` with held 0),
/// for "nothing left". Thawing takes a freeze away and leaves a producer's claim alone.
#[test]
fn a_frozen_slot_is_not_an_empty_one() {
    let heap = HeapRing::new(1, 2, Policy::Overwrite);
    let ring = heap.ring();
    let mut p = ProducerCore::new();
    let mut payload = [u64::MAX; 1];
    let late = ConsumerCore::join(&ring, StartAt::Next, 2, 2).unwrap();
    publish(&mut p, &ring, &mut payload).unwrap();
    let line = &ring.slots[0].stamp;
    for held in [1, 0] {
        // Frozen by a recount, as one in progress (or killed) leaves it.
        line.store(stamp::ready(0, held) | stamp::WRITING, Ordering::Relaxed);
        assert_eq!(late.try_pin(&ring), Ok(None));
        assert!(late.next_is_there(&ring), "held {held}");
        thaw(&ring, late.next_seq());
        assert!(!stamp::is_writing(line.load(Ordering::Relaxed)));
    }
    let (m, _) = late.try_pin(&ring).unwrap().unwrap();
    assert_eq!(m.seq, 0);
    late.release(&ring, m.slot).unwrap();
    // Nothing published past the cursor: not there.
    assert!(!late.next_is_there(&ring));
    // A producer's own claim of the next message is not a freeze, and thawing leaves it alone.
    p.try_claim(&ring).unwrap();
    assert!(stamp::is_writing(line.load(Ordering::Relaxed)));
    assert!(!late.next_is_there(&ring));
    thaw(&ring, late.next_seq());
    assert!(stamp::is_writing(line.load(Ordering::Relaxed)));
}

/// A retiring consumer's entry is freed only after the producer dropped what it opened of it
/// (`on_free`), and the owner can tell when; or it can give up and free it itself.
#[test]
fn retiring_waits_for_the_producer() {
    let heap = HeapRing::new(1, 2, Policy::Block);
    let ring = heap.ring();
    let a = ConsumerCore::join(&ring, StartAt::Next, 1, 1).unwrap();
    let b = ConsumerCore::join(&ring, StartAt::Next, 2, 2).unwrap();
    let retiring_a = a.leave(&ring, Leave::Retire).retiring.unwrap();
    let retiring_b = b.leave(&ring, Leave::Retire).retiring.unwrap();
    assert_eq!(ring.producer.retires.load(Ordering::Relaxed), 2);
    assert!(!retire_done(&ring, a.index(), retiring_a));
    assert!(give_up_retiring(&ring, b.index(), retiring_b));
    assert!(retire_done(&ring, b.index(), retiring_b));
    let freed = std::cell::RefCell::new(Vec::new());
    let r = reap(&ring, |_, _| true, |e, _| freed.borrow_mut().push(e), Recount::Yes).unwrap();
    assert_eq!((r.dead, r.freed), (0, 1));
    assert_eq!(*freed.borrow(), vec![a.index()]);
    assert!(retire_done(&ring, a.index(), retiring_a));
}
