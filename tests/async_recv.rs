//! Async receive and acquire (feature `tokio`): doorbells, parking, cancellation, streams, the
//! lost-wakeup race, and async consumers in other processes.
//!
//! Every waiter here has a liveness interval of a minute, and every wait a deadline of 20 s:
//! a wait that finishes in time was woken by its doorbell, not by its timer.
#![cfg(feature = "tokio")]

mod common;

use std::future::Future;
use std::time::Duration;

use common::{expect_success, role, spawn, unique_name};
use futures_util::StreamExt;
use gpuring::{Consumer, Policy, Producer, RecvError, StartAt};

const LONG: Duration = Duration::from_secs(60);
const DEADLINE: Duration = Duration::from_secs(20);

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

/// Awaits `f`, failing the test if it takes longer than [`DEADLINE`].
async fn in_time<T>(what: &str, f: impl Future<Output = T>) -> T {
    match tokio::time::timeout(DEADLINE, f).await {
        Ok(v) => v,
        Err(_) => panic!("{what}: not woken within {DEADLINE:?} (a lost wake-up)"),
    }
}

fn consumer(name: &str) -> Consumer {
    Consumer::builder(name).start_at(StartAt::Next).liveness_interval(LONG).open().unwrap()
}

/// A 4-slot ring named after `tag` and one consumer of it.
fn ring(tag: &str) -> (Producer, Consumer) {
    let name = unique_name(tag);
    let tx = Producer::builder(&name).capacity(4).slot_size(64).create().unwrap();
    let rx = consumer(&name);
    (tx, rx)
}

/// Sends `data` from another thread after `ms` milliseconds; joining gives the producer back.
fn send_later(
    mut tx: Producer,
    ms: u64,
    data: &'static [u8],
    header: &'static [u8],
) -> std::thread::JoinHandle<Producer> {
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(ms));
        tx.send(data, header).unwrap();
        tx
    })
}

#[test]
fn recv_async_is_woken_by_the_producers_publish() {
    let (tx, rx) = ring("async-bell");
    let sender = send_later(tx, 50, b"ding", b"hdr");
    runtime().block_on(async {
        let msg = in_time("recv_async", rx.recv_async()).await.unwrap();
        assert_eq!(&*msg, b"ding");
        assert_eq!(&msg.header()[..3], b"hdr");
    });
    drop(sender.join().unwrap());
    let end = runtime().block_on(in_time("disconnect", rx.recv_async()));
    assert!(matches!(end, Err(RecvError::Disconnected)));
}

#[test]
fn a_waiting_receive_is_parked_and_a_cancelled_one_is_not() {
    let (mut tx, rx) = ring("async-cancel");
    runtime().block_on(async {
        let wait = rx.recv_async();
        tokio::pin!(wait);
        let pending = tokio::time::timeout(Duration::from_millis(50), &mut wait).await;
        assert!(pending.is_err(), "nothing was sent");
        assert!(tx.consumers()[0].parked, "a pending recv_async parks");
    });
    // The future was dropped mid-wait: the consumer must be unparked again.
    assert!(!tx.consumers()[0].parked);
    tx.send(b"after", b"").unwrap();
    let got = runtime().block_on(in_time("recv_async", rx.recv_async())).unwrap();
    assert_eq!(&*got, b"after");
}

/// Two waits on one consumer at once (a stream and a `recv_async` in one task); the second is
/// cancelled. The first must still be rung: parking counts waits, it does not just flag them.
#[test]
fn a_cancelled_wait_does_not_unpark_another_wait_on_the_same_consumer() {
    let (tx, rx) = ring("async-two-waits");
    let sender = send_later(tx, 150, b"late", b"");
    runtime().block_on(async {
        let mut messages = rx.messages();
        let first = in_time("stream", messages.next());
        let second = async {
            let r = tokio::time::timeout(Duration::from_millis(50), rx.recv_async()).await;
            assert!(r.is_err(), "nothing was sent yet");
        };
        let (got, ()) = tokio::join!(first, second);
        assert_eq!(&*got.unwrap().unwrap(), b"late");
    });
    drop(sender.join().unwrap());
}

