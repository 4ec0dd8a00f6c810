//! The batcher in one process: producers and the batcher on threads, a consumer checking every
//! batch. (tests/batch.rs runs each in a process of its own, with kills and restarts.)

use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use super::*;
use crate::tensor::DType;
use crate::{Consumer, Producer, RecvTimeoutError};

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
        stop.store(true, Relaxed);
        let totals = run.join().unwrap().unwrap();
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
    assert!(matches!(e, BatchError::NoInputs), "{e}");
    let e = Batcher::builder("x", &["a", "b", "a"]).build().unwrap_err();
    assert!(matches!(e, BatchError::DuplicateInput(ref n) if n == "a"), "{e}");
    let e = Batcher::builder("x", &["a"]).spare_buffers(1).build().unwrap_err();
    assert!(matches!(e, BatchError::TooFewSpares(1)), "{e}");
    let deep = TensorHeader::new(DType::U8, &[1; 8]);
    let e = Batcher::builder("x", &["a"]).frame(deep).build().unwrap_err();
    assert!(e.to_string().contains("at most 7"), "{e}");
}
