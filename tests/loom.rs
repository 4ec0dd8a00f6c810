//! Loom model of the ring protocol: 1 producer and 1 or 2 consumers on a small ring, every
//! interleaving (up to loom's preemption bound). The payload is a loom `UnsafeCell` per buffer,
//! so loom also proves that no consumer read races with a producer write, and every consumer
//! checks that a message it pinned carries its own payload.
//!
//! The models of the first part were written when a position and its buffer were one slot; they
//! run with no spare buffer (`spares = 0`), where a held buffer blocks the producer as a held slot
//! did. The models after "Spare buffers and delivery modes" run with spares.
//!
//! Run: `RUSTFLAGS="--cfg loom" cargo test --release --test loom`. Deeper runs: raise
//! `LOOM_MAX_PREEMPTIONS` (CI uses 1), and set `GPURING_LOOM_DEEP=1` for the larger variants of
//! the 2-thread spare-buffer models (more messages and laps: about a minute more in all).
#![cfg(loom)]

use loom::cell::UnsafeCell;
use loom::sync::atomic::AtomicBool;
use loom::sync::{Arc, Notify};
use loom::thread;
use std::sync::atomic::Ordering::SeqCst;

use gpuring::ring::producer::ClaimError;
use gpuring::ring::{
    evict, hold, lease, reap, stamp, Blocked, ConsumerCore, HeapRing, Leave, Mode, Pinned, Policy,
    ProducerCore, Recount, StartAt,
};

struct Shared {
    ring: HeapRing,
    /// One payload word per buffer (`capacity + spares`).
    payload: Vec<UnsafeCell<u64>>,
    /// Stand-ins for the futex: a waiting thread blocks on its `Notify` (so loom does not
    /// explore spin iterations); the other side notifies after every change it makes.
    producer_wait: Notify,
    consumer_wait: [Notify; 2],
}

/// Loom's builder, with preemption bound 2 unless LOOM_MAX_PREEMPTIONS says otherwise.
fn builder() -> loom::model::Builder {
    let mut builder = loom::model::Builder::new();
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = Some(2);
    }
    builder
}

/// Whether to run the larger variants of the spare-buffer models (`GPURING_LOOM_DEEP=1`).
fn deep() -> bool {
    std::env::var_os("GPURING_LOOM_DEEP").is_some_and(|v| v != "0")
}

impl Shared {
    /// A ring of `capacity` positions and `capacity + spares` buffers, for 2 consumers.
    fn new(capacity: u32, spares: u32, policy: Policy) -> Arc<Shared> {
        Arc::new(Shared {
            ring: HeapRing::new(capacity, spares, 2, policy),
            payload: (0..capacity + spares).map(|_| UnsafeCell::new(u64::MAX)).collect(),
            producer_wait: Notify::new(),
            consumer_wait: [Notify::new(), Notify::new()],
        })
    }

    /// Reads a pinned message's payload (loom reports a race with a producer write) and checks
    /// that it, and the published length, are the message's.
    fn check(&self, m: &Pinned) {
        // SAFETY: loom's cell; a read that races a write is reported, not undefined.
        let v = self.payload[m.buffer].with(|p| unsafe { *p });
        assert_eq!(v, m.seq, "message {} pinned in buffer {} carries {v}", m.seq, m.buffer);
        assert_eq!(m.len, m.seq + 100, "message {} has another's length", m.seq);
    }
}

/// The producer of a model: its core, and which message each buffer last carried, to check
/// what each claim says the buffer carried before (`Claimed::prev`).
struct Writer {
    core: ProducerCore,
    last: Vec<Option<u64>>,
}

impl Writer {
    fn new(shared: &Shared) -> Writer {
        let ring = shared.ring.ring();
        Writer { core: ProducerCore::new(&ring), last: vec![None; ring.buffers.len()] }
    }

    /// Claims the next message's buffer; each time it is blocked, calls `blocked` (which waits,
    /// or panics where the model says it cannot be blocked) and tries again.
    fn claim(&mut self, shared: &Shared, mut blocked: impl FnMut(Blocked)) -> usize {
        let ring = shared.ring.ring();
        let seq = self.core.next_seq();
        let claimed = loop {
            match self.core.try_claim(&ring) {
                Ok(claimed) => break claimed,
                Err(ClaimError::Blocked(why)) => blocked(why),
                Err(ClaimError::Corrupt(c)) => panic!("{c}"),
            }
        };
        let b = claimed.buffer;
        assert_eq!(claimed.prev, self.last[b], "claim of {seq}: what buffer {b} carried");
        self.last[b] = Some(seq);
        b
    }

    /// Writes the next message's payload (its sequence number) into `buffer`, claimed for it,
    /// publishes it with length `seq + 100` and wakes the consumers.
    fn publish(&mut self, shared: &Shared, buffer: usize) {
        let seq = self.core.next_seq();
        // SAFETY: loom's cell; a write that races a read is reported, not undefined.
        shared.payload[buffer].with_mut(|p| unsafe { *p = seq });
        self.core.publish(&shared.ring.ring(), seq + 100, 0);
        shared.consumer_wait.iter().for_each(Notify::notify);
    }
}

