//! Real GStreamer pipelines in separate processes, in host memory: `videotestsrc ! gpuringsink`
//! feeding `gpuringsrc ! appsink` consumers and a plain Rust consumer, each frame checked
//! byte for byte against what `videotestsrc` makes for that frame number.
//!
//! The tests re-execute this binary as the producer and the consumers (`common::spawn`).

#[path = "../../tests/common/mod.rs"]
mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::{env, expect_success, role, spawn, unique_name};
use gpuring::{Consumer, Mode, RecvError};
use gst::prelude::*;
use gstgpuring::header::FrameHeader;

const WIDTH: u32 = 160;
const HEIGHT: u32 = 120;

/// Caps of the test frames: `pattern=ball` moves with the frame number, so every frame differs.
fn caps() -> String {
    format!("video/x-raw,format=RGBA,width={WIDTH},height={HEIGHT},framerate=1000/1")
}

fn init() {
    gst::init().expect("gst init");
    gstgpuring::plugin_register_static().expect("register the plugin");
}

/// What `videotestsrc` makes for frames 0..n: bytes and PTS by frame number.
fn reference(n: u64) -> HashMap<u64, (Vec<u8>, Option<gst::ClockTime>)> {
    let desc = format!(
        "videotestsrc num-buffers={n} pattern=ball ! {} ! appsink name=s sync=false",
        caps()
    );
    let mut frames = HashMap::new();
    pull_all(&desc, |b| {
        frames.insert(b.offset(), (b.map_readable().unwrap().to_vec(), b.pts()));
        true
    });
    assert_eq!(frames.len() as u64, n, "reference frames");
    frames
}

/// Runs `desc` (ending in `appsink name=s`) and hands each buffer to `each` until EOS or until
/// `each` returns false. Panics on a pipeline error, or after a minute.
fn pull_all(desc: &str, mut each: impl FnMut(&gst::BufferRef) -> bool) {
    let pipeline = gst::parse::launch(desc).expect("parse").downcast::<gst::Pipeline>().unwrap();
    let sink = pipeline.by_name("s").unwrap().downcast::<gst_app::AppSink>().unwrap();
    pipeline.set_state(gst::State::Playing).expect("playing");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        assert!(Instant::now() < deadline, "{desc}: no EOS within a minute");
        if let Some(msg) = pipeline.bus().unwrap().pop_filtered(&[gst::MessageType::Error]) {
            panic!("{desc}: {msg:?}");
        }
        match sink.try_pull_sample(gst::ClockTime::from_mseconds(100)) {
            Some(sample) if !each(sample.buffer().unwrap()) => break,
            Some(_) => {}
            None if sink.is_eos() => break,
            None => {}
        }
    }
    pipeline.set_state(gst::State::Null).unwrap();
}

/// Runs a producer pipeline to its end.
fn run_producer(desc: &str) {
    run_producer_counting(desc);
}

/// Runs a producer pipeline to its end; if its sink is named `sink`, returns how many frames it
/// published in place (pool buffers) and how many it copied.
fn run_producer_counting(desc: &str) -> (u64, u64) {
    let pipeline = gst::parse::launch(desc).expect("parse");
    pipeline.set_state(gst::State::Playing).expect("playing");
    let bus = pipeline.bus().unwrap();
    let msg = bus
        .timed_pop_filtered(
            gst::ClockTime::from_seconds(60),
            &[gst::MessageType::Eos, gst::MessageType::Error],
        )
        .expect("the producer ends within a minute");
    assert!(matches!(msg.view(), gst::MessageView::Eos(_)), "producer: {msg:?}");
    let counts = match pipeline.downcast_ref::<gst::Bin>().and_then(|b| b.by_name("sink")) {
        Some(sink) => (sink.property("frames-in-place"), sink.property("frames-copied")),
        None => (0, 0),
    };
    pipeline.set_state(gst::State::Null).unwrap();
    counts
}

