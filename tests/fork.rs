//! A process that joined a ring and then `fork`ed without `exec` (Python's multiprocessing with
//! the fork start method, a daemon that forks workers): when it is killed and its child lives
//! on, it must read as dead. Its liveness lock is on a description the child inherits; the fork
//! handler (src/shm/presence.rs) drops the child's copy, so the kernel releases the lock with
//! the parent.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{role, unique_name, ROLE};
use gpuring::{Consumer, Ended, Producer, RecvTimeoutError};

/// Generous: liveness is checked every 100 ms by default.
const DEADLINE: Duration = Duration::from_secs(10);

/// Starts this test binary as `role` on ring `name`, with its stdout piped.
fn start(test: &str, role: &str, name: &str) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(ROLE, role)
        .env("RING", name)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Reads the child's stdout until `ready PID` (the pid of the child it forked), and returns it.
fn forked_pid(child: &mut Child) -> i32 {
    let out = child.stdout.take().unwrap();
    for line in BufReader::new(out).lines() {
        let line = line.unwrap();
        if let Some(pid) = line.split("ready ").nth(1) {
            return pid.trim().parse().unwrap();
        }
    }
    panic!("the child ended before it forked");
}

/// In a child: forks a grandchild that sleeps (holding every inherited descriptor), prints its
/// pid, then waits to be killed.
fn fork_and_wait() -> ! {
    // SAFETY: the grandchild only sleeps and exits (async-signal-safe calls).
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        // SAFETY: async-signal-safe calls only, in the forked child.
        unsafe {
            libc::sleep(60);
            libc::_exit(0);
        }
    }
    assert!(pid > 0, "fork failed");
    println!("ready {pid}");
    loop {
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// Kills a grandchild at the end, whatever happened.
struct Grandchild(i32);
impl Drop for Grandchild {
    fn drop(&mut self) {
        // SAFETY: plain system calls on a pid this test made (reaped by init once orphaned).
        unsafe {
            libc::kill(self.0, libc::SIGKILL);
        }
    }
}

/// Whether process `pid` still runs (not a zombie).
fn running(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|s| s.rsplit(')').next().is_some_and(|r| !r.trim_start().starts_with('Z')))
}

#[test]
fn a_consumer_killed_after_forking_is_reclaimed_while_its_child_lives() {
    const TEST: &str = "a_consumer_killed_after_forking_is_reclaimed_while_its_child_lives";
    if role().as_deref() == Some("consumer") {
        let rx = Consumer::open(&std::env::var("RING").unwrap()).unwrap();
        let _held = rx.recv().unwrap(); // holds a message, as a worker mid-frame does
        fork_and_wait();
    }
    let name = unique_name("fork-consumer");
    let mut tx = Producer::builder(&name).capacity(2).spare_buffers(0).create().unwrap();
    let mut child = start(TEST, "consumer", &name);
    tx.wait_for_consumers(1, DEADLINE).unwrap();
    tx.send(b"frame", b"").unwrap();
    let grandchild = Grandchild(forked_pid(&mut child));
    child.kill().unwrap();
    child.wait().unwrap();
    let start = Instant::now();
    while tx.consumer_count() > 0 {
        assert!(start.elapsed() < DEADLINE, "the killed consumer was never reclaimed");
        // An acquire reaps dead consumers (and would wait on the held slot otherwise).
        let _ = tx.try_acquire();
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        running(grandchild.0),
        "the forked child must still run for this test to mean anything"
    );
    // The held buffer came back: the ring goes on.
    for _ in 0..4 {
        tx.send(b"more", b"").unwrap();
    }
}

#[test]
fn a_producer_killed_after_forking_is_dead_to_its_consumers() {
    const TEST: &str = "a_producer_killed_after_forking_is_dead_to_its_consumers";
    if role().as_deref() == Some("producer") {
        let mut tx = Producer::builder(&std::env::var("RING").unwrap()).create().unwrap();
        tx.send(b"one", b"").unwrap();
        fork_and_wait();
    }
    let name = unique_name("fork-producer");
    let mut child = start(TEST, "producer", &name);
    let grandchild = Grandchild(forked_pid(&mut child));
    let rx =
        Consumer::builder(&name).start_at(gpuring::StartAt::Oldest).open_timeout(DEADLINE).unwrap();
    assert_eq!(&*rx.recv().unwrap(), b"one");
    child.kill().unwrap();
    child.wait().unwrap();
    match rx.recv_timeout(DEADLINE) {
        Err(RecvTimeoutError::Disconnected) => {}
        other => panic!("expected Disconnected, got {:?}", other.map(|m| m.to_vec())),
    }
    assert_eq!(rx.ended(), Some(Ended::Died));
    assert!(
        running(grandchild.0),
        "the forked child must still run for this test to mean anything"
    );
    // The name is free for a new producer: the dead one's file is replaced.
    Producer::builder(&name).create().expect("a new producer replaces the dead one's ring");
}