/// Pins the consumer's next message, waiting on `wait` while there is none.
fn pin(core: &ConsumerCore, shared: &Shared, wait: &Notify) -> Pinned {
    let ring = shared.ring.ring();
    loop {
        match core.try_pin(&ring).unwrap() {
            None => wait.wait(),
            Some((m, _)) => {
                shared.producer_wait.notify();
                return m;
            }
        }
    }
}

/// Releases a pinned message and tells the producer.
fn release(core: &ConsumerCore, shared: &Shared, m: &Pinned) {
    core.release(&shared.ring.ring(), m.buffer).unwrap();
    shared.producer_wait.notify();
}

/// What a consumer counted of what it pinned.
#[derive(Default)]
struct Tally {
    received: u64,
    lost: u64,
}

impl Tally {
    /// Checks a message pinned when the cursor was `before`: the cursor moved by the lag it
    /// reports plus the one received, so received + lost always equals the cursor's movement.
    fn add(&mut self, core: &ConsumerCore, before: u64, m: &Pinned) {
        assert_eq!(m.seq, before + m.lag, "message {} after cursor {before}, lag {}", m.seq, m.lag);
        assert_eq!(core.cursor(), m.seq + 1);
        self.received += 1;
        self.lost += m.lag;
    }

    /// Checks the totals against the consumer's statistics and its cursor's movement since
    /// `start`.
    fn finish(&self, core: &ConsumerCore, shared: &Shared, start: u64) {
        let ring = shared.ring.ring();
        core.write_stats(&ring);
        let entry = &ring.consumers[core.index()];
        assert_eq!(entry.received.load(SeqCst), self.received);
        assert_eq!(entry.lost.load(SeqCst), self.lost);
        assert_eq!(entry.holding.load(SeqCst), 0);
        assert_eq!(self.received + self.lost, core.cursor() - start);
    }
}

/// Two consumers of the ring's default mode read every message (Block: all of them, in order;
/// Overwrite: every one they do not lose) while the producer publishes `messages`.
fn model(policy: Policy, capacity: u32, spares: u32, messages: u64) {
    builder().check(move || {
        let shared = Shared::new(capacity, spares, policy);
        // Join before the producer starts, so that Block must deliver every message.
        let consumers: Vec<_> = (0..2)
            .map(|_| {
                let ring = shared.ring.ring();
                ConsumerCore::join(&ring, StartAt::Next, policy.default_mode(), 1, 1).unwrap()
            })
            .collect();
        let handles: Vec<_> = consumers
            .into_iter()
            .enumerate()
            .map(|(k, core)| {
                let shared = shared.clone();
                thread::spawn(move || {
                    let mut tally = Tally::default();
                    let mut next = 0;
                    while next < messages {
                        let before = core.cursor();
                        let m = pin(&core, &shared, &shared.consumer_wait[k]);
                        tally.add(&core, before, &m);
                        assert_eq!(m.seq, next + m.lag);
                        if policy == Policy::Block {
                            assert_eq!(m.lag, 0);
                        }
                        // The buffer is pinned: reading it must not race the producer.
                        shared.check(&m);
                        next = m.seq + 1;
                        release(&core, &shared, &m);
                    }
                    tally.finish(&core, &shared, 0);
                    core.leave(&shared.ring.ring(), Leave::Free);
                    shared.producer_wait.notify();
                })
            })
            .collect();
        let mut w = Writer::new(&shared);
        for _ in 0..messages {
            let b = w.claim(&shared, |_| shared.producer_wait.wait());
            w.publish(&shared, b);
        }
        for h in handles {
            h.join().unwrap();
        }
    });
}

// No spares: a held buffer blocks the producer, as a held slot did before positions and buffers
// were decoupled.

#[test]
fn block_two_slots() {
    model(Policy::Block, 2, 0, 3);
}

#[test]
fn overwrite_two_slots() {
    model(Policy::Overwrite, 2, 0, 3);
}

#[test]
fn block_one_slot() {
    model(Policy::Block, 1, 0, 2);
}

#[test]
fn overwrite_one_slot() {
    model(Policy::Overwrite, 1, 0, 2);
}

/// Where the dying consumer stops.
#[derive(Clone, Copy)]
enum Death {
    /// After pinning message 0 completely: it holds the buffer.
    Holding,
    /// After its pin CAS, before recording HELD: its record still says PINNING.
    AfterPinCas,
    /// After its release CAS, before clearing its record: the record says RELEASING.
    AfterReleaseCas,
}