/// A `gpuringsrc ! appsink` consumer: every frame in order from 0, each equal to the reference.
fn gst_consumer(ring: &str, n: u64, extra: &str) -> u64 {
    let refs = reference(n);
    let desc = format!("gpuringsrc ring={ring} {extra} ! appsink name=s sync=false");
    let mut next = 0;
    pull_all(&desc, |b| {
        assert_eq!(b.offset(), next, "frames in order, none lost");
        let (bytes, pts) = &refs[&next];
        let map = b.map_readable().unwrap();
        let bad = map.iter().zip(bytes).filter(|(a, b)| a != b).count();
        assert_eq!((map.len(), bad), (bytes.len(), 0), "frame {next}: length and bad bytes");
        assert_eq!(b.pts(), *pts, "frame {next}: PTS preserved");
        next += 1;
        next < n
    });
    next
}

/// The producer, two GStreamer consumers and a Rust consumer, each in its own process.
#[test]
fn host_ring_feeds_gst_and_rust_consumers() {
    const N: u64 = 300;
    match role().as_deref() {
        Some("producer") => {
            init();
            let ring: String = env("RING");
            run_producer(&format!(
                "videotestsrc num-buffers={N} pattern=ball ! {} ! gpuringsink ring={ring} capacity=4 wait-for-consumers=3",
                caps()
            ));
            return;
        }
        Some("gst") => {
            init();
            assert_eq!(gst_consumer(&env::<String>("RING"), N, "mode=lossless"), N);
            eprintln!("gst consumer: {N} frames, 0 bad bytes");
            return;
        }
        Some("rust") => {
            init();
            let refs = reference(N);
            let ring: String = env("RING");
            let rx = Consumer::builder(&ring)
                .mode(Mode::Lossless)
                .open_timeout(Duration::from_secs(30))
                .unwrap();
            let mut n = 0;
            loop {
                let msg = match rx.recv() {
                    Ok(msg) => msg,
                    Err(RecvError::Disconnected) => break,
                    Err(e) => panic!("recv: {e}"),
                };
                let h = FrameHeader::read(msg.header()).expect("a frame header");
                assert_eq!(
                    (h.format.as_str(), h.width, h.height, h.planes),
                    ("RGBA", WIDTH, HEIGHT, 1)
                );
                assert_eq!((h.offset, h.strides[0], h.fps), (Some(n), WIDTH * 4, (1000, 1)));
                assert_eq!(msg.seq(), n, "seq follows the frame number");
                let (bytes, pts) = &refs[&n];
                assert_eq!(h.pts, pts.map(|t| t.nseconds()));
                assert!(*msg == bytes[..], "frame {n}: bytes");
                n += 1;
            }
            assert_eq!(n, N);
            eprintln!("rust consumer: {N} frames, 0 bad bytes");
            return;
        }
        Some(other) => panic!("unknown role {other}"),
        None => {}
    }
    let ring = unique_name("gst");
    let env = [("RING", ring.clone())];
    let test = "host_ring_feeds_gst_and_rust_consumers";
    let consumers = [spawn(test, "gst", &env), spawn(test, "gst", &env), spawn(test, "rust", &env)];
    let producer = spawn(test, "producer", &env);
    expect_success(producer, "producer");
    for (c, what) in
        consumers.into_iter().zip(["gst consumer 1", "gst consumer 2", "rust consumer"])
    {
        expect_success(c, what);
    }
}