/// A consumer used on one runtime, which is then dropped, waits on a second runtime: its
/// doorbell is registered with the reactor of whichever runtime polls the wait.
#[test]
fn a_consumer_moves_between_runtimes() {
    let (mut tx, rx) = ring("async-runtimes");
    tx.send(b"one", b"").unwrap();
    let first = runtime();
    first.block_on(async {
        let wait = tokio::time::timeout(Duration::from_millis(20), rx.recv_async());
        assert_eq!(&*wait.await.unwrap().unwrap(), b"one");
        // A real wait on this runtime, cancelled: the doorbell is registered here once.
        assert!(tokio::time::timeout(Duration::from_millis(20), rx.recv_async()).await.is_err());
    });
    drop(first);
    let sender = send_later(tx, 50, b"two", b"");
    let got = runtime().block_on(in_time("recv_async on a second runtime", rx.recv_async()));
    assert_eq!(&*got.unwrap(), b"two");
    drop(sender.join().unwrap());
}

#[test]
fn the_stream_yields_every_message_then_ends() {
    let (mut tx, rx) = ring("async-stream");
    let sender = std::thread::spawn(move || {
        for i in 0..100u32 {
            tx.send(&i.to_le_bytes(), b"").unwrap();
            if i % 10 == 0 {
                std::thread::sleep(Duration::from_millis(2));
            }
        }
    });
    let seen = runtime().block_on(async {
        let mut seen = Vec::new();
        let mut messages = rx.messages();
        while let Some(msg) = in_time("stream", messages.next()).await {
            let msg = msg.unwrap();
            seen.push(u32::from_le_bytes(msg[..4].try_into().unwrap()));
        }
        seen
    });
    sender.join().unwrap();
    assert_eq!(seen, (0..100).collect::<Vec<_>>());
}

#[test]
fn acquire_async_is_woken_by_a_release() {
    let name = unique_name("async-acquire");
    let mut tx = Producer::builder(&name)
        .capacity(1)
        .spare_buffers(0)
        .slot_size(64)
        .policy(Policy::Block)
        .liveness_interval(LONG)
        .create()
        .unwrap();
    let (held_tx, held_rx) = std::sync::mpsc::channel();
    let reader = {
        let name = name.clone();
        std::thread::spawn(move || {
            let rx = consumer(&name);
            held_tx.send(()).unwrap();
            let m = rx.recv().unwrap();
            held_tx.send(()).unwrap();
            std::thread::sleep(Duration::from_millis(100));
            drop(m);
            assert!(rx.recv().is_ok());
        })
    };
    held_rx.recv().unwrap();
    tx.send(b"one", b"").unwrap();
    held_rx.recv().unwrap();
    runtime().block_on(async {
        // The only slot is held: this parks until the reader's release knocks.
        let mut slot = in_time("acquire_async", tx.acquire_async()).await.unwrap();
        slot[..3].copy_from_slice(b"two");
        slot.publish(3, b"").unwrap();
    });
    reader.join().unwrap();
    // The wait counts as blocked time, as a blocking acquire's does.
    let blocked = gpuring::inspect::status(&name).unwrap().blocked_ns;
    assert!(blocked > 50_000_000, "blocked {blocked} ns");
}