/// One live consumer reads every message (its reads must not race a producer write) while the
/// other dies at `death`. When the producer is stuck it reclaims the dead one (after it has
/// stopped, as a dead process has) and goes on. No spares: the producer must be stuck on the
/// buffer the dead one held (or, Block, on its cursor) to reclaim it.
fn model_dead(policy: Policy, capacity: u32, messages: u64, death: Death) {
    builder().check(move || {
        let shared = Shared::new(capacity, 0, policy);
        let mode = policy.default_mode();
        let live = ConsumerCore::join(&shared.ring.ring(), StartAt::Next, mode, 1, 1).unwrap();
        let dying = ConsumerCore::join(&shared.ring.ring(), StartAt::Next, mode, 2, 2).unwrap();
        let dead_index = dying.index();
        let s = shared.clone();
        let live_thread = thread::spawn(move || {
            let mut next = 0;
            while next < messages {
                let m = pin(&live, &s, &s.consumer_wait[0]);
                if policy == Policy::Block {
                    assert_eq!(m.lag, 0);
                }
                s.check(&m);
                next = m.seq + 1;
                release(&live, &s, &m);
            }
            live.leave(&s.ring.ring(), Leave::Free);
            s.producer_wait.notify();
        });
        let s = shared.clone();
        let mut dying_thread = Some(thread::spawn(move || {
            let ring = s.ring.ring();
            let m = pin(&dying, &s, &s.consumer_wait[1]);
            let record = ring.hold(dying.index(), m.buffer);
            match death {
                Death::Holding => {}
                Death::AfterPinCas => record.store(hold::record(m.seq, hold::PINNING), SeqCst),
                Death::AfterReleaseCas => {
                    dying.release(&ring, m.buffer).unwrap();
                    record.store(hold::record(m.seq, hold::RELEASING), SeqCst);
                }
            }
            // Dies here: never releases, never leaves.
        }));
        let ring = shared.ring.ring();
        let mut w = Writer::new(&shared);
        for _ in 0..messages {
            let b = w.claim(&shared, |_| match dying_thread.take() {
                // Stuck: the dying consumer is the suspect. Once it has stopped, as a dead
                // process has, reclaim it.
                Some(h) => {
                    h.join().unwrap();
                    // Pid 2 is the dead one; reap until its entry is free.
                    let free = |ring: &gpuring::ring::Ring<'_>| {
                        let l = ring.consumers[dead_index].lease.load(SeqCst);
                        lease::state(l) == lease::FREE
                    };
                    while !free(&ring) {
                        reap(&ring, |_, pid| pid != 2, |_, _| {}, Recount::Yes).unwrap();
                        thread::yield_now();
                    }
                    // Consumers that found a buffer frozen by the reclaim may wait.
                    shared.consumer_wait.iter().for_each(Notify::notify);
                }
                None => shared.producer_wait.wait(),
            });
            w.publish(&shared, b);
        }
        live_thread.join().unwrap();
        if let Some(h) = dying_thread {
            h.join().unwrap();
        }
    });
}

#[test]
fn block_consumer_dies_holding() {
    model_dead(Policy::Block, 1, 3, Death::Holding);
}

#[test]
fn overwrite_consumer_dies_after_pin_cas() {
    model_dead(Policy::Overwrite, 1, 2, Death::AfterPinCas);
}

#[test]
fn block_consumer_dies_after_release_cas() {
    model_dead(Policy::Block, 1, 3, Death::AfterReleaseCas);
}

/// A consumer whose pin found its message frozen by a recount writes no hold record while it
/// polls again: a pin writes its PINNING record only after it has seen `READY` (a record
/// written by each poll of a frozen buffer would make the recount wait it out). The recount is
/// a stamp set frozen by hand; a second thread looks at the record after the first poll.
#[test]
fn polls_of_a_frozen_buffer_write_no_record() {
    builder().check(|| {
        let shared = Shared::new(1, 0, Policy::Block);
        let ring = shared.ring.ring();
        let core = ConsumerCore::join(&ring, StartAt::Next, Mode::Queue, 1, 1).unwrap();
        let mut w = Writer::new(&shared);
        let b = w.claim(&shared, |_| panic!("a new ring has a free buffer"));
        w.publish(&shared, b);
        let line = &ring.buffers[b];
        line.stamp.store(line.stamp.load(SeqCst) | stamp::WRITING, SeqCst);
        let index = core.index();
        let polled = Arc::new(AtomicBool::new(false));
        let (s, p) = (shared.clone(), polled.clone());
        let poller = thread::spawn(move || {
            let ring = s.ring.ring();
            assert!(core.try_pin(&ring).unwrap().is_none(), "pinned a frozen message");
            p.store(true, SeqCst);
            assert!(core.try_pin(&ring).unwrap().is_none(), "pinned a frozen message");
        });
        while !polled.load(SeqCst) {
            thread::yield_now();
        }
        let record = ring.hold(index, b).load(SeqCst);
        assert_ne!(hold::state(record), hold::PINNING, "a poll of a frozen buffer wrote a record");
        poller.join().unwrap();
    });
}

