//! A lost GPU context, in host memory through the `test-support` hook
//! (`gpuring::lose_context_after`, `GPURING_TEST_LOSE_CONTEXT`): every call names it, the
//! ring shows it, a restarted producer replaces the ring at once, and the programs exit with
//! status 75. And the graceful stop on SIGTERM that keeps a stop from faulting anyone.
//!
//! The loss is for good in a process, so each test that loses runs its losing part in a
//! child process.

mod common;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{role, spawn, unique_name};
use gpuring::{
    inspect, AcquireError, AcquireTimeoutError, Consumer, ContextLost, CreateErrorKind, Ended,
    OpenErrorKind, Producer, RecvError, RecvTimeoutError, SendError, TryAcquireError, TryRecvError,
};

const RING: &str = "GPURING_TEST_RING";

/// Waits up to 20 s for `done`.
fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let t = Instant::now();
    while !done() {
        assert!(t.elapsed() < Duration::from_secs(20), "{what}: not within 20 s");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Checks one error: it is the lost context, and says what to do.
fn named(e: &(dyn std::error::Error + 'static), what: &str) {
    let text = e.to_string();
    assert!(gpuring::is_context_lost(e), "{what}: not a lost context: {text}");
    assert_eq!(gpuring::exit_status(e), 75, "{what}");
    for words in ["GPU context of this process is lost", "MPS", "restarted"] {
        assert!(text.contains(words), "{what}: {text:?} does not say {words:?}");
    }
}

/// The child: a producer and a consumer that work, then every call after the loss.
fn lose(name: &str) {
    let mut tx = Producer::builder(name).capacity(4).create().unwrap();
    let rx = Consumer::open(name).unwrap();
    // The parent's consumer joins too.
    wait_for("the parent's consumer", || tx.consumer_count() == 2);
    tx.send(b"before", b"").unwrap();
    assert_eq!(&*rx.recv().unwrap(), b"before");
    assert!(gpuring::context_lost().is_none());

    gpuring::lose_context_after(0);
    let lost: ContextLost = match rx.try_recv() {
        Err(TryRecvError::ContextLost(l)) => l,
        other => panic!("try_recv: {:?}", other.map(|m| m.seq())),
    };
    named(&lost, "try_recv");
    assert_eq!(gpuring::context_lost(), Some(lost.clone()));
    assert!(matches!(rx.recv(), Err(RecvError::ContextLost(_))));
    let e = rx.recv_timeout(Duration::from_millis(10)).map(|_| ()).unwrap_err();
    assert!(matches!(e, RecvTimeoutError::ContextLost(_)));
    named(&e, "recv_timeout");
    let e = tx.send(b"after", b"").unwrap_err();
    assert!(matches!(e, SendError::ContextLost(_)), "send: {e:?}");
    named(&e, "send");
    assert!(matches!(tx.try_acquire().map(|_| ()), Err(TryAcquireError::ContextLost(_))));
    let e = tx.acquire_timeout(Duration::from_millis(10)).map(|_| ()).unwrap_err();
    assert!(matches!(e, AcquireTimeoutError::ContextLost(_)));
    let e = Consumer::open(name).unwrap_err();
    assert!(matches!(e.kind(), OpenErrorKind::ContextLost(_)), "open: {e}");
    named(&e, "open");
    let e = Producer::builder(&unique_name("lost-create")).create().unwrap_err();
    assert!(matches!(e.kind(), CreateErrorKind::ContextLost(_)), "create: {e}");
    named(&e, "create");
    progress!("child: {lost}");
    // Dropping the producer closes the ring as lost and keeps its name.
    drop(rx);
    drop(tx);
}

/// Every call of a process whose context is lost returns `ContextLost`; its producer closes
/// the ring saying so (consumers elsewhere see `Ended::ContextLost`, `gpuring stat` and the
/// status show it), and a restarted producer replaces that ring at once.
#[test]
fn a_lost_context_is_named_everywhere_and_its_ring_replaced() {
    const TEST: &str = "a_lost_context_is_named_everywhere_and_its_ring_replaced";
    if role().as_deref() == Some("lose") {
        return lose(&std::env::var(RING).unwrap());
    }
    if role().is_some() {
        return;
    }
    let name = unique_name("lost");
    let mut child = spawn(TEST, "lose", &[(RING, name.clone())]);
    let mut rx = None;
    wait_for("the child's ring", || {
        rx = Consumer::open(&name).ok();
        rx.is_some()
    });
    let rx = rx.unwrap();
    let status = child.wait().unwrap();
    assert!(status.success(), "the child failed: {status}");

    // This process's context is fine: the consumer reads on, then sees why the stream ended.
    assert_eq!(&*rx.recv().unwrap(), b"before");
    assert!(matches!(rx.recv(), Err(RecvError::Disconnected)));
    assert_eq!(rx.ended(), Some(Ended::ContextLost));
    assert_eq!(Ended::ContextLost.name(), "context lost");
    drop(rx);

    let s = inspect::status(&name).expect("the ring keeps its name");
    assert!(s.closed && s.context_lost && !s.producer_alive, "{s:?}");
    let (code, out, err) = common::run_cli(&["stat", &name]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("GPU context was lost"), "gpuring stat says:\n{out}");
    let (code, out, err) = common::run_cli(&["stat", "--json", &name]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("\"context_lost\": true") || out.contains("\"context_lost\":true"),
        "{out}"
    );

    // A restarted producer replaces the ring at once.
    let tx = Producer::builder(&name).create().expect("the dead ring is replaced");
    assert_ne!(tx.epoch(), s.epoch);
    assert!(!inspect::status(&name).unwrap().context_lost);
}

/// The child: three waits that make no GPU call (a consumer of an idle producer, a producer
/// blocked on its consumer, a consumer waiting for a producer that never comes) each end with
/// `ContextLost` soon after the loss, as under MPS they must (a faulted process that lingers
/// keeps every other from getting a context). Its rings are in `dir`.
fn idle(name: &str, dir: &std::path::Path) {
    use std::sync::mpsc;
    let every = Duration::from_millis(50);
    let (done, results) = mpsc::channel::<(&str, String, bool)>();

    let quiet = format!("{name}-quiet");
    let _quiet = Producer::builder(&quiet).dir(dir).create().unwrap();
    let rx = Consumer::builder(&quiet).dir(dir).liveness_interval(every).open().unwrap();
    let d = done.clone();
    std::thread::spawn(move || {
        let r = rx.recv().map(|m| m.seq());
        let lost = matches!(r, Err(RecvError::ContextLost(_)));
        let _ = d.send(("recv", format!("{r:?}"), lost));
    });

    let full = format!("{name}-full");
    let b = Producer::builder(&full).dir(dir).capacity(2).liveness_interval(every);
    let mut tx = b.create().unwrap();
    let _slow = Consumer::builder(&full).dir(dir).open().unwrap();
    tx.send(b"1", b"").unwrap();
    tx.send(b"2", b"").unwrap();
    let d = done.clone();
    std::thread::spawn(move || {
        let r = tx.acquire().map(|_| ());
        let lost = matches!(r, Err(AcquireError::ContextLost(_)));
        let _ = d.send(("acquire", format!("{r:?}"), lost));
    });

    let absent = Consumer::builder(&format!("{name}-absent")).dir(dir).liveness_interval(every);
    std::thread::spawn(move || {
        let r = absent.open_when_ready(None, Duration::from_secs(600));
        let lost = r.as_ref().is_err_and(|e| matches!(e.kind(), OpenErrorKind::ContextLost(_)));
        let _ = done.send(("open_when_ready", format!("{:?}", r.map(|c| c.epoch())), lost));
    });

    // Let all three settle into their waits, then lose the context.
    std::thread::sleep(Duration::from_millis(300));
    gpuring::lose_context_after(0);
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut seen = Vec::new();
    for _ in 0..3 {
        let left = deadline.saturating_duration_since(Instant::now());
        let Ok((what, r, lost)) = results.recv_timeout(left) else {
            panic!("after {seen:?}, a wait did not end within 20 s of the loss");
        };
        assert!(lost, "{what} ended with {r}, not ContextLost");
        seen.push(what);
    }
    progress!("child: {seen:?} ended with ContextLost");
}

/// A process that only waits still learns that its context was lost: its waits ask at each
/// liveness tick, and each ends with `ContextLost`.
#[test]
fn waits_that_make_no_gpu_call_learn_of_the_loss() {
    const TEST: &str = "waits_that_make_no_gpu_call_learn_of_the_loss";
    if role().as_deref() == Some("idle") {
        let dir = PathBuf::from(std::env::var("GPURING_TEST_DIR").unwrap());
        return idle(&std::env::var(RING).unwrap(), &dir);
    }
    if role().is_some() {
        return;
    }
    let name = unique_name("lost-idle");
    let dir = tempdir(&name);
    let env = [(RING, name.clone()), ("GPURING_TEST_DIR", dir.display().to_string())];
    let mut child = spawn(TEST, "idle", &env);
    let t = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if t.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            panic!("the child did not end within 60 s");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let _ = std::fs::remove_dir_all(&dir);
    assert!(status.success(), "the child failed: {status}");
}

/// The pipeline example, its producer or a consumer.
fn pipeline() -> PathBuf {
    common::example_bin("pipeline")
}

/// Waits up to 30 s for `child` to exit, and returns its exit code.
fn exit_code(child: &mut Child, what: &str) -> Option<i32> {
    let t = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status.code();
        }
        if t.elapsed() > Duration::from_secs(30) {
            let _ = child.kill();
            panic!("{what} did not exit within 30 s");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A program whose context is lost exits promptly with status 75, for its supervisor to
/// restart it: the pipeline example, both roles, and the `gpuring` command.
#[test]
fn programs_exit_with_status_75_when_the_context_is_lost() {
    if role().is_some() {
        return;
    }
    let name = unique_name("lost-exit");
    let dir = tempdir(&name);
    // The producer loses its context after some 50 frames; its consumer sees the ring end so.
    let mut producer = side_in(&name, &dir, "producer", Some(100));
    let mut consumer = side_in(&name, &dir, "consumer", None);
    assert_eq!(exit_code(&mut producer, "the producer"), Some(75));
    let err: String =
        BufReader::new(producer.stderr.take().unwrap()).lines().map_while(Result::ok).collect();
    assert!(err.contains("GPU context of this process is lost"), "{err}");
    // 4: the producer's GPU context was lost (examples/pipeline.rs).
    assert_eq!(exit_code(&mut consumer, "the consumer"), Some(4));

    // A consumer that loses its own context exits 75 too; its producer goes on.
    let _ = std::fs::remove_dir_all(&dir);
    let dir2 = tempdir(&format!("{name}-2"));
    let mut producer = side_in(&name, &dir2, "producer", None);
    let mut consumer = side_in(&name, &dir2, "consumer", Some(60));
    assert_eq!(exit_code(&mut consumer, "the consumer"), Some(75));
    let s = inspect::status_in(&dir2, &name).unwrap();
    assert!(s.producer_alive && !s.closed, "{s:?}");
    terminate(&producer);
    assert_eq!(exit_code(&mut producer, "the producer"), Some(0));

    // The command: `gpuring bench` in a process whose context is lost.
    let bench = Command::new(common::gpuring_bin())
        .args(["bench", "--memory", "host", "--seconds", "1"])
        .env("GPURING_TEST_LOSE_CONTEXT", "20")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = bench.id();
    let out = bench.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(75), "gpuring bench: {err}");
    assert!(err.contains("GPU context of this process is lost"), "{err}");
    // Its ring keeps its name (closed by a lost context) until someone replaces or removes it.
    let ring = format!("gpuring-bench-{pid}");
    assert!(inspect::status(&ring).is_ok_and(|s| s.context_lost), "{ring} is kept");
    inspect::remove(&ring, true).unwrap();
    let _ = std::fs::remove_dir_all(&dir2);
}

/// A ring directory of this test's own.
fn tempdir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(tag);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `side` of the pipeline in `dir`, losing its context after `lose` steps if set.
fn side_in(name: &str, dir: &std::path::Path, role: &str, lose: Option<u32>) -> Child {
    let mut cmd = Command::new(pipeline());
    cmd.args(["--role", role, "--name", name, "--memory", "host", "--seconds", "0"])
        .args(["--external", "1", "--fps", "200", "--width", "64", "--height", "64"])
        .arg("--dir")
        .arg(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(n) = lose {
        cmd.env("GPURING_TEST_LOSE_CONTEXT", n.to_string());
    }
    cmd.spawn().unwrap()
}

fn terminate(child: &Child) {
    let pid = rustix::process::Pid::from_raw(child.id() as i32).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
}

/// SIGTERM stops a consumer gracefully: it leaves the ring (no dead consumer to reclaim),
/// says so, and exits 0; then the producer closes the ring and exits 0 too.
#[test]
fn sigterm_stops_both_sides_gracefully() {
    if role().is_some() {
        return;
    }
    let name = unique_name("term");
    let dir = tempdir(&name);
    let mut producer = side_in(&name, &dir, "producer", None);
    let mut consumer = side_in(&name, &dir, "consumer", None);
    wait_for("frames flowing", || {
        inspect::status_in(&dir, &name).is_ok_and(|s| s.consumers.len() == 1 && s.published > 20)
    });
    terminate(&consumer);
    assert_eq!(exit_code(&mut consumer, "the consumer"), Some(0));
    let out: Vec<String> =
        BufReader::new(consumer.stdout.take().unwrap()).lines().map_while(Result::ok).collect();
    assert!(out.iter().any(|l| l.contains("ended: stopped (SIGTERM")), "{out:?}");
    let s = inspect::status_in(&dir, &name).unwrap();
    assert!(s.consumers.is_empty() && s.reclaims == 0, "it left cleanly: {s:?}");
    terminate(&producer);
    assert_eq!(exit_code(&mut producer, "the producer"), Some(0));
    assert!(inspect::status_in(&dir, &name).is_err(), "a clean close removes the name");
    let _ = std::fs::remove_dir_all(&dir);
}
