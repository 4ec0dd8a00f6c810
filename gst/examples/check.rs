//! Checks what a `gpuringsink` ring delivers, frame by frame, against reference frames: those
//! a reference pipeline makes (by default `videotestsrc pattern=ball`, whose frames differ by
//! frame number), matched by the buffer offset (the frame number) in the frame header.
//!
//! ```text
//! check rust RING N [--ref PIPELINE]            a plain gpuring consumer (host or CUDA ring)
//! check gst RING N [--via ELEMENTS] [--ref PIPELINE]
//!                                               gpuringsrc ! ELEMENTS ! appsink
//! check ref N OUT [--ref PIPELINE]              write the reference frames, raw, to OUT
//! ```
//! PIPELINE must produce system-memory frames of the format the producer publishes; the
//! default is `videotestsrc pattern=ball num-buffers=N ! video/x-raw,format=RGBA,width=320,
//! height=240`. Each mode prints frames, mismatching bytes, frames lost and frames/s, and exits
//! with status 1 if any byte differs or a frame is missing.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use gpuring::cuda::driver;
use gpuring::{Consumer, Host, MemoryKind, Mode, OpenErrorKind, RecvError};
use gst::prelude::*;
use gstgpuring::header::FrameHeader;
use gstgpuring::planes::Layout;

type Frames = HashMap<u64, Vec<u8>>;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let opt = |name: &str| args.iter().position(|a| a == name).map(|i| args[i + 1].clone());
    let n_at = if args.first().map(String::as_str) == Some("ref") { 1 } else { 2 };
    let n: u64 = args.get(n_at).and_then(|s| s.parse().ok()).expect("usage: see the file's docs");
    gst::init().expect("gst init");
    gstgpuring::plugin_register_static().expect("register the plugin");
    let reference_desc = opt("--ref").unwrap_or_else(|| {
        "videotestsrc pattern=ball ! video/x-raw,format=RGBA,width=320,height=240".to_owned()
    });
    let (refs, info) = reference(&reference_desc, n);
    let (frames, bad, lost, fps) = match args[0].as_str() {
        "ref" => {
            let mut out = Vec::new();
            for i in 0..n {
                out.extend_from_slice(&refs[&i]);
            }
            std::fs::write(&args[2], out).expect("write the reference");
            println!(
                "reference: {n} frames of {}x{} {}",
                info.width(),
                info.height(),
                info.format()
            );
            return;
        }
        "rust" => rust_consumer(&args[1], n, &refs, &info),
        "gst" => gst_consumer(&args[1], n, &refs, &info, opt("--via").as_deref()),
        other => panic!("unknown mode {other}"),
    };
    println!(
        "{} consumer of {}: {frames} frames, {bad} bad bytes, {lost} lost, {fps:.1} frames/s",
        args[0], args[1]
    );
    if bad > 0 || frames + lost != n || frames == 0 {
        std::process::exit(1);
    }
}

/// The reference frames, packed, by frame number; and their format.
fn reference(desc: &str, n: u64) -> (Frames, gst_video::VideoInfo) {
    let desc = format!("{desc} ! appsink name=s sync=false");
    let desc = desc.replacen("videotestsrc", &format!("videotestsrc num-buffers={n}"), 1);
    let mut frames = HashMap::new();
    let mut info = None;
    pull(&desc, |sample, b| {
        let i = gst_video::VideoInfo::from_caps(sample.caps().unwrap()).unwrap();
        frames.insert(frames.len() as u64, packed(b, &i));
        info = Some(i);
        (frames.len() as u64) < n
    });
    (frames, info.expect("reference frames"))
}

/// A buffer's frame, packed in its format's default layout (whatever strides it came with).
fn packed(b: &gst::BufferRef, info: &gst_video::VideoInfo) -> Vec<u8> {
    let map = b.map_readable().unwrap();
    let from = match b.meta::<gst_video::VideoMeta>() {
        Some(m) => Layout::new(info, m.offset(), m.stride()),
        None => Layout::of_info(info),
    };
    let mut out = vec![0u8; info.size()];
    from.copy_cpu(&map, &Layout::of_info(info), &mut out).expect("frame fits its layout");
    out
}

fn pull(desc: &str, mut each: impl FnMut(&gst::SampleRef, &gst::BufferRef) -> bool) {
    let pipeline = gst::parse::launch(desc).expect("parse").downcast::<gst::Pipeline>().unwrap();
    let sink = pipeline.by_name("s").unwrap().downcast::<gst_app::AppSink>().unwrap();
    pipeline.set_state(gst::State::Playing).expect("playing");
    loop {
        if let Some(msg) = pipeline.bus().unwrap().pop_filtered(&[gst::MessageType::Error]) {
            panic!("{desc}: {msg:?}");
        }
        match sink.try_pull_sample(gst::ClockTime::from_mseconds(100)) {
            Some(s) if !each(&s, s.buffer().unwrap()) => break,
            Some(_) => {}
            None if sink.is_eos() => break,
            None => {}
        }
    }
    pipeline.set_state(gst::State::Null).unwrap();
}

