//! The batcher in one process: producers and the batcher on threads, a consumer checking every
//! batch. (tests/batch.rs runs each in a process of its own, with kills and restarts.)

use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use super::*;
use crate::tensor::DType;
use crate::{Consumer, Mode, Producer, RecvTimeoutError};

/// A ring name no other test (or test run) uses.
fn unique_name(tag: &str) -> String {
    use std::sync::atomic::AtomicU32;
    static N: AtomicU32 = AtomicU32::new(0);
    format!("t-{tag}-{}-{}", std::process::id(), N.fetch_add(1, Relaxed))
}

/// Sets the flag when dropped: a failed check must still stop the batcher and cameras, or the
/// scope that joins them would wait for ever.
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Relaxed);
    }
}

const SHAPE: [u64; 3] = [4, 6, 3];
const FRAME: usize = 4 * 6 * 3;

/// Byte `i` of camera `cam`'s frame `seq`.
fn pattern(cam: usize, seq: u64, i: usize) -> u8 {
    (cam as u64 * 37 + seq * 11 + i as u64) as u8
}

fn frame_header() -> Vec<u8> {
    let mut h = vec![0u8; 64];
    TensorHeader::new(DType::U8, &SHAPE).write(&mut h).unwrap();
    h
}

/// A camera: `frames` frames every `every`, each with the tensor header.
fn camera(name: &str, cam: usize, every: Duration, stop: &AtomicBool) {
    let mut tx = Producer::builder(name).slot_size(FRAME).user_header_size(64).create().unwrap();
    let h = frame_header();
    let mut seq = 0;
    while !stop.load(Relaxed) {
        let frame: Vec<u8> = (0..FRAME).map(|i| pattern(cam, seq, i)).collect();
        seq = tx.send(&frame, &h).unwrap() + 1;
        std::thread::sleep(every);
    }
}

/// Checks every batch received until `n` are, and returns their tables.
fn check_batches(rx: &Consumer, k: usize, n: usize) -> Vec<BatchTable> {
    let mut tables = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while tables.len() < n {
        assert!(Instant::now() < deadline, "only {} batches in 20 s", tables.len());
        let m = match rx.recv_timeout(Duration::from_millis(100)) {
            Ok(m) => m,
            Err(RecvTimeoutError::Timeout) => continue,
            Err(e) => panic!("{e}"),
        };
        let t = TensorHeader::read(m.header()).unwrap().expect("a tensor header");
        assert_eq!(t.shape, [k as u64, 4, 6, 3]);
        let table = BatchTable::read(m.header()).unwrap().expect("a batch table");
        assert_eq!(table.cameras.len(), k);
        assert_eq!(m.len(), k * FRAME);
        for (c, e) in table.cameras.iter().enumerate() {
            let place = &m[c * FRAME..(c + 1) * FRAME];
            if e.has_frame() {
                let bad = (0..FRAME).filter(|&i| place[i] != pattern(c, e.seq, i)).count();
                assert_eq!(bad, 0, "batch {} camera {c} ({e:?})", table.batch);
            } else {
                assert!(place.iter().all(|&b| b == 0), "batch {} camera {c}", table.batch);
            }
        }
        tables.push(table);
    }
    tables
}

