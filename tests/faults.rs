//! Faults a host-memory ring must survive: consumers that churn against an eager reaper, leak
//! a slot and leave, or have their table entry overwritten while the stream runs. (The CUDA
//! ones are in `gpu_faults.rs`; killed consumers and producers in `conformance.rs`.)

mod common;

use std::time::{Duration, Instant};

use common::{env, role, spawn, unique_name};
use gpuring::format::{Layout, Params};
use gpuring::shm::{OpenOptions, RingDir, Segment, ShmName};
use gpuring::{Consumer, Policy, Producer, RecvTimeoutError, StartAt, TryRecvError};

/// A payload that says which message it is.
fn payload(seq: u64) -> [u8; 16] {
    let mut p = [0u8; 16];
    p[..8].copy_from_slice(&seq.to_le_bytes());
    p[8..].copy_from_slice(&(!seq).to_le_bytes());
    p
}

fn check(bytes: &[u8], seq: u64) {
    assert_eq!(bytes, payload(seq), "payload of message {seq}");
}

/// Ring `name`'s segment, mapped again in this process, with its parameters and layout.
fn segment(name: &str) -> (Segment, Params, Layout) {
    let dir = RingDir::open_default().unwrap();
    let seg = Segment::open(&dir, &ShmName::new(name).unwrap(), OpenOptions::default()).unwrap();
    let (params, layout) = Params::read(seg.header(), seg.len() as u64).unwrap();
    (seg, params, layout)
}

/// The shared word at byte `at` of `seg`, for writing over it as a hostile peer would.
fn word(seg: &Segment, at: usize) -> &std::sync::atomic::AtomicU64 {
    assert!(at % 8 == 0 && at + 8 <= seg.len(), "word at {at}");
    // SAFETY: `at` is 8-byte aligned and the word lies inside the mapping (checked above),
    // which lives as long as `seg`; every shared word is an atomic, so a racy store is what a
    // hostile peer does.
    unsafe { &*(seg.base().add(at) as *const std::sync::atomic::AtomicU64) }
}

fn open_when_created(name: &str) -> Consumer {
    let b = Consumer::builder(name).start_at(StartAt::Next);
    b.open_timeout(Duration::from_secs(30)).unwrap_or_else(|e| panic!("{e}"))
}

/// Consumer processes join, read a few messages and leave, over and over, and some finally
/// die joined and holding a message, while the producer reaps after every message and
/// every millisecond. Whatever the interleaving, no consumer may find its entry taken from it
/// or another's holds mixed with its own (a shared entry shows as `Evicted`, a release
/// underflow or a wrong payload), the producer never errs nor wedges, and at the end nothing
/// is held and nobody is joined.
#[test]
fn join_leave_churn_against_an_eager_reaper() {
    const WORKERS: usize = 4;
    const ROUNDS: u64 = 400;
    if let Some(role) = role() {
        assert_eq!(role, "churn");
        let name: String = env("RING");
        let me: u64 = env("WORKER");
        for round in 0..ROUNDS {
            let rx = open_when_created(&name);
            for _ in 0..1 + (round + me) % 3 {
                match rx.recv_timeout(Duration::from_secs(10)) {
                    Ok(m) => check(&m, m.seq()),
                    Err(RecvTimeoutError::Disconnected) => return,
                    Err(e) => panic!("worker {me} round {round}: {e}"),
                }
            }
            drop(rx);
        }
        // The last act of some workers: die while joined and holding a message.
        if me % 2 == 0 {
            let rx = open_when_created(&name);
            let m = rx.recv_timeout(Duration::from_secs(10));
            std::mem::forget(m);
            std::mem::forget(rx);
            std::process::exit(0);
        }
        return;
    }
    let name = unique_name("churn");
    let mut tx = Producer::builder(&name)
        .capacity(4)
        .slot_size(16)
        .max_consumers(WORKERS as u32)
        .policy(Policy::Block)
        .liveness_interval(Duration::from_millis(1))
        .create()
        .unwrap();
    let children: Vec<_> = (0..WORKERS)
        .map(|w| {
            let env = [("RING", name.clone()), ("WORKER", w.to_string())];
            spawn("join_leave_churn_against_an_eager_reaper", "churn", &env)
        })
        .collect();
    let mut children: Vec<_> = children.into_iter().map(Some).collect();
    let started = Instant::now();
    let mut seq = 0;
    while children.iter().any(Option::is_some) {
        assert!(started.elapsed() < Duration::from_secs(120), "churn took too long");
        match tx.acquire_timeout(Duration::from_millis(5)) {
            Ok(mut slot) => {
                slot[..16].copy_from_slice(&payload(seq));
                slot.publish(16, b"").unwrap();
                seq += 1;
            }
            Err(gpuring::AcquireTimeoutError::Timeout) => {}
            Err(e) => panic!("producer: {e}"),
        }
        tx.reap().unwrap();
        for c in children.iter_mut() {
            if let Some(status) = c.as_mut().and_then(|ch| ch.try_wait().unwrap()) {
                assert!(status.success(), "a churning consumer failed: {status}");
                *c = None;
            }
        }
    }
    // Everyone is gone: the dead ones' entries and holds come back.
    let t = Instant::now();
    while tx.consumer_count() > 0 || tx.held_buffers() > 0 {
        assert!(t.elapsed() < Duration::from_secs(10), "left behind: {:?}", tx.consumers());
        tx.reap().unwrap();
        std::thread::sleep(Duration::from_millis(1));
    }
    eprintln!("churn: {seq} messages, {} joins", WORKERS as u64 * (ROUNDS + 1));
}