/// Parking (`ring::park`), the protocol behind async receive and acquire, with the real wake
/// checks and nothing else: the doorbells are `Notify`s, which stay rung like an eventfd. Both
/// sides park on a one-position Block ring with no spare (so the producer waits both on the
/// consumer's cursor and on the buffer it holds) for every message. A lost wake-up leaves a side
/// waiting on a doorbell nobody rings, which loom reports as a deadlock.
#[test]
fn parked_waiters_are_always_rung() {
    use gpuring::ring::park;
    const MESSAGES: u64 = 2;
    builder().check(|| {
        let shared = Shared::new(1, 0, Policy::Block);
        let core =
            ConsumerCore::join(&shared.ring.ring(), StartAt::Next, Mode::Lossless, 1, 1).unwrap();
        let index = core.index();
        let consumer = {
            let shared = shared.clone();
            thread::spawn(move || {
                let ring = shared.ring.ring();
                let flag = &ring.consumers[index].parked;
                let mut next = 0;
                while next < MESSAGES {
                    let (m, wake) = match core.try_pin(&ring).unwrap() {
                        Some(got) => got,
                        None => {
                            park::park(ring.consumer_wake, Some(flag));
                            let again = core.try_pin(&ring).unwrap();
                            if again.is_none() {
                                shared.consumer_wait[0].wait();
                            }
                            park::unpark(ring.consumer_wake, Some(flag));
                            match again {
                                Some(got) => got,
                                None => continue,
                            }
                        }
                    };
                    let mut rung = wake && park::has_parked(ring.producer_wake);
                    assert_eq!(m.seq, next);
                    next += 1;
                    rung |= core.release(&ring, m.buffer).unwrap()
                        && park::has_parked(ring.producer_wake);
                    if rung {
                        shared.producer_wait.notify();
                    }
                }
                core.leave(&ring, Leave::Free);
            })
        };
        let ring = shared.ring.ring();
        let mut p = ProducerCore::new(&ring);
        for _ in 0..MESSAGES {
            let claimed = loop {
                match p.try_claim(&ring) {
                    Ok(claimed) => break claimed,
                    Err(ClaimError::Blocked(_)) => {
                        park::park(ring.producer_wake, None);
                        let again = p.try_claim(&ring);
                        if again.is_err() {
                            shared.producer_wait.wait();
                        }
                        park::unpark(ring.producer_wake, None);
                        if let Ok(claimed) = again {
                            break claimed;
                        }
                    }
                    Err(ClaimError::Corrupt(c)) => panic!("{c}"),
                }
            };
            let _ = claimed;
            let (_, wake) = p.publish(&ring, 1, 0);
            let flag = &ring.consumers[index].parked;
            if wake && park::has_parked(ring.consumer_wake) && park::is_parked(flag) {
                shared.consumer_wait[0].notify();
            }
        }
        consumer.join().unwrap();
    });
}

/// The reaper (`ring::reclaim::reap`, with a liveness oracle standing in for /proc) runs while a
/// live consumer (pid 2) joins. Whatever the interleaving, the joiner must end up owning an
/// active entry: a reaper that mistakes a half-joined entry for a dead one frees it under the
/// joiner.
#[test]
fn reap_never_frees_a_live_joiner() {
    builder().check(|| {
        let shared = Shared::new(1, 0, Policy::Block);
        let joined = Arc::new(AtomicBool::new(false));
        let (s, j) = (shared.clone(), joined.clone());
        let joiner = thread::spawn(move || {
            let ring = s.ring.ring();
            let core = ConsumerCore::join(&ring, StartAt::Next, Mode::Lossless, 2, 2).unwrap();
            j.store(true, SeqCst);
            core.index()
        });
        let ring = shared.ring.ring();
        // The joiner holds its entry's liveness lock from before its claim: alive throughout.
        let alive = |_: usize, pid: u32| pid == 2;
        while !joined.load(SeqCst) {
            reap(&ring, alive, |_, _| {}, Recount::Yes).unwrap();
            thread::yield_now();
        }
        reap(&ring, alive, |_, _| {}, Recount::Yes).unwrap();
        let index = joiner.join().unwrap();
        let l = ring.consumers[index].lease.load(SeqCst);
        assert_eq!(lease::state(l), lease::ACTIVE, "a live joiner's entry was freed by the reaper");
        assert_eq!(lease::pid(l), 2);
    });
}

/// A consumer (pid 3) leaves and then dies while another (pid 2, alive) joins into the entry it
/// left; the reaper runs throughout. The reaper may free pid 3's entry only while pid 3 owns
/// it: the live joiner must end up owning an active entry.
#[test]
fn reap_never_frees_a_reused_entry() {
    builder().check(|| {
        let shared = Shared::new(1, 0, Policy::Block);
        let dead3 = Arc::new(AtomicBool::new(false));
        let first =
            ConsumerCore::join(&shared.ring.ring(), StartAt::Next, Mode::Lossless, 3, 3).unwrap();
        let s = shared.clone();
        let d = dead3.clone();
        let joiner = thread::spawn(move || {
            let ring = s.ring.ring();
            first.leave(&ring, Leave::Free);
            d.store(true, SeqCst); // pid 3 exits
            loop {
                match ConsumerCore::join(&ring, StartAt::Next, Mode::Lossless, 2, 2) {
                    Ok(core) => return core.index(),
                    Err(_) => thread::yield_now(),
                }
            }
        });
        let ring = shared.ring.ring();
        let alive = |_: usize, pid: u32| match pid {
            2 => true,
            3 => !dead3.load(SeqCst),
            _ => false,
        };
        reap(&ring, alive, |_, _| {}, Recount::Yes).unwrap();
        let index = joiner.join().unwrap();
        let l = ring.consumers[index].lease.load(SeqCst);
        assert_eq!(lease::state(l), lease::ACTIVE, "a live joiner's entry was freed by the reaper");
        assert_eq!(lease::pid(l), 2);
    });
}

