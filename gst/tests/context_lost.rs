//! A lost GPU context in a GStreamer process, on machines without a GPU: the `test-support`
//! hook (`GPURING_TEST_LOSE_CONTEXT=N`: after N ring operations, every one fails with
//! `ContextLost`) makes the context of a child process count as lost, in host memory. The
//! element that sees it posts one error with the `gpuring-context-lost` details and stops the
//! pipeline; the child, written as docs/gstreamer.md says an application should be, exits with
//! the status the details give (75). A source of another process, whose producer lost its
//! context, waits for the restarted producer.
//!
//! The loss is for good in a process, so every pipeline that loses it runs in a child: this
//! test binary run again with a role (`common::spawn`); the parent never loses its context.

#[path = "../../tests/common/mod.rs"]
mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{env, expect_success, role, spawn, unique_name};
use gpuring::{Policy, Producer};
use gst::prelude::*;
use gstgpuring::header::{FrameHeader, USER_HEADER_SIZE};

/// What the error's debug text says (the Rust error's message).
const LOST: &str = "the GPU context of this process is lost";

/// 16x4 RGBA frames.
const CAPS: &str = "video/x-raw,format=RGBA,width=16,height=4,framerate=1000/1";

fn init() {
    gst::init().expect("gst init");
    gstgpuring::plugin_register_static().expect("register the plugin");
}

/// A ring directory of this test's own: a ring closed by a lost context keeps its file (for
/// `gpuring stat`), which must not be left in /dev/shm.
fn ring_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(unique_name(&format!("gst-lost-{tag}")));
    std::fs::create_dir_all(&dir).expect("make the ring directory");
    dir
}

/// The environment of a child: the ring, its directory, and (for `Some`) the operations before
/// its context is lost.
fn child_env(ring: &str, dir: &Path, lose_after: Option<u64>) -> Vec<(&'static str, String)> {
    let mut e = vec![("RING", ring.to_string()), ("RING_DIR", dir.display().to_string())];
    if let Some(n) = lose_after {
        e.push(("GPURING_TEST_LOSE_CONTEXT", n.to_string()));
    }
    e
}

/// Runs pipeline `desc` as an application should: on an error it exits with the status
/// `gstgpuring::exit_status` gives (75 for a lost context), here after checking that the error
/// is the gpuring element's lost-context one and, if the pipeline has an `appsink name=s`,
/// that at least `AT_LEAST` frames (from the environment; default 0) reached it first.
fn run_as_application(desc: &str) -> ! {
    let pipeline = gst::parse::launch(desc).expect("parse").downcast::<gst::Pipeline>().unwrap();
    let appsink = pipeline.by_name("s").map(|s| s.downcast::<gst_app::AppSink>().unwrap());
    pipeline.set_state(gst::State::Playing).expect("playing");
    let bus = pipeline.bus().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut pulled = 0u64;
    loop {
        assert!(Instant::now() < deadline, "{desc}: neither an end nor an error in 30 s");
        if let Some(s) = &appsink {
            while s.try_pull_sample(gst::ClockTime::ZERO).is_some() {
                pulled += 1;
            }
        }
        let Some(msg) = bus.timed_pop_filtered(
            gst::ClockTime::from_mseconds(20),
            &[gst::MessageType::Eos, gst::MessageType::Error],
        ) else {
            continue;
        };
        let gst::MessageView::Error(e) = msg.view() else {
            panic!("{desc}: ended without the error");
        };
        if let Some(s) = &appsink {
            // What reached the appsink before the error.
            while s.try_pull_sample(gst::ClockTime::ZERO).is_some() {
                pulled += 1;
            }
        }
        check_lost_error(e);
        progress!("{}: {} ({pulled} frames before)", e.error(), e.debug().unwrap_or_default());
        let at_least: u64 = std::env::var("AT_LEAST").map_or(0, |v| v.parse().unwrap());
        assert!(pulled >= at_least, "{pulled} frames before the loss, not {at_least}");
        let status = gstgpuring::exit_status(e).unwrap_or(1);
        pipeline.set_state(gst::State::Null).unwrap();
        std::process::exit(status);
    }
}

