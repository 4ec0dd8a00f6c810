//! Single-threaded tests of the protocol, and property tests against a model of the ring.
//!
//! The tests keep a payload array with one word per buffer, which they write with the message's
//! sequence number when they claim the buffer: a message whose buffer was overwritten under a
//! reader shows another number there.

use std::collections::BTreeSet;

use proptest::prelude::*;

use super::atomic::Ordering;
use super::consumer::{give_up_retiring, retire_done};
use super::producer::{min_lossless_cursor, Blocked, ClaimError, Claimed};
use super::*;

/// Claims a buffer for the next message, writes its sequence number into `payload[buffer]`
/// and publishes it (length `seq * 10`, timestamp `seq`). Returns what the claim returned.
fn publish_claimed(
    p: &mut ProducerCore,
    ring: &Ring<'_>,
    payload: &mut [u64],
) -> Result<Claimed, ClaimError> {
    let claimed = p.try_claim(ring)?;
    let seq = p.next_seq();
    payload[claimed.buffer] = seq;
    assert_eq!(p.publish(ring, seq * 10, seq).0, seq);
    Ok(claimed)
}

/// [`publish_claimed`], returning the message's sequence number.
fn publish(p: &mut ProducerCore, ring: &Ring<'_>, payload: &mut [u64]) -> Result<u64, ClaimError> {
    let seq = p.next_seq();
    publish_claimed(p, ring, payload).map(|_| seq)
}

/// Joins in the ring policy's default mode, as process `pid` (start time `pid` too).
fn join(ring: &Ring<'_>, start: StartAt, pid: u32) -> ConsumerCore {
    join_as(ring, start, ring.policy.default_mode(), pid)
}

/// Joins in `mode`, as process `pid` (start time `pid` too).
fn join_as(ring: &Ring<'_>, start: StartAt, mode: Mode, pid: u32) -> ConsumerCore {
    let c = ConsumerCore::join(ring, start, mode, pid, pid as u64).unwrap();
    assert_eq!(c.mode(), mode);
    c
}

/// Pins the next message, which must be there.
fn pin(c: &ConsumerCore, ring: &Ring<'_>) -> Pinned {
    c.try_pin(ring).unwrap().expect("a message to pin").0
}

/// Buffer `buffer`'s held count.
fn held(ring: &Ring<'_>, buffer: usize) -> u64 {
    stamp::held(ring.buffers[buffer].stamp.load(Ordering::Relaxed))
}

/// The consumer's statistics as its entry shows them: (received, lost, holding).
fn stats(ring: &Ring<'_>, c: &ConsumerCore) -> (u64, u64, u64) {
    c.write_stats(ring);
    let entry = &ring.consumers[c.index()];
    let load = |v: &atomic::AtomicU64| v.load(Ordering::Relaxed);
    (load(&entry.received), load(&entry.lost), load(&entry.holding))
}

const BLOCKED_HELD: Result<u64, ClaimError> = Err(ClaimError::Blocked(Blocked::Held));
const BLOCKED_CONSUMERS: Result<u64, ClaimError> = Err(ClaimError::Blocked(Blocked::Consumers));

#[test]
fn block_gates_on_slowest_consumer() {
    for spares in [0, 1] {
        let heap = HeapRing::new(4, spares, 2, Policy::Block);
        let ring = heap.ring();
        let mut p = ProducerCore::new(&ring);
        let mut payload = vec![u64::MAX; 4 + spares as usize];
        let a = join(&ring, StartAt::Next, 1);
        assert_eq!(a.mode(), Mode::Lossless);
        for s in 0..4 {
            assert_eq!(publish(&mut p, &ring, &mut payload), Ok(s));
        }
        assert_eq!(publish(&mut p, &ring, &mut payload), BLOCKED_CONSUMERS);
        let m = pin(&a, &ring);
        assert_eq!((m.seq, m.len, m.lag), (0, 0, 0));
        if spares == 0 {
            // Received but still held, and no spare: the buffer is not free.
            assert_eq!(publish(&mut p, &ring, &mut payload), BLOCKED_HELD);
            a.release(&ring, m.buffer).unwrap();
            assert_eq!(publish(&mut p, &ring, &mut payload), Ok(4));
        } else {
            // Received and held: the spare takes its place, the held message stays.
            assert_eq!(publish(&mut p, &ring, &mut payload), Ok(4));
            assert_eq!(payload[m.buffer], 0);
            a.release(&ring, m.buffer).unwrap();
            // The consumer (at 1) still gates message 5.
            assert_eq!(publish(&mut p, &ring, &mut payload), BLOCKED_CONSUMERS);
        }
        // Leaving ungates the producer.
        assert!(!a.leave(&ring, Leave::Free).wake);
        for s in 5..20 {
            assert_eq!(publish(&mut p, &ring, &mut payload), Ok(s));
        }
    }
}

#[test]
fn overwrite_reports_lag_and_spares_held_buffers() {
    for spares in [0, 1] {
        let heap = HeapRing::new(4, spares, 2, Policy::Overwrite);
        let ring = heap.ring();
        let mut p = ProducerCore::new(&ring);
        let mut payload = vec![u64::MAX; 4 + spares as usize];
        let a = join(&ring, StartAt::Next, 1);
        assert_eq!(a.mode(), Mode::Queue);
        publish(&mut p, &ring, &mut payload).unwrap();
        let held = pin(&a, &ring);
        assert_eq!(held.seq, 0);
        for s in 1..4 {
            assert_eq!(publish(&mut p, &ring, &mut payload), Ok(s));
        }
        if spares == 0 {
            // Buffer 0 is held and there is no spare: no overwrite.
            assert_eq!(publish(&mut p, &ring, &mut payload), BLOCKED_HELD);
        } else {
            // Buffer 0 is held: the spare takes its place, message 0 stays in it.
            assert_eq!(publish(&mut p, &ring, &mut payload), Ok(4));
        }
        assert_eq!(payload[held.buffer], 0);
        a.release(&ring, held.buffer).unwrap();
        while p.next_seq() < 11 {
            publish(&mut p, &ring, &mut payload).unwrap();
        }
        // Head is 11; 7..=10 remain. The consumer was at 1.
        let m = pin(&a, &ring);
        assert_eq!((m.seq, m.lag), (7, 6));
        assert_eq!(payload[m.buffer], 7);
        assert_eq!(stats(&ring, &a), (2, 6, 1));
    }
}

#[test]
fn start_positions() {
    let heap = HeapRing::new(4, 0, 5, Policy::Overwrite);
    let ring = heap.ring();
    let mut p = ProducerCore::new(&ring);
    let mut payload = [0; 4];
    for _ in 0..6 {
        publish(&mut p, &ring, &mut payload).unwrap();
    }
    let newest = join(&ring, StartAt::Newest, 1);
    let next = join(&ring, StartAt::Next, 1);
    let oldest = join(&ring, StartAt::Oldest, 1);
    assert_eq!(pin(&newest, &ring).seq, 5);
    assert_eq!(next.try_pin(&ring).unwrap(), None);
    assert_eq!(pin(&oldest, &ring).seq, 2);
    // A Lossless consumer starts at the oldest message that cannot be overwritten while it
    // joins: the last `capacity - 1`.
    let lossless = join_as(&ring, StartAt::Oldest, Mode::Lossless, 1);
    assert_eq!(lossless.cursor(), 3);
    // A Latest one starts where asked, and jumps to the newest at its first pin.
    let latest = join_as(&ring, StartAt::Oldest, Mode::Latest, 1);
    assert_eq!(latest.cursor(), 2);
    let m = pin(&latest, &ring);
    assert_eq!((m.seq, m.lag), (5, 3));
}

#[test]
fn table_full() {
    let heap = HeapRing::new(2, 0, 1, Policy::Block);
    let ring = heap.ring();
    let a = join(&ring, StartAt::Next, 1);
    let mode = Mode::Latest;
    assert_eq!(ConsumerCore::join(&ring, StartAt::Next, mode, 1, 1).unwrap_err(), JoinError::Full);
    a.leave(&ring, Leave::Free);
    assert!(ConsumerCore::join(&ring, StartAt::Next, mode, 1, 1).is_ok());
}