/// The producer evicts a consumer while that consumer releases a message another consumer
/// still holds (its release may be in flight past any check), then reaps and recounts the
/// buffer (`audit`): the held count must come down by that one release only, never by a recount
/// too.
#[test]
fn eviction_never_takes_a_hold_twice() {
    use gpuring::ring::stamp;
    builder().check(|| {
        let shared = Shared::new(1, 0, Policy::Overwrite);
        let ring = shared.ring.ring();
        let evicted = ConsumerCore::join(&ring, StartAt::Next, Mode::Queue, 1, 1).unwrap();
        let reader = ConsumerCore::join(&ring, StartAt::Next, Mode::Queue, 2, 2).unwrap();
        let mut p = ProducerCore::new(&ring);
        p.try_claim(&ring).unwrap();
        p.publish(&ring, 1, 0);
        let (e, _) = evicted.try_pin(&ring).unwrap().unwrap();
        let (r, _) = reader.try_pin(&ring).unwrap().unwrap();
        assert_eq!(e.buffer, r.buffer);
        let index = evicted.index();
        let s = shared.clone();
        let releaser = thread::spawn(move || {
            let _ = evicted.release(&s.ring.ring(), e.buffer);
        });
        let seen = ring.consumers[index].lease.load(SeqCst);
        evict(&ring, index, seen, lease::evict_reason::RELEASE_EVENT);
        reap(&ring, |_, _| true, |_, _| {}, Recount::Yes).unwrap();
        // A producer blocked on the buffer recounts it.
        gpuring::ring::audit(&ring, r.buffer).unwrap();
        releaser.join().unwrap();
        reap(&ring, |_, _| true, |_, _| {}, Recount::Yes).unwrap();
        let held = stamp::held(ring.buffers[r.buffer].stamp.load(SeqCst));
        assert_eq!(held, 1, "the other reader's hold was taken away");
        reader.release(&ring, r.buffer).unwrap();
    });
}

/// A retiring consumer (pid 1, start 11, alive) gives up waiting for the producer and frees its
/// entry itself, and another process (pid 2, start 22) joins the one-entry table at once, while
/// the producer reaps (its /proc oracle judges each pid by its own start time, so it may read
/// the new owner's start time against the old owner's pid). Whoever wins, the new owner's entry
/// must end ACTIVE, with its own start time and its hold record intact.
#[test]
fn giving_up_a_retired_entry_never_races_the_producer() {
    builder().check(|| {
        let heap = Arc::new(HeapRing::new(1, 0, 1, Policy::Overwrite));
        let ring = heap.ring();
        let first = ConsumerCore::join(&ring, StartAt::Next, Mode::Queue, 1, 11).unwrap();
        let index = first.index();
        let retiring = first.leave(&ring, Leave::Retire).retiring.unwrap();
        let h = heap.clone();
        let leaver = thread::spawn(move || {
            let ring = h.ring();
            gpuring::ring::consumer::give_up_retiring(&ring, index, retiring);
        });
        let h = heap.clone();
        let joiner = thread::spawn(move || {
            let ring = h.ring();
            loop {
                match ConsumerCore::join(&ring, StartAt::Next, Mode::Queue, 2, 22) {
                    Ok(core) => {
                        ring.hold(core.index(), 0).store(hold::record(0, hold::HELD), SeqCst);
                        return core.index();
                    }
                    Err(_) => thread::yield_now(),
                }
            }
        });
        let alive = |_: usize, pid: u32| matches!(pid, 1 | 2);
        reap(&ring, alive, |_, _| {}, Recount::No).unwrap();
        leaver.join().unwrap();
        let again = joiner.join().unwrap();
        let l = ring.consumers[again].lease.load(SeqCst);
        assert_eq!((lease::state(l), lease::pid(l)), (lease::ACTIVE, 2));
        let start = ring.consumers[again].start_time.load(SeqCst);
        assert_eq!(start, 22, "the new owner's start time was overwritten");
        let record = ring.hold(again, 0).load(SeqCst);
        assert_eq!(record, hold::record(0, hold::HELD), "the new owner's record was cleared");
    });
}

// ---------------------------------------------------------------------------------------------
// Spare buffers and delivery modes
// ---------------------------------------------------------------------------------------------

