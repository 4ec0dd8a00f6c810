//! A lost GPU context seen through the C API, on machines without a GPU: the `test-support`
//! hook (`gpuring::lose_context_after`, or `GPURING_TEST_LOSE_CONTEXT=N` in the environment)
//! makes this process's context count as lost, and then every call returns
//! `GPURING_CONTEXT_LOST` with the Rust error's message, in host memory as in CUDA.
//!
//! The loss is for good in a process, so the calls that lose it run in child processes: this
//! test binary run again, for one test, with a role variable.

use std::ffi::{CStr, CString};
use std::process::Command;
use std::ptr::{null, null_mut};

use gpuring_c::gpuring_status::*;
use gpuring_c::*;

/// What every lost-context message says (the Rust error's; create and open name the ring first).
const LOST: &str = "the GPU context of this process is lost";

/// Set in a child process: what it does ("calls", or the name of the ring to consume).
const ROLE: &str = "GPURING_CAPI_LOST_ROLE";

/// This test binary, to run `test` alone in a child process with `role`.
fn child(test: &str, role: &str) -> Command {
    let mut c = Command::new(std::env::current_exe().expect("the test binary's path"));
    c.args(["--exact", test, "--nocapture", "--test-threads=1"]).env(ROLE, role);
    c
}

fn name(tag: &str) -> CString {
    CString::new(format!("capi-lost-{tag}-{}", std::process::id())).unwrap()
}

fn last_error() -> String {
    // SAFETY: a NUL-terminated string valid until the next call on this thread.
    unsafe { CStr::from_ptr(gpuring_last_error()) }.to_string_lossy().into_owned()
}

fn host_options() -> gpuring_producer_options {
    let mut o = gpuring_producer_options_default();
    o.memory = gpuring_memory::GPURING_MEMORY_HOST as u32;
    o.capacity = 4;
    o.slot_size = 256;
    o
}

/// Asserts that a call returned `GPURING_CONTEXT_LOST` with the loss's message.
#[track_caller]
fn assert_lost(status: gpuring_status, call: &str) {
    let message = last_error();
    assert_eq!(status, GPURING_CONTEXT_LOST, "{call}: {message}");
    assert!(message.contains(LOST), "{call}: {message}");
    assert!(message.contains("must exit (status 75)"), "{call}: {message}");
}

