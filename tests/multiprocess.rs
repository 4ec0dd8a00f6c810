//! Producer and consumers in separate processes. Each test re-executes this binary with a role
//! (see `common::spawn`); the child runs the same test function, which dispatches on the role.

mod common;

use std::time::{Duration, Instant};

use common::{env, expect_success, role, spawn, unique_name};
use gpuring::{pattern, Consumer, OpenError, Policy, Producer, RecvError, StartAt};

const SLOT: usize = 4096;

/// Publishes messages `seqs`: each has a length derived from its seq, the pattern of its seq,
/// and the seq in its user header.
fn produce(tx: &mut Producer, seqs: std::ops::Range<u64>) {
    for seq in seqs {
        let mut slot = tx.acquire().unwrap();
        assert_eq!(slot.seq(), seq);
        let len = pattern::len_for(seq, 1, SLOT);
        pattern::fill(&mut slot[..len], seq);
        slot.publish(len, &seq.to_le_bytes()).unwrap();
    }
}

/// What a checking consumer saw.
#[derive(Debug, Default)]
struct Seen {
    first: Option<u64>,
    received: u64,
    lost: u64,
    last: Option<u64>,
}

/// Receives until disconnected, checking every byte, the header, and the sequence: each
/// message is the next one or, if it reports lag, exactly `lag` after it.
fn consume_and_check(rx: &Consumer) -> Seen {
    let mut seen = Seen::default();
    loop {
        let m = match rx.recv() {
            Ok(m) => m,
            Err(RecvError::Disconnected) => return seen,
            Err(e) => panic!("recv: {e}"),
        };
        let seq = m.seq();
        if let Some(last) = seen.last {
            assert_eq!(seq, last + 1 + m.lag(), "sequence gap not reported as lag");
        }
        seen.first.get_or_insert(seq);
        seen.last = Some(seq);
        seen.received += 1;
        seen.lost += m.lag();
        assert_eq!(m.len(), pattern::len_for(seq, 1, SLOT), "length of {seq}");
        assert_eq!(pattern::mismatches(&m, seq), 0, "payload of {seq}");
        assert_eq!(&m.header()[..8], &seq.to_le_bytes(), "header of {seq}");
    }
}

/// Opens ring `name` (starting at the next message) once its producer process has created it.
fn open_when_created(name: &str) -> Consumer {
    let t = Instant::now();
    loop {
        match Consumer::builder(name).start_at(StartAt::Next).open() {
            Ok(rx) => return rx,
            Err(OpenError::NotFound | OpenError::NotInitialized) if t.elapsed().as_secs() < 30 => {
                std::thread::sleep(Duration::from_millis(1))
            }
            Err(e) => panic!("open: {e}"),
        }
    }
}