/// A Queue consumer pins message 0 and holds it while the producer publishes `laps` laps past
/// it (capacity 1, one spare): every one of those claims succeeds at once (the held buffer
/// leaves the ring and the spare takes its place; the producer is never blocked by it) and
/// none writes the held buffer: the consumer reads it during the laps (a write would race) and
/// after them (it must still carry message 0). Then the consumer releases it and receives the
/// rest while the producer publishes `tail` more, which may wait only for a held buffer, never
/// for a Queue consumer's cursor. Every pinned message carries its payload, and received + lost
/// equals the cursor's movement.
///
/// Why the tail may wait at all, though the consumer never holds more than one buffer: the
/// claim reads the spare's stamp with a Relaxed load, which may not yet see the consumer's
/// release of it (loom finds this with capacity 1: the claim of message 3 sees buffer 1 held by
/// the pin of message 2, and buffer 0 still held by message 0, released before that pin). It is
/// a retry, not a lost wake-up: the release notifies, and the real producer's sleep re-checks
/// after a SeqCst fence. During the laps the producer has synchronised with the consumer's pin
/// (the `pinned` flag) and nothing else is pinned, so there a block is a bug.
fn model_held_across_laps(capacity: u32, laps: u64, tail: u64) {
    let lapped_to = 1 + laps * capacity as u64;
    let messages = lapped_to + tail;
    builder().check(move || {
        let shared = Shared::new(capacity, 1, Policy::Overwrite);
        let core =
            ConsumerCore::join(&shared.ring.ring(), StartAt::Next, Mode::Queue, 1, 1).unwrap();
        // Set by the consumer once it holds message 0, by the producer once it lapped it.
        let pinned = Arc::new(AtomicBool::new(false));
        let lapped = Arc::new(AtomicBool::new(false));
        let (s, pinned2, lapped2) = (shared.clone(), pinned.clone(), lapped.clone());
        let consumer = thread::spawn(move || {
            let m0 = pin(&core, &s, &s.consumer_wait[0]);
            assert_eq!((m0.seq, m0.lag), (0, 0));
            pinned2.store(true, SeqCst);
            s.producer_wait.notify();
            // Concurrent with the laps: a producer write of this buffer would race this read.
            s.check(&m0);
            while !lapped2.load(SeqCst) {
                s.consumer_wait[0].wait();
            }
            // After the laps: still message 0.
            s.check(&m0);
            release(&core, &s, &m0);
            let mut tally = Tally { received: 1, lost: 0 };
            let mut seq = 0;
            while seq + 1 < messages {
                let before = core.cursor();
                let m = pin(&core, &s, &s.consumer_wait[0]);
                tally.add(&core, before, &m);
                s.check(&m);
                seq = m.seq;
                release(&core, &s, &m);
            }
            tally.finish(&core, &s, 0);
        });
        let mut w = Writer::new(&shared);
        let b = w.claim(&shared, |why| panic!("the first claim was blocked: {why:?}"));
        w.publish(&shared, b);
        while !pinned.load(SeqCst) {
            shared.producer_wait.wait();
        }
        for seq in 1..lapped_to {
            let b = w.claim(&shared, |why| {
                panic!("claim of {seq} blocked ({why:?}) while one buffer is held, one spare")
            });
            w.publish(&shared, b);
        }
        lapped.store(true, SeqCst);
        shared.consumer_wait[0].notify();
        for _ in lapped_to..messages {
            let b = w.claim(&shared, |why| {
                assert_eq!(why, Blocked::Held, "a Queue consumer gated the producer");
                shared.producer_wait.wait();
            });
            w.publish(&shared, b);
        }
        consumer.join().unwrap();
    });
}

#[test]
fn queue_consumer_holds_across_laps() {
    if deep() {
        model_held_across_laps(1, 3, 4);
        model_held_across_laps(2, 2, 3);
    } else {
        model_held_across_laps(1, 2, 3);
        model_held_across_laps(2, 1, 2);
    }
}

/// Capacity 1, one spare: a consumer holds messages 0 and 1, so both buffers, and the claim of
/// message 2 is `Blocked::Held`. Then the consumer reads and releases them (newest first if
/// `newest_first`) while the producer claims message 2 and the rest as buffers come free: no
/// buffer is written while the consumer reads it (a loom race), every message the consumer pins
/// after carries its payload, and the producer is blocked only by held buffers (a Queue cursor
/// never gates).
fn model_spares_exhausted(newest_first: bool, messages: u64) {
    builder().check(move || {
        let shared = Shared::new(1, 1, Policy::Overwrite);
        let ring = shared.ring.ring();
        let core = ConsumerCore::join(&ring, StartAt::Next, Mode::Queue, 1, 1).unwrap();
        let mut w = Writer::new(&shared);
        let b0 = w.claim(&shared, |why| panic!("message 0 blocked: {why:?}"));
        w.publish(&shared, b0);
        let m0 = core.try_pin(&ring).unwrap().unwrap().0;
        let b1 = w.claim(&shared, |why| panic!("message 1 blocked with a spare free: {why:?}"));
        assert_ne!(b1, m0.buffer, "the held buffer was claimed");
        w.publish(&shared, b1);
        let m1 = core.try_pin(&ring).unwrap().unwrap().0;
        assert_eq!((m0.seq, m1.seq, m1.buffer), (0, 1, b1));
        // Both buffers held: the producer must wait.
        assert_eq!(w.core.try_claim(&ring), Err(ClaimError::Blocked(Blocked::Held)));
        let s = shared.clone();
        let consumer = thread::spawn(move || {
            let held = if newest_first { [m1, m0] } else { [m0, m1] };
            for m in &held {
                s.check(m);
                release(&core, &s, m);
            }
            let mut tally = Tally { received: 2, lost: 0 };
            let mut seq = 1;
            while seq + 1 < messages {
                let before = core.cursor();
                let m = pin(&core, &s, &s.consumer_wait[0]);
                tally.add(&core, before, &m);
                s.check(&m);
                seq = m.seq;
                release(&core, &s, &m);
            }
            tally.finish(&core, &s, 0);
        });
        for _ in 2..messages {
            let b = w.claim(&shared, |why| {
                assert_eq!(why, Blocked::Held, "a Queue consumer gated the producer");
                shared.producer_wait.wait();
            });
            w.publish(&shared, b);
        }
        consumer.join().unwrap();
    });
}

