// Run: cargo run --release --example pipeline -- [--consumers 3] [--seconds 5] [--fps 60]
//
// The main job: one producer generates synthetic video frames (1920x1080 RGBA by default) into
// a ring and spawns N consumer processes. Each consumer checks every byte of every frame
// against the pattern of its sequence number. The producer prints a line per second with each
// consumer's rate, lag and drops, and everyone prints a summary at the end.

use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use clap::{Parser, ValueEnum};
use gpuring::{monotonic_ns, pattern, Consumer, Policy, Producer, RecvError, StartAt};

#[derive(Parser, Debug, Clone)]
#[command(about = "Synthetic video pipeline: 1 producer process, N consumer processes")]
struct Args {
    /// Consumer processes.
    #[arg(long, default_value_t = 3)]
    consumers: usize,
    /// Frame width in pixels.
    #[arg(long, default_value_t = 1920)]
    width: u32,
    /// Frame height in pixels.
    #[arg(long, default_value_t = 1080)]
    height: u32,
    /// Frames per second (0: as fast as the consumers allow).
    #[arg(long, default_value_t = 60)]
    fps: u32,
    /// How long to run.
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
    /// Slots in the ring.
    #[arg(long, default_value_t = 8)]
    capacity: u32,
    /// What the producer does when a consumer falls a ring behind.
    #[arg(long, value_enum, default_value_t = PolicyArg::Block)]
    policy: PolicyArg,
    /// Ring name (default: pipeline-PID).
    #[arg(long)]
    name: Option<String>,
    /// Internal: run as a consumer process.
    #[arg(long, hide = true)]
    role_consumer: Option<usize>,
}

#[derive(ValueEnum, Clone, Copy, Debug)]
enum PolicyArg {
    Block,
    Overwrite,
}

/// User header of every frame: width, height, bytes per pixel, then the frame number.
fn frame_header(args: &Args, seq: u64) -> [u8; 20] {
    let mut h = [0u8; 20];
    h[0..4].copy_from_slice(&args.width.to_le_bytes());
    h[4..8].copy_from_slice(&args.height.to_le_bytes());
    h[8..12].copy_from_slice(&4u32.to_le_bytes());
    h[12..20].copy_from_slice(&seq.to_le_bytes());
    h
}

fn main() -> ExitCode {
    let args = Args::parse();
    match args.role_consumer {
        Some(k) => consumer(&args, k),
        None => producer(&args),
    }
}

fn frame_bytes(args: &Args) -> usize {
    args.width as usize * args.height as usize * 4
}

