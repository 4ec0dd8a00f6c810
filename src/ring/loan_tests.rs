//! Loans (`ProducerCore::try_lend`, `try_adopt`, `give_back`, `end_kept`): single-threaded
//! tests, and a property test that mixes them with claims, pins and releases.
//!
//! As in `tests`, a payload array has one word per buffer, written with the message's sequence
//! number when the buffer is written: a message whose buffer was overwritten under a reader
//! shows another number there.

use proptest::prelude::*;

use super::atomic::Ordering;
use super::producer::{Blocked, ClaimError};
use super::*;

/// Joins in `mode` as process `pid`.
fn join(ring: &Ring<'_>, mode: Mode, pid: u32) -> ConsumerCore {
    ConsumerCore::join(ring, StartAt::Next, mode, pid, pid as u64).unwrap()
}

/// Claims the next message's buffer, writes its payload and publishes it: (seq, buffer).
fn publish(p: &mut ProducerCore, ring: &Ring<'_>, payload: &mut [u64]) -> (u64, usize) {
    let claimed = p.try_claim(ring).expect("a free buffer");
    let seq = p.next_seq();
    payload[claimed.buffer] = seq;
    assert_eq!(p.publish(ring, seq, seq).0, seq);
    (seq, claimed.buffer)
}

/// Publishes lent buffer `buffer` as the next message (its payload written then, as a
/// borrower that knows the order would): its sequence number.
fn publish_loan(p: &mut ProducerCore, ring: &Ring<'_>, payload: &mut [u64], buffer: usize) -> u64 {
    p.try_adopt(ring, buffer).expect("the gate open");
    let seq = p.next_seq();
    payload[buffer] = seq;
    assert_eq!(p.publish(ring, seq, seq).0, seq);
    seq
}

/// Pins the next message, which must be there, and checks its payload.
fn pin(c: &ConsumerCore, ring: &Ring<'_>, payload: &[u64]) -> Pinned {
    let m = c.try_pin(ring).unwrap().expect("a message to pin").0;
    assert_eq!(payload[m.buffer], m.seq, "message {} in buffer {}", m.seq, m.buffer);
    m
}

#[test]
fn loans_are_numbered_when_published_and_kept_until_ended() {
    let heap = HeapRing::new(2, 2, 1, Policy::Overwrite);
    let ring = heap.ring();
    let mut p = ProducerCore::new(&ring);
    let mut payload = [u64::MAX; 4];
    let c = join(&ring, Mode::Queue, 1);
    let a = p.try_lend(&ring).unwrap().buffer;
    let b = p.try_lend(&ring).unwrap().buffer;
    assert_eq!((a, b), (2, 3), "only spares are lent");
    assert_eq!(p.try_lend(&ring), Err(ClaimError::Blocked(Blocked::Held)));
    p.check_invariants(&ring);
    // A claim beside the loans takes the position's own buffer.
    assert_eq!(publish(&mut p, &ring, &mut payload), (0, 0));
    assert_eq!(publish_loan(&mut p, &ring, &mut payload, b), 1);
    assert_eq!(publish_loan(&mut p, &ring, &mut payload, a), 2);
    p.check_invariants(&ring);
    assert!(p.is_kept(a) && p.is_kept(b));
    // Buffers 0 and 1 (the positions' old ones) are spares now; message 0 is gone from the
    // ring (position 0 names message 2), so the consumer starts at 1.
    for (seq, buffer) in [(1, b), (2, a)] {
        let m = pin(&c, &ring, &payload);
        assert_eq!((m.seq, m.buffer), (seq, buffer));
        c.release(&ring, m.buffer).unwrap();
    }
    // Laps: the kept buffers are never taken, whoever holds them.
    for _ in 0..6 {
        let (_, buffer) = publish(&mut p, &ring, &mut payload);
        assert!(buffer != a && buffer != b, "a kept buffer was taken");
        let m = pin(&c, &ring, &payload);
        c.release(&ring, m.buffer).unwrap();
    }
    assert_eq!((payload[a], payload[b]), (2, 1), "the borrower still reads its messages");
    p.end_kept(a);
    p.end_kept(b);
    p.check_invariants(&ring);
    // The laps swapped them out of the positions: they are the spares, lent again.
    let mut again = [p.try_lend(&ring).unwrap().buffer, p.try_lend(&ring).unwrap().buffer];
    again.sort();
    assert_eq!(again, [a, b], "ended loans come back");
    p.check_invariants(&ring);
}