#[test]
fn corrupt_stamps_are_reported() {
    let heap = HeapRing::new(2, 1, 2, Policy::Overwrite);
    let ring = heap.ring();
    let mut p = ProducerCore::new(&ring);
    let mut payload = [u64::MAX; 3];
    let c = join(&ring, StartAt::Next, 1);
    let stamp0 = &ring.buffers[0].stamp;
    // A tag the producer never wrote there.
    let initial = stamp0.load(Ordering::Relaxed);
    stamp0.store(stamp::ready(77, 0), Ordering::Relaxed);
    assert_eq!(p.try_claim(&ring), Err(ClaimError::Corrupt(RingCorrupt::BufferTag { buffer: 0 })));
    // A held count larger than the table, at the producer.
    stamp0.store(initial + 9, Ordering::Relaxed);
    let corrupt = RingCorrupt::HeldCount { buffer: 0, held: 9 };
    assert_eq!(p.try_claim(&ring), Err(ClaimError::Corrupt(corrupt)));
    stamp0.store(initial, Ordering::Relaxed);
    assert_eq!(publish(&mut p, &ring, &mut payload), Ok(0));
    // ... and at a consumer.
    stamp0.store(stamp::ready(0, 9), Ordering::Relaxed);
    assert_eq!(c.try_pin(&ring), Err(corrupt));
    // A buffer whose stamp names an older message (-1) than its position word says (0).
    stamp0.store(stamp::ready(u64::MAX, 0), Ordering::Relaxed);
    assert_eq!(c.try_pin(&ring), Err(RingCorrupt::BufferTag { buffer: 0 }));
    stamp0.store(stamp::ready(0, 0), Ordering::Relaxed);
    let m = pin(&c, &ring);
    c.release(&ring, m.buffer).unwrap();
    // A position word naming a buffer the ring does not have.
    ring.positions[1].store(position::word(1, 7), Ordering::Relaxed);
    assert_eq!(c.try_pin(&ring), Err(RingCorrupt::Position { position: 1 }));
    // Releasing a buffer no one holds.
    ring.buffers[1].stamp.store(stamp::ready(1, 0), Ordering::Relaxed);
    assert_eq!(c.release(&ring, 1), Err(RingCorrupt::ReleaseUnderflow { buffer: 1 }));
    assert_eq!(ring.buffers[1].stamp.load(Ordering::Relaxed), stamp::ready(1, 0));
}

/// A damaged position word that names a buffer the consumer holds an older message in is
/// reported, and the consumer's hold of that message stays recorded (a pin writes its record
/// only after it has seen the stamp it expects).
#[test]
fn a_damaged_word_naming_a_held_buffer_keeps_the_hold() {
    let heap = HeapRing::new(2, 1, 2, Policy::Overwrite);
    let ring = heap.ring();
    let mut p = ProducerCore::new(&ring);
    let mut payload = [u64::MAX; 3];
    let c = join(&ring, StartAt::Next, 1);
    assert_eq!(publish(&mut p, &ring, &mut payload), Ok(0));
    let m = pin(&c, &ring);
    let held = ring.hold(c.index(), m.buffer).load(Ordering::Relaxed);
    assert_eq!(held, hold::record(0, hold::HELD));
    // Message 1's word names the buffer that carries message 0.
    ring.positions[1].store(position::word(1, m.buffer), Ordering::Relaxed);
    let corrupt = RingCorrupt::BufferTag { buffer: m.buffer as u32 };
    assert_eq!(c.try_pin(&ring), Err(corrupt));
    assert_eq!(ring.hold(c.index(), m.buffer).load(Ordering::Relaxed), held);
    c.release(&ring, m.buffer).unwrap();
    assert_eq!(ring.buffers[m.buffer].stamp.load(Ordering::Relaxed), stamp::ready(0, 0));
}

#[test]
fn sleepers_are_woken() {
    let heap = HeapRing::new(2, 0, 1, Policy::Block);
    let ring = heap.ring();
    let mut p = ProducerCore::new(&ring);
    ring.consumer_wake.sleepers.store(1, Ordering::Relaxed);
    let w0 = ring.consumer_wake.word.load(Ordering::Relaxed);
    p.try_claim(&ring).unwrap();
    assert!(p.publish(&ring, 0, 0).1);
    assert_eq!(ring.consumer_wake.word.load(Ordering::Relaxed), w0 + 1);
}

#[test]
fn modes_and_policies() {
    assert_eq!(Policy::Block.default_mode(), Mode::Lossless);
    assert_eq!(Policy::Overwrite.default_mode(), Mode::Queue);
    for mode in [Mode::Lossless, Mode::Queue, Mode::Latest] {
        assert_eq!(Mode::from_raw(mode as u32), Some(mode));
        assert_eq!(Mode::from_name(mode.name()), Some(mode));
    }
    assert_eq!(Mode::from_raw(0), None);
    assert_eq!(Mode::from_raw(4), None);
    assert_eq!(Mode::from_name("block"), None);
    // The mode is in the entry, for the producer and tools.
    let heap = HeapRing::new(2, 0, 3, Policy::Overwrite);
    let ring = heap.ring();
    for (pid, mode) in [(1, Mode::Lossless), (2, Mode::Queue), (3, Mode::Latest)] {
        let c = join_as(&ring, StartAt::Next, mode, pid);
        assert_eq!(ring.consumers[c.index()].mode.load(Ordering::Relaxed), mode as u32);
    }
}

/// A consumer holds one message while the producer laps the ring several times: with one spare
/// the producer never waits, the held message stays intact in its buffer (out of the ring), and
/// a Queue consumer learns how many it lost when it resumes; a Lossless one that reads on
/// while it holds loses nothing.
#[test]
fn a_held_message_survives_laps_with_one_spare() {
    for mode in [Mode::Queue, Mode::Lossless] {
        let heap = HeapRing::new(2, 1, 1, Policy::Overwrite);
        let ring = heap.ring();
        let mut p = ProducerCore::new(&ring);
        let mut payload = [u64::MAX; 3];
        let c = join_as(&ring, StartAt::Next, mode, 1);
        assert_eq!(publish(&mut p, &ring, &mut payload), Ok(0));
        let held = pin(&c, &ring);
        assert_eq!((held.seq, held.buffer), (0, 0));
        // Three and a half laps.
        for s in 1..8 {
            let claimed = publish_claimed(&mut p, &ring, &mut payload).unwrap();
            assert_ne!(claimed.buffer, held.buffer, "message {s} took the held buffer");
            assert_eq!(payload[held.buffer], 0, "{mode:?}");
            if mode == Mode::Lossless {
                let m = pin(&c, &ring);
                assert_eq!((m.seq, m.lag, payload[m.buffer]), (s, 0, s));
                c.release(&ring, m.buffer).unwrap();
            }
        }
        // Message 2 swapped the spare (buffer 2) in for buffer 0, which keeps message 0 for its
        // holder, out of the ring: no new reader finds it.
        assert_eq!(ring.buffer_of(0), None);
        assert_eq!(ring.buffers[0].stamp.load(Ordering::Relaxed), stamp::ready(0, 1));
        assert_eq!(p.candidates(&ring).collect::<Vec<_>>(), vec![2, 0]);
        if mode == Mode::Queue {
            // Head 8: messages 6 and 7 remain. The consumer, at 1, lost 1..=5.
            let m = pin(&c, &ring);
            assert_eq!((m.seq, m.lag, payload[m.buffer]), (6, 5, 6));
            assert_eq!(c.cursor(), 7);
            assert_eq!(stats(&ring, &c), (2, 5, 2));
            c.release(&ring, m.buffer).unwrap();
        } else {
            assert_eq!(c.cursor(), 8);
            assert_eq!(stats(&ring, &c), (8, 0, 1));
        }
        assert_eq!(payload[held.buffer], 0);
        c.release(&ring, held.buffer).unwrap();
        assert_eq!(held_total(&ring), 0);
    }
}

/// Sum of the buffers' held counts.
fn held_total(ring: &Ring<'_>) -> u64 {
    (0..ring.buffers.len()).map(|b| held(ring, b)).sum()
}

/// When consumers hold the position's buffer and every spare, the producer waits (`Held`);
/// a release of any of them lets the claim through, and nothing held is overwritten.
#[test]
fn exhausted_spares_block_the_producer_until_a_release() {
    let heap = HeapRing::new(2, 1, 1, Policy::Overwrite);
    let ring = heap.ring();
    let mut p = ProducerCore::new(&ring);
    let mut payload = [u64::MAX; 3];
    let c = join(&ring, StartAt::Next, 1);
    publish(&mut p, &ring, &mut payload).unwrap();
    publish(&mut p, &ring, &mut payload).unwrap();
    let m0 = pin(&c, &ring);
    let m1 = pin(&c, &ring);
    assert_eq!((m0.buffer, m1.buffer), (0, 1));
    // Message 2's position names buffer 0, held: the spare (buffer 2) takes its place.
    let claimed = publish_claimed(&mut p, &ring, &mut payload);
    assert_eq!(claimed, Ok(Claimed { buffer: 2, prev: None }));
    let m2 = pin(&c, &ring);
    assert_eq!((m2.seq, m2.buffer), (2, 2));
    // Message 3's position names buffer 1 (message 1), the spare is buffer 0 (message 0): all
    // held.
    assert_eq!(p.candidates(&ring).collect::<Vec<_>>(), vec![1, 0]);
    assert_eq!(publish(&mut p, &ring, &mut payload), BLOCKED_HELD);
    assert_eq!(publish(&mut p, &ring, &mut payload), BLOCKED_HELD);
    assert_eq!((p.next_seq(), p.is_claimed()), (3, false));
    for m in [m0, m1, m2] {
        assert_eq!(payload[m.buffer], m.seq);
    }
    // Releasing message 0 frees the spare.
    c.release(&ring, m0.buffer).unwrap();
    let claimed = publish_claimed(&mut p, &ring, &mut payload);
    assert_eq!(claimed, Ok(Claimed { buffer: 0, prev: Some(0) }));
    assert_eq!((payload[m1.buffer], payload[m2.buffer]), (1, 2));
    // Message 4's position names buffer 2 (message 2), the spare is buffer 1 (message 1).
    assert_eq!(p.candidates(&ring).collect::<Vec<_>>(), vec![2, 1]);
    assert_eq!(publish(&mut p, &ring, &mut payload), BLOCKED_HELD);
    c.release(&ring, m1.buffer).unwrap();
    let claimed = publish_claimed(&mut p, &ring, &mut payload);
    assert_eq!(claimed, Ok(Claimed { buffer: 1, prev: Some(1) }));
    assert_eq!(payload[m2.buffer], 2);
    c.release(&ring, m2.buffer).unwrap();
    // The consumer is at 3, still in the ring: it lost nothing.
    let m = pin(&c, &ring);
    assert_eq!((m.seq, m.lag, m.buffer, payload[m.buffer]), (3, 0, 0, 3));
}

