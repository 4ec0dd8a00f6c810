//! The batcher in CUDA memory, every process separate: four camera producers filling frames on
//! the GPU (one at half the others' rate), `gpuring batch --memory cuda`, and a consumer that
//! checks every batch byte for byte against the sequence numbers in its table. With legacy IPC
//! sharing and with VMM sharing; then a camera killed mid-stream and restarted.

mod common;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{env, gpuring_bin, role, spawn, unique_name};
use gpuring::batch::{BatchTable, CameraState};
use gpuring::cuda::driver;
use gpuring::tensor::{DType, TensorHeader};
use gpuring::testing::kernels::PatternKernels;
use gpuring::testing::pattern;
use gpuring::{Consumer, Mode, PeerPolicy, Producer, RecvTimeoutError, Sharing};

const CAMERAS: usize = 4;
const SHAPE: [u64; 3] = [512, 512, 4];
const FRAME: usize = 512 * 512 * 4;

/// The test pattern's number of camera `cam`'s frame `seq`: cameras differ.
fn pattern_seq(cam: usize, seq: u64) -> u64 {
    seq + cam as u64 * 1_000_000
}

/// A camera child: a frame every `EVERY_MS`, filled on the GPU, until `DONE` exists or its
/// parent is gone.
fn camera() {
    let cam: usize = env("CAM");
    let every = Duration::from_millis(env("EVERY_MS"));
    let done = PathBuf::from(env::<String>("DONE"));
    let parent = std::os::unix::process::parent_id();
    let mut b = Producer::builder(&env::<String>("RING")).slot_size(FRAME).user_header_size(64);
    if env::<String>("SHARING") == "vmm" {
        b = b.sharing(Sharing::Vmm(PeerPolicy::SameUid));
    }
    let mut tx = b.create_gpu(0).unwrap();
    let k = PatternKernels::get(tx.context()).unwrap();
    let mut h = [0u8; 64];
    TensorHeader::new(DType::U8, &SHAPE).write(&mut h).unwrap();
    while !done.exists() && std::os::unix::process::parent_id() == parent {
        let slot = tx.acquire().unwrap();
        let seq = slot.seq();
        // SAFETY: the slot holds `FRAME` bytes and is ours until publish.
        unsafe { k.fill(slot.stream(), slot.ptr(), FRAME as u64, pattern_seq(cam, seq)) }.unwrap();
        slot.publish(FRAME, &h).unwrap();
        std::thread::sleep(every);
    }
}

/// A checker child: `WANT` batches, each copied to the host and checked byte for byte; writes
/// "batches bad present0 present1 ..." to `RESULT`.
fn checker() {
    let want: u64 = env("WANT");
    let b = Consumer::builder(&env::<String>("OUT")).mode(Mode::Lossless);
    let rx = b.open_gpu_when_ready(None, Duration::from_secs(30)).unwrap();
    let mut host = vec![0u8; CAMERAS * FRAME];
    let (mut batches, mut bad, mut present) = (0u64, 0u64, [0u64; CAMERAS]);
    let deadline = Instant::now() + Duration::from_secs(60);
    while batches < want {
        assert!(Instant::now() < deadline, "only {batches} batches in 60 s");
        let m = match rx.recv_timeout(Duration::from_millis(100)) {
            Ok(m) => m,
            Err(RecvTimeoutError::Timeout) => continue,
            Err(e) => panic!("{e}"),
        };
        let table = BatchTable::read(m.header()).unwrap().expect("a batch table");
        assert_eq!(m.len(), CAMERAS * FRAME);
        // A test may wait for the GPU: the batch's bytes, once its stream has them (a bounded
        // wait: a stream stuck on a fence that never comes fails the test, not hangs it).
        while !m.stream().is_idle().unwrap() {
            assert!(Instant::now() < deadline, "a batch's stream stayed busy");
            std::thread::sleep(Duration::from_micros(100));
        }
        let _bound = rx.context().bind().unwrap();
        // SAFETY: the batch is `CAMERAS * FRAME` device bytes of this context, pinned by `m`.
        unsafe { driver::memcpy_dtoh(&mut host, m.ptr()) }.unwrap();
        for (c, e) in table.cameras.iter().enumerate() {
            let place = &host[c * FRAME..(c + 1) * FRAME];
            bad += if e.has_frame() {
                pattern::mismatches(place, pattern_seq(c, e.seq))
            } else {
                place.iter().filter(|&&b| b != 0).count() as u64
            };
            present[c] += (e.state == CameraState::Present) as u64;
        }
        batches += 1;
    }
    let counts: Vec<String> = present.iter().map(u64::to_string).collect();
    let result = format!("{batches} {bad} {}", counts.join(" "));
    std::fs::write(env::<String>("RESULT"), result).unwrap();
}

