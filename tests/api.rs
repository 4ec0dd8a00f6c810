//! The public API within one process: sending, receiving, closing and the errors of each.

mod common;

use std::time::Duration;

use common::unique_name;
use gpuring::{
    Consumer, CreateError, CreateErrorKind, NameError, OpenError, OpenErrorKind, Policy, Producer,
    PublishError, RecvError, RecvTimeoutError, StartAt, TryAcquireError, TryRecvError,
};

#[test]
fn send_and_receive_with_header() {
    let name = unique_name("basic");
    let mut tx = Producer::builder(&name).capacity(4).slot_size(256).create().unwrap();
    let rx = Consumer::builder(&name).start_at(StartAt::Next).open().unwrap();
    assert_eq!(tx.consumer_count(), 1);
    assert!(matches!(rx.try_recv(), Err(TryRecvError::Empty)));
    let seq = tx.send(b"frame", &[1, 2, 3]).unwrap();
    assert_eq!(seq, 0);
    let m = rx.recv().unwrap();
    assert_eq!(&*m, b"frame");
    assert_eq!(m.seq(), 0);
    assert_eq!(m.lag(), 0);
    assert_eq!(&m.header()[..4], &[1, 2, 3, 0]);
    assert_eq!(m.header().len(), 64);
    assert!(m.timestamp_ns() > 0);
}

#[test]
fn several_messages_held_at_once() {
    let name = unique_name("hold");
    let builder = Producer::builder(&name).capacity(4).spare_buffers(1).slot_size(64);
    let mut tx = builder.create().unwrap();
    let rx = Consumer::builder(&name).start_at(StartAt::Next).open().unwrap();
    for i in 0..4u8 {
        tx.send(&[i; 10], b"").unwrap();
    }
    let held: Vec<_> = (0..4).map(|_| rx.recv().unwrap()).collect();
    // Every slot's buffer is held: the spare takes the next message's place...
    tx.send(&[4; 10], b"").unwrap();
    // ...and then every buffer is held: none for the producer.
    assert!(matches!(tx.try_acquire(), Err(TryAcquireError::Full)));
    assert_eq!(tx.consumers()[0].holding, 4);
    assert_eq!(tx.held_buffers(), 4);
    for (i, m) in held.iter().enumerate() {
        assert_eq!(&**m, &[i as u8; 10]);
    }
    drop(held);
    assert!(tx.try_acquire().is_ok());
}

#[test]
fn disconnected_after_drain() {
    let name = unique_name("drain");
    let mut tx = Producer::builder(&name).capacity(4).create().unwrap();
    let rx = Consumer::builder(&name).start_at(StartAt::Next).open().unwrap();
    tx.send(b"a", b"").unwrap();
    tx.send(b"b", b"").unwrap();
    drop(tx);
    assert!(!std::path::Path::new(&format!("/dev/shm/gpuring.{name}")).exists());
    assert_eq!(&*rx.recv().unwrap(), b"a");
    assert_eq!(&*rx.recv().unwrap(), b"b");
    assert!(matches!(rx.recv(), Err(RecvError::Disconnected)));
    assert!(matches!(rx.try_recv(), Err(TryRecvError::Disconnected)));
    assert!(matches!(
        Consumer::open(&name).map_err(OpenError::into_kind),
        Err(OpenErrorKind::NotFound)
    ));
}

#[test]
fn timeouts() {
    let name = unique_name("timeout");
    let mut tx = Producer::builder(&name).capacity(1).policy(Policy::Block).create().unwrap();
    let rx = Consumer::builder(&name).start_at(StartAt::Next).open().unwrap();
    let t = std::time::Instant::now();
    assert!(matches!(rx.recv_timeout(Duration::from_millis(30)), Err(RecvTimeoutError::Timeout)));
    assert!(t.elapsed() >= Duration::from_millis(30));
    tx.send(b"x", b"").unwrap();
    // Block, capacity 1, one unread message: the producer cannot go on.
    assert!(matches!(
        tx.acquire_timeout(Duration::from_millis(30)),
        Err(gpuring::AcquireTimeoutError::Timeout)
    ));
    drop(rx.recv().unwrap());
    assert!(tx.acquire_timeout(Duration::from_millis(30)).is_ok());
}