#[test]
fn spares_exhausted_oldest_released_first() {
    model_spares_exhausted(false, if deep() { 6 } else { 5 });
}

#[test]
fn spares_exhausted_newest_released_first() {
    model_spares_exhausted(true, if deep() { 6 } else { 5 });
}

/// A Latest consumer pins, reads and releases while the producer publishes `messages` and laps
/// the ring (one spare). Each pin returns a message no older than the newest published before
/// it began, carrying its payload; received + lost equals the cursor's movement; the consumer
/// gets the last message. The consumer never gates the producer: a claim may wait only for a
/// held buffer.
fn model_latest(capacity: u32, messages: u64) {
    builder().check(move || {
        let shared = Shared::new(capacity, 1, Policy::Overwrite);
        let core =
            ConsumerCore::join(&shared.ring.ring(), StartAt::Next, Mode::Latest, 1, 1).unwrap();
        let s = shared.clone();
        let consumer = thread::spawn(move || {
            let ring = s.ring.ring();
            let mut tally = Tally::default();
            let mut seq = None;
            while seq.is_none_or(|seq| seq + 1 < messages) {
                let head = ring.producer.head.load(SeqCst);
                let before = core.cursor();
                let m = pin(&core, &s, &s.consumer_wait[0]);
                assert!(m.seq + 1 >= head, "Latest pinned {} though {head} were out", m.seq);
                assert!(seq.is_none_or(|seq| m.seq > seq));
                tally.add(&core, before, &m);
                s.check(&m);
                seq = Some(m.seq);
                release(&core, &s, &m);
            }
            tally.finish(&core, &s, 0);
        });
        let mut w = Writer::new(&shared);
        for _ in 0..messages {
            let b = w.claim(&shared, |why| {
                assert_eq!(why, Blocked::Held, "a Latest consumer gated the producer");
                shared.producer_wait.wait();
            });
            w.publish(&shared, b);
        }
        consumer.join().unwrap();
    });
}

#[test]
fn latest_races_a_lap_one_position() {
    // 4 messages: ~40 s at preemption bound 1; 5 take more than 5 minutes.
    model_latest(1, 4);
}

#[test]
fn latest_races_a_lap_two_positions() {
    model_latest(2, if deep() { 5 } else { 4 });
}

/// A Lossless consumer joins while the producer runs, against the gate's refresh from the
/// entries that gated at its last scan of the table (Block, capacity 1, no spare). The main
/// thread produces and reads every message itself as a first Lossless consumer, so each claim
/// after the first refreshes the gate; the joiner must get every message from the one it
/// starts at, unlapped, and read none under a write. A refresh that kept using the list of
/// entries made before the join would lap it.
#[test]
fn a_lossless_joiner_races_the_cached_gate() {
    const MESSAGES: u64 = 3;
    builder().check(|| {
        let shared = Shared::new(1, 0, Policy::Block);
        let first =
            ConsumerCore::join(&shared.ring.ring(), StartAt::Next, Mode::Lossless, 1, 1).unwrap();
        let s = shared.clone();
        let joiner = thread::spawn(move || {
            let ring = s.ring.ring();
            let core = ConsumerCore::join(&ring, StartAt::Newest, Mode::Lossless, 2, 2).unwrap();
            s.producer_wait.notify();
            while core.cursor() < MESSAGES {
                let before = core.cursor();
                let m = pin(&core, &s, &s.consumer_wait[1]);
                assert_eq!((m.seq, m.lag), (before, 0), "the joiner was lapped");
                s.check(&m);
                release(&core, &s, &m);
            }
            core.leave(&ring, Leave::Free);
            s.producer_wait.notify();
        });
        let mut w = Writer::new(&shared);
        for _ in 0..MESSAGES {
            let b = w.claim(&shared, |_| shared.producer_wait.wait());
            w.publish(&shared, b);
            let m = pin(&first, &shared, &shared.consumer_wait[0]);
            shared.check(&m);
            release(&first, &shared, &m);
        }
        first.leave(&shared.ring.ring(), Leave::Free);
        joiner.join().unwrap();
    });
}