#[test]
fn a_loan_published_under_block_waits_for_the_lossless_gate() {
    let heap = HeapRing::new(1, 1, 1, Policy::Block);
    let ring = heap.ring();
    let mut p = ProducerCore::new(&ring);
    let mut payload = [u64::MAX; 2];
    let c = join(&ring, Mode::Lossless, 1);
    assert_eq!(publish(&mut p, &ring, &mut payload), (0, 0));
    let l = p.try_lend(&ring).unwrap().buffer;
    assert_eq!(p.try_adopt(&ring, l), Err(ClaimError::Blocked(Blocked::Consumers)));
    assert!(p.is_lent(l), "a refused adoption leaves the loan as it was");
    p.check_invariants(&ring);
    let m = pin(&c, &ring, &payload);
    assert_eq!(m.seq, 0);
    assert_eq!(publish_loan(&mut p, &ring, &mut payload, l), 1);
    c.release(&ring, m.buffer).unwrap();
    let m = pin(&c, &ring, &payload);
    assert_eq!((m.seq, m.buffer, m.lag), (1, l, 0));
}

#[test]
fn a_loan_given_back_unwritten_keeps_its_message_and_a_written_one_does_not() {
    let heap = HeapRing::new(1, 1, 2, Policy::Overwrite);
    let ring = heap.ring();
    let mut p = ProducerCore::new(&ring);
    let mut payload = [u64::MAX; 2];
    let c = join(&ring, Mode::Queue, 1);
    assert_eq!(publish(&mut p, &ring, &mut payload), (0, 0));
    let m0 = pin(&c, &ring, &payload);
    // Message 1 swaps the spare in for the held buffer 0, which becomes the spare.
    assert_eq!(publish(&mut p, &ring, &mut payload), (1, 1));
    c.release(&ring, m0.buffer).unwrap();
    let l = p.try_lend(&ring).unwrap();
    assert_eq!((l.buffer, l.prev), (0, Some(0)), "the readers of message 0 are to wait for");
    p.give_back(&ring, 0, false);
    assert_eq!(ring.buffers[0].stamp.load(Ordering::Relaxed), stamp::ready(0, 0));
    p.check_invariants(&ring);
    let l = p.try_lend(&ring).unwrap();
    assert_eq!((l.buffer, l.prev), (0, Some(0)), "and still are after an unwritten loan");
    p.give_back(&ring, 0, true);
    assert_eq!(ring.buffers[0].stamp.load(Ordering::Relaxed), stamp::ready(2, 0));
    p.check_invariants(&ring);
    // Its readers were waited for before it was lent: the next claim need not.
    assert_eq!(publish(&mut p, &ring, &mut payload), (2, 1));
    let claimed = p.try_claim(&ring).unwrap();
    assert_eq!((claimed.buffer, claimed.prev), (1, Some(2)));
}

/// A claim in progress swapped a spare in for the held buffer of message 0; once released,
/// that buffer is lent. A consumer that had not taken message 0 finds it gone (the claim's
/// gate let go of it), and takes message 1 with a lag of one.
#[test]
fn a_lapped_buffer_lent_during_a_claim_reads_as_lost() {
    let heap = HeapRing::new(1, 2, 2, Policy::Overwrite);
    let ring = heap.ring();
    let mut p = ProducerCore::new(&ring);
    let mut payload = [u64::MAX; 3];
    let holder = join(&ring, Mode::Queue, 1);
    let late = join(&ring, Mode::Queue, 2);
    assert_eq!(publish(&mut p, &ring, &mut payload), (0, 0));
    let m0 = pin(&holder, &ring, &payload);
    let claimed = p.try_claim(&ring).unwrap();
    assert_ne!(claimed.buffer, 0, "the held buffer was claimed");
    holder.release(&ring, m0.buffer).unwrap();
    // Spares: buffer 2 (or 1) and buffer 0, now free; lend until buffer 0 is out.
    let mut lent = vec![p.try_lend(&ring).unwrap().buffer];
    if lent[0] != 0 {
        lent.push(p.try_lend(&ring).unwrap().buffer);
    }
    assert!(lent.contains(&0));
    p.check_invariants(&ring);
    assert!(late.try_pin(&ring).unwrap().is_none(), "message 0 is gone, 1 not yet there");
    payload[claimed.buffer] = 1;
    p.publish(&ring, 1, 1);
    let m = pin(&late, &ring, &payload);
    assert_eq!((m.seq, m.lag), (1, 1));
}

/// One step of the property test.
#[derive(Clone, Debug)]
enum Op {
    /// Claim and publish the next message.
    Publish,
    /// Lend a spare.
    Lend,
    /// Publish the loan at this index (mod the loans out), if any.
    PublishLoan(usize),
    /// The borrower of the loan at this index writes it.
    Write(usize),
    /// Give back the loan at this index unpublished (as written if it was).
    GiveBack(usize),
    /// End the kept loan at this index.
    EndKept(usize),
    /// Consumer k pins its next message.
    Pin(usize),
    /// Consumer k releases the oldest message it holds.
    Release(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => Just(Op::Publish),
        2 => Just(Op::Lend),
        2 => any::<usize>().prop_map(Op::PublishLoan),
        2 => any::<usize>().prop_map(Op::Write),
        1 => any::<usize>().prop_map(Op::GiveBack),
        2 => any::<usize>().prop_map(Op::EndKept),
        4 => (0..2usize).prop_map(Op::Pin),
        3 => (0..2usize).prop_map(Op::Release),
    ]
}