/// Both sides async on their own threads, a one-slot ring, and a producer that pauses at random:
/// each side parks thousands of times, in every order against the other's changes. A lost
/// wake-up stalls a side for the minute-long liveness interval and fails its deadline.
#[test]
fn no_wake_up_is_lost_when_both_sides_park_and_race() {
    const N: u32 = 20_000;
    let name = unique_name("async-race");
    let mut tx = Producer::builder(&name)
        .capacity(1)
        .slot_size(64)
        .policy(Policy::Block)
        .liveness_interval(LONG)
        .create()
        .unwrap();
    let rx = consumer(&name);
    let producer = std::thread::spawn(move || {
        runtime().block_on(async {
            let mut x = 0x9e37_79b9_u32;
            for i in 0..N {
                in_time("send_async", tx.send_async(&i.to_le_bytes(), b"")).await.unwrap();
                // xorshift: pause now and then, so the consumer runs dry and parks.
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                match x % 8 {
                    0 => tokio::task::yield_now().await,
                    1 => std::thread::sleep(Duration::from_micros(u64::from(x % 50))),
                    _ => {}
                }
            }
        });
    });
    runtime().block_on(async {
        for i in 0..N {
            let msg = in_time("recv_async", rx.recv_async()).await.unwrap();
            assert_eq!(u32::from_le_bytes(msg[..4].try_into().unwrap()), i);
            if i % 7 == 0 {
                // A slow reader now and then, so the producer finds the ring full and parks.
                std::thread::sleep(Duration::from_micros(20));
            }
        }
    });
    producer.join().unwrap();
}

/// Two async consumers in other processes receive every message from an async producer here.
#[test]
fn async_consumers_in_other_processes_receive_everything() {
    const N: u32 = 5_000;
    if role().as_deref() == Some("async-consumer") {
        let name: String = common::env("RING");
        let rx = Consumer::builder(&name)
            .start_at(StartAt::Oldest)
            .liveness_interval(LONG)
            .open_timeout(DEADLINE)
            .unwrap();
        runtime().block_on(async {
            for i in 0..N {
                let msg = in_time("recv_async", rx.recv_async()).await.unwrap();
                assert_eq!(msg.seq(), u64::from(i));
                assert!(msg.iter().all(|&b| b == i as u8), "message {i} damaged");
            }
            let end = in_time("disconnect", rx.recv_async()).await;
            assert!(matches!(end, Err(RecvError::Disconnected)));
        });
        return;
    }
    let name = unique_name("async-procs");
    let mut tx = Producer::builder(&name)
        .capacity(4)
        .slot_size(4096)
        .policy(Policy::Block)
        .liveness_interval(LONG)
        .create()
        .unwrap();
    let test = "async_consumers_in_other_processes_receive_everything";
    let children: Vec<_> =
        (0..2).map(|_| spawn(test, "async-consumer", &[("RING", name.clone())])).collect();
    let start = std::time::Instant::now();
    while tx.consumer_count() < 2 {
        assert!(start.elapsed() < DEADLINE, "consumers did not join");
        std::thread::sleep(Duration::from_millis(5));
    }
    runtime().block_on(async {
        for i in 0..N {
            let mut slot = in_time("acquire_async", tx.acquire_async()).await.unwrap();
            let len = 64 + (i as usize * 31) % 4000;
            slot[..len].fill(i as u8);
            slot.publish(len, b"").unwrap();
        }
    });
    drop(tx);
    for child in children {
        expect_success(child, "async consumer");
    }
}

/// The producer's futures are `Send` (they can go to `tokio::spawn`), as the docs say; this
/// fails to compile if that changes.
#[test]
fn the_producers_futures_are_send() {
    fn send<T: Send>(_: T) {}
    let (mut tx, _rx) = ring("async-send");
    send(tx.acquire_async());
    send(tx.send_async(b"x", b""));
}

