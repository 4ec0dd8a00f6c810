//! The batcher in CUDA memory, every process separate: four camera producers filling frames on
//! the GPU (one at half the others' rate), `gpuring batch --memory cuda`, and a consumer that
//! checks every batch byte for byte against the sequence numbers in its table. With legacy IPC
//! sharing and with VMM sharing; then a camera killed mid-stream and restarted. Then pitched
//! NV12 frames written after their publish (packed, and in order), and a batch that must not
//! wait for a frame it does not hold.
#![cfg(feature = "cuda")]

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

/// The pitched test's frames: NV12 of `NV12_W` × `NV12_H`, packed `NV12_PACKED` bytes.
const NV12_W: usize = 256;
const NV12_H: usize = 64;
const NV12_PACKED: usize = NV12_W * NV12_H * 3 / 2;
/// How long a camera's stream spins before its frame's bytes land: past its publish, so a
/// batch published before its copies ran would hold the frames before.
const LATE_SPIN_NS: u64 = 3_000_000;

/// Byte `i` (packed) of camera `cam`'s frame `seq` in the pitched test.
fn nv12_byte(cam: usize, seq: u64, i: usize) -> u8 {
    (cam as u64 * 37 + seq * 11 + i as u64 * 7 + (i / NV12_W) as u64) as u8
}

/// A camera child of NV12 frames rows `PITCH` apart (the chroma plane `GAP` bytes after the luma
/// plane, padding 0xEE), written on the GPU `LATE_SPIN_NS` after its stream reaches the frame,
/// one every 15 ms, until `DONE` exists or its parent is gone.
fn pitched_camera() {
    let cam: usize = env("CAM");
    let (pitch, gap): (usize, usize) = (env("PITCH"), env("GAP"));
    let done = PathBuf::from(env::<String>("DONE"));
    let parent = std::os::unix::process::parent_id();
    let uv_at = pitch * NV12_H + gap;
    let len = uv_at + pitch * NV12_H / 2;
    let b = Producer::builder(&env::<String>("RING"))
        .slot_size(len)
        .user_header_size(gpuring::frame::USER_HEADER_SIZE as u32);
    let mut tx = b.create_gpu(0).unwrap();
    let k = PatternKernels::get(tx.context()).unwrap();
    let spin = gpuring::testing::kernels::MismatchCounter::new(tx.stream()).unwrap();
    let mut fh = gpuring::frame::FrameHeader::new("NV12", NV12_W as u32, NV12_H as u32);
    fh.planes = 2;
    fh.offsets = [0, uv_at as u64, 0, 0];
    fh.strides = [pitch as u32, pitch as u32, 0, 0];
    let mut h = vec![0u8; gpuring::frame::USER_HEADER_SIZE];
    TensorHeader::new(DType::U8, &[len as u64]).write(&mut h).unwrap();
    fh.write(&mut h);
    let mut host = vec![0u8; len];
    let ctx = tx.context().clone();
    while !done.exists() && std::os::unix::process::parent_id() == parent {
        let slot = tx.acquire().unwrap();
        let seq = slot.seq();
        host.fill(0xEE);
        let rows = (0..NV12_H).map(|r| r * pitch).chain((0..NV12_H / 2).map(|r| uv_at + r * pitch));
        for (r, at) in rows.enumerate() {
            for x in 0..NV12_W {
                host[at + x] = nv12_byte(cam, seq, r * NV12_W + x);
            }
        }
        let _bound = ctx.bind().unwrap();
        // SAFETY: the slot holds `len` device bytes (8 read by the spin), ours until publish;
        // `spin` is a device u64 of this context; `host` is left alone until the stream is idle.
        unsafe {
            k.check(slot.stream(), slot.ptr(), 8, 0, spin.ptr(), LATE_SPIN_NS).unwrap();
            driver::memcpy_htod_async(slot.ptr(), &host, slot.stream().raw()).unwrap();
        }
        slot.publish(len, &h).unwrap();
        while !tx.stream().is_idle().unwrap() {
            std::thread::sleep(Duration::from_micros(200));
        }
        std::thread::sleep(Duration::from_millis(15));
    }
}