/// A consumer that leaks a read slot (`mem::forget`) and then leaves must not wedge the
/// producer: leaving gives back what it still holds.
#[test]
fn a_consumer_that_leaks_a_slot_and_leaves_does_not_wedge_the_producer() {
    for policy in [Policy::Block, Policy::Overwrite] {
        let name = unique_name("leak-leave");
        let mut tx = Producer::builder(&name).capacity(2).policy(policy).create().unwrap();
        let rx = Consumer::builder(&name).start_at(StartAt::Next).open().unwrap();
        tx.send(b"a", b"").unwrap();
        tx.send(b"b", b"").unwrap();
        std::mem::forget(rx.recv().unwrap());
        drop(rx);
        assert_eq!(tx.held_buffers(), 0, "{policy:?}: the leaked slot is still held");
        for _ in 0..4 {
            let slot = tx.acquire_timeout(Duration::from_secs(2));
            assert!(slot.is_ok(), "{policy:?}: the producer is wedged");
            slot.unwrap().publish(0, b"").unwrap();
        }
    }
}

/// Random words written over one consumer's table entry and hold records while the stream
/// runs (a buggy or hostile process of the same user): the producer goes on, the other
/// consumers receive every message intact, and the victim is either unharmed or told.
#[test]
fn an_overwritten_consumer_entry_does_not_stop_the_stream() {
    const MESSAGES: u64 = 3000;
    if let Some(role) = role() {
        let rx = open_when_created(&env::<String>("RING"));
        let mut next = None;
        loop {
            match rx.recv_timeout(Duration::from_secs(30)) {
                Ok(m) => {
                    check(&m, m.seq());
                    if role == "steady" {
                        if let Some(n) = next {
                            assert_eq!(m.seq(), n, "a steady consumer lost messages");
                        }
                    }
                    next = Some(m.seq() + 1);
                    if m.seq() + 1 == MESSAGES {
                        return;
                    }
                }
                Err(RecvTimeoutError::Disconnected) => {
                    assert_eq!(role, "victim", "a steady consumer was cut off");
                    return;
                }
                // The victim may learn that its entry is no longer its own: that is the point.
                Err(e) if role == "victim" => {
                    progress!("victim, as expected: {e}");
                    return;
                }
                Err(e) => panic!("{role}: {e}"),
            }
        }
    }
    let name = unique_name("scribble");
    let mut tx = Producer::builder(&name)
        .capacity(8)
        .slot_size(16)
        .policy(Policy::Block)
        .liveness_interval(Duration::from_millis(10))
        .create()
        .unwrap();
    let test = "an_overwritten_consumer_entry_does_not_stop_the_stream";
    let env = [("RING", name.clone())];
    let steady: Vec<_> = (0..2).map(|_| spawn(test, "steady", &env)).collect();
    let mut victim = spawn(test, "victim", &env);
    let t = Instant::now();
    while tx.consumer_count() < 3 {
        assert!(t.elapsed() < Duration::from_secs(30), "consumers did not join");
        std::thread::sleep(Duration::from_millis(1));
    }
    let victim_entry = tx.consumers().iter().find(|c| c.pid == victim.id()).unwrap().index;
    // The victim's entry and hold records, as offsets in the segment.
    let (seg, params, layout) = segment(&name);
    let stride = gpuring::ring::hold::stride(params.buffers() as usize) * 8;
    let regions = [
        (layout.consumers + victim_entry * 128, 128),
        (layout.holds + victim_entry * stride, stride),
    ];
    let mut rng = 0x9E37_79B9_7F4A_7C15u64;
    for seq in 0..MESSAGES {
        if (1000..1100).contains(&seq) {
            for &(start, len) in &regions {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                let at = start + (rng as usize % (len / 8)) * 8;
                word(&seg, at).store(rng, std::sync::atomic::Ordering::Relaxed);
            }
        }
        let mut slot = tx.acquire_timeout(Duration::from_secs(10)).expect("the producer wedged");
        slot[..16].copy_from_slice(&payload(seq));
        slot.publish(16, b"").unwrap();
    }
    for c in steady {
        common::expect_success(c, "a steady consumer");
    }
    // The victim ends cleanly whatever it saw (it returns on an error): a panic there, from a
    // wrong payload or a lost steady message, is a failure.
    let status = victim.wait().unwrap();
    eprintln!("victim: {status}; producer saw {:?}", tx.consumers());
    assert!(status.success(), "the victim failed: {status}");
    drop(tx);
}