#[test]
fn publish_checks_lengths() {
    let name = unique_name("lens");
    let mut tx = Producer::builder(&name).slot_size(16).user_header_size(4).create().unwrap();
    let slot = tx.acquire().unwrap();
    assert_eq!(slot.len(), 16);
    assert_eq!(slot.publish(17, b""), Err(PublishError::TooLong { len: 17, slot_size: 16 }));
    let slot = tx.acquire().unwrap();
    assert_eq!(slot.publish(1, b"12345"), Err(PublishError::HeaderTooLong { len: 5, max: 4 }));
    // The failed publishes left the slot claimed; it is handed out again.
    let slot = tx.acquire().unwrap();
    assert_eq!(slot.seq(), 0);
    assert_eq!(slot.publish(16, b"1234"), Ok(0));
}

#[test]
fn config_and_name_errors() {
    assert!(matches!(
        Producer::builder("").create().map_err(CreateError::into_kind),
        Err(CreateErrorKind::InvalidName(NameError::Empty))
    ));
    assert!(matches!(
        Producer::builder("a/b").create().map_err(CreateError::into_kind),
        Err(CreateErrorKind::InvalidName(NameError::Slash))
    ));
    assert!(matches!(
        Consumer::open("a\0b").map_err(OpenError::into_kind),
        Err(OpenErrorKind::InvalidName(NameError::Nul))
    ));
    let long = "n".repeat(gpuring::MAX_NAME_LEN + 1);
    assert!(matches!(
        Consumer::open(&long).map_err(OpenError::into_kind),
        Err(OpenErrorKind::InvalidName(NameError::TooLong { .. }))
    ));
    let name = unique_name("cfg");
    assert!(matches!(
        Producer::builder(&name).capacity(0).create().map_err(CreateError::into_kind),
        Err(CreateErrorKind::InvalidConfig { field: "capacity", .. })
    ));
    assert!(matches!(
        Producer::builder(&name).slot_size(0).create().map_err(CreateError::into_kind),
        Err(CreateErrorKind::InvalidConfig { field: "slot_size", .. })
    ));
    assert!(matches!(
        Producer::builder(&name).mode(0o4777).create().map_err(CreateError::into_kind),
        Err(CreateErrorKind::InvalidConfig { field: "mode", .. })
    ));
}

/// What `?` in a `main` returning `Box<dyn Error>` prints is the error's `Debug`: it holds the
/// message, the ring's name and its kind.
#[test]
fn the_debug_of_create_and_open_errors_holds_their_message() {
    let name = unique_name("debug");
    let open = Consumer::open(&name).unwrap_err();
    let _tx = Producer::builder(&name).create().unwrap();
    let create = Producer::builder(&name).create().unwrap_err();
    let invalid = Producer::builder(&name).capacity(0).create().unwrap_err();
    let boxed: Box<dyn std::error::Error> = Box::new(Consumer::open("a/b").unwrap_err());
    let errors: [(String, String); 4] = [
        (format!("{open:?}"), open.to_string()),
        (format!("{create:?}"), create.to_string()),
        (format!("{invalid:?}"), invalid.to_string()),
        (format!("{boxed:?}"), boxed.to_string()),
    ];
    for (debug, message) in &errors {
        assert!(debug.contains(&format!("message: {message:?}")), "{debug} lacks {message:?}");
    }
    let [(open_debug, open_message), (create_debug, _), ..] = &errors;
    assert!(open_debug.starts_with(&format!("OpenError {{ ring: {name:?}, kind: NotFound,")));
    assert!(open_message.starts_with(&format!("no ring named {name:?} in ")));
    assert!(create_debug.starts_with(&format!("CreateError {{ ring: {name:?}, kind: Already")));
}