fn producer(args: &Args) -> ExitCode {
    let name = args.name.clone().unwrap_or_else(|| format!("pipeline-{}", std::process::id()));
    let policy = match args.policy {
        PolicyArg::Block => Policy::Block,
        PolicyArg::Overwrite => Policy::Overwrite,
    };
    let bytes = frame_bytes(args);
    let mut tx = match Producer::builder(&name)
        .capacity(args.capacity)
        .slot_size(bytes)
        .user_header_size(32)
        .policy(policy)
        .create()
    {
        Ok(tx) => tx,
        Err(e) => {
            eprintln!("pipeline: cannot create ring {name}: {e}");
            return ExitCode::FAILURE;
        }
    };
    println!(
        "pipeline: ring '{name}', {}x{} RGBA ({:.1} MiB/frame), {} slots, {:?}, host memory, {} consumers",
        args.width,
        args.height,
        bytes as f64 / (1 << 20) as f64,
        args.capacity,
        policy,
        args.consumers
    );
    let children: Vec<Child> =
        (0..args.consumers).map(|k| spawn_consumer(args, &name, k)).collect();
    let t0 = Instant::now();
    while tx.consumer_count() < args.consumers {
        if t0.elapsed() > Duration::from_secs(20) {
            eprintln!("pipeline: consumers did not join");
            return ExitCode::FAILURE;
        }
        std::thread::sleep(Duration::from_millis(2));
    }

    let start = Instant::now();
    let run_for = Duration::from_secs_f64(args.seconds);
    let period = (args.fps > 0).then(|| Duration::from_secs_f64(1.0 / args.fps as f64));
    let mut next_report = start + Duration::from_secs(1);
    let mut last_published = 0u64;
    let mut last_received = vec![0u64; args.consumers];
    let mut seq = 0u64;
    while start.elapsed() < run_for {
        if let Some(p) = period {
            let due = start + p.mul_f64(seq as f64);
            let now = Instant::now();
            if due > now {
                std::thread::sleep(due - now);
            }
        }
        let mut slot = tx.acquire().expect("acquire");
        pattern::fill(&mut slot[..bytes], seq);
        slot.publish(bytes, &frame_header(args, seq)).expect("publish");
        seq += 1;
        if Instant::now() >= next_report {
            let secs = start.elapsed().as_secs_f64();
            let published = tx.published();
            let mut line =
                format!("t={secs:4.1}s  producer {:6.1} fps", (published - last_published) as f64);
            last_published = published;
            for (k, c) in tx.consumers().iter().enumerate().take(args.consumers) {
                let got = c.received - last_received.get(k).copied().unwrap_or(0);
                if let Some(r) = last_received.get_mut(k) {
                    *r = c.received;
                }
                line += &format!(" | c{k} {got:5} fps lag {:2} drops {}", c.lag, c.lost);
            }
            println!("{line}");
            next_report += Duration::from_secs(1);
        }
    }
    let secs = start.elapsed().as_secs_f64();
    let published = tx.published();
    drop(tx); // closes the ring: consumers drain, then see Disconnected
    println!(
        "producer: published {published} frames in {secs:.2} s ({:.1} fps, {:.2} GB/s written)",
        published as f64 / secs,
        published as f64 * bytes as f64 / secs / 1e9
    );
    let mut ok = true;
    for (k, mut c) in children.into_iter().enumerate() {
        let status = c.wait().expect("wait");
        if !status.success() {
            eprintln!("pipeline: consumer {k} failed: {status}");
            ok = false;
        }
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn spawn_consumer(args: &Args, name: &str, k: usize) -> Child {
    Command::new(std::env::current_exe().expect("current_exe"))
        .args(["--name", name, "--role-consumer", &k.to_string()])
        .args(["--width", &args.width.to_string(), "--height", &args.height.to_string()])
        .stdin(Stdio::null())
        .spawn()
        .expect("spawn consumer")
}

fn consumer(args: &Args, k: usize) -> ExitCode {
    let name = args.name.as_deref().expect("--name");
    let rx = match Consumer::builder(name).start_at(StartAt::Next).open() {
        Ok(rx) => rx,
        Err(e) => {
            eprintln!("consumer {k}: cannot open {name}: {e}");
            return ExitCode::FAILURE;
        }
    };
    let bytes = frame_bytes(args);
    let (mut frames, mut lost, mut bad_frames, mut bad_bytes) = (0u64, 0u64, 0u64, 0u64);
    let mut latencies_us = Vec::new();
    let start = Instant::now();
    loop {
        let frame = match rx.recv() {
            Ok(f) => f,
            Err(RecvError::Disconnected) => break,
            Err(e) => {
                eprintln!("consumer {k}: {e}");
                return ExitCode::FAILURE;
            }
        };
        latencies_us.push((monotonic_ns().saturating_sub(frame.timestamp_ns())) as f64 / 1e3);
        let seq = frame.seq();
        lost += frame.lag();
        // "Process" the frame: check every byte, and the header.
        let mismatched =
            if frame.len() == bytes { pattern::mismatches(&frame, seq) } else { bytes as u64 };
        let header_ok = frame.header()[..20] == frame_header(args, seq);
        if mismatched > 0 || !header_ok {
            bad_frames += 1;
            bad_bytes += mismatched;
        }
        frames += 1;
    }
    let secs = start.elapsed().as_secs_f64();
    latencies_us.sort_by(f64::total_cmp);
    let pct = |p: f64| latencies_us.get(((latencies_us.len() as f64 - 1.0) * p) as usize).copied();
    println!(
        "consumer {k} (pid {}): {frames} frames, {:.1} fps, {lost} dropped, {bad_frames} bad frames ({bad_bytes} bad bytes), publish->recv p50 {:.1} us p99 {:.1} us",
        std::process::id(),
        frames as f64 / secs,
        pct(0.5).unwrap_or(0.0),
        pct(0.99).unwrap_or(0.0),
    );
    if bad_frames == 0 && frames > 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