/// A checker child of the pitched test: `WANT` batches, each copied to the host once its
/// stream is idle and checked byte for byte; writes "batches bad present0 present1" to `RESULT`.
fn pitched_checker() {
    let want: u64 = env("WANT");
    let b = Consumer::builder(&env::<String>("OUT")).mode(Mode::Lossless);
    let rx = b.open_gpu_when_ready(None, Duration::from_secs(30)).unwrap();
    let mut host = vec![0u8; 2 * NV12_PACKED];
    let (mut batches, mut bad, mut present) = (0u64, 0u64, [0u64; 2]);
    let deadline = Instant::now() + Duration::from_secs(60);
    while batches < want {
        assert!(Instant::now() < deadline, "only {batches} batches in 60 s");
        let m = match rx.recv_timeout(Duration::from_millis(100)) {
            Ok(m) => m,
            Err(RecvTimeoutError::Timeout) => continue,
            Err(e) => panic!("{e}"),
        };
        let t = TensorHeader::read(m.header()).unwrap().expect("a tensor header");
        assert_eq!(t, TensorHeader::new(DType::U8, &[2, NV12_H as u64 * 3 / 2, NV12_W as u64]));
        let table = BatchTable::read(m.header()).unwrap().expect("a batch table");
        while !m.stream().is_idle().unwrap() {
            assert!(Instant::now() < deadline, "a batch's stream stayed busy");
            std::thread::sleep(Duration::from_micros(100));
        }
        let _bound = rx.context().bind().unwrap();
        // SAFETY: the batch is `2 * NV12_PACKED` device bytes of this context, pinned by `m`.
        unsafe { driver::memcpy_dtoh(&mut host, m.ptr()) }.unwrap();
        for (c, e) in table.cameras.iter().enumerate() {
            let place = &host[c * NV12_PACKED..(c + 1) * NV12_PACKED];
            bad += if e.has_frame() {
                (0..NV12_PACKED).filter(|&i| place[i] != nv12_byte(c, e.seq, i)).count() as u64
            } else {
                place.iter().filter(|&&b| b != 0).count() as u64
            };
            present[c] += (e.state == CameraState::Present) as u64;
        }
        batches += 1;
    }
    let result = format!("{batches} {bad} {} {}", present[0], present[1]);
    std::fs::write(env::<String>("RESULT"), result).unwrap();
}

/// Two cameras of pitched NV12 frames (different pitches, one with a gap before its chroma
/// plane) whose bytes land 3 ms after their publish: every batch holds them packed, byte for
/// byte, so each copy ran after its frame's fence and the batch's fence after every copy.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_pitched_frames_written_late_are_packed_in_order() {
    let test = "gpu_pitched_frames_written_late_are_packed_in_order";
    match role().as_deref() {
        Some("camera") => return pitched_camera(),
        Some("checker") => return pitched_checker(),
        _ => {}
    }
    let dir = std::env::temp_dir().join(unique_name("gpu-batch-nv12"));
    std::fs::create_dir_all(&dir).unwrap();
    let done = dir.join("done");
    let out = unique_name("gpu-nv12-out");
    let inputs: Vec<String> = (0..2).map(|c| unique_name(&format!("gpu-nv12-{c}"))).collect();
    let mut kids = Kids(Vec::new());
    for (c, (pitch, gap)) in [(384, 0), (320, 4096)].into_iter().enumerate() {
        let env = [
            ("CAM", c.to_string()),
            ("RING", inputs[c].clone()),
            ("PITCH", pitch.to_string()),
            ("GAP", gap.to_string()),
            ("DONE", done.display().to_string()),
        ];
        kids.0.push(spawn(test, "camera", &env));
    }
    kids.0.push(spawn_batcher(&out, &inputs));
    let result = dir.join("checker");
    let want = 150u64;
    let env = [("OUT", out), ("WANT", want.to_string()), ("RESULT", result.display().to_string())];
    kids.0.push(spawn(test, "checker", &env));
    let deadline = Instant::now() + Duration::from_secs(120);
    let status = loop {
        if let Some(status) = kids.0[3].try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "the checker did not finish in 120 s");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "checker: {status}");
    let r = std::fs::read_to_string(&result).unwrap();
    eprintln!("{test}: {r}");
    let v: Vec<u64> = r.split_whitespace().map(|x| x.parse().unwrap()).collect();
    assert_eq!(v[0], want);
    assert_eq!(v[1], 0, "bad bytes in {want} batches");
    assert!(v[2] >= want / 4 && v[3] >= want / 4, "cameras rarely present: {r}");
    std::fs::write(&done, b"").unwrap();
    drop(kids);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A camera child of the "not held" test: frame 0 at once, then frame 1 whose bytes land only
