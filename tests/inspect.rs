//! `gpuring::inspect` and the `gpuring` command: what they report about a live ring, and that
//! `rm` refuses a live producer's ring.

mod common;

#[cfg(feature = "cli")]
use common::run_cli;
use common::unique_name;
use gpuring::inspect::{self, RemoveError};
use gpuring::{Consumer, MemoryKind, OpenError, OpenErrorKind, Policy, Producer, StartAt};

#[test]
fn status_reports_the_counters() {
    let name = unique_name("inspect");
    let mut tx = Producer::builder(&name).capacity(16).slot_size(256).create().unwrap();
    let rx = Consumer::builder(&name).start_at(StartAt::Next).open().unwrap();
    for i in 0..10u8 {
        tx.send(&[i; 100], b"").unwrap();
    }
    let a = rx.recv().unwrap();
    drop(a);
    let b = rx.recv().unwrap();
    drop(b);
    let held = rx.recv().unwrap();

    let s = inspect::status(&name).unwrap();
    assert_eq!(s.name, name);
    assert_eq!(s.memory, MemoryKind::Host);
    assert_eq!((s.capacity, s.slot_size, s.policy), (16, 256, Policy::Block));
    assert_eq!(s.producer_pid, std::process::id());
    assert!(s.producer_alive && !s.closed);
    assert_eq!(s.published, 10);
    assert_eq!(s.consumers.len(), 1);
    let c = &s.consumers[0];
    assert_eq!((c.pid, c.alive), (std::process::id(), true));
    assert_eq!(c.holding, 1, "one message is held");
    assert_eq!(c.lag, 7, "3 of 10 taken");
    // `received` is flushed by the consumer on release: the two released messages at least.
    assert!(c.received >= 2, "received {}", c.received);
    assert!(inspect::ring_names().unwrap().contains(&name));
    drop(held);
}

#[test]
fn remove_refuses_a_live_producer_unless_forced() {
    let name = unique_name("inspect-rm");
    let tx = Producer::builder(&name).create().unwrap();
    match inspect::remove(&name, false) {
        Err(RemoveError::ProducerAlive { pid }) => assert_eq!(pid, std::process::id()),
        other => panic!("expected ProducerAlive, got {other:?}"),
    }
    inspect::remove(&name, true).unwrap();
    assert!(matches!(
        inspect::status(&name).map_err(OpenError::into_kind),
        Err(OpenErrorKind::NotFound)
    ));
    assert!(matches!(inspect::remove(&name, false), Err(RemoveError::NotFound)));
    drop(tx);
}