/// A Lossless and a Queue consumer on one ring (Block, capacity 1, one spare). The Lossless one
/// gates the producer: it receives every message, in order, never lapped. The Queue one only
/// counts what it loses. Both read every pinned buffer against the producer's writes.
fn model_mixed(messages: u64) {
    builder().check(move || {
        let shared = Shared::new(1, 1, Policy::Block);
        let ring = shared.ring.ring();
        let lossless = ConsumerCore::join(&ring, StartAt::Next, Mode::Lossless, 1, 1).unwrap();
        let queue = ConsumerCore::join(&ring, StartAt::Next, Mode::Queue, 2, 2).unwrap();
        assert_eq!(Policy::Block.default_mode(), Mode::Lossless);
        let handles: Vec<_> = [lossless, queue]
            .into_iter()
            .enumerate()
            .map(|(k, core)| {
                let s = shared.clone();
                thread::spawn(move || {
                    let mut tally = Tally::default();
                    let mut seq = None;
                    while seq.is_none_or(|seq| seq + 1 < messages) {
                        let before = core.cursor();
                        let m = pin(&core, &s, &s.consumer_wait[k]);
                        if core.mode() == Mode::Lossless {
                            assert_eq!((m.seq, m.lag), (before, 0), "the Lossless one lost some");
                        }
                        tally.add(&core, before, &m);
                        s.check(&m);
                        seq = Some(m.seq);
                        release(&core, &s, &m);
                    }
                    tally.finish(&core, &s, 0);
                    core.leave(&s.ring.ring(), Leave::Free);
                    s.producer_wait.notify();
                })
            })
            .collect();
        let mut w = Writer::new(&shared);
        for _ in 0..messages {
            let b = w.claim(&shared, |_| shared.producer_wait.wait());
            w.publish(&shared, b);
        }
        for h in handles {
            h.join().unwrap();
        }
    });
}

#[test]
fn lossless_gates_beside_a_queue_consumer() {
    // 3 threads: 2 messages take ~35 s at preemption bound 1, 3 more than 10 minutes.
    model_mixed(2);
}

/// The first model's two Queue consumers, with a spare: the producer swaps held buffers out
/// instead of waiting, until both consumers hold one each and the spare is used up.
#[test]
fn overwrite_one_slot_one_spare() {
    // As `lossless_gates_beside_a_queue_consumer`: 3 messages take more than 10 minutes.
    model(Policy::Overwrite, 1, 1, 2);
}

/// Loans (capacity 1, one spare): the producer publishes messages 0 and 1, lends a spare (the
/// buffer of a message the consumer may still be reading, when it held it across message 1),
/// writes it at once, publishes message 2, then the loan as message 3. The borrower's write
/// must not race any consumer read (a loom race), and the consumer gets every message it does
/// not lose (under `Block`: all of them) with its payload.
fn model_loan(policy: Policy) {
    let messages = 4;
    builder().check(move || {
        let shared = Shared::new(1, 1, policy);
        let ring = shared.ring.ring();
        let core = ConsumerCore::join(&ring, StartAt::Next, policy.default_mode(), 1, 1).unwrap();
        let s = shared.clone();
        let consumer = thread::spawn(move || {
            let mut tally = Tally::default();
            let mut seq = None;
            while seq.is_none_or(|seq| seq + 1 < messages) {
                let before = core.cursor();
                let m = pin(&core, &s, &s.consumer_wait[0]);
                if policy == Policy::Block {
                    assert_eq!((m.seq, m.lag), (before, 0), "a Lossless consumer lost some");
                }
                tally.add(&core, before, &m);
                s.check(&m);
                seq = Some(m.seq);
                release(&core, &s, &m);
            }
            tally.finish(&core, &s, 0);
        });
        let mut w = Writer::new(&shared);
        for _ in 0..2 {
            let b = w.claim(&shared, |_| shared.producer_wait.wait());
            w.publish(&shared, b);
        }
        let loan = loop {
            match w.core.try_lend(&ring) {
                Ok(l) => break l,
                Err(ClaimError::Blocked(_)) => shared.producer_wait.wait(),
                Err(ClaimError::Corrupt(c)) => panic!("{c}"),
            }
        };
        assert_eq!(loan.prev, w.last[loan.buffer], "what the lent buffer carried");
        // SAFETY: loom's cell; a write that races a read is reported, not undefined.
        shared.payload[loan.buffer].with_mut(|p| unsafe { *p = 3 });
        let b = w.claim(&shared, |_| shared.producer_wait.wait());
        w.publish(&shared, b);
        loop {
            match w.core.try_adopt(&ring, loan.buffer) {
                Ok(()) => break,
                Err(ClaimError::Blocked(why)) => {
                    assert_eq!(why, Blocked::Consumers, "an adoption waits only at the gate");
                    shared.producer_wait.wait();
                }
                Err(ClaimError::Corrupt(c)) => panic!("{c}"),
            }
        }
        w.last[loan.buffer] = Some(3);
        w.core.publish(&ring, 3 + 100, 0);
        shared.consumer_wait.iter().for_each(Notify::notify);
        consumer.join().unwrap();
    });
}

#[test]
fn a_loan_never_races_a_reader_block() {
    model_loan(Policy::Block);
}

#[test]
fn a_loan_never_races_a_reader_overwrite() {
    model_loan(Policy::Overwrite);
}