/// A source ends the stream once a closed ring is drained; with `reconnect=true` it goes on
/// with the next producer of the same name.
#[test]
fn source_ends_or_reconnects_when_the_producer_goes() {
    const N: u64 = 20;
    match role().as_deref() {
        Some("producer") => {
            init();
            let ring: String = env("RING");
            let wait: u32 = env("WAIT");
            run_producer(&format!(
                "videotestsrc num-buffers={N} pattern=ball ! {} ! gpuringsink ring={ring} wait-for-consumers={wait}",
                caps()
            ));
            return;
        }
        Some("ends") => {
            init();
            assert_eq!(gst_consumer(&env::<String>("RING"), N, ""), N, "EOS after the last frame");
            return;
        }
        Some("reconnects") => {
            init();
            let refs = reference(N);
            let desc = format!(
                "gpuringsrc ring={} reconnect=true ! appsink name=s sync=false",
                env::<String>("RING")
            );
            let mut got = Vec::new();
            pull_all(&desc, |b| {
                let map = b.map_readable().unwrap();
                assert!(map[..] == refs[&b.offset()].0[..], "frame {}", b.offset());
                got.push(b.offset());
                got.len() < 2 * N as usize
            });
            let want: Vec<u64> = (0..N).chain(0..N).collect();
            assert_eq!(got, want, "both producers' frames, in order");
            return;
        }
        Some(other) => panic!("unknown role {other}"),
        None => {}
    }
    let ring = unique_name("gst-re");
    let test = "source_ends_or_reconnects_when_the_producer_goes";
    let env1 = [("RING", ring.clone()), ("WAIT", "2".to_owned())];
    let ends = spawn(test, "ends", &env1);
    let reconnects = spawn(test, "reconnects", &env1);
    expect_success(spawn(test, "producer", &env1), "first producer");
    expect_success(ends, "the consumer that ends");
    let env2 = [("RING", ring.clone()), ("WAIT", "1".to_owned())];
    expect_success(spawn(test, "producer", &env2), "second producer");
    expect_success(reconnects, "the consumer that reconnects");
}

/// A producer killed mid-stream: the source delivers what was published, then ends the stream.
#[test]
fn source_ends_the_stream_when_the_producer_is_killed() {
    match role().as_deref() {
        Some("producer") => {
            init();
            let ring: String = env("RING");
            run_producer(&format!(
                "videotestsrc is-live=true pattern=ball ! {} ! gpuringsink ring={ring} wait-for-consumers=1",
                caps().replace("1000/1", "100/1")
            ));
            return;
        }
        Some("consumer") => {
            init();
            let refs = reference(1000);
            let desc =
                format!("gpuringsrc ring={} ! appsink name=s sync=false", env::<String>("RING"));
            let mut n = 0u64;
            pull_all(&desc, |b| {
                let map = b.map_readable().unwrap();
                assert!(map[..] == refs[&b.offset()].0[..], "frame {}", b.offset());
                n += 1;
                true
            });
            assert!(n >= 10, "frames before the kill: {n}");
            eprintln!("killed producer: {n} frames, then EOS");
            return;
        }
        Some(other) => panic!("unknown role {other}"),
        None => {}
    }
    let ring = unique_name("gst-kill");
    let test = "source_ends_the_stream_when_the_producer_is_killed";
    let env = [("RING", ring.clone())];
    let consumer = spawn(test, "consumer", &env);
    let mut producer = spawn(test, "producer", &env);
    // Let it publish for a while (100 frames/s), then kill it without warning.
    std::thread::sleep(Duration::from_millis(1500));
    producer.kill().unwrap();
    producer.wait().unwrap();
    expect_success(consumer, "consumer");
    // The killed producer could not remove its segment.
    let _ = std::fs::remove_file(format!("/dev/shm/gpuring.{ring}"));
}