fn wait_for_consumers(tx: &Producer, n: usize) {
    let t = Instant::now();
    while tx.consumer_count() < n {
        assert!(t.elapsed() < Duration::from_secs(30), "consumers did not join");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// 1 producer, `consumers` consumer processes, `MESSAGES` messages, all bytes checked.
fn fan_out(test: &str, consumers: usize, policy: Policy) {
    const MESSAGES: u64 = 100_000;
    if let Some(role) = role() {
        assert_eq!(role, "consumer");
        let rx = Consumer::builder(&env::<String>("RING")).start_at(StartAt::Next).open().unwrap();
        let seen = consume_and_check(&rx);
        let n: u64 = env("MESSAGES");
        // Joined before the first publish: every message was either received or lost.
        assert_eq!(seen.received + seen.lost, n, "{seen:?}");
        assert_eq!(seen.last, Some(n - 1), "{seen:?}");
        if env::<String>("POLICY") == "block" {
            assert_eq!((seen.received, seen.lost), (n, 0), "Block lost messages");
        }
        eprintln!("consumer {}: received {} lost {}", std::process::id(), seen.received, seen.lost);
        return;
    }
    let name = unique_name(test);
    let mut tx =
        Producer::builder(&name).capacity(64).slot_size(SLOT).policy(policy).create().unwrap();
    let pol = if policy == Policy::Block { "block" } else { "overwrite" };
    let vars =
        [("RING", name.clone()), ("MESSAGES", MESSAGES.to_string()), ("POLICY", pol.to_string())];
    let children: Vec<_> = (0..consumers).map(|_| spawn(test, "consumer", &vars)).collect();
    wait_for_consumers(&tx, consumers);
    produce(&mut tx, 0..MESSAGES);
    drop(tx);
    for c in children {
        expect_success(c, "consumer");
    }
}

#[test]
fn one_to_one_block() {
    fan_out("one_to_one_block", 1, Policy::Block);
}

#[test]
fn one_to_four_block() {
    fan_out("one_to_four_block", 4, Policy::Block);
}

#[test]
fn one_to_one_overwrite() {
    fan_out("one_to_one_overwrite", 1, Policy::Overwrite);
}

#[test]
fn one_to_four_overwrite() {
    fan_out("one_to_four_overwrite", 4, Policy::Overwrite);
}

/// Consumers that join after messages were published start where `StartAt` says and then miss
/// nothing (Block).
#[test]
fn late_join() {
    const BEFORE: u64 = 100;
    const CAP: u32 = 8;
    if let Some(role) = role() {
        let start = if role == "newest" { StartAt::Newest } else { StartAt::Oldest };
        let rx = Consumer::builder(&env::<String>("RING")).start_at(start).open().unwrap();
        let seen = consume_and_check(&rx);
        let first = seen.first.unwrap();
        match start {
            StartAt::Newest => assert_eq!(first, BEFORE - 1),
            // Under Block, the oldest message that cannot be overwritten while joining.
            _ => assert_eq!(first, BEFORE - CAP as u64 + 1),
        }
        assert_eq!(seen.lost, 0);
        assert_eq!(seen.last, Some(env::<u64>("TOTAL") - 1));
        return;
    }
    let name = unique_name("late");
    let mut tx = Producer::builder(&name).capacity(CAP).slot_size(SLOT).create().unwrap();
    // No consumers yet: Block does not block.
    produce(&mut tx, 0..BEFORE);
    let vars = [("RING", name.clone()), ("TOTAL", (BEFORE + 5000).to_string())];
    let a = spawn("late_join", "newest", &vars);
    let b = spawn("late_join", "oldest", &vars);
    wait_for_consumers(&tx, 2);
    produce(&mut tx, BEFORE..BEFORE + 5000);
    drop(tx);
    expect_success(a, "newest joiner");
    expect_success(b, "oldest joiner");
}

/// A Block producer waiting on a consumer that stops reading wakes up when that consumer's
/// process leaves the ring (iceoryx2 #314).
#[test]
fn consumer_leaves_while_producer_blocked() {
    if role().is_some() {
        let rx = Consumer::builder(&env::<String>("RING")).start_at(StartAt::Next).open().unwrap();
        let m = rx.recv().unwrap();
        assert_eq!(m.seq(), 0);
        drop(m);
        // Let the producer fill the ring and go to sleep on it.
        std::thread::sleep(Duration::from_millis(300));
        return; // drops the consumer: it leaves the ring
    }
    let name = unique_name("leave");
    let mut tx = Producer::builder(&name).capacity(4).slot_size(64).create().unwrap();
    let child = spawn("consumer_leaves_while_producer_blocked", "consumer", &[("RING", name)]);
    wait_for_consumers(&tx, 1);
    for _ in 0..5 {
        tx.send(b"m", b"").unwrap();
    }
    // The consumer read 1 of 5 and stopped: the ring is full.
    let t = Instant::now();
    let slot = tx.acquire_timeout(Duration::from_secs(20)).expect("producer stayed blocked");
    let waited = t.elapsed();
    let _ = slot;
    expect_success(child, "consumer");
    assert_eq!(tx.consumer_count(), 0);
    println!("producer unblocked after {waited:?}");
}

/// A consumer of a producer process that exits gets every message, then `Disconnected`.
#[test]
fn producer_exit_disconnects_after_drain() {
    if role().is_some() {
        let mut tx = Producer::builder(&env::<String>("RING")).capacity(16).create().unwrap();
        while tx.consumer_count() == 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
        for i in 0..10u64 {
            tx.send(&i.to_le_bytes(), b"").unwrap();
        }
        return;
    }
    let name = unique_name("pexit");
    let child =
        spawn("producer_exit_disconnects_after_drain", "producer", &[("RING", name.clone())]);
    let rx = open_when_created(&name);
    expect_success(child, "producer");
    for i in 0..10u64 {
        assert_eq!(&*rx.recv().unwrap(), &i.to_le_bytes());
    }
    assert_eq!(rx.recv().err(), Some(RecvError::Disconnected));
}

/// A consumer of a producer that is killed (no chance to close) drains, then gets
/// `Disconnected` from its liveness check instead of waiting forever.
#[test]
fn producer_killed_disconnects() {
    if role().is_some() {
        let mut tx = Producer::builder(&env::<String>("RING")).capacity(16).create().unwrap();
        while tx.consumer_count() == 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
        for i in 0..10u64 {
            tx.send(&i.to_le_bytes(), b"").unwrap();
        }
        std::thread::sleep(Duration::from_secs(60));
        unreachable!("killed before");
    }
    let name = unique_name("pkill");
    let mut child = spawn("producer_killed_disconnects", "producer", &[("RING", name.clone())]);
    let rx = open_when_created(&name);
    for i in 0..10u64 {
        assert_eq!(&*rx.recv().unwrap(), &i.to_le_bytes());
    }
    let pid = rustix::process::Pid::from_raw(child.id() as i32).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::KILL).unwrap();
    child.wait().unwrap();
    let t = Instant::now();
    assert_eq!(rx.recv().err(), Some(RecvError::Disconnected));
    eprintln!("Disconnected {:?} after the kill", t.elapsed());
    // The dead producer's segment is still there; a new producer reclaims the name.
    let tx = Producer::builder(&name).create().expect("stale segment reclaimed");
    drop(tx);
}
