//! Loom model of the ring protocol: 1 producer and 2 consumers on a small ring, every
//! interleaving (up to loom's preemption bound). The payload is a loom `UnsafeCell` per slot,
//! so loom also proves that no consumer read races with a producer write.
//!
//! Run: `RUSTFLAGS="--cfg loom" cargo test --release --test loom`
#![cfg(loom)]

use loom::cell::UnsafeCell;
use loom::sync::{Arc, Notify};
use loom::thread;
use std::sync::atomic::Ordering::SeqCst;

use gpuring::ring::producer::ClaimError;
use gpuring::ring::{
    evict, hold, lease, reap, ConsumerCore, HeapRing, Leave, Policy, ProducerCore, Recount, StartAt,
};

struct Shared {
    ring: HeapRing,
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

impl Shared {
    fn new(capacity: u32, policy: Policy) -> Arc<Shared> {
        Arc::new(Shared {
            ring: HeapRing::new(capacity, 2, policy),
            payload: (0..capacity).map(|_| UnsafeCell::new(u64::MAX)).collect(),
            producer_wait: Notify::new(),
            consumer_wait: [Notify::new(), Notify::new()],
        })
    }
}

fn model(policy: Policy, capacity: u32, messages: u64) {
    builder().check(move || {
        let shared = Shared::new(capacity, policy);
        // Join before the producer starts, so that Block must deliver every message.
        let consumers: Vec<_> = (0..2)
            .map(|_| ConsumerCore::join(&shared.ring.ring(), StartAt::Next, 1, 1).unwrap())
            .collect();
        let handles: Vec<_> = consumers
            .into_iter()
            .enumerate()
            .map(|(k, core)| {
                let shared = shared.clone();
                thread::spawn(move || {
                    let ring = shared.ring.ring();
                    let mut next = 0;
                    while next < messages {
                        match core.try_pin(&ring).unwrap() {
                            None => shared.consumer_wait[k].wait(),
                            Some((m, _)) => {
                                shared.producer_wait.notify();
                                assert_eq!(m.seq, next + m.lag);
                                if policy == Policy::Block {
                                    assert_eq!(m.lag, 0);
                                }
                                // The slot is pinned: reading it must not race the producer.
                                let v = shared.payload[m.slot].with(|p| unsafe { *p });
                                assert_eq!(v, m.seq);
                                assert_eq!(m.len, m.seq + 100);
                                next = m.seq + 1;
                                core.release(&ring, m.slot).unwrap();
                                shared.producer_wait.notify();
                            }
                        }
                    }
                    core.leave(&ring, Leave::Free);
                    shared.producer_wait.notify();
                })
            })
            .collect();
        let ring = shared.ring.ring();
        let mut p = ProducerCore::new();
        for seq in 0..messages {
            let slot = loop {
                match p.try_claim(&ring) {
                    Ok(slot) => break slot,
                    Err(ClaimError::Blocked(_)) => shared.producer_wait.wait(),
                    Err(ClaimError::Corrupt(c)) => panic!("{c}"),
                }
            };
            shared.payload[slot].with_mut(|p| unsafe { *p = seq });
            p.publish(&ring, seq + 100, 0);
            shared.consumer_wait.iter().for_each(Notify::notify);
        }
        for h in handles {
            h.join().unwrap();
        }
    });
}

#[test]
fn block_two_slots() {
    model(Policy::Block, 2, 3);
}

#[test]
fn overwrite_two_slots() {
    model(Policy::Overwrite, 2, 3);
}

#[test]
fn block_one_slot() {
    model(Policy::Block, 1, 2);
}

#[test]
fn overwrite_one_slot() {
    model(Policy::Overwrite, 1, 2);
}

/// Where the dying consumer stops.
#[derive(Clone, Copy)]
enum Death {
    /// After pinning message 0 completely: it holds the slot.
    Holding,
    /// After its pin CAS, before recording HELD: its record still says PINNING.
    AfterPinCas,
    /// After its release CAS, before clearing its record: the record says RELEASING.
    AfterReleaseCas,
}

/// One live consumer reads every message (its reads must not race a producer write) while the
/// other dies at `death`. When the producer is stuck it reclaims the dead one (after it has
/// stopped, as a dead process has) and goes on.
fn model_dead(policy: Policy, capacity: u32, messages: u64, death: Death) {
    builder().check(move || {
        let shared = Shared::new(capacity, policy);
        let live = ConsumerCore::join(&shared.ring.ring(), StartAt::Next, 1, 1).unwrap();
        let dying = ConsumerCore::join(&shared.ring.ring(), StartAt::Next, 2, 2).unwrap();
        let dead_index = dying.index();
        let s = shared.clone();
        let live_thread = thread::spawn(move || {
            let ring = s.ring.ring();
            let mut next = 0;
            while next < messages {
                match live.try_pin(&ring).unwrap() {
                    None => s.consumer_wait[0].wait(),
                    Some((m, _)) => {
                        s.producer_wait.notify();
                        let v = s.payload[m.slot].with(|p| unsafe { *p });
                        assert_eq!(v, m.seq);
                        next = m.seq + 1;
                        live.release(&ring, m.slot).unwrap();
                        s.producer_wait.notify();
                    }
                }
            }
            live.leave(&ring, Leave::Free);
            s.producer_wait.notify();
        });
        let s = shared.clone();
        let mut dying_thread = Some(thread::spawn(move || {
            let ring = s.ring.ring();
            let m = loop {
                match dying.try_pin(&ring).unwrap() {
                    None => s.consumer_wait[1].wait(),
                    Some((m, _)) => break m,
                }
            };
            let record = ring.hold(dying.index(), m.slot);
            match death {
                Death::Holding => {}
                Death::AfterPinCas => record.store(hold::record(m.seq, hold::PINNING), SeqCst),
                Death::AfterReleaseCas => {
                    dying.release(&ring, m.slot).unwrap();
                    record.store(hold::record(m.seq, hold::RELEASING), SeqCst);
                }
            }
            // Dies here: never releases, never leaves.
        }));
        let ring = shared.ring.ring();
        let mut p = ProducerCore::new();
        for seq in 0..messages {
            let slot = loop {
                match p.try_claim(&ring) {
                    Ok(slot) => break slot,
                    Err(ClaimError::Blocked(_)) => match dying_thread.take() {
                        // Stuck: the dying consumer is the suspect. Once it has stopped, as a
                        // dead process has, reclaim it.
                        Some(h) => {
                            h.join().unwrap();
                            // Pid 2 is the dead one; reap until its entry is free.
                            let free = |ring: &gpuring::ring::Ring<'_>| {
                                let l = ring.consumers[dead_index].lease.load(SeqCst);
                                lease::state(l) == lease::FREE
                            };
                            while !free(&ring) {
                                reap(&ring, |pid, _| pid != 2, |_, _| {}, Recount::Yes).unwrap();
                                thread::yield_now();
                            }
                            // Consumers that found a slot frozen by the reclaim may wait.
                            shared.consumer_wait.iter().for_each(Notify::notify);
                        }
                        None => shared.producer_wait.wait(),
                    },
                    Err(ClaimError::Corrupt(c)) => panic!("{c}"),
                }
            };
            shared.payload[slot].with_mut(|p| unsafe { *p = seq });
            p.publish(&ring, seq + 100, 0);
            shared.consumer_wait.iter().for_each(Notify::notify);
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

/// Parking (`ring::park`), the protocol behind async receive and acquire, with the real wake
/// checks and nothing else: the doorbells are `Notify`s, which stay rung like an eventfd. Both
/// sides park on a one-slot Block ring for every message. A lost wake-up leaves a side waiting
/// on a doorbell nobody rings, which loom reports as a deadlock.
#[test]
fn parked_waiters_are_always_rung() {
    use gpuring::ring::park;
    const MESSAGES: u64 = 2;
    builder().check(|| {
        let shared = Shared::new(1, Policy::Block);
        let core = ConsumerCore::join(&shared.ring.ring(), StartAt::Next, 1, 1).unwrap();
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
                    rung |= core.release(&ring, m.slot).unwrap()
                        && park::has_parked(ring.producer_wake);
                    if rung {
                        shared.producer_wait.notify();
                    }
                }
                core.leave(&ring, Leave::Free);
            })
        };
        let ring = shared.ring.ring();
        let mut p = ProducerCore::new();
        for _ in 0..MESSAGES {
            let slot = loop {
                match p.try_claim(&ring) {
                    Ok(slot) => break slot,
                    Err(ClaimError::Blocked(_)) => {
                        park::park(ring.producer_wake, None);
                        let again = p.try_claim(&ring);
                        if again.is_err() {
                            shared.producer_wait.wait();
                        }
                        park::unpark(ring.producer_wake, None);
                        if let Ok(slot) = again {
                            break slot;
                        }
                    }
                    Err(ClaimError::Corrupt(c)) => panic!("{c}"),
                }
            };
            let _ = slot;
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
    use loom::sync::atomic::AtomicBool;
    builder().check(|| {
        let shared = Shared::new(1, Policy::Block);
        let joined = Arc::new(AtomicBool::new(false));
        let (s, j) = (shared.clone(), joined.clone());
        let joiner = thread::spawn(move || {
            let core = ConsumerCore::join(&s.ring.ring(), StartAt::Next, 2, 2).unwrap();
            j.store(true, SeqCst);
            core.index()
        });
        let ring = shared.ring.ring();
        // A start time not yet stored (None) is judged by the pid, as `shm::process` does.
        let alive = |pid: u32, start: Option<u64>| pid == 2 && start.is_none_or(|s| s == 2);
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
    use loom::sync::atomic::AtomicBool;
    builder().check(|| {
        let shared = Shared::new(1, Policy::Block);
        let dead3 = Arc::new(AtomicBool::new(false));
        let first = ConsumerCore::join(&shared.ring.ring(), StartAt::Next, 3, 3).unwrap();
        let s = shared.clone();
        let d = dead3.clone();
        let joiner = thread::spawn(move || {
            let ring = s.ring.ring();
            first.leave(&ring, Leave::Free);
            d.store(true, SeqCst); // pid 3 exits
            loop {
                match ConsumerCore::join(&ring, StartAt::Next, 2, 2) {
                    Ok(core) => return core.index(),
                    Err(_) => thread::yield_now(),
                }
            }
        });
        let ring = shared.ring.ring();
        let alive = |pid: u32, start: Option<u64>| match pid {
            2 => start.is_none_or(|s| s == 2),
            3 => start.is_none_or(|s| s == 3) && !dead3.load(SeqCst),
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
/// still holds (its release may be in flight past any check), then reaps and recounts the slot
/// (`audit`): the held count must come down by that one release only, never by a recount too.
#[test]
fn eviction_never_takes_a_hold_twice() {
    use gpuring::ring::stamp;
    builder().check(|| {
        let shared = Shared::new(1, Policy::Overwrite);
        let ring = shared.ring.ring();
        let evicted = ConsumerCore::join(&ring, StartAt::Next, 1, 1).unwrap();
        let reader = ConsumerCore::join(&ring, StartAt::Next, 2, 2).unwrap();
        let mut p = ProducerCore::new();
        p.try_claim(&ring).unwrap();
        p.publish(&ring, 1, 0);
        let (e, _) = evicted.try_pin(&ring).unwrap().unwrap();
        let (r, _) = reader.try_pin(&ring).unwrap().unwrap();
        let index = evicted.index();
        let s = shared.clone();
        let releaser = thread::spawn(move || {
            let _ = evicted.release(&s.ring.ring(), e.slot);
        });
        let seen = ring.consumers[index].lease.load(SeqCst);
        evict(&ring, index, seen, lease::evict_reason::RELEASE_EVENT);
        reap(&ring, |_, _| true, |_, _| {}, Recount::Yes).unwrap();
        // A producer blocked on the slot recounts it.
        gpuring::ring::audit(&ring, 0).unwrap();
        releaser.join().unwrap();
        reap(&ring, |_, _| true, |_, _| {}, Recount::Yes).unwrap();
        let held = stamp::held(ring.slots[0].stamp.load(SeqCst));
        assert_eq!(held, 1, "the other reader's hold was taken away");
        reader.release(&ring, r.slot).unwrap();
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
        let heap = Arc::new(HeapRing::new(1, 1, Policy::Overwrite));
        let ring = heap.ring();
        let first = ConsumerCore::join(&ring, StartAt::Next, 1, 11).unwrap();
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
                match ConsumerCore::join(&ring, StartAt::Next, 2, 22) {
                    Ok(core) => {
                        ring.hold(core.index(), 0).store(hold::record(0, hold::HELD), SeqCst);
                        return core.index();
                    }
                    Err(_) => thread::yield_now(),
                }
            }
        });
        let alive = |pid: u32, start: Option<u64>| match pid {
            1 => start.is_none_or(|s| s == 11),
            2 => start.is_none_or(|s| s == 22),
            _ => false,
        };
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