/// A consumer whose table entry was taken from it (its lease word overwritten, as a hostile
/// peer would) while it waits on an empty ring learns it at its next liveness check, and then
/// at every later receive: it never goes back to reporting an empty ring.
#[test]
fn a_consumer_that_lost_its_entry_is_told_at_every_receive() {
    let name = unique_name("lost-entry");
    let tx = Producer::builder(&name).create().unwrap();
    let rx = Consumer::builder(&name).liveness_interval(Duration::from_millis(5)).open().unwrap();
    let entry = tx.consumers()[0].index;
    let (seg, _, layout) = segment(&name);
    // The lease is the first word of the entry's 128-byte line.
    let lease = word(&seg, layout.consumers + entry * 128);
    assert!(matches!(rx.try_recv(), Err(TryRecvError::Empty)));
    lease.store(0xdead_beef, std::sync::atomic::Ordering::Relaxed);
    let t = Instant::now();
    let told = loop {
        match rx.try_recv() {
            Err(TryRecvError::Empty) => {
                assert!(t.elapsed() < Duration::from_secs(10), "never told");
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(e) => break e,
            Ok(m) => panic!("received {} from an empty ring", m.seq()),
        }
    };
    use gpuring::{ring::RingCorrupt, Corruption};
    assert!(
        matches!(told, TryRecvError::Corrupt(Corruption::Ring(RingCorrupt::Evicted { .. }))),
        "{told}"
    );
    for i in 0..100 {
        match rx.try_recv() {
            Err(TryRecvError::Empty) => panic!("told \"{told}\", then receive {i} found it empty"),
            Err(_) => {}
            Ok(m) => panic!("received {} from an empty ring", m.seq()),
        }
    }
}

/// A consumer that always finds a message waiting (64 of them, published before) still checks
/// the segment once per liveness interval: the file cut short by its last page, which only the
/// unused tail of the last buffer lies in (so nothing faults), is reported as `Truncated`
/// before the 64 messages are all received (a check made only once the ring is empty would
/// come after them).
#[test]
fn a_consumer_that_always_finds_a_message_still_learns_of_a_truncation() {
    const MESSAGES: u64 = 64;
    let name = unique_name("fed-truncated");
    let mut tx = Producer::builder(&name)
        .capacity(MESSAGES as u32)
        .slot_size(64 << 10)
        .policy(Policy::Block)
        .create()
        .unwrap();
    let rx = Consumer::builder(&name).liveness_interval(Duration::from_millis(5)).open().unwrap();
    for seq in 0..MESSAGES {
        let mut slot = tx.acquire_timeout(Duration::from_secs(10)).unwrap();
        slot[..16].copy_from_slice(&payload(seq));
        slot.publish(16, b"").unwrap();
    }
    let path = format!("/dev/shm/gpuring.{name}");
    let len = std::fs::metadata(&path).unwrap().len();
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.set_len(len - 4096).unwrap();
    let mut received = 0u64;
    let told = loop {
        match rx.recv_timeout(Duration::from_secs(10)) {
            Ok(m) => {
                check(&m[..16], m.seq());
                received += 1;
                // A millisecond a message: the 64 take far longer than one interval.
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(e) => break e,
        }
    };
    assert!(
        matches!(told, RecvTimeoutError::Corrupt(gpuring::Corruption::Truncated)),
        "{told} after {received} messages"
    );
    assert!(received < MESSAGES, "told only after all {received} messages were received");
    eprintln!("told after {received} messages");
    drop(tx);
}
