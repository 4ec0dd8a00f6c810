//! The batcher with every process separate: four camera producers (one at half the others'
//! rate), `gpuring batch`, and two consumers that check every batch byte for byte against the
//! sequence numbers in its table. A camera is killed (its place turns absent, the others go
//! on), restarted (it comes back under its new epoch), then the batcher itself is killed and
//! restarted (the consumers reconnect).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{env, gpuring_bin, role, run_cli, spawn, unique_name};
use gpuring::batch::{BatchStatus, BatchTable, CameraState};
use gpuring::tensor::{DType, TensorHeader};
use gpuring::{Consumer, Mode, Producer, RecvTimeoutError};

const TEST: &str = "cameras_a_batcher_and_consumers_survive_kills_and_restarts";
const CAMERAS: usize = 4;
const SHAPE: [u64; 3] = [6, 8, 3];
const FRAME: usize = 6 * 8 * 3;

/// Byte `i` of camera `cam`'s frame `seq`.
fn pattern(cam: usize, seq: u64, i: usize) -> u8 {
    (cam as u64 * 37 + seq * 11 + i as u64 * 3) as u8
}

/// A camera child: a frame every `EVERY_MS` until `DONE` exists or its parent is gone.
fn camera() {
    let cam: usize = env("CAM");
    let every = Duration::from_millis(env("EVERY_MS"));
    let done = PathBuf::from(env::<String>("DONE"));
    let parent = std::os::unix::process::parent_id();
    let b = Producer::builder(&env::<String>("RING")).slot_size(FRAME).user_header_size(64);
    let mut tx = b.create().unwrap();
    let mut h = [0u8; 64];
    TensorHeader::new(DType::U8, &SHAPE).write(&mut h).unwrap();
    let mut seq = 0;
    while !done.exists() && std::os::unix::process::parent_id() == parent {
        let frame: Vec<u8> = (0..FRAME).map(|i| pattern(cam, seq, i)).collect();
        seq = tx.send(&frame, &h).unwrap() + 1;
        std::thread::sleep(every);
    }
}

/// What a checker found: batches checked, bad bytes, batcher instances seen, batches checked
/// from the last instance.
struct Checked {
    batches: u64,
    bad: u64,
    epochs: u64,
    last: u64,
}

/// Checks batch `m` byte for byte against its table; returns the bad bytes.
fn check(m: &[u8], header: &[u8]) -> u64 {
    let t = TensorHeader::read(header).unwrap().expect("a tensor header");
    assert_eq!(t.shape, [CAMERAS as u64, 6, 8, 3]);
    let table = BatchTable::read(header).unwrap().expect("a batch table");
    assert_eq!(m.len(), CAMERAS * FRAME);
    let mut bad = 0;
    for (c, e) in table.cameras.iter().enumerate() {
        let place = &m[c * FRAME..(c + 1) * FRAME];
        for (i, &b) in place.iter().enumerate() {
            let want = if e.has_frame() { pattern(c, e.seq, i) } else { 0 };
            bad += (b != want) as u64;
        }
    }
    bad
}