/// Mismatching bytes between a frame and its reference.
fn diff(got: &[u8], want: &[u8]) -> u64 {
    got.iter().zip(want).filter(|(a, b)| a != b).count() as u64
        + got.len().abs_diff(want.len()) as u64
}

fn gst_consumer(
    ring: &str,
    n: u64,
    refs: &Frames,
    info: &gst_video::VideoInfo,
    via: Option<&str>,
) -> (u64, u64, u64, f64) {
    let caps = format!("video/x-raw,format={}", info.format().to_str());
    let desc = match via {
        Some(v) => format!(
            "gpuringsrc ring={ring} mode=lossless ! {v} ! {caps} ! appsink name=s sync=false"
        ),
        None => {
            format!("gpuringsrc ring={ring} mode=lossless ! {caps} ! appsink name=s sync=false")
        }
    };
    let (mut frames, mut bad, mut next, mut lost) = (0u64, 0u64, 0u64, 0u64);
    let mut first = None;
    pull(&desc, |sample, b| {
        first.get_or_insert_with(Instant::now);
        let i = gst_video::VideoInfo::from_caps(sample.caps().unwrap()).unwrap();
        // The frame number: the buffer offset, or (a source that sets none) the count so far.
        let offset = Some(b.offset()).filter(|&o| o != u64::MAX).unwrap_or(frames + lost);
        lost += offset.saturating_sub(next);
        next = offset + 1;
        bad += diff(&packed(b, &i), &refs[&offset]);
        frames += 1;
        next < n
    });
    (frames, bad, lost, rate(frames, first))
}

fn rate(frames: u64, first: Option<Instant>) -> f64 {
    let secs = first.map_or(Duration::ZERO, |t| t.elapsed()).as_secs_f64();
    if frames > 1 && secs > 0.0 {
        (frames - 1) as f64 / secs
    } else {
        0.0
    }
}

fn rust_consumer(
    ring: &str,
    n: u64,
    refs: &Frames,
    info: &gst_video::VideoInfo,
) -> (u64, u64, u64, f64) {
    let b = || Consumer::builder(ring).mode(Mode::Lossless);
    let host = b().open_in_when_ready::<Host>(None, Duration::from_secs(60));
    let (mut frames, mut bad, mut lost) = (0u64, 0u64, 0u64);
    let mut first = None;
    let mut check = |header: &[u8], bytes: &[u8], lag: u64| {
        first.get_or_insert_with(Instant::now);
        let h = FrameHeader::read(header).expect("a frame header");
        assert_eq!(
            (h.format.as_str(), h.width, h.height),
            (info.format().to_str().as_str(), info.width(), info.height())
        );
        let from = Layout::of_header(info, &h, bytes.len()).expect("a valid frame layout");
        let mut out = vec![0u8; info.size()];
        from.copy_cpu(bytes, &Layout::of_info(info), &mut out)
            .expect("the message holds its layout");
        lost += lag;
        let number = h.offset.unwrap_or(frames + lost);
        bad += diff(&out, &refs[&number]);
        frames += 1;
        number + 1 < n
    };
    match host {
        Ok(rx) => loop {
            match rx.recv() {
                Ok(m) if !check(m.header(), &m, m.lag()) => break,
                Ok(_) => {}
                Err(RecvError::Disconnected) => break,
                Err(e) => panic!("recv: {e}"),
            }
        },
        Err(e) if matches!(e.kind(), OpenErrorKind::WrongMemory { found: MemoryKind::Cuda }) => {
            let rx = b().open_gpu().expect("open the CUDA ring");
            let _bound = rx.context().bind().unwrap();
            loop {
                let m = match rx.recv() {
                    Ok(m) => m,
                    Err(RecvError::Disconnected) => break,
                    Err(e) => panic!("recv: {e}"),
                };
                let mut host = vec![0u8; m.len()];
                m.stream().synchronize().unwrap();
                // SAFETY: the slot holds `len` device bytes, ready (its stream has waited for
                // the producer and finished), held until `m` drops; our context is current.
                unsafe { driver::memcpy_dtoh(&mut host, m.ptr()) }.unwrap();
                if !check(m.header(), &host, m.lag()) {
                    break;
                }
            }
        }
        Err(e) => panic!("open {ring}: {e}"),
    }
    (frames, bad, lost, rate(frames, first))
}