/// Asserts that `e` is the error a gpuring element posts for a lost context.
fn check_lost_error(e: &gst::message::Error) {
    let from = e.src().map(|s| s.path_string().to_string()).unwrap_or_default();
    let debug = e.debug().map(|d| d.to_string()).unwrap_or_default();
    assert!(from.contains("gpuring"), "from {from}: {} ({debug})", e.error());
    assert!(e.error().matches(gst::ResourceError::Failed), "{}", e.error());
    assert!(e.error().message().contains("GPU context"), "{}", e.error());
    assert!(debug.contains(LOST), "{debug}");
    let details = e.details().expect("the error carries details");
    assert_eq!(details.name(), gstgpuring::CONTEXT_LOST);
    assert_eq!(details.get::<i32>("exit-status").ok(), Some(gpuring::EXIT_CONTEXT_LOST));
    assert_eq!(details.get::<String>("call").ok().as_deref(), Some("test hook"));
}

/// Waits for a child and returns its exit status.
fn exit_code(mut child: std::process::Child) -> Option<i32> {
    child.wait().expect("wait for the child").code()
}

/// `gpuringsink` whose context is lost when it creates the ring, and after a few frames: it
/// posts the error and the pipeline stops; the application exits 75.
#[test]
fn gpuringsink_posts_the_loss_and_the_application_exits_75() {
    if role().as_deref() == Some("sink") {
        init();
        let (ring, dir): (String, String) = (env("RING"), env("RING_DIR"));
        run_as_application(&format!(
            "videotestsrc num-buffers=50 ! {CAPS} ! gpuringsink ring={ring} dir={dir} sync=false"
        ));
    }
    let test = "gpuringsink_posts_the_loss_and_the_application_exits_75";
    // 0: the create fails. 5: the create and two frames (an acquire and a publish each) pass,
    // the third frame's acquire fails.
    for lose_after in [0, 5] {
        let (ring, dir) = (unique_name("gst-lost-sink"), ring_dir("sink"));
        let child = spawn(test, "sink", &child_env(&ring, &dir, Some(lose_after)));
        let code = exit_code(child);
        assert_eq!(code, Some(gpuring::EXIT_CONTEXT_LOST), "lost after {lose_after}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

/// `gpuringsrc` whose context is lost when it opens the ring (which does not exist: with
/// `wait` and `reconnect` it would wait for ever for any other failure to open), and after
/// three frames: it posts the error rather than waiting for the ring or reconnecting.
#[test]
fn gpuringsrc_posts_the_loss_and_does_not_reconnect() {
    if role().as_deref() == Some("source") {
        init();
        let (ring, dir): (String, String) = (env("RING"), env("RING_DIR"));
        run_as_application(&format!(
            "gpuringsrc ring={ring} dir={dir} wait=true reconnect=true ! appsink name=s sync=false"
        ));
    }
    let test = "gpuringsrc_posts_the_loss_and_does_not_reconnect";

    // No ring, and the open is lost.
    let (ring, dir) = (unique_name("gst-lost-src-open"), ring_dir("src-open"));
    let e = child_env(&ring, &dir, Some(0));
    assert_eq!(exit_code(spawn(test, "source", &e)), Some(gpuring::EXIT_CONTEXT_LOST));
    std::fs::remove_dir_all(&dir).unwrap();

    // A producer here sends frames for as long as the child runs (an overwrite ring: it never
    // waits). The open and three messages (two steps each) pass, and the fourth receive is
    // lost; a receive that waited a tick for a message counts a step too, so at least one
    // frame comes through first.
    let (ring, dir) = (unique_name("gst-lost-src"), ring_dir("src"));
    let mut tx = Producer::builder(&ring)
        .dir(&dir)
        .capacity(4)
        .policy(Policy::Overwrite)
        .slot_size(4096)
        .user_header_size(USER_HEADER_SIZE as u32)
        .create()
        .unwrap();
    let mut header = vec![0u8; USER_HEADER_SIZE];
    let mut h = FrameHeader::new("RGBA", 16, 4);
    h.strides[0] = 64;
    h.write(&mut header);
    let mut e = child_env(&ring, &dir, Some(7));
    e.push(("AT_LEAST", "1".into()));
    let mut child = spawn(test, "source", &e);
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "the source did not end in 30 s");
        tx.send(&[7u8; 256], &header).unwrap();
        std::thread::sleep(Duration::from_millis(5));
    };
    assert_eq!(status.code(), Some(gpuring::EXIT_CONTEXT_LOST), "{status}");
    drop(tx);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A producer that loses its context ends its ring as cut, exits 75, and is restarted: a
/// `gpuringsrc` with `reconnect` (here, whose context is fine) takes the frames of the first
/// and then of the restarted one, and posts no error.
#[test]
fn a_source_reconnects_to_the_restart_of_a_producer_that_lost_its_context() {
    if role().as_deref() == Some("producer") {
        init();
        let (ring, dir): (String, String) = (env("RING"), env("RING_DIR"));
        let pattern: String = env("PATTERN");
        let desc = format!(
            "videotestsrc num-buffers=20 pattern={pattern} ! {CAPS} ! \
             gpuringsink ring={ring} dir={dir} wait-for-consumers=1"
        );
        if std::env::var_os("GPURING_TEST_LOSE_CONTEXT").is_some() {
            run_as_application(&desc);
        }
        let pipeline = gst::parse::launch(&desc).expect("parse");
        pipeline.set_state(gst::State::Playing).expect("playing");
        let msg = pipeline
            .bus()
            .unwrap()
            .timed_pop_filtered(
                gst::ClockTime::from_seconds(30),
                &[gst::MessageType::Eos, gst::MessageType::Error],
            )
            .expect("the producer ends within 30 s");
        assert!(matches!(msg.view(), gst::MessageView::Eos(_)), "{msg:?}");
        pipeline.set_state(gst::State::Null).unwrap();
        return;
    }
    let test = "a_source_reconnects_to_the_restart_of_a_producer_that_lost_its_context";
    init();
    let (ring, dir) = (unique_name("gst-lost-restart"), ring_dir("restart"));
    let pipeline = gst::parse::launch(&format!(
        "gpuringsrc ring={ring} dir={} reconnect=true ! appsink name=s sync=false",
        dir.display()
    ))
    .unwrap()
    .downcast::<gst::Pipeline>()
    .unwrap();
    let appsink = pipeline.by_name("s").unwrap().downcast::<gst_app::AppSink>().unwrap();
    pipeline.set_state(gst::State::Playing).unwrap();

    // The first producer sends black frames; the create and four frames (an acquire and a
    // publish each) pass, the fifth frame's acquire is lost.
    let mut e = child_env(&ring, &dir, Some(9));
    e.push(("PATTERN", "black".into()));
    let first = spawn(test, "producer", &e);
    // Its restart, whose context is fine, sends 20 white ones, then ends its stream.
    let mut e = child_env(&ring, &dir, None);
    e.push(("PATTERN", "white".into()));
    let mut restarted = None;
    let mut first = Some(first);

    let (mut black, mut white) = (0, 0);
    let deadline = Instant::now() + Duration::from_secs(60);
    while white < 20 {
        assert!(Instant::now() < deadline, "{black} black and {white} white frames in 60 s");
        if let Some(msg) = pipeline.bus().unwrap().pop_filtered(&[gst::MessageType::Error]) {
            panic!("the source failed: {msg:?}");
        }
        if let Some(status) = first.as_mut().and_then(|c| c.try_wait().unwrap()) {
            assert_eq!(status.code(), Some(gpuring::EXIT_CONTEXT_LOST), "{status}");
            first = None;
            restarted = Some(spawn(test, "producer", &e));
        }
        if let Some(sample) = appsink.try_pull_sample(gst::ClockTime::from_mseconds(20)) {
            let map = sample.buffer().unwrap().map_readable().unwrap();
            match map[0] {
                0 => black += 1,
                255 => white += 1,
                other => panic!("a frame that is neither black nor white ({other})"),
            }
        }
    }
    // Each of its acquires that waited a tick for a free slot counts a step too.
    assert!((1..=4).contains(&black), "{black} frames of the first producer, before its loss");
    expect_success(restarted.expect("the restart ran"), "the restarted producer");
    pipeline.set_state(gst::State::Null).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
}