/// Runs `ops` on a ring of `cap` positions and `spares` spares with a consumer of each mode
/// in `modes`: every message a consumer pins carries its payload, and keeps it while held; a
/// kept buffer keeps its message until its loan ends; every consumer's received + lost is its
/// cursor's movement; the producer's invariants hold after every step.
fn run(policy: Policy, modes: [Mode; 2], cap: u32, spares: u32, ops: Vec<Op>) {
    let heap = HeapRing::new(cap, spares, 2, policy);
    let ring = heap.ring();
    let mut p = ProducerCore::new(&ring);
    let mut payload = vec![u64::MAX; (cap + spares) as usize];
    let consumers: Vec<ConsumerCore> =
        modes.iter().enumerate().map(|(k, &m)| join(&ring, m, k as u32 + 1)).collect();
    let mut held: Vec<Vec<Pinned>> = vec![Vec::new(), Vec::new()];
    // Lent buffers, and whether their borrower wrote them.
    let mut lent: Vec<(usize, bool)> = Vec::new();
    let mut kept: Vec<(usize, u64)> = Vec::new();
    let mut tally = [(0u64, 0u64); 2];
    for op in ops {
        match op {
            Op::Publish => {
                if let Ok(claimed) = p.try_claim(&ring) {
                    assert!(lent.iter().all(|l| l.0 != claimed.buffer), "a lent one was claimed");
                    assert!(kept.iter().all(|k| k.0 != claimed.buffer), "a kept one was");
                    let seq = p.next_seq();
                    payload[claimed.buffer] = seq;
                    p.publish(&ring, seq, seq);
                }
            }
            Op::Lend => {
                if let Ok(l) = p.try_lend(&ring) {
                    assert!(kept.iter().all(|k| k.0 != l.buffer), "a kept buffer was lent");
                    lent.push((l.buffer, false));
                }
            }
            Op::Write(i) if !lent.is_empty() => {
                let n = lent.len();
                let l = &mut lent[i % n];
                // A race with a reader shows in the reader's payload check.
                payload[l.0] = u64::MAX - 1;
                l.1 = true;
            }
            Op::PublishLoan(i) if !lent.is_empty() => {
                let b = lent[i % lent.len()].0;
                if p.try_adopt(&ring, b).is_ok() {
                    let seq = p.next_seq();
                    payload[b] = seq;
                    p.publish(&ring, seq, seq);
                    lent.retain(|l| l.0 != b);
                    kept.push((b, seq));
                }
            }
            Op::GiveBack(i) if !lent.is_empty() => {
                let (b, written) = lent.remove(i % lent.len());
                p.give_back(&ring, b, written);
            }
            Op::EndKept(i) if !kept.is_empty() => {
                let (b, seq) = kept.remove(i % kept.len());
                assert_eq!(payload[b], seq, "kept buffer {b} was overwritten");
                p.end_kept(b);
            }
            Op::Pin(k) => {
                let c = &consumers[k];
                let before = c.cursor();
                if let Some((m, _)) = c.try_pin(&ring).unwrap() {
                    assert_eq!(payload[m.buffer], m.seq, "consumer {k} pinned {m:?}");
                    assert_eq!(m.seq, before + m.lag);
                    tally[k].0 += 1;
                    tally[k].1 += m.lag;
                    held[k].push(m);
                }
            }
            Op::Release(k) if !held[k].is_empty() => {
                let m = held[k].remove(0);
                consumers[k].release(&ring, m.buffer).unwrap();
            }
            _ => {}
        }
        for (k, h) in held.iter().enumerate() {
            for m in h {
                assert_eq!(payload[m.buffer], m.seq, "consumer {k}'s held {m:?} overwritten");
            }
        }
        for &(b, seq) in &kept {
            assert_eq!(payload[b], seq, "kept buffer {b} overwritten");
        }
        p.check_invariants(&ring);
    }
    for (k, c) in consumers.iter().enumerate() {
        assert_eq!(tally[k].0 + tally[k].1, c.cursor(), "consumer {k}'s accounting");
        if c.mode() == Mode::Lossless {
            assert_eq!(tally[k].1, 0, "a Lossless consumer lost messages");
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn loans_keep_every_guarantee_under_block(
        cap in 1u32..4, spares in 1u32..4, ops in prop::collection::vec(op(), 1..120)
    ) {
        run(Policy::Block, [Mode::Lossless, Mode::Queue], cap, spares, ops);
    }

    #[test]
    fn loans_keep_every_guarantee_under_overwrite(
        cap in 1u32..4, spares in 1u32..4, ops in prop::collection::vec(op(), 1..120)
    ) {
        run(Policy::Overwrite, [Mode::Queue, Mode::Latest], cap, spares, ops);
    }
}