/// This test's children, killed when it ends, passed or failed.
struct Kids(Vec<Child>);

impl Drop for Kids {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn spawn_camera(
    test: &str,
    cam: usize,
    ring: &str,
    sharing: &str,
    done: &std::path::Path,
) -> Child {
    let every = if cam == CAMERAS - 1 { 20 } else { 10 };
    let env = [
        ("CAM", cam.to_string()),
        ("RING", ring.to_string()),
        ("EVERY_MS", every.to_string()),
        ("SHARING", sharing.to_string()),
        ("DONE", done.display().to_string()),
    ];
    spawn(test, "camera", &env)
}

fn spawn_batcher(out: &str, inputs: &[String]) -> Child {
    let args = ["batch", "--memory", "cuda", "--ring", out, "--max-wait-ms", "40", "--inputs"];
    Command::new(gpuring_bin())
        .args(args)
        .arg(inputs.join(","))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(if common::verbose() { Stdio::inherit() } else { Stdio::null() })
        .spawn()
        .unwrap()
}

/// Four cameras, the batcher and a checker of `want` batches; `mid` runs while they do.
fn run(
    test: &str,
    sharing: &str,
    want: u64,
    mid: impl FnOnce(&mut Kids, &[String], &std::path::Path),
) {
    let dir = std::env::temp_dir().join(unique_name("gpu-batch"));
    std::fs::create_dir_all(&dir).unwrap();
    let done = dir.join("done");
    let out = unique_name("gpu-batch-out");
    let inputs: Vec<String> = (0..CAMERAS).map(|c| unique_name(&format!("gpu-cam{c}"))).collect();
    let mut kids =
        Kids((0..CAMERAS).map(|c| spawn_camera(test, c, &inputs[c], sharing, &done)).collect());
    kids.0.push(spawn_batcher(&out, &inputs));
    let result = dir.join("checker");
    let env = [
        ("OUT", out.clone()),
        ("WANT", want.to_string()),
        ("RESULT", result.display().to_string()),
    ];
    kids.0.push(spawn(test, "checker", &env));
    mid(&mut kids, &inputs, &done);
    let deadline = Instant::now() + Duration::from_secs(120);
    let status = loop {
        if let Some(status) = kids.0[CAMERAS + 1].try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "the checker did not finish in 120 s");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "checker: {status}");
    let r = std::fs::read_to_string(&result).unwrap();
    let v: Vec<u64> = r.split_whitespace().map(|x| x.parse().unwrap()).collect();
    eprintln!("{test}: {r}");
    assert_eq!(v[0], want);
    assert_eq!(v[1], 0, "bad bytes in {want} batches");
    for c in 0..CAMERAS {
        assert!(v[2 + c] >= want / 4, "camera {c} present in only {} of {want} batches", v[2 + c]);
    }
    std::fs::write(&done, b"").unwrap();
    drop(kids);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_batches_are_whole_with_legacy_sharing() {
    let test = "gpu_batches_are_whole_with_legacy_sharing";
    match role().as_deref() {
        Some("camera") => return camera(),
        Some("checker") => return checker(),
        _ => {}
    }
    run(test, "legacy", 300, |_, _, _| {});
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_batches_are_whole_with_vmm_sharing() {
    let test = "gpu_batches_are_whole_with_vmm_sharing";
    match role().as_deref() {
        Some("camera") => return camera(),
        Some("checker") => return checker(),
        _ => {}
    }
    run(test, "vmm", 300, |_, _, _| {});
}

/// Camera 3 is killed after a second and restarted a second later: the batches go on, whole.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_batches_go_on_past_a_killed_and_restarted_camera() {
    let test = "gpu_batches_go_on_past_a_killed_and_restarted_camera";
    match role().as_deref() {
        Some("camera") => return camera(),
        Some("checker") => return checker(),
        _ => {}
    }
    run(test, "legacy", 400, |kids, inputs, done| {
        std::thread::sleep(Duration::from_secs(1));
        kids.0[3].kill().unwrap();
        kids.0[3].wait().unwrap();
        std::thread::sleep(Duration::from_secs(1));
        kids.0[3] = spawn_camera(test, 3, &inputs[3], "legacy", done);
    });
}