#[cfg(feature = "cli")]
#[test]
fn cli_lists_stats_and_removes() {
    let name = unique_name("cli");
    let mut tx = Producer::builder(&name).capacity(8).slot_size(1 << 20).create().unwrap();
    let rx = Consumer::builder(&name).start_at(StartAt::Next).open().unwrap();
    tx.send(b"frame", b"").unwrap();
    let held = rx.recv().unwrap();

    let (code, out, err) = run_cli(&["list", "--json"]);
    assert_eq!(code, 0, "{err}");
    let list: serde_json::Value = serde_json::from_str(&out).unwrap();
    let me = list.as_array().unwrap().iter().find(|r| r["name"] == name.as_str()).unwrap();
    assert_eq!(me["memory"], "host");
    assert_eq!(me["capacity"], 8);
    assert_eq!(me["slot_size"], 1 << 20);
    assert_eq!(me["policy"], "block");
    assert_eq!(me["producer_alive"], true);
    assert_eq!(me["consumers"].as_array().unwrap().len(), 1);

    let (code, out, err) = run_cli(&["stat", &name, "--json"]);
    assert_eq!(code, 0, "{err}");
    let stat: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(stat["published"], 1);
    assert!(stat["rate"].is_number() && stat["blocked_share"].is_number());
    assert_eq!(stat["consumers"][0]["received"], 1);
    // Who holds what: the consumer (lossless, the block policy's default) holds message 0.
    assert_eq!(stat["spares"], 8);
    assert_eq!(stat["held_buffers"], 1);
    assert_eq!(stat["consumers"][0]["mode"], "lossless");
    assert_eq!(stat["consumers"][0]["holding"], 1);
    assert_eq!(stat["consumers"][0]["oldest_held"], 0);

    let (code, out, _) = run_cli(&["stat", &name]);
    assert_eq!(code, 0);
    let head = format!("ring {name}: host memory, 8 slots + 8 spares of 1.0 MiB, block");
    assert!(out.contains(&head), "{out}");
    assert!(out.contains("buffers held 1 of 16"), "{out}");
    assert!(out.contains("lossless") && out.contains("#0"), "{out}");
    drop(held);
    let (_, out, _) = run_cli(&["stat", &name, "--json"]);
    let stat: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(stat["held_buffers"], 0);
    assert_eq!(stat["consumers"][0]["oldest_held"], serde_json::Value::Null);

    let (code, _, err) = run_cli(&["rm", &name]);
    assert_eq!(code, 1);
    assert!(err.starts_with("gpuring: ") && err.contains("is alive"), "{err}");
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    let (code, out, err) = run_cli(&["rm", &name, "--force", "--json"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(serde_json::from_str::<serde_json::Value>(&out).unwrap()["removed"], name.as_str());

    let (code, _, err) = run_cli(&["stat", &name]);
    assert_eq!(code, 1);
    assert_eq!(
        err.trim_end(),
        format!("gpuring: no ring named {name:?} in /dev/shm"),
        "one wording"
    );
    let (code, _, err) = run_cli(&["rm", &name]);
    assert_eq!(code, 1);
    assert_eq!(
        err.trim_end(),
        format!("gpuring: no ring named {name:?} in /dev/shm"),
        "one wording"
    );
    drop(tx);
}

#[cfg(feature = "cli")]
#[test]
fn cli_bench_host_checks_every_byte() {
    let args = ["bench", "--memory", "host", "--consumers", "2", "--seconds", "0.3", "--json"];
    let (code, out, err) = run_cli(&args);
    assert_eq!(code, 0, "{err}");
    let r: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(r["memory"], "host");
    assert_eq!(r["bad_bytes"], 0);
    let fps = r["consumer_fps"].as_array().unwrap();
    assert_eq!(fps.len(), 2);
    assert!(fps.iter().all(|f| f.as_f64().unwrap() > 0.0), "{out}");
    assert!(r["p50_ns"].as_array().unwrap().iter().all(|p| p.as_u64().unwrap() > 0), "{out}");
}

#[cfg(feature = "cli")]
#[test]
fn cli_bench_with_a_slow_consumer_runs_both_and_compares() {
    let args = [
        "bench",
        "--memory",
        "host",
        "--consumers",
        "1",
        "--seconds",
        "0.3",
        "--policy",
        "overwrite",
        "--capacity",
        "4",
        "--slow-hold-ms",
        "20",
        "--json",
    ];
    let (code, out, err) = run_cli(&args);
    assert_eq!(code, 0, "{err}");
    let r: serde_json::Value = serde_json::from_str(&out).unwrap();
    let (without, with) = (&r["without_slow"], &r["with_slow"]);
    assert_eq!(without["consumers"], 1, "{out}");
    assert_eq!(without["slow_hold_ms"], 0, "{out}");
    assert_eq!(with["consumers"], 2, "{out}");
    assert_eq!(with["slow_hold_ms"], 20, "{out}");
    assert_eq!(with["policy"], "overwrite", "{out}");
    for run in [without, with] {
        assert_eq!(run["bad_bytes"], 0, "{out}");
        assert!(run["producer_fps"].as_f64().unwrap() > 0.0, "{out}");
    }
    // The slow consumer received something, and the ratios are the runs' own.
    assert!(with["consumer_fps"][1].as_f64().unwrap() > 0.0, "{out}");
    let ratio = with["producer_fps"].as_f64().unwrap() / without["producer_fps"].as_f64().unwrap();
    assert!((r["producer_ratio"].as_f64().unwrap() - ratio).abs() < 1e-9, "{out}");
}

/// A stall shows while it happens: `status` reports the wait going on, what it waits on, and
/// counts its time so far in `blocked_ns` (it once counted a wait only when it ended).
#[test]
fn a_stall_shows_while_it_happens() {
    use gpuring::inspect::BlockedOn;
    use std::time::{Duration, Instant};
    let name = common::unique_name("stall");
    let mut tx = gpuring::Producer::builder(&name).capacity(2).spare_buffers(0).create().unwrap();
    let rx = gpuring::Consumer::builder(&name).mode(gpuring::Mode::Lossless).open().unwrap();
    let entry = gpuring::inspect::status(&name).unwrap().consumers[0].index;
    let sender = std::thread::spawn(move || {
        for i in 0..3u8 {
            tx.send(&[i], b"").unwrap(); // the third waits for the consumer
        }
        tx
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    let first = loop {
        let s = gpuring::inspect::status(&name).unwrap();
        if let Some(b) = s.blocked_now {
            break b;
        }
        assert!(Instant::now() < deadline, "the producer never showed as blocked");
        std::thread::sleep(Duration::from_millis(2));
    };
    assert_eq!(first.on, BlockedOn::Consumers);
    assert_eq!(first.waiting_on, Some((entry, std::process::id())));
    std::thread::sleep(Duration::from_millis(300));
    let s = gpuring::inspect::status(&name).unwrap();
    let now = s.blocked_now.expect("still blocked");
    assert!(now.for_ns >= 250_000_000, "the wait so far: {} ns", now.for_ns);
    // Counted as it passes, at each liveness tick (100 ms by default).
    assert!(s.blocked_ns + 150_000_000 >= now.for_ns, "the total counts the wait going on");
    assert_eq!(rx.recv().unwrap()[0], 0); // frees a slot: the producer goes on
    let _tx = sender.join().unwrap();
    let s = gpuring::inspect::status(&name).unwrap();
    assert!(s.blocked_now.is_none());
    assert!(s.blocked_ns >= 250_000_000);
}

/// A producer that waits in short timed steps (as Python's `send` and the GStreamer sink do)
/// shows one stall growing across the steps, and its blocked time never goes back.
#[test]
fn a_stall_of_timed_waits_shows_whole_and_never_counts_back() {
    use std::time::{Duration, Instant};
    let name = common::unique_name("stall-steps");
    let mut tx = gpuring::Producer::builder(&name).capacity(2).spare_buffers(0).create().unwrap();
    let rx = gpuring::Consumer::builder(&name).mode(gpuring::Mode::Lossless).open().unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stopping = stop.clone();
    let sender = std::thread::spawn(move || {
        let mut sent = 0u8;
        while !stopping.load(std::sync::atomic::Ordering::Relaxed) {
            match tx.acquire_timeout(Duration::from_millis(20)) {
                Ok(slot) => {
                    slot.publish(0, b"").unwrap();
                    sent += 1;
                }
                Err(gpuring::AcquireTimeoutError::Timeout) => {}
                Err(e) => panic!("{e}"),
            }
        }
        sent
    });
    let (start, mut last_total, mut longest) = (Instant::now(), 0u64, 0u64);
    while start.elapsed() < Duration::from_millis(700) {
        let s = gpuring::inspect::status(&name).unwrap();
        assert!(
            s.blocked_ns >= last_total,
            "blocked_ns went back: {} < {last_total}",
            s.blocked_ns
        );
        last_total = s.blocked_ns;
        longest = longest.max(s.blocked_now.map_or(0, |b| b.for_ns));
        std::thread::sleep(Duration::from_millis(3));
    }
    assert!(longest >= 400_000_000, "one stall across the timed waits, {longest} ns at most");
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    assert_eq!(sender.join().unwrap(), 2, "the ring filled, then nothing was read");
    drop(rx);
}