/// after `HELD_SPIN_NS` (its fence with them), then nothing until `DONE`.
fn slow_second_camera() {
    let done = PathBuf::from(env::<String>("DONE"));
    let parent = std::os::unix::process::parent_id();
    let b = Producer::builder(&env::<String>("RING")).slot_size(FRAME).user_header_size(64);
    let mut tx = b.create_gpu(0).unwrap();
    let k = PatternKernels::get(tx.context()).unwrap();
    let spin = gpuring::testing::kernels::MismatchCounter::new(tx.stream()).unwrap();
    let mut h = [0u8; 64];
    TensorHeader::new(DType::U8, &SHAPE).write(&mut h).unwrap();
    for spin_ns in [0, HELD_SPIN_NS] {
        let slot = tx.acquire().unwrap();
        let seq = slot.seq();
        // SAFETY: the slot holds `FRAME` bytes, ours until publish; `spin` is a device u64 of
        // this context.
        unsafe {
            k.check(slot.stream(), slot.ptr(), 8, 0, spin.ptr(), spin_ns).unwrap();
            k.fill(slot.stream(), slot.ptr(), FRAME as u64, pattern_seq(0, seq)).unwrap();
        }
        // Frame 1 right after frame 0: the batcher receives it while frame 0's batch is open.
        slot.publish(FRAME, &h).unwrap();
    }
    while !done.exists() && std::os::unix::process::parent_id() == parent {
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// How long the second frame of the "not held" test's slow camera takes to be written.
const HELD_SPIN_NS: u64 = 20_000_000_000;

/// A lossless batcher holds camera 0's frame 0 in a batch while its frame 1, already received
/// (its stream waits for that frame's fence), is still being written, for 20 s: that batch's
/// fence must not wait for frame 1, which it does not hold. The batch's bytes are ready within
/// 5 s (a camera's stream joined when the batch closes, not its copy, would make it 20 s).
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_a_batch_does_not_wait_for_a_frame_it_does_not_hold() {
    let test = "gpu_a_batch_does_not_wait_for_a_frame_it_does_not_hold";
    match role().as_deref() {
        Some("slow") => return slow_second_camera(),
        Some("camera") => return camera(),
        _ => {}
    }
    let dir = std::env::temp_dir().join(unique_name("gpu-batch-held"));
    std::fs::create_dir_all(&dir).unwrap();
    let done = dir.join("done");
    let out = unique_name("gpu-held-out");
    let inputs: Vec<String> = (0..2).map(|c| unique_name(&format!("gpu-held-{c}"))).collect();
    let mut kids = Kids(Vec::new());
    let rx = {
        let args = ["batch", "--memory", "cuda", "--mode", "lossless", "--max-wait-ms", "40"];
        kids.0.push(
            Command::new(gpuring_bin())
                .args(args)
                .args(["--ring", &out, "--inputs", &inputs.join(",")])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(if common::verbose() { Stdio::inherit() } else { Stdio::null() })
                .spawn()
                .unwrap(),
        );
        let b = Consumer::builder(&out).mode(Mode::Lossless);
        // Camera 1, a steady one, first: the batch ring is made on its first frame.
        kids.0.push(spawn_camera(test, 1, &inputs[1], "legacy", &done));
        b.open_gpu_when_ready(None, Duration::from_secs(30)).unwrap()
    };
    let env = [("RING", inputs[0].clone()), ("DONE", done.display().to_string())];
    kids.0.push(spawn(test, "slow", &env));
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut host = vec![0u8; CAMERAS * FRAME];
    loop {
        assert!(Instant::now() < deadline, "no batch with camera 0's frame 0 in 30 s");
        let m = match rx.recv_timeout(Duration::from_millis(100)) {
            Ok(m) => m,
            Err(RecvTimeoutError::Timeout) => continue,
            Err(e) => panic!("{e}"),
        };
        let table = BatchTable::read(m.header()).unwrap().expect("a batch table");
        let c0 = table.cameras[0];
        if !(c0.state == CameraState::Present && c0.seq == 0) {
            continue;
        }
        let ready_by = Instant::now() + Duration::from_secs(5);
        while !m.stream().is_idle().unwrap() {
            assert!(Instant::now() < ready_by, "the batch waited for a frame it does not hold");
            std::thread::sleep(Duration::from_millis(1));
        }
        let _bound = rx.context().bind().unwrap();
        // SAFETY: the batch is `2 * FRAME` device bytes of this context, pinned by `m`.
        unsafe { driver::memcpy_dtoh(&mut host[..2 * FRAME], m.ptr()) }.unwrap();
        assert_eq!(pattern::mismatches(&host[..FRAME], pattern_seq(0, 0)), 0);
        break;
    }
    std::fs::write(&done, b"").unwrap();
    drop(kids);
    let _ = std::fs::remove_dir_all(&dir);
}
