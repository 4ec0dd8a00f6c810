//! What a hostile or unusual peer, or a pipeline's own state changes, must not do to the
//! elements: frame headers that point outside the message are refused, frames held downstream
//! do not stall an overwrite ring, and a sink paused while the ring is full resumes.
//! (From an adversarial review: each of these failed before its fix.)

use std::time::{Duration, Instant};

use gpuring::{Consumer, Mode, Policy, Producer, RecvTimeoutError};
use gst::prelude::*;
use gstgpuring::header::{FrameHeader, USER_HEADER_SIZE};

fn init() {
    gst::init().unwrap();
    gstgpuring::plugin_register_static().unwrap();
}

fn name(tag: &str) -> String {
    format!("t-gstrb-{tag}-{}", std::process::id())
}

/// The first sample of `desc` (ending in `appsink name=s`), or the pipeline's error.
fn pull_one(desc: &str) -> Result<gst::Sample, String> {
    let p = gst::parse::launch(desc).unwrap().downcast::<gst::Pipeline>().unwrap();
    let s = p.by_name("s").unwrap().downcast::<gst_app::AppSink>().unwrap();
    p.set_state(gst::State::Playing).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let r = loop {
        if let Some(m) = p.bus().unwrap().pop_filtered(&[gst::MessageType::Error]) {
            break Err(format!("{m:?}"));
        }
        if let Some(x) = s.try_pull_sample(gst::ClockTime::from_mseconds(50)) {
            break Ok(x);
        }
        assert!(Instant::now() < deadline, "neither a sample nor an error");
    };
    p.set_state(gst::State::Null).unwrap();
    r
}

/// The user header of a 16x4 RGBA frame, changed by `edit`.
fn rgba_header(edit: impl Fn(&mut FrameHeader)) -> Vec<u8> {
    let mut h = FrameHeader::new("RGBA", 16, 4);
    h.strides[0] = 64;
    edit(&mut h);
    let mut header = vec![0u8; USER_HEADER_SIZE];
    h.write(&mut header);
    header
}

/// A 16x4 RGBA frame header with one plane changed by `edit`, published (on an overwrite
/// ring, so the sender never waits) until the source has answered.
fn refused(tag: &str, edit: impl Fn(&mut FrameHeader)) -> String {
    init();
    let ring = name(tag);
    let mut tx = Producer::builder(&ring)
        .capacity(4)
        .policy(Policy::Overwrite)
        .slot_size(4096)
        .user_header_size(USER_HEADER_SIZE as u32)
        .create()
        .unwrap();
    let header = rgba_header(edit);
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop = done.clone();
    let sender = std::thread::spawn(move || {
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            tx.send(&[7u8; 256], &header).unwrap();
            std::thread::sleep(Duration::from_millis(10));
        }
    });
    let r = pull_one(&format!("gpuringsrc ring={ring} ! appsink name=s sync=false"));
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    sender.join().unwrap();
    match r {
        Ok(s) => panic!(
            "{tag}: a buffer came through: {:?}",
            s.buffer().unwrap().meta::<gst_video::VideoMeta>()
        ),
        Err(e) => e,
    }
}

#[test]
fn negative_stride_is_refused() {
    let e = refused("neg", |h| h.strides[0] = (-64i32) as u32);
    assert!(e.contains("stride out of range"), "{e}");
}

#[test]
fn short_stride_is_refused() {
    let e = refused("short", |h| h.strides[0] = 1);
    assert!(e.contains("shorter than a row"), "{e}");
}

#[test]
fn overflowing_offset_is_refused() {
    let e = refused("ovf", |h| h.offsets[0] = 0u64.wrapping_sub(256));
    assert!(e.contains("runs past the message"), "{e}");
}

#[test]
fn plane_count_must_match_the_format() {
    let e = refused("planes", |h| h.planes = 2);
    assert!(e.contains("planes"), "{e}");
}

#[test]
fn formats_the_header_cannot_bound_are_refused() {
    // v210 packs pixels below a byte each: any stride would pass a per-byte check.
    let e = refused("v210", |h| {
        h.format = "v210".into();
        h.strides[0] = 0;
    });
    assert!(e.contains("not supported"), "{e}");
}

/// An appsink nobody pulls holds every frame the source pushes: the source lends at most a
/// few slots and copies the rest, so an overwrite producer never waits.
#[test]
fn frames_held_downstream_do_not_stall_an_overwrite_ring() {
    for spares in [0, 1, 2, 8] {
        held_frames_do_not_stall(spares);
    }
}

fn held_frames_do_not_stall(spares: u32) {
    init();
    let ring = name(&format!("lend{spares}"));
    let mut tx = Producer::builder(&ring)
        .capacity(4)
        .spare_buffers(spares)
        .policy(Policy::Overwrite)
        .slot_size(4096)
        .user_header_size(USER_HEADER_SIZE as u32)
        .create()
        .unwrap();
    let header = rgba_header(|_| {});
    let p = gst::parse::launch(&format!(
        "gpuringsrc ring={ring} mode=queue ! appsink name=s sync=false max-buffers=0"
    ))
    .unwrap();
    p.set_state(gst::State::Playing).unwrap();
    while tx.consumer_count() == 0 {
        std::thread::sleep(Duration::from_millis(5));
    }
    for i in 0..40 {
        let mut slot = tx
            .acquire_timeout(Duration::from_secs(2))
            .unwrap_or_else(|e| panic!("{spares} spares: the producer waited at message {i}: {e}"));
        slot[..256].fill(i as u8);
        slot.publish(256, &header).unwrap();
        std::thread::sleep(Duration::from_millis(10));
    }
    p.set_state(gst::State::Null).unwrap();
}

/// Paused while it waits for a full ring, the sink resumes when playing again.
#[test]
fn a_sink_paused_while_the_ring_is_full_resumes() {
    init();
    let ring = name("pause");
    let p = gst::parse::launch(&format!(
        "videotestsrc num-buffers=100 ! video/x-raw,format=RGBA,width=16,height=4 ! gpuringsink ring={ring} capacity=2 spare-buffers=0 sync=false wait-for-consumers=1"
    ))
    .unwrap();
    p.set_state(gst::State::Playing).unwrap();
    let rx = Consumer::builder(&ring)
        .mode(Mode::Lossless)
        .open_timeout(Duration::from_secs(10))
        .unwrap();
    std::thread::sleep(Duration::from_millis(300)); // the ring fills; the sink waits in render
    p.set_state(gst::State::Paused).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    p.set_state(gst::State::Playing).unwrap();
    let mut got = 0;
    let deadline = Instant::now() + Duration::from_secs(20);
    while got < 100 && Instant::now() < deadline {
        match rx.recv_timeout(Duration::from_millis(100)) {
            Ok(_) => got += 1,
            Err(RecvTimeoutError::Timeout) => {}
            Err(e) => panic!("recv: {e}"),
        }
    }
    assert_eq!(got, 100, "every frame after a pause and resume");
    p.set_state(gst::State::Null).unwrap();
}
