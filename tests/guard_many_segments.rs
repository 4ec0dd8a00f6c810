//! The SIGBUS guard covers every segment a process maps, however many: a ring mapped after
//! hundreds of others, truncated under its producer, gives `Corruption::Truncated`, not a crash.
//! (The guard's table used to hold 256 ranges; a segment past them was not guarded, and its
//! truncation killed the process with SIGBUS.)

mod common;

use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Stdio};

use common::{role, unique_name, ROLE};
use gpuring::shm::{RingDir, Segment, ShmName};
use gpuring::{Corruption, Producer, SendError};

/// Segments mapped before the ring: more than the old table's 256.
const BEFORE: usize = 300;

/// What the child prints once it got the error.
const DONE: &str = "guard-many-segments: truncated";

#[test]
fn truncation_is_caught_past_the_256th_segment() {
    const TEST: &str = "truncation_is_caught_past_the_256th_segment";
    if role().is_some() {
        child();
        return;
    }
    // A failure kills the process with SIGBUS, so the body runs in a child.
    let name = unique_name("many");
    let out = Command::new(std::env::current_exe().unwrap())
        .args([TEST, "--exact", "--nocapture", "--test-threads=1"])
        .env(ROLE, "child")
        .env("RING", &name)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let dir = RingDir::open_default().unwrap();
    let file = dir.path().join(ShmName::new(&name).unwrap().file());
    let _ = std::fs::remove_file(file);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stderr.contains(DONE),
        "the child ended with {} (signal {:?}; SIGBUS is {}), stderr:\n{stderr}",
        out.status,
        out.status.signal(),
        libc::SIGBUS
    );
}

fn child() {
    // No core file if the guard fails us.
    let core = rustix::process::Resource::Core;
    let maximum = rustix::process::getrlimit(core).maximum;
    rustix::process::setrlimit(core, rustix::process::Rlimit { current: Some(0), maximum }).ok();
    let name = std::env::var("RING").unwrap();
    let dir = RingDir::open_default().unwrap();
    let others: Vec<Segment> = (0..BEFORE)
        .map(|i| {
            let n = ShmName::new(&format!("{name}-{i}")).unwrap();
            let seg = Segment::create(&dir, &n, 4096, 0o600).unwrap();
            seg.unlink();
            seg
        })
        .collect();
    let mut tx = Producer::builder(&name).capacity(4).slot_size(64 << 10).create().unwrap();
    tx.send(b"before", &[]).unwrap();
    // Truncate the ring's file to one page: the next send touches pages past its end.
    let file = dir.path().join(ShmName::new(&name).unwrap().file());
    std::fs::OpenOptions::new().write(true).open(file).unwrap().set_len(4096).unwrap();
    let mut errors = Vec::new();
    for _ in 0..8 {
        match tx.send(b"after", &[]) {
            Err(SendError::Corrupt(Corruption::Truncated)) => {
                eprintln!("{DONE} after {} other errors {errors:?}", errors.len());
                drop(others);
                return;
            }
            Err(e) => errors.push(e.to_string()),
            Ok(_) => errors.push("sent".into()),
        }
    }
    panic!("no Truncated error in 8 sends: {errors:?}");
}
