// Run: cargo run --release --example pipeline -- [--consumers 3] [--seconds 5] [--fps 60]
//                                                  [--memory auto|host|cuda] [--external N]
//                                                  [--sharing legacy|vmm]
//
// The main job: one producer generates synthetic video frames (1920x1080 RGBA by default) into
// a ring and spawns N consumer processes. Each consumer checks every byte of every frame
// against the pattern of its sequence number. The producer prints a line per second with each
// consumer's rate, lag and drops, and everyone prints a summary at the end.
//
// With a GPU (the default where one is usable) the frames live in device memory: the producer
// writes each with a kernel, each consumer checks it with a kernel on its own stream, and no
// byte crosses PCIe. Without one it runs the same pipeline in host memory, and its first line
// says why. `--sharing vmm` shares the device memory by file descriptor instead of legacy IPC
// handles (docs/gpu.md, "Sharing modes"); it needs CUDA memory. How frames are written and
// checked, and the kernels' launches, are in examples/common/.

use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::{Parser, ValueEnum};
use gpuring::{
    monotonic_ns,
    tensor::{DType, TensorHeader},
    Consumer, Host, Memory, MemoryKind, Policy, Producer, ReadSlot, RecvError, StartAt,
};

mod common;
use common::Frames;

#[derive(Parser, Debug, Clone)]
#[command(about = "Synthetic video pipeline: 1 producer process, N consumer processes")]
struct Args {
    /// Consumer processes.
    #[arg(long, default_value_t = 3)]
    consumers: usize,
    /// Consumers started by someone else (for example examples/python/consumer_torch.py) to
    /// wait for, besides our own, before the first frame.
    #[arg(long, default_value_t = 0)]
    external: usize,
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
    /// Where frames live: a GPU when one is usable (auto), or host memory.
    #[arg(long, value_enum, default_value_t = MemoryArg::Auto)]
    memory: MemoryArg,
    /// How CUDA memory reaches the consumers: legacy IPC handles, or VMM (fds, uid-checked).
    #[arg(long, value_enum, default_value_t = SharingArg::Legacy)]
    sharing: SharingArg,
    /// Ring name (default: pipeline-PID).
    #[arg(long)]
    name: Option<String>,
    /// Internal: run as a consumer process.
    #[arg(long, hide = true)]
    role_consumer: Option<usize>,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum MemoryArg {
    Auto,
    Host,
    Cuda,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum SharingArg {
    Legacy,
    Vmm,
}

#[derive(ValueEnum, Clone, Copy, Debug)]
enum PolicyArg {
    Block,
    Overwrite,
}

/// Bytes of user header: the tensor header (32 bytes for 3 dimensions), then the frame number.
const HEADER_BYTES: u32 = 64;

/// User header of every frame: a tensor header (`uint8[height, width, 4]`, see
/// `gpuring::tensor`, so Python consumers get frames of the right shape), then the frame
/// number.
fn frame_header(args: &Args, seq: u64) -> [u8; 40] {
    let shape = [args.height as u64, args.width as u64, 4];
    let mut h = [0u8; 40];
    let used = TensorHeader::new(DType::U8, &shape).write(&mut h).expect("40 > 32 bytes");
    h[used..used + 8].copy_from_slice(&seq.to_le_bytes());
    h
}

fn main() -> ExitCode {
    // The library's lifecycle events (joins, leaves, dead peers, reclaims) on stderr, filtered
    // by RUST_LOG (for example RUST_LOG=gpuring=info).
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    match args.role_consumer {
        Some(k) => consumer(&args, k),
        None => producer(&args),
    }
}

fn frame_bytes(args: &Args) -> usize {
    args.width as usize * args.height as usize * 4
}

/// Runs the producer in the memory `--memory` asks for.
fn producer(args: &Args) -> ExitCode {
    // Why host memory, when the producer runs in it: printed on its first line.
    #[cfg(feature = "cuda")]
    let why_host = match (args.memory, gpuring::cuda::available()) {
        (MemoryArg::Cuda, _) | (MemoryArg::Auto, Ok(())) => {
            return producer_in::<gpuring::Cuda>(args, "");
        }
        (MemoryArg::Host, _) => "--memory host".to_string(),
        (MemoryArg::Auto, Err(why)) => format!("no usable CUDA GPU: {why}"),
    };
    #[cfg(not(feature = "cuda"))]
    let why_host = match args.memory {
        MemoryArg::Cuda => {
            eprintln!("pipeline: this build has no CUDA support (feature `cuda`)");
            return ExitCode::FAILURE;
        }
        MemoryArg::Host => "--memory host".to_string(),
        MemoryArg::Auto => "built without feature `cuda`".to_string(),
    };
    if args.sharing == SharingArg::Vmm {
        eprintln!(
            "pipeline: --sharing vmm shares CUDA memory; this run uses host memory ({why_host})"
        );
        return ExitCode::FAILURE;
    }
    producer_in::<Host>(args, &why_host)
}

/// The memory kind's name, as `--memory` spells it.
fn kind_name<M: Memory>() -> &'static str {
    match M::KIND {
        MemoryKind::Host => "host",
        MemoryKind::Cuda => "cuda",
    }
}

/// The producer, for memory kind `M`: writes each frame's pattern (a kernel on the slot's
/// stream in CUDA memory), publishes it, and reports once a second. `why_host` says why a
/// host-memory run is one.
fn producer_in<M: Timed>(args: &Args, why_host: &str) -> ExitCode {
    let name = args.name.clone().unwrap_or_else(|| format!("pipeline-{}", std::process::id()));
    let policy = match args.policy {
        PolicyArg::Block => Policy::Block,
        PolicyArg::Overwrite => Policy::Overwrite,
    };
    let bytes = frame_bytes(args);
    let builder = Producer::builder(&name)
        .capacity(args.capacity)
        .slot_size(bytes)
        .user_header_size(HEADER_BYTES)
        .policy(policy);
    #[cfg(feature = "cuda")]
    let builder = match args.sharing {
        SharingArg::Legacy => builder,
        SharingArg::Vmm => builder.sharing(gpuring::Sharing::Vmm(gpuring::PeerPolicy::SameUid)),
    };
    let made = builder
        .create_in::<M>()
        .map_err(|e| e.to_string())
        .and_then(|tx| Ok((M::writer(&tx).map_err(|e| e.to_string())?, tx)));
    let (writer, mut tx) = match made {
        Ok(made) => made,
        Err(e) => {
            eprintln!("pipeline: {e}");
            return ExitCode::FAILURE;
        }
    };
    let memory = kind_name::<M>();
    let sharing = match (M::KIND, args.sharing) {
        (MemoryKind::Host, _) => format!(" ({why_host})"),
        (_, SharingArg::Legacy) => " (legacy IPC sharing)".to_string(),
        (_, SharingArg::Vmm) => " (VMM sharing)".to_string(),
    };
    println!(
        "pipeline: ring '{name}', {}x{} RGBA ({:.1} MiB/frame), {} slots, {:?}, {memory} memory{sharing}, {} consumers",
        args.width,
        args.height,
        bytes as f64 / (1 << 20) as f64,
        args.capacity,
        policy,
        args.consumers
    );
    let children: Vec<Child> =
        match (0..args.consumers).map(|k| spawn_consumer(args, &name, k, memory)).collect() {
            Ok(children) => children,
            Err(e) => {
                eprintln!("pipeline: cannot start a consumer process: {e}");
                return ExitCode::FAILURE;
            }
        };
    let t0 = Instant::now();
    while tx.consumer_count() < args.consumers + args.external {
        // Others' consumers may be started by hand: give them longer.
        let patience = if args.external > 0 { 120 } else { 20 };
        if t0.elapsed() > Duration::from_secs(patience) {
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
    let mut last_received = vec![0u64; args.consumers + args.external];
    let mut seq = 0u64;
    while start.elapsed() < run_for {
        if let Some(p) = period {
            let due = start + p.mul_f64(seq as f64);
            let now = Instant::now();
            if due > now {
                std::thread::sleep(due - now);
            }
        }
        if let Err(e) = publish_frame(&mut tx, &writer, bytes, seq, &frame_header(args, seq)) {
            eprintln!("pipeline: publishing frame {seq}: {e}");
            return ExitCode::FAILURE;
        }
        seq += 1;
        if Instant::now() >= next_report {
            let secs = start.elapsed().as_secs_f64();
            let published = tx.published();
            let mut line =
                format!("t={secs:4.1}s  producer {:6.1} fps", (published - last_published) as f64);
            last_published = published;
            for (k, c) in tx.consumers().iter().enumerate() {
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
        match c.wait() {
            Ok(status) if status.success() => {}
            Ok(status) => {
                eprintln!("pipeline: consumer {k} failed: {status}");
                ok = false;
            }
            Err(e) => {
                eprintln!("pipeline: waiting for consumer {k}: {e}");
                ok = false;
            }
        }
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// Writes frame `seq` into a free slot and publishes it.
fn publish_frame<M: Timed>(
    tx: &mut Producer<M>,
    writer: &M::Writer,
    bytes: usize,
    seq: u64,
    header: &[u8],
) -> Result<(), String> {
    let mut slot = tx.acquire().map_err(|e| e.to_string())?;
    M::fill(writer, &mut slot, bytes, seq).map_err(|e| e.to_string())?;
    slot.publish(bytes, header).map_err(|e| e.to_string())?;
    Ok(())
}

fn spawn_consumer(args: &Args, name: &str, k: usize, memory: &str) -> std::io::Result<Child> {
    Command::new(std::env::current_exe()?)
        .args(["--name", name, "--role-consumer", &k.to_string(), "--memory", memory])
        .args(["--width", &args.width.to_string(), "--height", &args.height.to_string()])
        .stdin(Stdio::null())
        .spawn()
}

/// Runs consumer `k` in the memory its producer chose (passed as `--memory`).
fn consumer(args: &Args, k: usize) -> ExitCode {
    #[cfg(feature = "cuda")]
    if args.memory == MemoryArg::Cuda {
        return consumer_in::<gpuring::Cuda>(args, k);
    }
    consumer_in::<Host>(args, k)
}

/// Consumer `k`, for memory kind `M`: checks every byte of every frame (a kernel on the
/// consumer's stream in CUDA memory, which the ring made wait for the producer's kernel) and
/// its header, until the ring closes; then reports.
fn consumer_in<M: Timed>(args: &Args, k: usize) -> ExitCode {
    let name = args.name.as_deref().expect("--name");
    let rx = match Consumer::builder(name).start_at(StartAt::Next).open_in::<M>() {
        Ok(rx) => rx,
        Err(e) => {
            eprintln!("consumer {k}: {e}");
            return ExitCode::FAILURE;
        }
    };
    match check_frames(args, k, &rx) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("consumer {k}: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Receives and checks frames until the ring closes; then reports.
fn check_frames<M: Timed>(args: &Args, k: usize, rx: &Consumer<M>) -> Result<ExitCode, String> {
    let checker = M::checker(rx).map_err(|e| e.to_string())?;
    let bytes = frame_bytes(args);
    let latencies = Latencies::default();
    let mut stats = Stats::default();
    let start = Instant::now();
    loop {
        let frame = match rx.recv() {
            Ok(f) => f,
            Err(RecvError::Disconnected) => break,
            Err(e) => return Err(e.to_string()),
        };
        M::stamp(&frame, &latencies)?;
        stats.lost += frame.lag();
        let header_ok = frame.header()[..40] == frame_header(args, frame.seq());
        if frame.len() != bytes || !header_ok {
            stats.bad_frames += 1;
        } else {
            M::check(&checker, &frame).map_err(|e| e.to_string())?;
        }
        stats.frames += 1;
    }
    stats.bad_bytes = M::mismatches(&checker).map_err(|e| e.to_string())?;
    stats.latencies_us = std::mem::take(&mut *latencies.lock().unwrap_or_else(|p| p.into_inner()));
    Ok(stats.report(k, start.elapsed().as_secs_f64(), M::LATENCY))
}

/// Frame latencies in microseconds, from the publish to the moment the frame is ready to read.
type Latencies = Arc<Mutex<Vec<f64>>>;

/// How a memory kind's consumer times a frame.
trait Timed: Frames {
    /// What the latency measures.
    const LATENCY: &'static str;

    /// Adds `m`'s latency to `into`, now or once its stream has it.
    fn stamp(m: &ReadSlot<'_, Self>, into: &Latencies) -> Result<(), String>;
}

/// Host memory: a frame is ready when `recv` returns it.
impl Timed for Host {
    const LATENCY: &'static str = "publish->recv";

    fn stamp(m: &ReadSlot<'_, Host>, into: &Latencies) -> Result<(), String> {
        let us = monotonic_ns().saturating_sub(m.timestamp_ns()) as f64 / 1e3;
        into.lock().unwrap_or_else(|p| p.into_inner()).push(us);
        Ok(())
    }
}

/// CUDA memory: a frame is ready when the consumer's stream has it (a host callback queued
/// right after the wait that `recv` queued).
#[cfg(feature = "cuda")]
impl Timed for gpuring::Cuda {
    const LATENCY: &'static str = "publish->stream-ready";

    fn stamp(m: &ReadSlot<'_, gpuring::Cuda>, into: &Latencies) -> Result<(), String> {
        let (published, into) = (m.timestamp_ns(), into.clone());
        let stamp = move || {
            let us = monotonic_ns().saturating_sub(published) as f64 / 1e3;
            into.lock().unwrap_or_else(|p| p.into_inner()).push(us);
        };
        // SAFETY: the callback and what it captures (an Arc of a Mutex of numbers) make no
        // CUDA call.
        unsafe { m.stream().on_complete(stamp) }.map_err(|e| e.to_string())
    }
}

/// What a consumer counted.
#[derive(Default)]
struct Stats {
    frames: u64,
    lost: u64,
    bad_frames: u64,
    bad_bytes: u64,
    latencies_us: Vec<f64>,
}

impl Stats {
    fn report(mut self, k: usize, secs: f64, latency: &str) -> ExitCode {
        let (frames, lost, bad_frames, bad_bytes) =
            (self.frames, self.lost, self.bad_frames, self.bad_bytes);
        self.latencies_us.sort_by(f64::total_cmp);
        let l = &self.latencies_us;
        let pct = |p: f64| l.get(((l.len() as f64 - 1.0) * p) as usize).copied().unwrap_or(0.0);
        println!(
            "consumer {k} (pid {}): {frames} frames, {:.1} fps, {lost} dropped, {bad_frames} bad frames, {bad_bytes} bad bytes, {latency} p50 {:.1} us p99 {:.1} us",
            std::process::id(),
            frames as f64 / secs,
            pct(0.5),
            pct(0.99),
        );
        if bad_frames == 0 && bad_bytes == 0 && frames > 0 {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        }
    }
}