#[test]
fn second_producer_is_refused_while_first_lives() {
    let name = unique_name("twice");
    let _tx = Producer::builder(&name).create().unwrap();
    let me = std::process::id();
    assert!(matches!(
        Producer::builder(&name).create().map_err(CreateError::into_kind),
        Err(CreateErrorKind::AlreadyExists { pid }) if pid == me
    ));
}

#[test]
fn table_full() {
    let name = unique_name("full");
    let _tx = Producer::builder(&name).max_consumers(2).create().unwrap();
    let _a = Consumer::open(&name).unwrap();
    let b = Consumer::open(&name).unwrap();
    assert!(matches!(
        Consumer::open(&name).map_err(OpenError::into_kind),
        Err(OpenErrorKind::TooManyConsumers { max: 2 })
    ));
    drop(b);
    assert!(Consumer::open(&name).is_ok());
}

#[test]
fn segment_mode_is_exact() {
    use std::os::unix::fs::PermissionsExt;
    let name = unique_name("mode");
    let _tx = Producer::builder(&name).create().unwrap();
    let path = format!("/dev/shm/gpuring.{name}");
    assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
    let name2 = unique_name("mode");
    let _tx2 = Producer::builder(&name2).mode(0o640).create().unwrap();
    let path2 = format!("/dev/shm/gpuring.{name2}");
    assert_eq!(std::fs::metadata(&path2).unwrap().permissions().mode() & 0o777, 0o640);
}

#[test]
fn overwrite_reports_lag() {
    let name = unique_name("lag");
    let mut tx = Producer::builder(&name).capacity(4).policy(Policy::Overwrite).create().unwrap();
    let rx = Consumer::builder(&name).start_at(StartAt::Next).open().unwrap();
    for i in 0..10u64 {
        tx.send(&i.to_le_bytes(), b"").unwrap();
    }
    let m = rx.recv().unwrap();
    assert_eq!((m.seq(), m.lag()), (6, 6));
    drop(m);
    assert_eq!(tx.consumers()[0].lost, 6);
    for want in 7..10 {
        let m = rx.recv().unwrap();
        assert_eq!((m.seq(), m.lag()), (want, 0));
    }
}

#[test]
fn blocked_producer_wakes_when_consumer_leaves() {
    let name = unique_name("leave");
    let mut tx = Producer::builder(&name).capacity(2).create().unwrap();
    let rx = Consumer::builder(&name).start_at(StartAt::Next).open().unwrap();
    tx.send(b"1", b"").unwrap();
    tx.send(b"2", b"").unwrap();
    let leaver = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(200));
        drop(rx);
    });
    // Blocks on the consumer (past the 50 µs spin, so it sleeps on the futex) until it leaves.
    let t = std::time::Instant::now();
    let slot = tx.acquire().unwrap();
    assert!(t.elapsed() >= Duration::from_millis(150));
    let _ = slot;
    leaver.join().unwrap();
}

#[test]
fn default_spares_fit_the_limits_and_explicit_ones_are_checked() {
    // 1024 x 1024 hold records is the most a ring may have: no room for spares by default,
    // and a consumer can open it.
    let name = unique_name("spare-limits");
    let builder = Producer::builder(&name).capacity(1024).max_consumers(1024).slot_size(64);
    let tx = builder.clone().create().unwrap();
    assert_eq!(tx.spare_buffers(), 0);
    let _rx = Consumer::open(&name).unwrap();
    drop(tx);
    let too_many = builder.spare_buffers(1).create();
    assert!(matches!(
        too_many.map_err(CreateError::into_kind),
        Err(CreateErrorKind::InvalidConfig { field: "spare_buffers", .. })
    ));
    let largest = Producer::builder(&unique_name("spare-largest")).capacity(65536).max_consumers(1);
    assert_eq!(largest.slot_size(16).create().unwrap().spare_buffers(), 0);
    let tx = Producer::builder(&unique_name("spare-default")).create().unwrap();
    assert_eq!(tx.spare_buffers(), gpuring::DEFAULT_SPARES);
}