/// Pins the next message, checks its payload, releases it: (seq, lag).
fn take(c: &ConsumerCore, ring: &Ring<'_>, payload: &[u64]) -> (u64, u64) {
    let m = pin(c, ring);
    assert_eq!(payload[m.buffer], m.seq);
    c.release(ring, m.buffer).unwrap();
    (m.seq, m.lag)
}

/// A Latest consumer takes the newest message each time and counts the ones it skipped as
/// lost; it never gates the producer, but what it holds it holds.
#[test]
fn latest_skips_to_the_newest_and_counts_the_skipped_as_lag() {
    let heap = HeapRing::new(4, 0, 1, Policy::Block);
    let ring = heap.ring();
    let mut p = ProducerCore::new(&ring);
    let mut payload = [u64::MAX; 4];
    for s in 0..6 {
        assert_eq!(publish(&mut p, &ring, &mut payload), Ok(s));
    }
    let t = join_as(&ring, StartAt::Oldest, Mode::Latest, 1);
    assert_eq!(t.cursor(), 2);
    assert_eq!(take(&t, &ring, &payload), (5, 3));
    assert_eq!(t.try_pin(&ring).unwrap(), None);
    for _ in 0..3 {
        publish(&mut p, &ring, &mut payload).unwrap();
    }
    assert_eq!(take(&t, &ring, &payload), (8, 2));
    publish(&mut p, &ring, &mut payload).unwrap();
    assert_eq!(take(&t, &ring, &payload), (9, 0));
    // It does not gate the producer, even on a Block ring: ten messages (two and a half laps)
    // while it does not read.
    for s in 10..20 {
        assert_eq!(publish(&mut p, &ring, &mut payload), Ok(s));
    }
    assert_eq!(take(&t, &ring, &payload), (19, 9));
    assert_eq!(t.cursor(), 20);
    // received + lost = 20 - 2, the distance its cursor moved.
    assert_eq!(stats(&ring, &t), (4, 14, 0));
    // What it holds, it holds: with no spare the producer waits for it a lap later.
    publish(&mut p, &ring, &mut payload).unwrap();
    let m = pin(&t, &ring);
    assert_eq!((m.seq, m.lag), (20, 0));
    for s in 21..24 {
        assert_eq!(publish(&mut p, &ring, &mut payload), Ok(s));
    }
    assert_eq!(publish(&mut p, &ring, &mut payload), BLOCKED_HELD);
    assert_eq!(payload[m.buffer], 20);
    t.release(&ring, m.buffer).unwrap();
    assert_eq!(publish(&mut p, &ring, &mut payload), Ok(24));
}

/// Losses the producer declares upstream (a bridge's gaps) come in the lag of the next message
/// each consumer takes, on top of what it skipped itself; a consumer starts from the total it
/// finds at its first message.
#[test]
fn declared_upstream_losses_add_to_the_lag_of_the_next_message_taken() {
    let heap = HeapRing::new(4, 0, 2, Policy::Overwrite);
    let ring = heap.ring();
    let mut p = ProducerCore::new(&ring);
    let mut payload = [u64::MAX; 4];
    p.declare_lost(7); // before message 0, declared before any consumer joined
    publish(&mut p, &ring, &mut payload).unwrap();
    let every = join_as(&ring, StartAt::Oldest, Mode::Queue, 1);
    let newest = join_as(&ring, StartAt::Oldest, Mode::Latest, 2);
    // A consumer's first message counts the losses declared just before it, however late it
    // joined.
    assert_eq!(take(&every, &ring, &payload), (0, 7));
    p.declare_lost(2);
    publish(&mut p, &ring, &mut payload).unwrap();
    p.declare_lost(1);
    publish(&mut p, &ring, &mut payload).unwrap();
    assert_eq!(take(&every, &ring, &payload), (1, 2));
    assert_eq!(take(&every, &ring, &payload), (2, 1));
    // The Latest consumer skips 0 and 1; message 2 is its first: the 2 skipped and the 1
    // declared just before it.
    assert_eq!(take(&newest, &ring, &payload), (2, 2 + 1));
    // Then it skips 3, and the 4 declared before 3 and 4 count for it all the same.
    p.declare_lost(4);
    publish(&mut p, &ring, &mut payload).unwrap();
    publish(&mut p, &ring, &mut payload).unwrap();
    assert_eq!(take(&newest, &ring, &payload), (4, 1 + 4));
    assert_eq!(take(&every, &ring, &payload), (3, 4));
    // A total that goes back (damage) adds nothing.
    ring.buffers[payload.iter().position(|&s| s == 4).unwrap()]
        .upstream_lost
        .store(0, Ordering::Relaxed);
    assert_eq!(take(&every, &ring, &payload), (4, 0));
}

/// The gate refreshes its bound from the entries that gated at its last scan of the whole
/// table until a consumer joins: a Lossless consumer that joins after that scan gates at once
/// (its join moves `joins`), and consumers that leave stop gating.
#[test]
fn a_lossless_consumer_that_joins_after_the_gate_scanned_gates_at_once() {
    let heap = HeapRing::new(2, 0, 4, Policy::Block);
    let ring = heap.ring();
    let mut p = ProducerCore::new(&ring);
    let mut payload = [u64::MAX; 2];
    let read = |c: &ConsumerCore| {
        let m = pin(c, &ring);
        c.release(&ring, m.buffer).unwrap();
        m.seq
    };
    let a = join(&ring, StartAt::Next, 1);
    assert_eq!(publish(&mut p, &ring, &mut payload), Ok(0));
    assert_eq!(publish(&mut p, &ring, &mut payload), Ok(1));
    // The gate of message 2 scans the table: `a` is at 0.
    assert_eq!(publish(&mut p, &ring, &mut payload), BLOCKED_CONSUMERS);
    assert_eq!(read(&a), 0);
    // Refreshed from `a`'s entry alone.
    assert_eq!(publish(&mut p, &ring, &mut payload), Ok(2));
    // `b` joins at the oldest message a Lossless joiner may take: 2.
    let b = join(&ring, StartAt::Oldest, 2);
    assert_eq!(b.cursor(), 2);
    assert_eq!((read(&a), read(&a)), (1, 2));
    assert_eq!(publish(&mut p, &ring, &mut payload), Ok(3));
    // Message 4 would overwrite 2, which `b` has not read.
    assert_eq!(publish(&mut p, &ring, &mut payload), BLOCKED_CONSUMERS);
    assert_eq!(read(&b), 2);
    assert_eq!(publish(&mut p, &ring, &mut payload), Ok(4));
    // Gone, neither gates any more.
    a.leave(&ring, Leave::Free);
    b.leave(&ring, Leave::Free);
    for s in 5..9 {
        assert_eq!(publish(&mut p, &ring, &mut payload), Ok(s));
    }
}