/// A checker child: every batch until `DONE` exists, reconnecting when the batcher restarts;
/// writes "batches bad epochs" to `RESULT`.
fn checker() {
    let out: String = env("OUT");
    let done = PathBuf::from(env::<String>("DONE"));
    let b = Consumer::builder(&out).mode(Mode::Lossless);
    let mut rx = b.open_timeout(Duration::from_secs(30)).unwrap();
    let mut c = Checked { batches: 0, bad: 0, epochs: 1, last: 0 };
    while !done.exists() {
        let got = rx.recv_timeout(Duration::from_millis(50)).map(|m| check(&m, m.header()));
        match got {
            Ok(bad) => {
                c.bad += bad;
                c.batches += 1;
                c.last += 1;
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => {
                rx = match rx.reconnect(Duration::from_secs(30)) {
                    Ok(rx) => rx,
                    Err(_) if done.exists() => break,
                    Err(e) => panic!("reconnect: {e}"),
                };
                c.epochs += 1;
                c.last = 0;
            }
            Err(e) => panic!("{e}"),
        }
    }
    let result = format!("{} {} {} {}", c.batches, c.bad, c.epochs, c.last);
    std::fs::write(env::<String>("RESULT"), result).unwrap();
}

fn spawn_camera(cam: usize, ring: &str, done: &Path) -> Child {
    let every = if cam == CAMERAS - 1 { 20 } else { 10 };
    let env = [
        ("CAM", cam.to_string()),
        ("RING", ring.to_string()),
        ("EVERY_MS", every.to_string()),
        ("DONE", done.display().to_string()),
    ];
    spawn(TEST, "camera", &env)
}

fn spawn_batcher(out: &str, inputs: &[String]) -> Child {
    Command::new(gpuring_bin())
        .args(["batch", "--ring", out, "--inputs", &inputs.join(","), "--max-wait-ms", "40"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(if common::verbose() { Stdio::inherit() } else { Stdio::null() })
        .spawn()
        .unwrap()
}

/// Receives batches on `rx` (reconnecting after a restart) until `want` holds of one; returns
/// its table and how many batches came before it.
fn until(
    rx: &mut Consumer,
    what: &str,
    within: Duration,
    mut want: impl FnMut(&BatchTable) -> bool,
) -> (BatchTable, u64) {
    let deadline = Instant::now() + within;
    let mut n = 0;
    loop {
        assert!(Instant::now() < deadline, "{what}: not within {within:?} ({n} batches)");
        let got = rx
            .recv_timeout(Duration::from_millis(50))
            .map(|m| BatchTable::read(m.header()).unwrap().expect("a batch table"));
        let t = match got {
            Ok(t) => t,
            Err(RecvTimeoutError::Timeout) => continue,
            Err(RecvTimeoutError::Disconnected) => {
                *rx = rx.reconnect(deadline - Instant::now()).expect("the batcher comes back");
                continue;
            }
            Err(e) => panic!("{e}"),
        };
        if want(&t) {
            return (t, n);
        }
        n += 1;
    }
}

fn kill(child: &mut Child) {
    child.kill().unwrap();
    child.wait().unwrap();
}

/// This test's children, killed when it ends, passed or failed (a failed assertion must not
/// leave a batcher running). `Child::kill` of one already waited for does nothing.
struct Kids(Vec<Child>);

impl Drop for Kids {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

#[test]
fn cameras_a_batcher_and_consumers_survive_kills_and_restarts() {
    match role().as_deref() {
        Some("camera") => return camera(),
        Some("checker") => return checker(),
        _ => {}
    }
    let dir = std::env::temp_dir().join(unique_name("batch"));
    std::fs::create_dir_all(&dir).unwrap();
    let done = dir.join("done");
    let out = unique_name("batch-out");
    let inputs: Vec<String> = (0..CAMERAS).map(|c| unique_name(&format!("batch-cam{c}"))).collect();
    // Children 0..4 are the cameras, 4 the batcher, 5 and 6 the checkers.
    let mut kids = Kids((0..CAMERAS).map(|c| spawn_camera(c, &inputs[c], &done)).collect());
    kids.0.push(spawn_batcher(&out, &inputs));
    let results: Vec<PathBuf> = (0..2).map(|i| dir.join(format!("checker{i}"))).collect();
    for result in &results {
        let env = [
            ("OUT", out.clone()),
            ("DONE", done.display().to_string()),
            ("RESULT", result.display().to_string()),
        ];
        kids.0.push(spawn(TEST, "checker", &env));
    }
    let b = Consumer::builder(&out).mode(Mode::Latest);
    let mut rx = b.open_timeout(Duration::from_secs(30)).unwrap();
    let all_present = |t: &BatchTable| t.cameras.iter().all(|c| c.state == CameraState::Present);
    let (t, _) = until(&mut rx, "every camera present", Duration::from_secs(30), all_present);
    let old_epoch = t.cameras[3].epoch;

    // Camera 3 dies: it turns absent within its input's liveness interval, and the others go
    // on being batched (counted over the next 30 batches: all present in most of them).
    kill(&mut kids.0[3]);
    let absent = |t: &BatchTable| t.cameras[3].state == CameraState::Absent;
    until(&mut rx, "camera 3 absent after its kill", Duration::from_secs(10), absent);
    let mut others = 0;
    for _ in 0..30 {
        let (t, _) = until(&mut rx, "a batch", Duration::from_secs(5), |_| true);
        assert_eq!(t.cameras[3].state, CameraState::Absent, "a dead camera stays absent");
        others += t.cameras[..3].iter().all(|c| c.state == CameraState::Present) as u32;
    }
    assert!(others >= 20, "the live cameras were all present in {others} of 30 batches");
    // `gpuring stat` of the batch ring shows the cameras and their states.
    let (code, text, err) = run_cli(&["stat", &out]);
    assert_eq!(code, 0, "{err}");
    let line = |ring: &str| text.lines().find(|l| l.contains(ring)).map(str::to_owned);
    let dead = line(&inputs[3]).unwrap_or_else(|| panic!("no camera line in:\n{text}"));
    assert!(dead.contains("absent"), "{dead}");
    assert!(line(&inputs[0]).unwrap().contains("present"), "{text}");

    // It restarts: back under a new epoch.
    kids.0[3] = spawn_camera(3, &inputs[3], &done);
    let back = |t: &BatchTable| {
        t.cameras[3].state == CameraState::Present && t.cameras[3].epoch != old_epoch
    };
    until(&mut rx, "camera 3 back after its restart", Duration::from_secs(10), back);

    // The batcher dies and restarts: consumers reconnect and batches come again, numbered
    // from 0 by the new instance of the batch ring.
    let first_instance = rx.epoch();
    kill(&mut kids.0[CAMERAS]);
    kids.0[CAMERAS] = spawn_batcher(&out, &inputs);
    let within = Duration::from_secs(30);
    let deadline = Instant::now() + within;
    while rx.epoch() == first_instance {
        assert!(Instant::now() < deadline, "no new batcher within {within:?}");
        until(&mut rx, "a batch", within, |_| true);
    }
    let (t, _) = until(&mut rx, "batches after the restart", within, all_present);
    assert!(t.batch < 100, "batch {}: numbers start from 0 in a new batcher", t.batch);
    until(&mut rx, "50 batches after the restart", within, |t| t.batch >= 50);

    std::fs::write(&done, b"").unwrap();
    for (i, result) in results.iter().enumerate() {
        let status = kids.0[CAMERAS + 1 + i].wait().unwrap();
        assert!(status.success(), "checker: {status}");
        let r = std::fs::read_to_string(result).unwrap();
        let v: Vec<u64> = r.split_whitespace().map(|x| x.parse().unwrap()).collect();
        let c = Checked { batches: v[0], bad: v[1], epochs: v[2], last: v[3] };
        assert_eq!(c.bad, 0, "bad bytes in {} batches", c.batches);
        assert!(c.epochs >= 2, "the checker did not see the batcher's restart");
        assert!(c.last >= 40, "only {} batches checked after the restart", c.last);
        assert!(c.batches >= 80, "only {} batches checked", c.batches);
    }
    for cam in &mut kids.0[..CAMERAS] {
        assert!(cam.wait().unwrap().success(), "a camera failed");
    }
    // Killed, the batcher leaves its status file behind; `gpuring rm` takes it with the ring.
    kill(&mut kids.0[CAMERAS]);
    let status = BatchStatus::path(&gpuring::shm::default_dir(), &out);
    assert!(status.exists(), "a killed batcher's status file");
    let (code, _, err) = run_cli(&["rm", &out]);
    assert_eq!(code, 0, "{err}");
    assert!(!status.exists(), "gpuring rm left the batch ring's status file");
    drop(kids);
    let _ = std::fs::remove_dir_all(&dir);
}