/// Issue 22, item 5: the usual tokio pattern compiles and runs. A consumer moves into
/// `tokio::spawn` on a multi-threaded runtime and holds each message across an `.await`; then
/// four spawned tasks share one consumer (`Arc`) and between them receive every message of a
/// lossless ring exactly once. Before the consumer was `Sync`, this file did not compile
/// (E0277: `Cell<bool>` in `Consumer`).
#[test]
fn spawned_tasks_own_or_share_a_consumer() {
    const N: u64 = 2000;
    let name = unique_name("async-spawn");
    let mut tx = Producer::builder(&name).capacity(8).slot_size(64).create().unwrap();
    let rx = consumer(&name);
    let shared = std::sync::Arc::new(consumer(&name));
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(4).enable_all().build();
    let rt = rt.unwrap();
    let owner = rt.spawn(async move {
        let mut seqs = Vec::new();
        while let Ok(msg) = rx.recv_async().await {
            tokio::task::yield_now().await; // held across an await, maybe on another worker
            assert_eq!(&msg[..8], &msg.seq().to_le_bytes()[..]);
            seqs.push(msg.seq());
        }
        seqs
    });
    let sharers: Vec<_> = (0..4)
        .map(|_| {
            let rx = shared.clone();
            rt.spawn(async move {
                let mut seqs = Vec::new();
                while let Ok(msg) = rx.recv_async().await {
                    tokio::task::yield_now().await;
                    seqs.push(msg.seq());
                }
                seqs
            })
        })
        .collect();
    for _ in 0..N {
        let mut slot = tx.acquire().unwrap();
        let seq = slot.seq();
        slot[..8].copy_from_slice(&seq.to_le_bytes());
        slot.publish(8, b"").unwrap();
    }
    drop(tx);
    rt.block_on(async {
        let owned = in_time("the owning task", owner).await.unwrap();
        assert_eq!(owned, (0..N).collect::<Vec<_>>(), "the owner got every message, in order");
        let mut all = Vec::new();
        for task in sharers {
            all.extend(in_time("a sharing task", task).await.unwrap());
        }
        all.sort_unstable();
        assert_eq!(all, (0..N).collect::<Vec<_>>(), "the sharers got each message once");
    });
}

/// Task B of the relay tests: a receive of `rx` on the runtime, parked on its doorbell by the
/// time this returns.
async fn parked_receiver(
    rx: &std::sync::Arc<Consumer>,
) -> tokio::task::JoinHandle<Result<Vec<u8>, RecvError>> {
    let b = tokio::spawn({
        let rx = rx.clone();
        async move { rx.recv_async().await.map(|m| m.to_vec()) }
    });
    for _ in 0..10 {
        tokio::task::yield_now().await; // B parks and awaits its doorbell
    }
    assert!(!b.is_finished());
    b
}

/// Review of item 5, finding F1: waiters of one consumer share its doorbell, so one may empty
/// knocks meant for another. Here task B is parked on the doorbell when two messages are
/// published; before B's runtime turns, another waiter of the consumer (the test, as an event
/// loop would) empties the doorbell and takes the first message. The receive that took it
/// rings the doorbell once more for B, which then gets the second within the deadline; without
/// that relay B slept until its liveness tick (a minute here).
#[test]
fn a_waiter_that_empties_the_doorbell_passes_the_wake_on() {
    let (mut tx, rx) = ring("async-relay");
    let rx = std::sync::Arc::new(rx);
    runtime().block_on(async {
        let b = parked_receiver(&rx).await;
        tx.send(b"one", b"").unwrap();
        tx.send(b"two", b"").unwrap();
        rx.disarm_doorbell(); // another waiter empties the doorbell...
        assert_eq!(&*rx.try_recv().unwrap(), b"one"); // ...and takes the first message
        let got = in_time("the task whose knocks were emptied", b).await.unwrap();
        assert_eq!(got.unwrap(), b"two");
    });
}

/// The same relay after the producer is gone: its drop removes every consumer's doorbell file
/// right after its closing knock, so the relay must reach the doorbell without its file (a
/// task sharing the consumer otherwise slept until its liveness tick instead of seeing the
/// end).
#[test]
fn the_wake_is_passed_on_after_the_producer_is_gone() {
    let (mut tx, rx) = ring("async-relay-end");
    let rx = std::sync::Arc::new(rx);
    runtime().block_on(async {
        let b = parked_receiver(&rx).await;
        tx.send(b"one", b"").unwrap();
        drop(tx); // knocks, then removes the doorbell files
        rx.disarm_doorbell(); // another waiter empties the doorbell...
        assert_eq!(&*rx.try_recv().unwrap(), b"one"); // ...and takes the message
        let got = in_time("the task whose knocks were emptied", b).await.unwrap();
        assert!(matches!(got, Err(RecvError::Disconnected)), "B sees the end: {got:?}");
    });
}