/// Lossless, Queue and Latest consumers on one ring: only the Lossless one's cursor gates the
/// producer; the others make it wait only for the buffers they hold.
#[test]
fn only_lossless_consumers_gate_the_producer() {
    let heap = HeapRing::new(2, 1, 3, Policy::Block);
    let ring = heap.ring();
    let mut p = ProducerCore::new(&ring);
    let mut payload = [u64::MAX; 3];
    let l = join(&ring, StartAt::Next, 1);
    assert_eq!(l.mode(), Mode::Lossless);
    let q = join_as(&ring, StartAt::Next, Mode::Queue, 2);
    let t = join_as(&ring, StartAt::Next, Mode::Latest, 3);
    assert_eq!(min_lossless_cursor(&ring, 0), 0);
    assert_eq!(publish(&mut p, &ring, &mut payload), Ok(0));
    assert_eq!(publish(&mut p, &ring, &mut payload), Ok(1));
    assert_eq!(publish(&mut p, &ring, &mut payload), BLOCKED_CONSUMERS);
    // The Lossless consumer reads message 0 and holds it: the spare takes its buffer.
    let l0 = pin(&l, &ring);
    assert_eq!(publish(&mut p, &ring, &mut payload), Ok(2));
    // It is at 1: message 3 would overwrite that.
    assert_eq!(min_lossless_cursor(&ring, 3), 1);
    assert_eq!(publish(&mut p, &ring, &mut payload), BLOCKED_CONSUMERS);
    let l1 = pin(&l, &ring);
    // Now it holds messages 0 and 1: message 3's buffer (1's) and the spare (0's).
    assert_eq!(publish(&mut p, &ring, &mut payload), BLOCKED_HELD);
    assert_eq!((payload[l0.buffer], payload[l1.buffer]), (0, 1));
    l.release(&ring, l0.buffer).unwrap();
    assert_eq!(publish(&mut p, &ring, &mut payload), Ok(3));
    l.release(&ring, l1.buffer).unwrap();
    // At 2, it gates message 4.
    assert_eq!(publish(&mut p, &ring, &mut payload), BLOCKED_CONSUMERS);
    // The Queue and Latest consumers, still at 0, never did; with the Lossless one gone,
    // nothing gates.
    assert_eq!((q.cursor(), t.cursor()), (0, 0));
    l.leave(&ring, Leave::Free);
    assert_eq!(min_lossless_cursor(&ring, 4), u64::MAX);
    for s in 4..11 {
        assert_eq!(publish(&mut p, &ring, &mut payload), Ok(s));
    }
    // Head 11: the Queue consumer resumes at the oldest (9), the Latest one takes the newest.
    let q9 = pin(&q, &ring);
    assert_eq!((q9.seq, q9.lag), (9, 9));
    let t10 = pin(&t, &ring);
    assert_eq!((t10.seq, t10.lag), (10, 10));
    // They hold what they read: message 11 swaps the spare in for 9's buffer, and message 12
    // finds 10's buffer and the spare (9's) held.
    assert_eq!(publish(&mut p, &ring, &mut payload), Ok(11));
    assert_eq!(publish(&mut p, &ring, &mut payload), BLOCKED_HELD);
    assert_eq!((payload[q9.buffer], payload[t10.buffer]), (9, 10));
    q.release(&ring, q9.buffer).unwrap();
    assert_eq!(publish(&mut p, &ring, &mut payload), Ok(12));
    assert_eq!(payload[t10.buffer], 10);
    t.release(&ring, t10.buffer).unwrap();
    // Head 13: 11 and 12 remain.
    assert_eq!(take(&q, &ring, &payload), (11, 1));
    assert_eq!(take(&t, &ring, &payload), (12, 1));
    assert_eq!(stats(&ring, &q), (2, 10, 0));
    assert_eq!(stats(&ring, &t), (2, 11, 0));
}

/// The producer's view of where the next message goes: `lapped_buffer` is the buffer of the
/// message one lap back, `candidates` that one then the spares; a claim that is not published
/// is returned again as it was, swap included.
#[test]
fn candidates_and_lapped_buffer_follow_the_swaps() {
    let heap = HeapRing::new(2, 2, 1, Policy::Overwrite);
    let ring = heap.ring();
    let mut p = ProducerCore::new(&ring);
    let mut payload = [u64::MAX; 4];
    let c = join(&ring, StartAt::Next, 1);
    let candidates = |p: &ProducerCore| p.candidates(&ring).collect::<Vec<_>>();
    assert_eq!((p.lapped_buffer(&ring), candidates(&p)), (None, vec![0, 2, 3]));
    let claimed = publish_claimed(&mut p, &ring, &mut payload);
    assert_eq!(claimed, Ok(Claimed { buffer: 0, prev: None }));
    assert_eq!((p.lapped_buffer(&ring), candidates(&p)), (None, vec![1, 2, 3]));
    publish(&mut p, &ring, &mut payload).unwrap();
    assert_eq!((p.lapped_buffer(&ring), candidates(&p)), (Some(0), vec![0, 2, 3]));
    let m0 = pin(&c, &ring);
    // Message 2: buffer 0 is held, the first spare (2) takes its place.
    let claimed = p.try_claim(&ring).unwrap();
    assert_eq!(claimed, Claimed { buffer: 2, prev: None });
    assert!(p.is_claimed());
    assert_eq!(ring.buffers[2].stamp.load(Ordering::Relaxed), stamp::writing(2));
    // Claimed again without publishing (a write slot dropped unpublished): the same buffer.
    assert_eq!(p.try_claim(&ring), Ok(claimed));
    payload[2] = 2;
    assert_eq!(p.publish(&ring, 20, 2), (2, false));
    assert_eq!(ring.buffer_of(2), Some(2));
    // Buffer 0, out of the ring with message 0, is a spare now.
    assert_eq!((p.lapped_buffer(&ring), candidates(&p)), (Some(1), vec![1, 0, 3]));
    c.release(&ring, m0.buffer).unwrap();
    let claimed = publish_claimed(&mut p, &ring, &mut payload);
    assert_eq!(claimed, Ok(Claimed { buffer: 1, prev: Some(1) }));
    let claimed = publish_claimed(&mut p, &ring, &mut payload);
    assert_eq!(claimed, Ok(Claimed { buffer: 2, prev: Some(2) }));
}

/// Joins in `mode` at `start` while the shared head reads `head` (as a hostile or damaged
/// segment can make it), and pins (and releases) a few times. Nothing may panic: overflow
/// checks are on here.
fn pin_at_hostile_head(head: u64, mode: Mode, start: StartAt) {
    let heap = HeapRing::new(2, 1, 2, Policy::Block);
    let ring = heap.ring();
    ring.producer.head.store(head, Ordering::Relaxed);
    let c = join_as(&ring, start, mode, 1);
    for _ in 0..4 {
        if let Ok(Some((m, _))) = c.try_pin(&ring) {
            let _ = c.release(&ring, m.buffer);
        }
    }
    c.leave(&ring, Leave::Free);
}

/// A consumer at 0 whose position word (`word`), or whose buffer (stamp tag `tag`), shows a
/// newer message takes the lag path with a hostile head of `u64::MAX`. Nothing may panic.
fn lag_at_hostile_head(mode: Mode, word: u64, tag: Option<u64>) {
    let heap = HeapRing::new(2, 1, 2, Policy::Block);
    let ring = heap.ring();
    let c = join_as(&ring, StartAt::Next, mode, 1);
    assert_eq!(word, position::word(word >> position::BUFFER_BITS, 0));
    ring.positions[0].store(word, Ordering::Relaxed);
    if let Some(tag) = tag {
        ring.buffers[0].stamp.store(stamp::ready(tag, 0), Ordering::Relaxed);
    }
    ring.producer.head.store(u64::MAX, Ordering::Relaxed);
    for _ in 0..4 {
        let _ = c.try_pin(&ring);
    }
    c.leave(&ring, Leave::Free);
}

/// The lag paths of [`lag_at_hostile_head`]: through the position word (`position::word(2, 0)`),
/// through the stamp (word 0 in buffer 0, stamp 5).
const HOSTILE_LAGS: [(u64, Option<u64>); 2] = [(2 << position::BUFFER_BITS, None), (0, Some(5))];

#[test]
fn hostile_head_does_not_panic() {
    for mode in [Mode::Lossless, Mode::Queue, Mode::Latest] {
        for head in [u64::MAX, u64::MAX - 1, u64::MAX - 2, 1 << 63, (1 << 63) + 1, 1 << 47] {
            for start in [StartAt::Newest, StartAt::Next, StartAt::Oldest] {
                pin_at_hostile_head(head, mode, start);
            }
        }
        for (word, tag) in HOSTILE_LAGS {
            lag_at_hostile_head(mode, word, tag);
        }
    }
}

/// A Latest consumer whose cursor reaches `u64::MAX` under a hostile head of `u64::MAX` (it
/// joins at `Next` there, or a lag jump takes it there) must not panic, nor move its cursor
/// back. (The Latest step once tested `head > c.wrapping_add(1)`, which wrapped to `head > 0`
/// at `c == u64::MAX` and then subtracted past zero.)
#[test]
fn latest_at_cursor_u64_max_does_not_panic() {
    pin_at_hostile_head(u64::MAX, Mode::Latest, StartAt::Next);
    for (word, tag) in HOSTILE_LAGS {
        lag_at_hostile_head(Mode::Latest, word, tag);
    }
}

#[test]
fn joining_entries_do_not_gate_and_can_be_abandoned() {
    let heap = HeapRing::new(2, 0, 1, Policy::Block);
    let ring = heap.ring();
    let mut p = ProducerCore::new(&ring);
    let mut payload = [0; 2];
    let joining = ConsumerCore::claim(&ring, 1, 1).unwrap();
    assert_eq!(joining.index(), 0);
    // Claimed but not active: the table is full, yet the producer is not gated.
    let mode = Mode::Lossless;
    assert_eq!(ConsumerCore::join(&ring, StartAt::Next, mode, 1, 1).unwrap_err(), JoinError::Full);
    for s in 0..5 {
        assert_eq!(publish(&mut p, &ring, &mut payload), Ok(s));
    }
    joining.abandon(&ring);
    let c = join_as(&ring, StartAt::Next, mode, 1);
    assert_eq!(c.cursor(), 5);
}

// ---- Model-based property test -------------------------------------------------------------

/// Consumer table size in the model tests.
const CONSUMERS: usize = 3;