/// VMM sharing is a setting of CUDA memory: a host ring refuses it rather than ignore it.
#[cfg(feature = "cuda")]
#[test]
fn a_host_ring_refuses_vmm_sharing() {
    let b = Producer::builder(&unique_name("host-vmm"));
    let vmm = gpuring::Sharing::Vmm(gpuring::PeerPolicy::SameUid);
    match b.sharing(vmm).create().map_err(gpuring::CreateError::into_kind) {
        Err(gpuring::CreateErrorKind::InvalidConfig { field: "sharing", .. }) => {}
        other => panic!("a host ring took VMM sharing: {:?}", other.err()),
    }
}

/// A lossless job's startup: the producer waits until its consumer has joined before it sends,
/// so nothing is sent to nobody.
#[test]
fn a_producer_waits_for_its_consumers() {
    let name = unique_name("wait-consumers");
    let mut tx = Producer::builder(&name).create().unwrap();
    let none = tx.wait_for_consumers(1, Duration::from_millis(20));
    let timeout = gpuring::ConsumersTimeout { joined: 0, wanted: 1 };
    assert_eq!(none, Err(gpuring::WaitForConsumersError::Timeout(timeout)));
    let consumer = {
        let name = name.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            let rx = Consumer::open(&name).unwrap();
            let first = rx.recv().unwrap();
            first.to_vec()
        })
    };
    assert_eq!(tx.wait_for_consumers(1, Duration::from_secs(10)), Ok(1));
    tx.send(b"first", b"").unwrap();
    assert_eq!(consumer.join().unwrap(), b"first");
}

/// A consumer tells a stream its producer closed from one whose producer died.
#[test]
fn a_died_producer_is_told_from_a_closed_one() {
    if common::role().as_deref() == Some("dies") {
        let name: String = common::env("RING");
        let mut tx = Producer::builder(&name).create().unwrap();
        tx.wait_for_consumers(1, Duration::from_secs(20)).unwrap();
        tx.send(b"only", b"").unwrap();
        std::process::abort(); // no close: the ring is left as a crash leaves it
    }
    let name = unique_name("dies");
    let child = common::spawn(
        "a_died_producer_is_told_from_a_closed_one",
        "dies",
        &[("RING", name.clone())],
    );
    let rx = Consumer::builder(&name)
        .start_at(gpuring::StartAt::Oldest)
        .open_timeout(Duration::from_secs(20))
        .unwrap();
    assert_eq!(&*rx.recv().unwrap(), b"only");
    assert!(matches!(rx.recv(), Err(RecvError::Disconnected)));
    assert_eq!(rx.ended(), Some(gpuring::Ended::Died));
    let status = {
        let mut c = child;
        c.wait().unwrap()
    };
    assert!(!status.success(), "the child aborted");
    let _ = std::fs::remove_file(format!("/dev/shm/gpuring.{name}"));
}

/// A panic that unwinds through a producer, or `abort`, cuts the stream: consumers are told
/// `Died`, not `Closed`, so a recording is not taken for complete.
#[test]
fn a_producer_dropped_by_a_panic_cuts_the_stream() {
    let name = unique_name("panic");
    let tx = Producer::builder(&name).create().unwrap();
    let rx = Consumer::open(&name).unwrap();
    let failed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
        let _tx = tx;
        panic!("the job failed");
    }));
    assert!(failed.is_err());
    assert!(matches!(rx.recv(), Err(RecvError::Disconnected)));
    assert_eq!(rx.ended(), Some(gpuring::Ended::Died));
}