#[test]
fn cameras_at_two_rates_make_whole_batches() {
    let out = unique_name("batch-out");
    let names: Vec<String> = (0..3).map(|c| unique_name(&format!("batch-cam{c}"))).collect();
    let stop = AtomicBool::new(false);
    let batcher = Batcher::builder(&out, &names)
        .timing(Timing::AllFresh { max_wait: Duration::from_millis(30) })
        .build()
        .unwrap();
    std::thread::scope(|s| {
        let run = s.spawn(|| batcher.run(&stop));
        for (c, name) in names.iter().enumerate() {
            // Camera 2 at half the rate of the others.
            let every = Duration::from_millis(if c == 2 { 10 } else { 5 });
            let stop = &stop;
            s.spawn(move || camera(name, c, every, stop));
        }
        let _stop = StopOnDrop(&stop);
        let rx = Consumer::builder(&out).open_timeout(Duration::from_secs(10)).unwrap();
        let tables = check_batches(&rx, 3, 60);
        // The status file tools read: the three cameras, by ring.
        let dir = crate::shm::default_dir();
        let status = BatchStatus::read(&dir, &out).unwrap().expect("a status file");
        let rings: Vec<&str> = status.inputs.iter().map(|i| i.ring.as_str()).collect();
        assert_eq!(rings, names.iter().map(String::as_str).collect::<Vec<_>>());
        assert!(status.batches > 0);
        stop.store(true, Relaxed);
        let totals = run.join().unwrap().unwrap();
        assert_eq!(BatchStatus::read(&dir, &out).unwrap(), None, "removed when it stops");
        assert!(totals.batches >= 60);
        // Batch numbers follow each other (a fresh consumer starts at the next one).
        assert!(tables.windows(2).all(|w| w[1].batch == w[0].batch + 1));
        // Every camera is in every batch once it started, present or stale, never absent
        // after it was present; a camera's sequence numbers never go back.
        for c in 0..3 {
            let seqs: Vec<u64> = tables.iter().map(|t| t.cameras[c].seq).collect();
            assert!(seqs.windows(2).all(|w| w[1] >= w[0]), "camera {c}: {seqs:?}");
            let present = tables.iter().filter(|t| t.cameras[c].state == CameraState::Present);
            assert!(present.count() > 10, "camera {c} is rarely present");
        }
    });
}

#[test]
fn a_missing_camera_is_absent_and_zero_and_batches_keep_their_rate() {
    let out = unique_name("batch-rate");
    let names = [unique_name("batch-live"), unique_name("batch-never")];
    let stop = AtomicBool::new(false);
    let frame = TensorHeader::new(DType::U8, &SHAPE);
    let batcher = Batcher::builder(&out, &names)
        .timing(Timing::Rate { period: Duration::from_millis(10) })
        .fill(Fill::Zeros)
        .frame(frame)
        .build()
        .unwrap();
    std::thread::scope(|s| {
        let run = s.spawn(|| batcher.run(&stop));
        let (name, stop_ref) = (&names[0], &stop);
        s.spawn(move || camera(name, 0, Duration::from_millis(25), stop_ref));
        let _stop = StopOnDrop(&stop);
        let rx = Consumer::builder(&out).open_timeout(Duration::from_secs(10)).unwrap();
        let tables = check_batches(&rx, 2, 40);
        stop.store(true, Relaxed);
        run.join().unwrap().unwrap();
        assert!(tables.iter().all(|t| t.cameras[1].state == CameraState::Absent));
        // A 25 ms camera in 10 ms batches is stale in most of them; with zeros, a stale
        // place holds no frame.
        let stale: Vec<_> =
            tables.iter().filter(|t| t.cameras[0].state == CameraState::Stale).collect();
        assert!(stale.len() > 10, "{} stale of {}", stale.len(), tables.len());
        assert!(stale.iter().all(|t| !t.cameras[0].has_frame()));
    });
}