#[derive(Clone, Debug)]
enum Op {
    Publish,
    Recv(usize),
    Release(usize, usize),
    /// Consumer `.0` joins at start `.1` (Next, Newest, Oldest) in mode `.2` (the policy's
    /// default, Lossless, Queue, Latest).
    Join(usize, u8, u8),
    /// Leaves, giving back what it still holds.
    Leave(usize),
    /// Dies, holding what it holds; the producer reaps it.
    Die(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => Just(Op::Publish),
        4 => (0..CONSUMERS).prop_map(Op::Recv),
        3 => (0..CONSUMERS, 0..4usize).prop_map(|(c, i)| Op::Release(c, i)),
        1 => (0..CONSUMERS, 0..3u8, 0..4u8).prop_map(|(c, s, m)| Op::Join(c, s, m)),
        1 => (0..CONSUMERS).prop_map(Op::Leave),
        1 => (0..CONSUMERS).prop_map(Op::Die),
    ]
}

/// The model: the head (the ring retains the `cap` messages before it) and, per consumer, its
/// mode, cursor and the messages it holds. It knows nothing of buffers: which buffer carries
/// what is the ring's business, checked through the payload.
struct Model {
    cap: u64,
    spares: usize,
    head: u64,
    consumers: Vec<Option<ModelConsumer>>,
}

struct ModelConsumer {
    mode: Mode,
    /// Its cursor when it joined.
    start: u64,
    cursor: u64,
    held: Vec<u64>,
    received: u64,
    lost: u64,
}

impl Model {
    /// The oldest message still in the ring (or the head, if none was published).
    fn oldest(&self) -> u64 {
        self.head.saturating_sub(self.cap)
    }

    /// The messages someone holds, each once: each is in a buffer of its own.
    fn held(&self) -> BTreeSet<u64> {
        self.consumers.iter().flatten().flat_map(|c| c.held.iter().copied()).collect()
    }

    /// How many consumers hold message `seq`.
    fn holders(&self, seq: u64) -> u64 {
        self.consumers.iter().flatten().filter(|c| c.held.contains(&seq)).count() as u64
    }

    /// The smallest Lossless cursor, `u64::MAX` if none.
    fn min_lossless(&self) -> u64 {
        let lossless = self.consumers.iter().flatten().filter(|c| c.mode == Mode::Lossless);
        lossless.map(|c| c.cursor).min().unwrap_or(u64::MAX)
    }

    /// What a publish should do: Ok(seq) or which wait.
    fn publish(&mut self) -> Result<u64, Blocked> {
        let s = self.head;
        if let Some(prev) = s.checked_sub(self.cap) {
            if self.min_lossless() <= prev {
                return Err(Blocked::Consumers);
            }
            // The candidates are the buffer of `prev` and the spares. A spare that is held
            // carries a lapped message (older than `prev`), a held buffer still in the ring a
            // message at or after `prev`.
            let held = self.held();
            if held.contains(&prev) && held.range(..prev).count() == self.spares {
                return Err(Blocked::Held);
            }
        }
        self.head += 1;
        Ok(s)
    }

    /// What a receive by consumer `k` should give: Some((seq, lag)).
    fn recv(&mut self, k: usize) -> Option<(u64, u64)> {
        let (head, oldest) = (self.head, self.oldest());
        let c = self.consumers[k].as_mut().unwrap();
        let mut lag = 0;
        if c.mode == Mode::Latest && head > c.cursor + 1 {
            lag += head - 1 - c.cursor;
            c.cursor = head - 1;
        }
        if c.cursor < oldest {
            lag += oldest - c.cursor;
            c.cursor = oldest;
        }
        if c.cursor >= head {
            assert_eq!(lag, 0);
            return None;
        }
        let seq = c.cursor;
        c.cursor += 1;
        c.held.push(seq);
        c.received += 1;
        c.lost += lag;
        Some((seq, lag))
    }
}

/// A consumer of the ring under test, and what it was told.
struct Real {
    core: ConsumerCore,
    pins: Vec<Pinned>,
    received: u64,
    /// The sum of the `lag` of its messages.
    lag: u64,
    /// The last message it received.
    last: Option<u64>,
}

fn run_model(policy: Policy, cap: u32, spares: u32, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let heap = HeapRing::new(cap, spares, CONSUMERS as u32, policy);
    let ring = heap.ring();
    let mut p = ProducerCore::new(&ring);
    let mut payload = vec![u64::MAX; (cap + spares) as usize];
    let mut real: Vec<Option<Real>> = (0..CONSUMERS).map(|_| None).collect();
    let mut model = Model {
        cap: cap as u64,
        spares: spares as usize,
        head: 0,
        consumers: (0..CONSUMERS).map(|_| None).collect(),
    };
    for op in ops {
        match op {
            Op::Publish => {
                let s = p.next_seq();
                let candidates: Vec<usize> = p.candidates(&ring).collect();
                let candidate_held: Vec<bool> =
                    candidates.iter().map(|&b| held(&ring, b) > 0).collect();
                match s.checked_sub(model.cap) {
                    Some(prev) => {
                        prop_assert_eq!(p.lapped_buffer(&ring), Some(candidates[0]));
                        prop_assert_eq!(payload[candidates[0]], prev);
                    }
                    None => prop_assert_eq!(p.lapped_buffer(&ring), None),
                }
                let lossless_behind =
                    s.checked_sub(model.cap).is_some_and(|prev| model.min_lossless() <= prev);
                let held_up_to_prev =
                    s.checked_sub(model.cap).map_or(0, |prev| model.held().range(..=prev).count());
                let want = model.publish();
                match p.try_claim(&ring) {
                    Ok(claimed) => {
                        prop_assert_eq!(Ok(s), want);
                        // (a) Nobody holds what the buffer carried: nothing is overwritten
                        // under a reader.
                        let old = payload[claimed.buffer];
                        prop_assert_eq!(model.holders(old), 0, "claimed a held buffer");
                        prop_assert_eq!(claimed.prev, (old != u64::MAX).then_some(old));
                        // The position's own buffer if free, else a free spare.
                        let i = candidates.iter().position(|&b| b == claimed.buffer);
                        prop_assert!(i.is_some_and(|i| !candidate_held[i]), "not a free candidate");
                        if !candidate_held[0] {
                            prop_assert_eq!(claimed.buffer, candidates[0]);
                        }
                        payload[claimed.buffer] = s;
                        prop_assert_eq!(p.publish(&ring, s * 10, s).0, s);
                    }
                    Err(ClaimError::Blocked(blocked)) => {
                        prop_assert_eq!(Err(blocked), want);
                        prop_assert!(!p.is_claimed());
                        match blocked {
                            // (d) Only when a Lossless consumer is a lap behind...
                            Blocked::Consumers => prop_assert!(lossless_behind),
                            // ... or the position's buffer and every spare are held.
                            Blocked::Held => {
                                prop_assert!(!lossless_behind);
                                prop_assert!(candidate_held.iter().all(|&h| h));
                                prop_assert_eq!(held_up_to_prev, model.spares + 1);
                            }
                        }
                    }
                    Err(e) => prop_assert!(false, "claim failed: {:?}", e),
                }
            }
            Op::Recv(k) => {
                let Some(rc) = real[k].as_mut() else {
                    continue;
                };
                let head = model.head;
                let want = model.recv(k);
                let got = rc.core.try_pin(&ring).unwrap().map(|(m, _)| m);
                match (got, want) {
                    (None, None) => {}
                    (Some(m), Some((seq, lag))) => {
                        prop_assert_eq!(m.seq, seq);
                        prop_assert_eq!(m.lag, lag);
                        // (a) at pin time.
                        prop_assert_eq!(payload[m.buffer], seq, "pinned a buffer with other data");
                        prop_assert_eq!((m.len, m.timestamp_ns), (seq * 10, seq));
                        prop_assert_eq!(ring.buffer_of(seq), Some(m.buffer));
                        match rc.core.mode() {
                            // (c)
                            Mode::Lossless => prop_assert_eq!(m.lag, 0, "Lossless lost a message"),
                            // (e)
                            Mode::Latest => prop_assert_eq!(m.seq, head - 1, "Latest not newest"),
                            Mode::Queue => {}
                        }
                        rc.pins.push(m);
                        rc.received += 1;
                        rc.lag += m.lag;
                        rc.last = Some(m.seq);
                    }
                    (got, want) => prop_assert!(false, "got {:?}, model {:?}", got, want),
                }
            }
            Op::Release(k, i) => {
                let Some(rc) = real[k].as_mut() else {
                    continue;
                };
                if rc.pins.is_empty() {
                    continue;
                }
                let m = rc.pins.remove(i % rc.pins.len());
                // (a) at release time.
                prop_assert_eq!(payload[m.buffer], m.seq, "held buffer was overwritten");
                rc.core.release(&ring, m.buffer).unwrap();
                let mc = model.consumers[k].as_mut().unwrap();
                mc.held.retain(|&s| s != m.seq);
            }
            Op::Join(k, start, mode) => {
                if real[k].is_some() {
                    continue;
                }
                let start = [StartAt::Next, StartAt::Newest, StartAt::Oldest][start as usize];
                let mode = [policy.default_mode(), Mode::Lossless, Mode::Queue, Mode::Latest]
                    [mode as usize];
                let core = ConsumerCore::join(&ring, start, mode, k as u32 + 1, 1).unwrap();
                let mut cursor = match start {
                    StartAt::Next => model.head,
                    StartAt::Newest => model.head.saturating_sub(1),
                    StartAt::Oldest => model.oldest(),
                };
                if mode == Mode::Lossless {
                    cursor = cursor.max((model.head + 1).saturating_sub(model.cap));
                }
                prop_assert_eq!(core.cursor(), cursor);
                prop_assert_eq!(core.mode(), mode);
                model.consumers[k] = Some(ModelConsumer {
                    mode,
                    start: cursor,
                    cursor,
                    held: vec![],
                    received: 0,
                    lost: 0,
                });
                real[k] = Some(Real { core, pins: vec![], received: 0, lag: 0, last: None });
            }
            Op::Leave(k) => {
                let Some(rc) = real[k].take() else {
                    continue;
                };
                for m in &rc.pins {
                    prop_assert_eq!(payload[m.buffer], m.seq, "held buffer was overwritten");
                }
                // What it still holds, leaving gives back.
                let left = rc.core.leave(&ring, Leave::Free);
                prop_assert_eq!((left.released as usize, left.retiring), (rc.pins.len(), None));
                prop_assert_eq!(lease_state(&ring, rc.core.index()), lease::FREE);
                model.consumers[k] = None;
            }
            Op::Die(k) => {
                let Some(rc) = real[k].take() else {
                    continue;
                };
                // Consumer `k` is process `k + 1`.
                let r = reap(&ring, |_, pid| pid != k as u32 + 1, |_, _| {}, Recount::Yes);
                let holds = rc.pins.len() as u32;
                let want = Reaped { dead: 1, freed: 1, holds, wake_consumers: false };
                prop_assert_eq!(r, Ok(want));
                prop_assert_eq!(lease_state(&ring, rc.core.index()), lease::FREE);
                model.consumers[k] = None;
            }
        }
        check_state(&ring, &p, &model, &real, &payload)?;
    }
    Ok(())
}