/// Issue 22, item 5: threads share one consumer; each message goes to exactly one of them, and
/// messages received on one thread are released on another (a Block ring of 4 stalls if a
/// release is lost).
#[test]
fn threads_share_one_consumer_and_release_on_any_thread() {
    const N: u64 = 5000;
    let name = unique_name("api-share");
    let mut tx = Producer::builder(&name).capacity(4).slot_size(64).create().unwrap();
    let rx = Consumer::builder(&name).start_at(StartAt::Next).open().unwrap();
    let (hand_over, handed) = std::sync::mpsc::channel();
    let got = std::thread::scope(|s| {
        let readers: Vec<_> = (0..3)
            .map(|_| {
                let (rx, hand_over) = (&rx, hand_over.clone());
                s.spawn(move || {
                    let mut seqs = Vec::new();
                    while let Ok(m) = rx.recv() {
                        assert_eq!(&m[..8], &m.seq().to_le_bytes()[..]);
                        seqs.push(m.seq());
                        hand_over.send(m).unwrap(); // released by the dropper thread
                    }
                    seqs
                })
            })
            .collect();
        drop(hand_over);
        s.spawn(move || handed.into_iter().for_each(drop));
        for _ in 0..N {
            let mut slot = tx.acquire_timeout(Duration::from_secs(20)).expect("a slot");
            let seq = slot.seq();
            slot[..8].copy_from_slice(&seq.to_le_bytes());
            slot.publish(8, b"").unwrap();
        }
        drop(tx);
        readers.into_iter().flat_map(|r| r.join().unwrap()).collect::<Vec<_>>()
    });
    let mut got = got;
    got.sort_unstable();
    assert_eq!(got, (0..N).collect::<Vec<_>>());
}

/// Whether `fd` is readable now.
fn readable(fd: std::os::fd::BorrowedFd<'_>) -> bool {
    use std::os::fd::AsRawFd;
    let mut fds = [libc::pollfd { fd: fd.as_raw_fd(), events: libc::POLLIN, revents: 0 }];
    // SAFETY: one valid pollfd; no wait.
    unsafe { libc::poll(fds.as_mut_ptr(), 1, 0) == 1 }
}

/// Issue 22, item 9 (the Rust half): an outside event loop's wait. An armed consumer's
/// doorbell is knocked by a publish and by the close; a disarmed one is not, and disarming
/// empties it; the producer sees the consumer parked exactly while it is armed (twice armed is
/// once), and a consumer dropped while armed stops counting as parked.
#[test]
fn an_armed_doorbell_rings_on_publish_and_close() {
    let name = unique_name("api-doorbell");
    let mut tx = Producer::builder(&name).capacity(4).create().unwrap();
    let rx = Consumer::builder(&name).start_at(StartAt::Next).open().unwrap();
    let fd = rx.doorbell_fd().expect("a doorbell");
    let parked = |tx: &Producer| tx.consumers()[0].parked;
    assert!(!readable(fd) && !parked(&tx));
    tx.send(b"a", b"").unwrap();
    assert!(!readable(fd), "not armed: no knock");
    rx.arm_doorbell();
    rx.arm_doorbell();
    assert!(parked(&tx));
    tx.send(b"b", b"").unwrap();
    assert!(readable(fd), "armed: the publish knocked");
    rx.disarm_doorbell();
    assert!(!readable(fd) && !parked(&tx), "disarmed once, and emptied");
    assert_eq!(&*rx.try_recv().unwrap(), b"a");
    assert_eq!(&*rx.try_recv().unwrap(), b"b");
    rx.arm_doorbell();
    drop(tx);
    assert!(readable(fd), "armed: the close knocked");
    assert_eq!(rx.try_recv().err(), Some(TryRecvError::Disconnected));

    let tx = Producer::builder(&unique_name("api-doorbell-drop")).create().unwrap();
    let rx = Consumer::open(tx.name()).unwrap();
    rx.arm_doorbell();
    assert!(tx.consumers()[0].parked);
    drop(rx);
    let other = Consumer::open(tx.name()).unwrap();
    assert!(!tx.consumers()[0].parked, "the dropped consumer's park went with it");
    drop(other);
}