/// `dir`: a sink and a source that name the same ring directory (one that containers share,
/// say) exchange every frame; a source that looks in the default directory finds no ring.
#[test]
fn sink_and_source_in_another_directory() {
    const N: u64 = 30;
    match role().as_deref() {
        Some("producer") => {
            init();
            let (ring, dir): (String, String) = (env("RING"), env("DIR"));
            run_producer(&format!(
                "videotestsrc num-buffers={N} pattern=ball ! {} ! gpuringsink ring={ring} dir={dir} wait-for-consumers=1",
                caps()
            ));
            return;
        }
        Some("consumer") => {
            init();
            let extra = format!("dir={} mode=lossless", env::<String>("DIR"));
            assert_eq!(gst_consumer(&env::<String>("RING"), N, &extra), N);
            return;
        }
        Some(other) => panic!("unknown role {other}"),
        None => {}
    }
    init();
    for factory in ["gpuringsink", "gpuringsrc"] {
        let e = gst::ElementFactory::make(factory).build().unwrap();
        assert_eq!(e.property::<String>("dir"), "", "{factory}: the library's default");
        e.set_property("dir", "/rings");
        assert_eq!(e.property::<String>("dir"), "/rings");
    }
    let ring = unique_name("gst-dir");
    let dir = std::env::temp_dir().join(&ring);
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join(format!("gpuring.{ring}"));
    let env = [("RING", ring.clone()), ("DIR", dir.to_str().unwrap().to_owned())];
    let test = "sink_and_source_in_another_directory";
    let producer = spawn(test, "producer", &env);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !file.exists() {
        assert!(Instant::now() < deadline, "the sink made no ring in {}", dir.display());
        std::thread::sleep(Duration::from_millis(10));
    }
    // Not in the default directory: a source that does not wait fails, naming where it looked.
    let desc = format!("gpuringsrc ring={ring} wait=false ! fakesink");
    let pipeline = gst::parse::launch(&desc).unwrap();
    pipeline.set_state(gst::State::Playing).unwrap();
    let msg = pipeline
        .bus()
        .unwrap()
        .timed_pop_filtered(gst::ClockTime::from_seconds(30), &[gst::MessageType::Error])
        .expect("an error from the source");
    let gst::MessageView::Error(err) = msg.view() else { unreachable!() };
    let wanted = format!("no ring named {ring:?} in {}", gpuring::shm::default_dir().display());
    let debug = err.debug().unwrap_or_default();
    assert!(debug.contains(&wanted), "{debug}");
    pipeline.set_state(gst::State::Null).unwrap();

    expect_success(spawn(test, "consumer", &env), "consumer");
    expect_success(producer, "producer");
    assert!(!file.exists(), "the sink removed its ring");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The pool the sink offers upstream: `videotestsrc` renders each frame straight into a ring
/// buffer, published without a copy (the sink counts 0 copies), and a consumer in another
/// process reads every frame byte for byte. A frame that is not a pool buffer (an application
/// pushing one buffer of its own again and again, as `imagefreeze` does; a `tee` sharing each
/// buffer between branches) is copied, and arrives all the same.
#[test]
fn pool_buffers_are_published_without_a_copy() {
    const N: u64 = 200;
    match role().as_deref() {
        Some("producer") => {
            init();
            let (ring, how): (String, String) = (env("RING"), env("HOW"));
            let sink = format!("gpuringsink name=sink ring={ring} capacity=4 wait-for-consumers=1");
            let src = format!("videotestsrc num-buffers={N} pattern=ball ! {}", caps());
            let (in_place, copied) = match how.as_str() {
                "pool" => run_producer_counting(&format!("{src} ! {sink}")),
                "repeat" => run_repeating(&sink, &reference(1)[&0].0, N),
                "tee" => run_producer_counting(&format!(
                    "{src} ! tee name=t ! queue ! {sink} t. ! queue ! fakesink"
                )),
                _ => unreachable!(),
            };
            eprintln!("{how}: {in_place} frames in place, {copied} copied");
            assert_eq!(in_place + copied, N, "every frame published once");
            match how.as_str() {
                "pool" => assert_eq!((in_place, copied), (N, 0), "pool frames are not copied"),
                _ => assert_eq!(in_place, 0, "a buffer not from the pool, or shared, is copied"),
            }
            return;
        }
        Some("consumer") => {
            init();
            let how: String = env("HOW");
            let refs = reference(N);
            let rx = Consumer::builder(&env::<String>("RING"))
                .mode(Mode::Lossless)
                .open_timeout(Duration::from_secs(30))
                .unwrap();
            let mut n = 0;
            while let Ok(msg) = rx.recv() {
                let frame = if how == "repeat" { 0 } else { n };
                assert!(*msg == refs[&frame].0[..], "{how}: frame {n}: bytes");
                n += 1;
            }
            assert_eq!(n, N, "{how}: frames");
            return;
        }
        Some(other) => panic!("unknown role {other}"),
        None => {}
    }
    let test = "pool_buffers_are_published_without_a_copy";
    for how in ["pool", "repeat", "tee"] {
        let env = [("RING", unique_name("gst-pool")), ("HOW", how.to_owned())];
        let consumer = spawn(test, "consumer", &env);
        expect_success(spawn(test, "producer", &env), &format!("{how} producer"));
        expect_success(consumer, &format!("{how} consumer"));
    }
}

/// An application's `appsrc` pushing one buffer of its own (`frame`) `n` times into `sink`
/// (named `sink`): (frames published in place, frames copied).
fn run_repeating(sink: &str, frame: &[u8], n: u64) -> (u64, u64) {
    let desc = format!("appsrc name=a format=time caps={} ! {sink}", caps());
    let pipeline = gst::parse::launch(&desc).expect("parse").downcast::<gst::Pipeline>().unwrap();
    let src = pipeline.by_name("a").unwrap().downcast::<gst_app::AppSrc>().unwrap();
    pipeline.set_state(gst::State::Playing).expect("playing");
    let buffer = gst::Buffer::from_slice(frame.to_vec());
    for _ in 0..n {
        src.push_buffer(buffer.clone()).expect("push");
    }
    src.end_of_stream().expect("eos");
    let msg = pipeline
        .bus()
        .unwrap()
        .timed_pop_filtered(
            gst::ClockTime::from_seconds(60),
            &[gst::MessageType::Eos, gst::MessageType::Error],
        )
        .expect("the producer ends within a minute");
    assert!(matches!(msg.view(), gst::MessageView::Eos(_)), "producer: {msg:?}");
    let sink = pipeline.by_name("sink").unwrap();
    let counts = (sink.property("frames-in-place"), sink.property("frames-copied"));
    pipeline.set_state(gst::State::Null).unwrap();
    counts
}

/// A sink whose in-place publish waits for a `Lossless` consumer that reads nothing (capacity
/// 1, `block`) still stops when the pipeline is set to NULL: the wait looks at the unlock.
#[test]
fn a_sink_blocked_on_a_consumer_stops_when_asked() {
    init();
    let ring = unique_name("gst-blocked");
    let desc = format!(
        "videotestsrc pattern=ball ! {} ! gpuringsink name=sink ring={ring} capacity=1 spare-buffers=2 wait-for-consumers=1",
        caps()
    );
    let pipeline = gst::parse::launch(&desc).unwrap().downcast::<gst::Pipeline>().unwrap();
    pipeline.set_state(gst::State::Playing).expect("playing");
    let rx = Consumer::builder(&ring)
        .mode(Mode::Lossless)
        .open_timeout(Duration::from_secs(30))
        .unwrap();
    let sink = pipeline.by_name("sink").unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while sink.property::<u64>("frames-in-place") + sink.property::<u64>("frames-copied") == 0 {
        assert!(Instant::now() < deadline, "no frame published");
        std::thread::sleep(Duration::from_millis(10));
    }
    // The next frame waits for `rx`, which reads nothing.
    std::thread::sleep(Duration::from_millis(200));
    let (done, stopped) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        pipeline.set_state(gst::State::Null).unwrap();
        let _ = done.send(());
    });
    assert!(
        stopped.recv_timeout(Duration::from_secs(20)).is_ok(),
        "a sink blocked on a consumer did not stop"
    );
    drop(rx);
}