#[test]
fn a_camera_of_another_shape_is_refused_by_name() {
    let out = unique_name("batch-refuse");
    let names = [unique_name("batch-good"), unique_name("batch-odd")];
    let stop = AtomicBool::new(false);
    let batcher =
        Batcher::builder(&out, &names).frame(TensorHeader::new(DType::U8, &SHAPE)).build().unwrap();
    std::thread::scope(|s| {
        let run = s.spawn(|| batcher.run(&stop));
        let (good, odd, stop_ref) = (&names[0], &names[1], &stop);
        s.spawn(move || camera(good, 0, Duration::from_millis(5), stop_ref));
        s.spawn(move || {
            let mut tx =
                Producer::builder(odd).slot_size(64).user_header_size(64).create().unwrap();
            let mut h = vec![0u8; 64];
            TensorHeader::new(DType::U8, &[8, 8]).write(&mut h).unwrap();
            while !stop_ref.load(Relaxed) {
                tx.send(&[1u8; 64], &h).unwrap();
                std::thread::sleep(Duration::from_millis(5));
            }
        });
        let _stop = StopOnDrop(&stop);
        let rx = Consumer::builder(&out).open_timeout(Duration::from_secs(10)).unwrap();
        let tables = check_batches(&rx, 2, 30);
        stop.store(true, Relaxed);
        run.join().unwrap().unwrap();
        let last = tables.last().unwrap();
        assert_eq!(last.cameras[1].state, CameraState::Refused);
        assert!(last.cameras[1].skipped > 0, "its frames count as skipped");
        assert_eq!(last.cameras[0].state, CameraState::Present);
    });
}

#[test]
fn settings_that_make_no_batcher_are_refused() {
    let e = Batcher::builder("x", &[] as &[&str]).build().unwrap_err();
    assert_eq!(e, BuildError::NoInputs);
    let e = Batcher::builder("x", &["a", "b", "a"]).build().unwrap_err();
    assert_eq!(e, BuildError::DuplicateInput("a".into()));
    let e = Batcher::builder("x", &["a"]).spare_buffers(1).build().unwrap_err();
    assert_eq!(e, BuildError::TooFewSpares(1));
    let e = Batcher::builder("x", &["a"]).capacity(0).build().unwrap_err();
    assert_eq!(e, BuildError::Capacity);
    let never = Timing::Rate { period: Duration::ZERO };
    assert_eq!(
        Batcher::builder("x", &["a"]).timing(never).build().unwrap_err(),
        BuildError::Timing
    );
    let forever = Timing::AllFresh { max_wait: Duration::MAX };
    assert_eq!(
        Batcher::builder("x", &["a"]).timing(forever).build().unwrap_err(),
        BuildError::Timing
    );
    let deep = TensorHeader::new(DType::U8, &[1; 8]);
    let e = Batcher::builder("x", &["a"]).frame(deep).build().unwrap_err();
    assert_eq!(e, BuildError::FrameDims(8));
    assert!(e.to_string().contains("at most 7"), "{e}");
    let empty = TensorHeader::new(DType::U8, &[0, 4]);
    let e = Batcher::builder("x", &["a"]).frame(empty).build().unwrap_err();
    assert_eq!(e, BuildError::FrameSize);
    let huge = TensorHeader::new(DType::U8, &[u64::MAX / 2, 4]);
    let e = Batcher::builder("x", &["a"]).frame(huge).build().unwrap_err();
    assert_eq!(e, BuildError::FrameSize);
}