/// What must hold between any two operations.
fn check_state(
    ring: &Ring<'_>,
    p: &ProducerCore,
    model: &Model,
    real: &[Option<Real>],
    payload: &[u64],
) -> Result<(), TestCaseError> {
    let head = model.head;
    prop_assert_eq!(p.next_seq(), head);
    prop_assert_eq!(ring.producer.head.load(Ordering::Relaxed), head);
    // Every buffer carries the message its payload says, is not being written, and is held by
    // exactly the consumers that hold that message.
    for (b, line) in ring.buffers.iter().enumerate() {
        let st = line.stamp.load(Ordering::Relaxed);
        prop_assert!(!stamp::is_writing(st), "buffer {} left WRITING", b);
        if payload[b] == u64::MAX {
            prop_assert_eq!(st, stamp::initial(b as u32, ring.buffers.len() as u32));
        } else {
            prop_assert_eq!(stamp::tag_diff(stamp::tag(st), payload[b]), 0, "buffer {}", b);
            prop_assert_eq!(stamp::held(st), model.holders(payload[b]), "buffer {}", b);
        }
    }
    // The held messages that left the ring fit in the spares.
    let oldest = model.oldest();
    prop_assert!(model.held().range(..oldest).count() <= model.spares);
    // The ring retains the last `cap` messages, each in a buffer of its own, and no other.
    for seq in oldest..head {
        let b = ring.buffer_of(seq);
        prop_assert!(b.is_some_and(|b| payload[b] == seq), "message {} at {:?}", seq, b);
    }
    for seq in oldest.saturating_sub(model.cap)..oldest {
        prop_assert_eq!(ring.buffer_of(seq), None, "message {} still found", seq);
    }
    prop_assert_eq!(ring.buffer_of(head), None);
    // The next claim's candidates and the buffers of the messages it does not lap are every
    // buffer once (when every position has been written, or is the next).
    let mut all: Vec<usize> = p.candidates(ring).collect();
    prop_assert_eq!(all.len(), model.spares + 1);
    if head + 1 >= model.cap {
        all.extend(
            ((head + 1).saturating_sub(model.cap)..head).map(|s| ring.buffer_of(s).unwrap()),
        );
        all.sort_unstable();
        prop_assert_eq!(all, (0..ring.buffers.len()).collect::<Vec<_>>());
    }
    prop_assert_eq!(min_lossless_cursor(ring, head), model.min_lossless());
    for (k, (rc, mc)) in real.iter().zip(&model.consumers).enumerate() {
        let (rc, mc) = match (rc, mc) {
            (None, None) => continue,
            (Some(rc), Some(mc)) => (rc, mc),
            _ => unreachable!(),
        };
        let cursor = rc.core.cursor();
        prop_assert_eq!(cursor, mc.cursor, "consumer {}", k);
        prop_assert_eq!(ring.consumers[rc.core.index()].cursor.load(Ordering::Relaxed), cursor);
        // (b) Received + lost = how far its cursor moved since it joined.
        prop_assert_eq!(mc.received + mc.lost, mc.cursor - mc.start);
        prop_assert_eq!(rc.received + rc.lag, cursor - mc.start, "consumer {}", k);
        if let Some(last) = rc.last {
            prop_assert_eq!(last + 1, cursor);
        }
        prop_assert_eq!(stats(ring, &rc.core), (rc.received, rc.lag, rc.pins.len() as u64));
        // (c)
        if mc.mode == Mode::Lossless {
            prop_assert_eq!(rc.lag, 0);
        }
        // (a) between operations.
        for m in &rc.pins {
            prop_assert_eq!(payload[m.buffer], m.seq, "held buffer was overwritten");
        }
        let mut held: Vec<u64> = rc.pins.iter().map(|m| m.seq).collect();
        held.sort_unstable();
        prop_assert_eq!(&held, &mc.held);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn block_matches_model(
        cap in 1u32..6,
        spares in 0u32..4,
        ops in proptest::collection::vec(op(), 1..200),
    ) {
        run_model(Policy::Block, cap, spares, ops)?;
    }

    #[test]
    fn overwrite_matches_model(
        cap in 1u32..6,
        spares in 0u32..4,
        ops in proptest::collection::vec(op(), 1..200),
    ) {
        run_model(Policy::Overwrite, cap, spares, ops)?;
    }
}

/// Reaps with consumer pid `dead` taken for dead and every other pid for alive.
fn reap_dead(ring: &Ring<'_>, dead: u32) -> Reaped {
    reap(ring, |_, pid| pid != dead, |_, _| {}, Recount::Yes).unwrap()
}

fn lease_state(ring: &Ring<'_>, entry: usize) -> u32 {
    lease::state(ring.consumers[entry].lease.load(Ordering::Relaxed))
}

/// A consumer that dies holding a buffer: reaping it ungates the producer under both policies,
/// gives the buffer back and leaves a live consumer's hold alone.
#[test]
fn reap_gives_back_a_dead_consumers_holds() {
    for policy in [Policy::Block, Policy::Overwrite] {
        let heap = HeapRing::new(2, 0, 3, policy);
        let ring = heap.ring();
        let mut p = ProducerCore::new(&ring);
        let mut payload = [u64::MAX; 2];
        let dead = join(&ring, StartAt::Next, 1);
        let live = join(&ring, StartAt::Next, 2);
        publish(&mut p, &ring, &mut payload).unwrap();
        publish(&mut p, &ring, &mut payload).unwrap();
        let (d0, _) = dead.try_pin(&ring).unwrap().unwrap();
        let (l0, _) = live.try_pin(&ring).unwrap().unwrap();
        assert_eq!((d0.buffer, l0.buffer), (0, 0));
        assert_eq!(stamp::held(ring.buffers[0].stamp.load(Ordering::Relaxed)), 2);
        live.release(&ring, l0.buffer).unwrap();
        // `dead` dies holding buffer 0 (and at cursor 1), and there is no spare: the producer is
        // stuck.
        assert!(publish(&mut p, &ring, &mut payload).is_err());
        let r = reap_dead(&ring, 1);
        assert_eq!((r.dead, r.freed, r.holds), (1, 1, 1));
        assert_eq!(lease_state(&ring, dead.index()), lease::FREE);
        assert_eq!(ring.producer.reclaims.load(Ordering::Relaxed), 1);
        let (l1, _) = live.try_pin(&ring).unwrap().unwrap();
        assert_eq!(l1.seq, 1);
        assert_eq!(publish(&mut p, &ring, &mut payload), Ok(2));
        // The live consumer's hold of buffer 1 survives a second reap.
        assert_eq!(reap_dead(&ring, 1), Reaped::default());
        assert_eq!(publish(&mut p, &ring, &mut payload), BLOCKED_HELD);
        live.release(&ring, l1.buffer).unwrap();
        assert_eq!(publish(&mut p, &ring, &mut payload), Ok(3));
    }
}

/// A dead consumer's hold of a buffer that left the ring (swapped out for a spare while it
/// held it) is given back too: the buffer is a free spare again.
#[test]
fn reap_gives_back_a_swapped_out_buffer() {
    let heap = HeapRing::new(1, 1, 2, Policy::Overwrite);
    let ring = heap.ring();
    let mut p = ProducerCore::new(&ring);
    let mut payload = [u64::MAX; 2];
    let dead = join(&ring, StartAt::Next, 1);
    let live = join(&ring, StartAt::Next, 2);
    publish(&mut p, &ring, &mut payload).unwrap();
    let d0 = pin(&dead, &ring);
    assert_eq!(take(&live, &ring, &payload), (0, 0));
    // Message 1 takes the spare; buffer 0 leaves the ring with message 0, held by `dead`.
    let claimed = publish_claimed(&mut p, &ring, &mut payload);
    assert_eq!(claimed, Ok(Claimed { buffer: 1, prev: None }));
    let l1 = pin(&live, &ring);
    // Message 2: its position's buffer (1) and the spare (0) are held.
    assert_eq!(p.candidates(&ring).collect::<Vec<_>>(), vec![1, 0]);
    assert_eq!(publish(&mut p, &ring, &mut payload), BLOCKED_HELD);
    // An audit finds the spare's count right while `dead` is alive.
    assert_eq!(audit(&ring, d0.buffer), Ok((false, false)));
    assert_eq!(held(&ring, d0.buffer), 1);
    // `dead` dies: its hold of the spare comes back.
    let r = reap_dead(&ring, 1);
    assert_eq!((r.dead, r.freed, r.holds), (1, 1, 1));
    assert_eq!(ring.buffers[0].stamp.load(Ordering::Relaxed), stamp::ready(0, 0));
    let claimed = publish_claimed(&mut p, &ring, &mut payload);
    assert_eq!(claimed, Ok(Claimed { buffer: 0, prev: Some(0) }));
    assert_eq!(payload[l1.buffer], 1);
    live.release(&ring, l1.buffer).unwrap();
    assert_eq!(take(&live, &ring, &payload), (2, 0));
}

/// Death at every step of pin and release: the recount from live records is right whether or
/// not the dead consumer's CAS happened.
#[test]
fn reap_handles_death_between_record_and_cas() {
    use super::hold::{record, HELD, PINNING, RELEASING};
    // (record the dead one leaves, whether its CAS on the stamp happened)
    let cases = [(PINNING, false), (PINNING, true), (HELD, true), (RELEASING, true)];
    for (state, cas_done) in cases {
        let heap = HeapRing::new(1, 0, 2, Policy::Overwrite);
        let ring = heap.ring();
        let mut p = ProducerCore::new(&ring);
        let mut payload = [u64::MAX; 1];
        let dead = join(&ring, StartAt::Next, 1);
        publish(&mut p, &ring, &mut payload).unwrap();
        let line = &ring.buffers[0].stamp;
        let st = line.load(Ordering::Relaxed);
        // Forge the dead consumer's last steps by hand.
        ring.hold(dead.index(), 0).store(record(0, state), Ordering::Relaxed);
        let holds_it = cas_done && state != RELEASING;
        if holds_it {
            line.store(st + 1, Ordering::Relaxed);
        }
        let r = reap_dead(&ring, 1);
        assert_eq!((r.freed, r.holds), (1, holds_it as u32), "{state} {cas_done}");
        assert_eq!(stamp::held(line.load(Ordering::Relaxed)), 0);
        assert_eq!(ring.hold(dead.index(), 0).load(Ordering::Relaxed), 0);
        assert_eq!(publish(&mut p, &ring, &mut payload), Ok(1));
    }
}

/// A live consumer caught between its record and its CAS makes the reclaim wait for it.
#[test]
fn reap_waits_for_a_live_consumer_mid_pin() {
    use super::hold::{record, PINNING};
    let heap = HeapRing::new(1, 0, 2, Policy::Overwrite);
    let ring = heap.ring();
    let mut p = ProducerCore::new(&ring);
    let mut payload = [u64::MAX; 1];
    let dead = join(&ring, StartAt::Next, 1);
    let live = join(&ring, StartAt::Next, 2);
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
    assert_eq!((r.dead, r.freed, r.holds), (0, 1, 1));
    assert_eq!(stamp::held(ring.buffers[0].stamp.load(Ordering::Relaxed)), 1);
    live.release(&ring, l.buffer).unwrap();
    assert_eq!(publish(&mut p, &ring, &mut payload), Ok(1));
    let _ = d;
}

/// A joiner whose start time is not stored yet keeps its entry: the reaper asks about the entry
/// (whose liveness lock the joiner holds from before its claim), not about a start time.
#[test]
fn reap_asks_about_an_unfinished_claim_by_its_entry() {
    let heap = HeapRing::new(1, 0, 1, Policy::Block);
    let ring = heap.ring();
    let joining = ConsumerCore::claim(&ring, 7, 77).unwrap();
    // As if the reaper looked between the claim CAS and the start time store.
    ring.consumers[0].start_time.store(0, Ordering::Relaxed);
    let seen = std::cell::Cell::new(None);
    let r = reap(
        &ring,
        |entry, pid| {
            seen.set(Some((entry, pid)));
            entry == 0
        },
        |_, _| {},
        Recount::Yes,
    )
    .unwrap();
    assert_eq!(seen.get(), Some((0, 7)));
    assert_eq!(r, Reaped::default());
    assert!(joining.activate(&ring, StartAt::Next, Mode::Lossless).is_ok());
    assert_eq!(lease_state(&ring, 0), lease::ACTIVE);
}

/// A lease observed before its owner left and someone else joined is stale: reaping from it
/// must not touch the new owner, even if the old owner is dead by now.
#[test]
fn reap_acts_only_on_the_lease_it_observed() {
    let heap = HeapRing::new(1, 0, 1, Policy::Block);
    let ring = heap.ring();
    let first = join(&ring, StartAt::Next, 3);
    let old = ring.consumers[0].lease.load(Ordering::Relaxed);
    // While a reaper probes pid 3, it leaves (and dies), and pid 2 joins the same entry.
    let reaper = reap(
        &ring,
        |_, pid| {
            if pid == 3 && lease_state(&ring, 0) == lease::ACTIVE {
                first.leave(&ring, Leave::Free);
                let _ = join(&ring, StartAt::Next, 2);
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
/// stamp) leaves the buffer READY, not frozen for ever, and is not fatal.
#[test]
fn a_recount_that_cannot_trust_the_count_unfreezes_the_buffer() {
    use super::hold::{record, HELD};
    let heap = HeapRing::new(1, 0, 3, Policy::Overwrite);
    let ring = heap.ring();
    let mut p = ProducerCore::new(&ring);
    let mut payload = [u64::MAX; 1];
    let dead = join(&ring, StartAt::Next, 1);
    let a = join(&ring, StartAt::Next, 2);
    let b = join(&ring, StartAt::Next, 2);
    publish(&mut p, &ring, &mut payload).unwrap();
    dead.try_pin(&ring).unwrap().unwrap();
    // Two live records say HELD(0), but the stamp counts only the dead one's hold.
    ring.hold(a.index(), 0).store(record(0, HELD), Ordering::Relaxed);
    ring.hold(b.index(), 0).store(record(0, HELD), Ordering::Relaxed);
    assert!(reap(&ring, |_, pid| pid != 1, |_, _| {}, Recount::Yes).is_ok());
    let st = ring.buffers[0].stamp.load(Ordering::Relaxed);
    assert!(!stamp::is_writing(st), "the recount left buffer 0 frozen");
    assert_eq!(stamp::held(st), 1);
}

/// Consumers that found a buffer frozen by a recount may have gone to sleep: a reap that froze
/// one says to wake them, and bumps their futex word.
#[test]
fn a_reap_that_froze_a_buffer_wakes_sleeping_consumers() {
    let heap = HeapRing::new(2, 0, 2, Policy::Overwrite);
    let ring = heap.ring();
    let mut p = ProducerCore::new(&ring);
    let mut payload = [u64::MAX; 2];
    let dead = join(&ring, StartAt::Next, 1);
    publish(&mut p, &ring, &mut payload).unwrap();
    dead.try_pin(&ring).unwrap().unwrap();
    // A consumer sleeps on the consumer line.
    ring.consumer_wake.sleepers.fetch_add(1, Ordering::Relaxed);
    let word = ring.consumer_wake.word.load(Ordering::Relaxed);
    let r = reap_dead(&ring, 1);
    assert!(r.wake_consumers);
    assert_ne!(ring.consumer_wake.word.load(Ordering::Relaxed), word);
}

/// A consumer that leaks a read slot (never releases its message) and then leaves gives the
/// buffer back: the producer (with no spare) is not wedged.
#[test]
fn leaving_gives_back_leaked_holds() {
    for policy in [Policy::Block, Policy::Overwrite] {
        let heap = HeapRing::new(1, 0, 1, policy);
        let ring = heap.ring();
        let mut p = ProducerCore::new(&ring);
        let mut payload = [u64::MAX; 1];
        let c = join(&ring, StartAt::Next, 1);
        publish(&mut p, &ring, &mut payload).unwrap();
        let _leaked = c.try_pin(&ring).unwrap().unwrap();
        assert_eq!(publish(&mut p, &ring, &mut payload), BLOCKED_HELD);
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
    let heap = HeapRing::new(2, 0, 2, Policy::Block);
    let ring = heap.ring();
    let mut p = ProducerCore::new(&ring);
    let mut payload = [u64::MAX; 2];
    let bad = join(&ring, StartAt::Next, 1);
    let good = join(&ring, StartAt::Next, 2);
    publish(&mut p, &ring, &mut payload).unwrap();
    publish(&mut p, &ring, &mut payload).unwrap();
    let (m, _) = bad.try_pin(&ring).unwrap().unwrap();
    for _ in 0..2 {
        let (g, _) = good.try_pin(&ring).unwrap().unwrap();
        good.release(&ring, g.buffer).unwrap();
    }
    // `bad` holds buffer 0, which message 2 needs (no spare).
    assert_eq!(publish(&mut p, &ring, &mut payload), BLOCKED_HELD);
    let seen = ring.consumers[bad.index()].lease.load(Ordering::Relaxed);
    assert!(evict(&ring, bad.index(), seen, lease::evict_reason::RELEASE_EVENT));
    assert_eq!(ring.producer.evictions.load(Ordering::Relaxed), 1);
    p.forget_min_cursor();
    // Evicted, its hold of buffer 0 still counts.
    assert_eq!(publish(&mut p, &ring, &mut payload), BLOCKED_HELD);
    let expect = RingCorrupt::Evicted {
        entry: bad.index() as u32,
        reason: lease::evict_reason::RELEASE_EVENT,
    };
    assert_eq!(bad.try_pin(&ring), Err(expect));
    // Its release still counts down; then message 3 overwrites message 1, which `bad` (at
    // cursor 1) has not read: it no longer gates the producer.
    bad.release(&ring, m.buffer).unwrap();
    assert_eq!(publish(&mut p, &ring, &mut payload), Ok(2));
    let (g, _) = good.try_pin(&ring).unwrap().unwrap();
    good.release(&ring, g.buffer).unwrap();
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
/// the release both (the buffer would be overwritten under the other reader).
#[test]
fn eviction_and_a_release_in_flight_take_one_hold_away_not_two() {
    let heap = HeapRing::new(1, 0, 2, Policy::Overwrite);
    let ring = heap.ring();
    let mut p = ProducerCore::new(&ring);
    let mut payload = [u64::MAX; 1];
    let evicted = join(&ring, StartAt::Next, 1);
    let reader = join(&ring, StartAt::Next, 2);
    publish(&mut p, &ring, &mut payload).unwrap();
    let (e, _) = evicted.try_pin(&ring).unwrap().unwrap();
    let (r, _) = reader.try_pin(&ring).unwrap().unwrap();
    let seen = ring.consumers[evicted.index()].lease.load(Ordering::Relaxed);
    assert!(evict(&ring, evicted.index(), seen, lease::evict_reason::RELEASE_EVENT));
    // Reaps and audits while the evicted one lives, then its release (in flight since before
    // the eviction) lands.
    reap(&ring, |_, _| true, |_, _| {}, Recount::Yes).unwrap();
    audit(&ring, 0).unwrap();
    evicted.release(&ring, e.buffer).unwrap();
    reap(&ring, |_, _| true, |_, _| {}, Recount::Yes).unwrap();
    assert_eq!(stamp::held(ring.buffers[0].stamp.load(Ordering::Relaxed)), 1);
    assert_eq!(publish(&mut p, &ring, &mut payload), BLOCKED_HELD);
    reader.release(&ring, r.buffer).unwrap();
    assert_eq!(publish(&mut p, &ring, &mut payload), Ok(1));
}

/// A buffer frozen by a recount is told apart from one the producer writes: a consumer that
/// finds the ring closed must not take its next message, published but frozen (held or not:
/// a producer killed mid-recount after every holder released leaves `WRITING` with held 0),
/// for "nothing left". Thawing takes a freeze away and leaves a producer's claim alone.
#[test]
fn a_frozen_buffer_is_not_an_empty_one() {
    let heap = HeapRing::new(1, 0, 2, Policy::Overwrite);
    let ring = heap.ring();
    let mut p = ProducerCore::new(&ring);
    let mut payload = [u64::MAX; 1];
    let late = join(&ring, StartAt::Next, 2);
    publish(&mut p, &ring, &mut payload).unwrap();
    let line = &ring.buffers[0].stamp;
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
    late.release(&ring, m.buffer).unwrap();
    // Nothing published past the cursor: not there.
    assert!(!late.next_is_there(&ring));
    // A producer's own claim of the next message is not a freeze, and thawing leaves it alone.
    p.try_claim(&ring).unwrap();
    assert!(stamp::is_writing(line.load(Ordering::Relaxed)));
    assert!(!late.next_is_there(&ring));
    thaw(&ring, late.next_seq());
    assert!(stamp::is_writing(line.load(Ordering::Relaxed)));
}

/// `buffer_of`, `next_is_there` and `thaw` follow the position word to the buffer it names,
/// which with spares need not be the position's own: a frozen spare swapped in is found, thawed
/// and pinned; a held buffer swapped out is no longer in the ring and is left alone.
#[test]
fn a_frozen_swapped_in_buffer_is_not_an_empty_one() {
    let heap = HeapRing::new(1, 1, 2, Policy::Overwrite);
    let ring = heap.ring();
    let mut p = ProducerCore::new(&ring);
    let mut payload = [u64::MAX; 2];
    let holder = join(&ring, StartAt::Next, 1);
    let late = join(&ring, StartAt::Next, 2);
    publish(&mut p, &ring, &mut payload).unwrap();
    let h = pin(&holder, &ring);
    assert_eq!(ring.buffer_of(0), Some(0));
    assert_eq!(take(&late, &ring, &payload), (0, 0));
    // Message 1's position names buffer 0, held: the spare, buffer 1, takes its place.
    let claimed = publish_claimed(&mut p, &ring, &mut payload);
    assert_eq!(claimed, Ok(Claimed { buffer: 1, prev: None }));
    assert_eq!((ring.buffer_of(0), ring.buffer_of(1), ring.buffer_of(2)), (None, Some(1), None));
    let line = &ring.buffers[1].stamp;
    for held in [1, 0] {
        // Frozen by a recount, as one in progress (or killed) leaves it.
        line.store(stamp::ready(1, held) | stamp::WRITING, Ordering::Relaxed);
        assert_eq!(ring.buffer_of(1), Some(1));
        assert_eq!(late.try_pin(&ring), Ok(None));
        assert!(late.next_is_there(&ring), "held {held}");
        thaw(&ring, late.next_seq());
        assert_eq!(line.load(Ordering::Relaxed), stamp::ready(1, held));
    }
    // Message 0, swapped out, is not thawed or found through its sequence number.
    thaw(&ring, 0);
    assert_eq!(ring.buffers[0].stamp.load(Ordering::Relaxed), stamp::ready(0, 1));
    let m = pin(&late, &ring);
    assert_eq!((m.seq, m.lag, m.buffer, payload[m.buffer]), (1, 0, 1, 1));
    late.release(&ring, m.buffer).unwrap();
    // Nothing published past the cursor: not there.
    assert!(!late.next_is_there(&ring));
    // The producer's claim of message 2 (position 0 names buffer 1 now) is not a freeze, and
    // thawing leaves it alone.
    assert_eq!(p.try_claim(&ring), Ok(Claimed { buffer: 1, prev: Some(1) }));
    assert_eq!(line.load(Ordering::Relaxed), stamp::writing(2));
    assert_eq!((ring.buffer_of(1), ring.buffer_of(2)), (None, None));
    assert!(!late.next_is_there(&ring));
    thaw(&ring, 1);
    thaw(&ring, 2);
    assert_eq!(line.load(Ordering::Relaxed), stamp::writing(2));
    assert_eq!(payload[h.buffer], 0);
    holder.release(&ring, h.buffer).unwrap();
}

/// A retiring consumer's entry is freed only after the producer dropped what it opened of it
/// (`on_free`), and the owner can tell when; or it can give up and free it itself.
#[test]
fn retiring_waits_for_the_producer() {
    let heap = HeapRing::new(1, 0, 2, Policy::Block);
    let ring = heap.ring();
    let a = join(&ring, StartAt::Next, 1);
    let b = join(&ring, StartAt::Next, 2);
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

/// A claim takes an entry's liveness lock before its CAS: an entry whose lock another holds is
/// skipped, and the lock of an entry whose CAS fails is let go.
#[test]
fn claim_holds_the_entry_lock_first() {
    let heap = HeapRing::new(1, 0, 3, Policy::Block);
    let ring = heap.ring();
    let held = std::cell::RefCell::new(vec![0usize]); // entry 0: someone else's lock
    let let_go = std::cell::RefCell::new(Vec::new());
    let joining = ConsumerCore::claim_held(
        &ring,
        5,
        55,
        |entry| {
            let mut h = held.borrow_mut();
            if h.contains(&entry) {
                return false;
            }
            h.push(entry);
            // As if another joiner took entry 1 between our load and our CAS.
            if entry == 1 {
                let free = ring.consumers[1].lease.load(Ordering::Relaxed);
                ring.consumers[1].lease.store(lease::claimed(free, 6), Ordering::Relaxed);
            }
            true
        },
        |entry| let_go.borrow_mut().push(entry),
    )
    .unwrap();
    assert_eq!(joining.index(), 2, "entry 0 is locked, entry 1 was taken under us");
    assert_eq!(*let_go.borrow(), vec![1], "the lost entry's lock is let go");
    assert!(held.borrow().contains(&2));
}