/// In a child process, which loses its context half-way (`gpuring::lose_context_after`).
#[test]
fn every_call_returns_context_lost_once_the_context_is_lost() {
    const TEST: &str = "every_call_returns_context_lost_once_the_context_is_lost";
    if std::env::var_os(ROLE).is_none() {
        let out = child(TEST, "calls").output().expect("run this test binary again");
        print!("{}", String::from_utf8_lossy(&out.stdout));
        eprint!("{}", String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "the child failed: {}", out.status);
        return;
    }
    assert_eq!(GPURING_CONTEXT_LOST as i32, 12, "a new status goes last: the ABI keeps the others");
    assert_eq!(GPURING_EXIT_CONTEXT_LOST, 75);
    // A ring closed by a lost context keeps its file (for `gpuring stat`): this one's go in a
    // directory of this test's, removed at the end.
    let dir = std::env::temp_dir().join(format!("capi-lost-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let dir_c = CString::new(dir.as_os_str().as_encoded_bytes()).unwrap();
    let n = name("calls");
    let mut o = host_options();
    o.dir = dir_c.as_ptr();
    // SAFETY: valid names, options (their `dir` outlives the calls) and out-pointers; live
    // handles, used by this thread only.
    unsafe {
        let mut p = null_mut();
        assert_eq!(gpuring_producer_create(n.as_ptr(), &o, &mut p), GPURING_OK);
        let mut co = gpuring_consumer_options_default();
        co.start = gpuring_start::GPURING_START_OLDEST as u32;
        co.dir = dir_c.as_ptr();
        let mut c = null_mut();
        assert_eq!(gpuring_consumer_open(n.as_ptr(), &co, &mut c), GPURING_OK);
        let data = *b"before";
        let s = gpuring_producer_send(p, data.as_ptr(), data.len(), null(), 0, 0, null_mut());
        assert_eq!(s, GPURING_OK, "{}", last_error());
        let mut m = null_mut();
        let mut info = std::mem::zeroed::<gpuring_message_info>();
        assert_eq!(gpuring_consumer_recv(c, 1000, null_mut(), &mut m, &mut info), GPURING_OK);
        let (mut ptr, mut capacity) = (0u64, 0usize);
        assert_eq!(gpuring_producer_acquire(p, 0, null_mut(), &mut ptr, &mut capacity), GPURING_OK);

        gpuring::lose_context_after(0);

        // The slot acquired before the loss cannot be published; the publish ends it.
        assert_lost(gpuring_producer_publish(p, 4, null(), 0, null_mut()), "publish");
        assert_eq!(gpuring_producer_consumer_count(p), 1, "the failed publish ended the slot");
        assert_lost(
            gpuring_producer_send(p, data.as_ptr(), data.len(), null(), 0, 0, null_mut()),
            "send",
        );
        for timeout_ms in [0, 100, -1] {
            let s = gpuring_producer_acquire(p, timeout_ms, null_mut(), &mut ptr, &mut capacity);
            assert_lost(s, &format!("acquire({timeout_ms})"));
            let mut lost = null_mut();
            let s = gpuring_consumer_recv(c, timeout_ms, null_mut(), &mut lost, null_mut());
            assert_lost(s, &format!("recv({timeout_ms})"));
            assert!(lost.is_null(), "no message comes with the error");
        }
        let mut c2 = null_mut();
        assert_lost(gpuring_consumer_open(n.as_ptr(), &co, &mut c2), "open");
        assert!(c2.is_null());
        let other = name("other");
        let mut p2 = null_mut();
        assert_lost(gpuring_producer_create(other.as_ptr(), &o, &mut p2), "create");
        assert!(p2.is_null());

        // What was received before is still the caller's to release (a host message's release
        // cannot fail), and the handles are freed as usual before the process exits.
        assert_eq!(std::slice::from_raw_parts(info.ptr as *const u8, info.len), b"before");
        assert_eq!(gpuring_message_release(m), GPURING_OK);
        gpuring_consumer_free(c);
        gpuring_producer_free(p);
    }
    assert!(gpuring::context_lost().is_some(), "for good");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A consumer written as the C examples are (exit 75 on `GPURING_CONTEXT_LOST`, 1 on any other
/// failure), run in a child process whose context the environment makes lost after a few
/// messages: it receives them, then exits 75. Its producer, in this process, never loses its
/// context.
#[test]
fn a_loss_from_the_environment_ends_a_c_style_consumer_with_75() {
    const TEST: &str = "a_loss_from_the_environment_ends_a_c_style_consumer_with_75";
    if let Ok(ring) = std::env::var(ROLE) {
        std::process::exit(consume(&ring));
    }
    let n = name("env");
    let o = host_options();
    let mut p = null_mut();
    // SAFETY: valid name, options and out-pointer.
    assert_eq!(unsafe { gpuring_producer_create(n.as_ptr(), &o, &mut p) }, GPURING_OK);
    let mut consumer = child(TEST, n.to_str().unwrap())
        // The open and three messages (two steps each) pass; the fourth receive is lost.
        .env("GPURING_TEST_LOSE_CONTEXT", "7")
        .spawn()
        .expect("run this test binary again as the consumer");
    // SAFETY: `p` is live and used by this thread only.
    while unsafe { gpuring_producer_consumer_count(p) } == 0 {
        if let Some(status) = consumer.try_wait().unwrap() {
            panic!("the consumer ended before it joined: {status}");
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    for i in 0..3u8 {
        let data = [i; 16];
        // SAFETY: as above; `data` is 16 readable bytes.
        let s = unsafe {
            gpuring_producer_send(p, data.as_ptr(), data.len(), null(), 0, 5000, null_mut())
        };
        assert_eq!(s, GPURING_OK, "{}", last_error());
    }
    let status = consumer.wait().unwrap();
    assert_eq!(status.code(), Some(GPURING_EXIT_CONTEXT_LOST), "{status}");
    // SAFETY: made above, not freed before.
    unsafe { gpuring_producer_free(p) };
}

/// The child's consumer: receives until a call fails, and returns the exit status a C program
/// would (the C examples' `CHECK`).
fn consume(ring: &str) -> i32 {
    let ring = CString::new(ring).unwrap();
    let mut co = gpuring_consumer_options_default();
    co.start = gpuring_start::GPURING_START_OLDEST as u32;
    co.mode = gpuring_mode::GPURING_MODE_LOSSLESS as u32;
    let mut c = null_mut();
    let exit = |s: gpuring_status| {
        eprintln!("consumer: status {}: {}", s as i32, last_error());
        if s == GPURING_CONTEXT_LOST {
            assert!(last_error().contains(LOST), "{}", last_error());
            GPURING_EXIT_CONTEXT_LOST
        } else {
            1
        }
    };
    // SAFETY: valid name, options and out-pointer.
    let s = unsafe { gpuring_consumer_open(ring.as_ptr(), &co, &mut c) };
    if s != GPURING_OK {
        return exit(s);
    }
    let mut received = 0u8;
    let status = loop {
        let mut m = null_mut();
        let mut info = gpuring_message_info {
            ptr: 0,
            len: 0,
            seq: 0,
            timestamp_ns: 0,
            lag: 0,
            header: null(),
            header_len: 0,
            stream: null_mut(),
        };
        // SAFETY: `c` is live; `m` and `info` are writable locals.
        let s = unsafe { gpuring_consumer_recv(c, 5000, null_mut(), &mut m, &mut info) };
        if s != GPURING_OK {
            break exit(s);
        }
        // SAFETY: a host message: `info.len` bytes at `info.ptr`, valid until its release.
        let bytes = unsafe { std::slice::from_raw_parts(info.ptr as *const u8, info.len) };
        if bytes != [received; 16] {
            eprintln!("consumer: message {received} is {bytes:?}");
            break 1;
        }
        received += 1;
        // SAFETY: received above, released once.
        let s = unsafe { gpuring_message_release(m) };
        if s != GPURING_OK {
            break exit(s);
        }
    };
    eprintln!("consumer: {received} messages received");
    if received != 3 {
        return 1;
    }
    // SAFETY: opened above; every message was released.
    unsafe { gpuring_consumer_free(c) };
    status
}