/// A camera that sends `n` frames as fast as the ring lets it (Block: a `Lossless` batcher
/// slows it down) once `go` is set, then waits for `stop`. Its first frame waits for `go`
/// too, so the first batch ring is made then.
fn burst(name: &str, cam: usize, n: u64, go: &AtomicBool, stop: &AtomicBool) {
    let b = Producer::builder(name).slot_size(FRAME).user_header_size(64).capacity(4);
    let mut tx = b.create().unwrap();
    tx.wait_for_consumers(1, Duration::from_secs(10)).unwrap();
    while !go.load(Relaxed) {
        std::thread::sleep(Duration::from_millis(1));
    }
    let h = frame_header();
    for seq in 0..n {
        let frame: Vec<u8> = (0..FRAME).map(|i| pattern(cam, seq, i)).collect();
        tx.send(&frame, &h).unwrap();
    }
    while !stop.load(Relaxed) {
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn lossless_cameras_put_every_frame_in_a_batch_in_order() {
    const N: u64 = 200;
    let out = unique_name("batch-lossless");
    let names = [unique_name("batch-l0"), unique_name("batch-l1")];
    let (go, stop) = (AtomicBool::new(false), AtomicBool::new(false));
    let batcher = Batcher::builder(&out, &names)
        .mode(Mode::Lossless)
        .timing(Timing::AllFresh { max_wait: Duration::from_millis(5) })
        .frame(TensorHeader::new(DType::U8, &SHAPE))
        .build()
        .unwrap();
    std::thread::scope(|s| {
        let _stop = StopOnDrop(&stop);
        let run = s.spawn(|| batcher.run(&stop));
        for (c, name) in names.iter().enumerate() {
            let (go, stop) = (&go, &stop);
            s.spawn(move || burst(name, c, N, go, stop));
        }
        // The batch ring is made at once (the frame is given): join it before any frame.
        let rx = Consumer::builder(&out).mode(Mode::Lossless);
        let rx = rx.open_timeout(Duration::from_secs(10)).unwrap();
        go.store(true, Relaxed);
        let mut seen: [Vec<u64>; 2] = [Vec::new(), Vec::new()];
        let deadline = Instant::now() + Duration::from_secs(20);
        while seen.iter().any(|v| v.len() < N as usize) {
            assert!(
                Instant::now() < deadline,
                "frames batched: {} and {}",
                seen[0].len(),
                seen[1].len()
            );
            for t in check_batches(&rx, 2, 1) {
                for (c, e) in t.cameras.iter().enumerate() {
                    if e.state == CameraState::Present {
                        assert_eq!(e.skipped, 0, "a lossless camera skips nothing");
                        seen[c].push(e.seq);
                    }
                }
            }
        }
        stop.store(true, Relaxed);
        let totals = run.join().unwrap().unwrap();
        for (c, v) in seen.iter().enumerate() {
            assert_eq!(*v, (0..N).collect::<Vec<_>>(), "camera {c}'s frames, in batches");
        }
        for c in 0..2 {
            assert_eq!(totals.cameras[c].iter().sum::<u64>(), totals.batches);
            assert_eq!(totals.cameras[c][Totals::index(CameraState::Present)], N);
        }
    });
}

#[test]
fn a_slow_camera_keeps_its_previous_frame_and_does_not_hold_the_others_up() {
    let out = unique_name("batch-stale");
    let names = [unique_name("batch-fast"), unique_name("batch-slow")];
    let stop = AtomicBool::new(false);
    let batcher = Batcher::builder(&out, &names)
        .timing(Timing::AllFresh { max_wait: Duration::from_millis(10) })
        .fill(Fill::Previous)
        .build()
        .unwrap();
    std::thread::scope(|s| {
        let _stop = StopOnDrop(&stop);
        let run = s.spawn(|| batcher.run(&stop));
        let (fast, slow, stop_ref) = (&names[0], &names[1], &stop);
        s.spawn(move || camera(fast, 0, Duration::from_millis(2), stop_ref));
        s.spawn(move || camera(slow, 1, Duration::from_millis(60), stop_ref));
        let rx = Consumer::builder(&out).mode(Mode::Lossless);
        let rx = rx.open_timeout(Duration::from_secs(10)).unwrap();
        let tables = check_batches(&rx, 2, 80);
        stop.store(true, Relaxed);
        run.join().unwrap().unwrap();
        // The slow camera is stale in most batches, its place holding its last frame (the
        // bytes were checked against the sequence number its entry names).
        let mut stale = 0;
        for w in tables.windows(2) {
            let (before, now) = (&w[0].cameras[1], &w[1].cameras[1]);
            if now.state == CameraState::Stale {
                stale += 1;
                // Before its first frame it has none to keep.
                if before.has_frame() {
                    assert!(now.has_frame(), "a stale camera's place keeps its frame");
                    assert_eq!((now.seq, now.epoch), (before.seq, before.epoch));
                }
            }
        }
        // Batches went out without it (a batcher that waited for it would have it present in
        // every batch), and with the fast one in most.
        assert!(stale > 20, "the slow camera was stale in {stale} of 79 batches");
        let present = tables.iter().filter(|t| t.cameras[0].state == CameraState::Present);
        assert!(present.count() > 40);
    });
}

/// A camera of NV12 frames, `w` × `h`, rows `pitch` apart and the chroma plane `gap` bytes
/// after the luma plane's last row; padding holds 0xEE, pixels `pattern` of their packed index.
fn nv12_camera(name: &str, cam: usize, pitch: usize, gap: usize, stop: &AtomicBool) {
    let (w, h) = (48, 8);
    let uv_at = pitch * h + gap;
    let len = uv_at + pitch * h / 2;
    let mut tx = Producer::builder(name)
        .slot_size(len)
        .user_header_size(crate::frame::USER_HEADER_SIZE as u32)
        .create()
        .unwrap();
    let mut fh = crate::frame::FrameHeader::new("NV12", w as u32, h as u32);
    fh.planes = 2;
    fh.offsets = [0, uv_at as u64, 0, 0];
    fh.strides = [pitch as u32, pitch as u32, 0, 0];
    let mut header = vec![0u8; crate::frame::USER_HEADER_SIZE];
    // As `gpuringsink` writes it: the tensor header says only the message's bytes.
    TensorHeader::new(DType::U8, &[len as u64]).write(&mut header).unwrap();
    fh.write(&mut header);
    let mut seq = 0;
    while !stop.load(Relaxed) {
        let mut frame = vec![0xEEu8; len];
        // Luma rows, then chroma rows: packed index `i` runs over both.
        let rows = (0..h).map(|r| r * pitch).chain((0..h / 2).map(|r| uv_at + r * pitch));
        for (r, at) in rows.enumerate() {
            for x in 0..w {
                frame[at + x] = pattern(cam, seq, r * w + x);
            }
        }
        seq = tx.send(&frame, &header).unwrap() + 1;
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn planar_frames_of_any_pitch_are_packed() {
    let out = unique_name("batch-nv12");
    let names = [unique_name("batch-pitch64"), unique_name("batch-pitch80")];
    let stop = AtomicBool::new(false);
    let batcher = Batcher::builder(&out, &names)
        .timing(Timing::AllFresh { max_wait: Duration::from_millis(30) })
        .build()
        .unwrap();
    let packed = 48 * 12;
    std::thread::scope(|s| {
        let run = s.spawn(|| batcher.run(&stop));
        let (a, b, stop_ref) = (&names[0], &names[1], &stop);
        s.spawn(move || nv12_camera(a, 0, 64, 0, stop_ref));
        s.spawn(move || nv12_camera(b, 1, 80, 100, stop_ref));
        let _stop = StopOnDrop(&stop);
        let rx = Consumer::builder(&out).open_timeout(Duration::from_secs(10)).unwrap();
        let mut checked = 0;
        let deadline = Instant::now() + Duration::from_secs(20);
        while checked < 30 {
            assert!(Instant::now() < deadline, "only {checked} batches in 20 s");
            let m = match rx.recv_timeout(Duration::from_millis(100)) {
                Ok(m) => m,
                Err(RecvTimeoutError::Timeout) => continue,
                Err(e) => panic!("{e}"),
            };
            let t = TensorHeader::read(m.header()).unwrap().expect("a tensor header");
            assert_eq!(t, TensorHeader::new(DType::U8, &[2, 12, 48]));
            assert_eq!(m.len(), 2 * packed);
            let table = BatchTable::read(m.header()).unwrap().expect("a batch table");
            for (c, e) in table.cameras.iter().enumerate() {
                assert_ne!(e.state, CameraState::Refused, "camera {c}");
                if e.has_frame() {
                    let place = &m[c * packed..(c + 1) * packed];
                    let bad = (0..packed).filter(|&i| place[i] != pattern(c, e.seq, i)).count();
                    assert_eq!(bad, 0, "batch {} camera {c} ({e:?})", table.batch);
                    checked += usize::from(c == 1);
                }
            }
        }
        stop.store(true, Relaxed);
        run.join().unwrap().unwrap();
    });
}
