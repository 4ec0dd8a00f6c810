// Run: cargo run --release --example pipeline -- [--consumers 3] [--seconds 5] [--fps 60]
//                                                  [--memory auto|host|cuda] [--external N]
//                                                  [--sharing legacy|vmm] [--fence auto|events|memory]
//                                                  [--name NAME] [--dir DIR]
//
// The main job: one producer generates synthetic video frames (1920x1080 RGBA by default) into
// a ring and spawns N consumer processes. Each consumer checks every byte of every frame
// against the pattern of its sequence number. The producer prints a line per second with each
// consumer's rate, lag and drops and the ring's reclaims of dead consumers, and everyone
// prints a summary at the end. SIGTERM or SIGINT (Ctrl-C) ends the run early and cleanly.
//
// With a GPU (the default where one is usable) the frames live in device memory: the producer
// writes each with a kernel, each consumer checks it with a kernel on its own stream, and no
// byte crosses PCIe. Without one it runs the same pipeline in host memory, and its first line
// says why. `--sharing vmm` shares the device memory by file descriptor instead of legacy IPC
// handles (docs/gpu.md, "Sharing modes"); it needs CUDA memory. How frames are written and
// checked, and the kernels' launches, are in examples/common/.
//
// One side per process, for containers (docker/compose.yaml runs these, a container each):
//
//   pipeline --role producer --name cam0 --external 2 --seconds 0
//   pipeline --role consumer --name cam0 [--async]
//
// `--role producer` creates the ring, spawns no consumer, waits for `--external` consumers
// started elsewhere and publishes until `--seconds` ends (0: until SIGTERM or SIGINT; then it
// closes the ring). `--role consumer` waits up to `--wait` seconds for the ring to appear,
// checks every frame as the spawned consumers do (the frame's shape comes from its tensor
// header), prints a line per second, and exits with a code that says how the stream ended:
//
//   0  the producer closed the ring, or SIGTERM/SIGINT stopped this consumer; every byte right
//   3  the producer died (killed, crashed): the stream was cut; every byte received was right
//   4  the producer's GPU context was lost (docs/gpu.md): the stream was cut, likewise
//  75  this process's GPU context was lost: restart it (every side exits so; docs/gpu.md)
//   1  a bad byte or frame, no frame before the ring closed, or an error (2: bad arguments)
//
// `--async` receives with `recv_async` on a current-thread tokio runtime (build with
// `--features tokio`). Every side finds the ring in `--dir`, else in `GPURING_DIR`, else in
// /dev/shm: containers share a tmpfs volume there (docs/containers.md).

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::{Parser, ValueEnum};
use gpuring::{
    inspect, monotonic_ns,
    tensor::{DType, TensorHeader},
    AcquireTimeoutError, Consumer, Ended, Host, Memory, MemoryKind, OpenError, Policy, Producer,
    ReadSlot, RecvTimeoutError, StartAt,
};

mod common;
use common::{failure, stop, Frames};

#[derive(Parser, Debug, Clone)]
#[command(
    about = "Synthetic video pipeline: 1 producer process, N consumer processes",
    after_help = "Exit codes of a consumer (--role consumer): 0 the producer closed the ring, \
                  or SIGTERM/SIGINT stopped it; 3 the producer died (the stream was cut); 4 the \
                  producer's GPU context was lost; 75 this process's GPU context was lost \
                  (every side); 1 a \
                  bad frame or byte, no frame before the ring closed, or an error; 2 bad \
                  arguments."
)]
struct Args {
    /// Consumer processes to spawn (none with `--role producer`).
    #[arg(long, default_value_t = 3)]
    consumers: usize,
    /// Consumers started by someone else (another container, or for example
    /// examples/python/consumer_torch.py) to wait for, besides our own, before the first frame.
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
    /// How long to publish, in seconds (0: until SIGTERM or SIGINT).
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
    /// Slots in the ring.
    #[arg(long, default_value_t = 8)]
    capacity: u32,
    /// What the producer does when a consumer falls a ring behind.
    #[arg(long, value_enum, default_value_t = PolicyArg::Block)]
    policy: PolicyArg,
    /// Where frames live: a GPU when one is usable (auto), or host memory. A `--role consumer`
    /// with `auto` follows the ring it finds.
    #[arg(long, value_enum, default_value_t = MemoryArg::Auto)]
    memory: MemoryArg,
    /// How CUDA memory reaches the consumers: legacy IPC handles, or VMM (fds, uid-checked).
    #[arg(long, value_enum, default_value_t = SharingArg::Legacy)]
    sharing: SharingArg,
    /// How CUDA consumers wait for frames and the producer for releases: `auto` (memory words
    /// where the GPU can use 64-bit stream memory operations, else events), IPC `events`, or
    /// `memory` words in the ring's segment (legacy sharing across containers needs memory
    /// words: an IPC event does not open where the consumer has its own /dev/shm).
    #[arg(long, value_enum, default_value_t = FenceArg::Auto)]
    fence: FenceArg,
    /// Ring name (default: pipeline-PID; required with `--role`).
    #[arg(long)]
    name: Option<String>,
    /// Ring directory (default: GPURING_DIR, else /dev/shm): a tmpfs directory that every side
    /// sees, such as a volume shared by containers.
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Run one side only (a container each): `producer` (creates the ring, spawns no
    /// consumer, waits for `--external` ones) or `consumer` (waits for the ring, checks every
    /// frame, prints a line per second; exit codes below).
    #[arg(long, value_enum)]
    role: Option<RoleArg>,
    /// Consumer: receive with `recv_async` on a current-thread tokio runtime (feature `tokio`).
    #[arg(long = "async")]
    use_async: bool,
    /// Seconds the producer waits for its consumers (default 20; 120 with `--external` or a
    /// role), and a `--role consumer` for the ring to appear (default 120). 0: no limit.
    #[arg(long)]
    wait: Option<u64>,
    /// Internal: run as a consumer process the producer spawned.
    #[arg(long, hide = true)]
    role_consumer: Option<usize>,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum RoleArg {
    Producer,
    Consumer,
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

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum FenceArg {
    Auto,
    Events,
    Memory,
}

#[derive(ValueEnum, Clone, Copy, Debug)]
enum PolicyArg {
    Block,
    Overwrite,
}

/// Bytes of user header: the tensor header (32 bytes for 3 dimensions), then the frame number.
const HEADER_BYTES: u32 = 64;

/// A `--role consumer`'s exit code when the producer died (see the top of this file).
const EXIT_PRODUCER_DIED: u8 = 3;
/// A `--role consumer`'s exit code when the producer's GPU context was lost.
const EXIT_PRODUCER_LOST: u8 = 4;

/// User header of every frame: a tensor header (`uint8[height, width, 4]`, see
/// `gpuring::tensor`, so Python consumers get frames of the right shape), then the frame
/// number.
fn frame_header(height: u32, width: u32, seq: u64) -> [u8; 40] {
    let shape = [height as u64, width as u64, 4];
    let mut h = [0u8; 40];
    let used = TensorHeader::new(DType::U8, &shape).write(&mut h).expect("40 > 32 bytes");
    h[used..used + 8].copy_from_slice(&seq.to_le_bytes());
    h
}

/// The height and width a frame's user header announces, if it is a frame's header.
fn frame_shape(header: &[u8]) -> Option<(u32, u32)> {
    let t = TensorHeader::read(header).ok()??;
    match t.shape[..] {
        [h, w, 4] if t.dtype == DType::U8 => Some((h.try_into().ok()?, w.try_into().ok()?)),
        _ => None,
    }
}

fn main() -> ExitCode {
    // The library's lifecycle events (joins, leaves, dead peers, reclaims) on stderr, filtered
    // by RUST_LOG (for example RUST_LOG=gpuring=info).
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    if args.role.is_some() && args.name.is_none() {
        eprintln!("pipeline: --role needs --name, the ring's name on every side");
        return ExitCode::from(2);
    }
    if args.use_async && !cfg!(feature = "tokio") {
        eprintln!("pipeline: --async needs feature `tokio` (--features tokio)");
        return ExitCode::from(2);
    }
    if let Err(e) = stop::install() {
        eprintln!("pipeline: cannot handle SIGTERM and SIGINT: {e}");
        return failure();
    }
    let code = match (args.role_consumer, args.role) {
        (Some(k), _) => consumer(&args, &format!("consumer {k}"), false),
        (None, Some(RoleArg::Consumer)) => consumer(&args, "consumer", true),
        (None, Some(RoleArg::Producer) | None) => producer(&args),
    };
    // Every ring is dropped by now; no kernel of ours may still run when the process exits
    // (under MPS that would fault the GPU's other processes).
    #[cfg(feature = "cuda")]
    let _ = gpuring::cuda::finish_gpu_work();
    code
}

fn frame_bytes(args: &Args) -> usize {
    args.width as usize * args.height as usize * 4
}

/// The ring's name: `--name`, else one of this process's own.
fn ring_name(args: &Args) -> String {
    args.name.clone().unwrap_or_else(|| format!("pipeline-{}", std::process::id()))
}

/// How long to wait for the other side: `--wait` (0: no limit), else `default` seconds.
fn patience(args: &Args, default: u64) -> Duration {
    match args.wait.unwrap_or(default) {
        0 => Duration::MAX,
        secs => Duration::from_secs(secs),
    }
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
            return failure();
        }
        MemoryArg::Host => "--memory host".to_string(),
        MemoryArg::Auto => "built without feature `cuda`".to_string(),
    };
    for (asked, what) in [
        (args.sharing == SharingArg::Vmm, "--sharing vmm shares"),
        (args.fence == FenceArg::Memory, "--fence memory fences"),
    ] {
        if asked {
            eprintln!("pipeline: {what} CUDA memory; this run uses host memory ({why_host})");
            return failure();
        }
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
    let name = ring_name(args);
    let policy = match args.policy {
        PolicyArg::Block => Policy::Block,
        PolicyArg::Overwrite => Policy::Overwrite,
    };
    let bytes = frame_bytes(args);
    let mut builder = Producer::builder(&name)
        .capacity(args.capacity)
        .slot_size(bytes)
        .user_header_size(HEADER_BYTES)
        .policy(policy);
    if let Some(dir) = &args.dir {
        builder = builder.dir(dir);
    }
    #[cfg(feature = "cuda")]
    let builder = match args.sharing {
        SharingArg::Legacy => builder,
        SharingArg::Vmm => builder.sharing(gpuring::Sharing::Vmm(gpuring::PeerPolicy::SameUid)),
    };
    #[cfg(feature = "cuda")]
    let builder = builder.fence(match args.fence {
        FenceArg::Auto => gpuring::Fence::Auto,
        FenceArg::Events => gpuring::Fence::Events,
        FenceArg::Memory => gpuring::Fence::Memory,
    });
    let made = builder
        .create_in::<M>()
        .map_err(|e| e.to_string())
        .and_then(|tx| Ok((M::writer(&tx).map_err(|e| e.to_string())?, tx)));
    let (writer, mut tx) = match made {
        Ok(made) => made,
        Err(e) => {
            eprintln!("pipeline: {e}");
            return failure();
        }
    };
    let memory = kind_name::<M>();
    let sharing = match (M::KIND, args.sharing) {
        (MemoryKind::Host, _) => format!(" ({why_host})"),
        (_, SharingArg::Legacy) => " (legacy IPC sharing)".to_string(),
        (_, SharingArg::Vmm) => " (VMM sharing)".to_string(),
    };
    let own = if args.role == Some(RoleArg::Producer) { 0 } else { args.consumers };
    let external = match args.external {
        0 => String::new(),
        n => format!(", waiting for {n} started elsewhere"),
    };
    println!(
        "pipeline: ring '{name}', {}x{} RGBA ({:.1} MiB/frame), {} slots, {:?}, {memory} memory{sharing}, {own} consumers{external}",
        args.width,
        args.height,
        bytes as f64 / (1 << 20) as f64,
        args.capacity,
        policy,
    );
    let children: Vec<Child> =
        match (0..own).map(|k| spawn_consumer(args, &name, k, memory)).collect() {
            Ok(children) => children,
            Err(e) => {
                eprintln!("pipeline: cannot start a consumer process: {e}");
                return failure();
            }
        };
    // Others' consumers may be started by hand, or be containers still starting: longer.
    let wait = patience(args, if args.external > 0 || args.role.is_some() { 120 } else { 20 });
    let t0 = Instant::now();
    while tx.consumer_count() < own + args.external {
        if t0.elapsed() > wait || stop::requested() {
            eprintln!("pipeline: consumers did not join");
            return failure();
        }
        std::thread::sleep(Duration::from_millis(2));
    }

    let start = Instant::now();
    let run_for = (args.seconds > 0.0).then(|| Duration::from_secs_f64(args.seconds));
    let period = (args.fps > 0).then(|| Duration::from_secs_f64(1.0 / args.fps as f64));
    let mut next_report = start + Duration::from_secs(1);
    let mut last_published = 0u64;
    // Messages each consumer had received at the last report, by consumer table index.
    let mut last_received = HashMap::new();
    let mut seq = 0u64;
    while !stop::requested() && run_for.is_none_or(|d| start.elapsed() < d) {
        if Instant::now() >= next_report {
            let secs = start.elapsed().as_secs_f64();
            let published = tx.published();
            let mut line = format!(
                "t={secs:5.1}s  producer {:6.1} fps  reclaims {}",
                (published - last_published) as f64,
                reclaims(args, &name)
            );
            last_published = published;
            for c in tx.consumers() {
                let got = c.received - last_received.insert(c.index, c.received).unwrap_or(0);
                line += &format!(" | c{} {got:5} fps lag {:2} drops {}", c.index, c.lag, c.lost);
            }
            println!("{line}");
            next_report += Duration::from_secs(1);
        }
        if let Some(p) = period {
            let due = start + p.mul_f64(seq as f64);
            let now = Instant::now();
            if due > now {
                std::thread::sleep((due - now).min(stop::SLICE));
                continue;
            }
        }
        match publish_frame(
            &mut tx,
            &writer,
            bytes,
            seq,
            &frame_header(args.height, args.width, seq),
        ) {
            Ok(true) => seq += 1,
            Ok(false) => {} // no free slot yet: report, look at the clock and the signals
            Err(e) => {
                eprintln!("pipeline: publishing frame {seq}: {e}");
                return failure();
            }
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
        failure()
    }
}

/// The dead consumers the ring has reclaimed so far (`gpuring stat` shows the same), or "?".
fn reclaims(args: &Args, name: &str) -> String {
    let status = match &args.dir {
        Some(dir) => inspect::status_in(dir, name),
        None => inspect::status(name),
    };
    status.map_or_else(|_| "?".to_string(), |s| s.reclaims.to_string())
}

/// Writes frame `seq` into a free slot and publishes it: false if no slot came free within
/// [`stop::SLICE`].
fn publish_frame<M: Timed>(
    tx: &mut Producer<M>,
    writer: &M::Writer,
    bytes: usize,
    seq: u64,
    header: &[u8],
) -> Result<bool, String> {
    let mut slot = match tx.acquire_timeout(stop::SLICE) {
        Ok(slot) => slot,
        Err(AcquireTimeoutError::Timeout) => return Ok(false),
        Err(e) => return Err(e.to_string()),
    };
    M::fill(writer, &mut slot, bytes, seq).map_err(|e| e.to_string())?;
    slot.publish(bytes, header).map_err(|e| e.to_string())?;
    Ok(true)
}

fn spawn_consumer(args: &Args, name: &str, k: usize, memory: &str) -> std::io::Result<Child> {
    let mut cmd = Command::new(std::env::current_exe()?);
    cmd.args(["--name", name, "--role-consumer", &k.to_string(), "--memory", memory]);
    if let Some(dir) = &args.dir {
        cmd.arg("--dir").arg(dir);
    }
    cmd.stdin(Stdio::null()).spawn()
}

/// A consumer, named `who` in what it prints, with a line per second if `progress`: opens the
/// ring in the memory `--memory` names (`auto`: the ring's), checks frames until the stream
/// ends, and reports.
fn consumer(args: &Args, who: &str, progress: bool) -> ExitCode {
    #[cfg(feature = "cuda")]
    if args.memory == MemoryArg::Cuda {
        return consume::<gpuring::Cuda>(args, who, progress, open(args));
    }
    let rx = open::<Host>(args);
    #[cfg(feature = "cuda")]
    if args.memory == MemoryArg::Auto
        && rx
            .as_ref()
            .is_err_and(|e| matches!(e.kind(), gpuring::OpenErrorKind::WrongMemory { .. }))
    {
        return consume::<gpuring::Cuda>(args, who, progress, open(args));
    }
    consume::<Host>(args, who, progress, rx)
}

/// Opens the ring in memory kind `M`, waiting for it to appear and be ready (`--wait`); the
/// consumer receives what is published from then on.
fn open<M: Memory>(args: &Args) -> Result<Consumer<M>, OpenError> {
    let mut b = Consumer::builder(&ring_name(args)).start_at(StartAt::Next);
    if let Some(dir) = &args.dir {
        b = b.dir(dir);
    }
    b.open_in_timeout::<M>(patience(args, 120))
}

/// Checks the frames of `rx` until the stream ends (or a signal stops it), and reports.
fn consume<M: Timed>(
    args: &Args,
    who: &str,
    progress: bool,
    rx: Result<Consumer<M>, OpenError>,
) -> ExitCode {
    let run = rx.map_err(|e| e.to_string()).and_then(|rx| {
        let mut check = Check::new(&rx, who, progress)?;
        let end = if args.use_async {
            receive_async(&rx, &mut check)?
        } else {
            receive(&rx, &mut check)?
        };
        check.finish(end)
    });
    run.unwrap_or_else(|e| {
        eprintln!("{who}: {e}");
        failure()
    })
}

/// How a consumer's stream ended.
#[derive(Clone, Copy, Debug)]
enum End {
    /// The ring ended: closed, or its producer died.
    Ring(Ended),
    /// SIGTERM or SIGINT.
    Stopped,
}

/// How the ring of `rx`, which said `Disconnected`, ended.
fn ended<M: Memory>(rx: &Consumer<M>) -> Result<End, String> {
    rx.ended().map(End::Ring).ok_or_else(|| "disconnected, yet the ring has not ended".into())
}

/// Receives with `recv_timeout`, waking at least every [`stop::SLICE`] for the signals and the
/// line per second.
fn receive<M: Timed>(rx: &Consumer<M>, check: &mut Check<'_, M>) -> Result<End, String> {
    loop {
        if stop::requested() {
            return Ok(End::Stopped);
        }
        match rx.recv_timeout(check.wait()) {
            Ok(frame) => check.frame(&frame)?,
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return ended(rx),
            Err(e) => return Err(e.to_string()),
        }
        check.tick()?;
    }
}

/// Receives with `recv_async` on a current-thread tokio runtime, each wait bounded like
/// [`receive`]'s (`recv_async` is cancel-safe). Says at the end how many frames came after
/// the task had parked, which only a wake of the runtime (the doorbell) ends.
#[cfg(feature = "tokio")]
fn receive_async<M: Timed>(rx: &Consumer<M>, check: &mut Check<'_, M>) -> Result<End, String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("tokio runtime: {e}"))?;
    let mut parked = 0u64;
    let end = runtime.block_on(async {
        loop {
            if stop::requested() {
                return Ok(End::Stopped);
            }
            match tokio::time::timeout(check.wait(), pending_once(rx.recv_async())).await {
                Ok((Ok(frame), was_parked)) => {
                    parked += u64::from(was_parked);
                    check.frame(&frame)?;
                }
                Ok((Err(gpuring::RecvError::Disconnected), _)) => return ended(rx),
                Ok((Err(e), _)) => return Err(e.to_string()),
                Err(_elapsed) => {}
            }
            check.tick()?;
        }
    })?;
    println!(
        "{}: recv_async: {} frames, {parked} of them after the task parked{}",
        check.who,
        check.frames,
        async_wakes()
    );
    Ok(end)
}

#[cfg(not(feature = "tokio"))]
fn receive_async<M: Timed>(_: &Consumer<M>, _: &mut Check<'_, M>) -> Result<End, String> {
    Err("--async needs feature `tokio`".into())
}

/// Awaits `f`, and says whether it returned `Pending` first (its task parked until a wake).
#[cfg(feature = "tokio")]
async fn pending_once<F: std::future::Future>(f: F) -> (F::Output, bool) {
    let mut f = std::pin::pin!(f);
    let mut pending = false;
    let out = std::future::poll_fn(|cx| {
        let poll = f.as_mut().poll(cx);
        pending |= poll.is_pending();
        poll
    })
    .await;
    (out, pending)
}

/// What a consumer checks and counts, and its line per second.
struct Check<'w, M: Timed> {
    /// How it is named in what it prints.
    who: &'w str,
    /// Whether it prints a line per second.
    progress: bool,
    checker: M::Checker,
    /// The frames' height and width, from the first frame's tensor header.
    shape: Option<(u32, u32)>,
    latencies: Latencies,
    frames: u64,
    lost: u64,
    bad_frames: u64,
    start: Instant,
    next_line: Instant,
    frames_at_last_line: u64,
}

impl<'w, M: Timed> Check<'w, M> {
    fn new(rx: &Consumer<M>, who: &'w str, progress: bool) -> Result<Self, String> {
        let start = Instant::now();
        Ok(Check {
            who,
            progress,
            checker: M::checker(rx).map_err(|e| e.to_string())?,
            shape: None,
            latencies: Latencies::default(),
            frames: 0,
            lost: 0,
            bad_frames: 0,
            start,
            next_line: start + Duration::from_secs(1),
            frames_at_last_line: 0,
        })
    }

    /// How long the next receive may wait: until the next line is due, and at most
    /// [`stop::SLICE`].
    fn wait(&self) -> Duration {
        match self.progress {
            true => self.next_line.saturating_duration_since(Instant::now()).min(stop::SLICE),
            false => stop::SLICE,
        }
    }

    /// Checks a frame: its header (shape and sequence number), its length, and every byte
    /// (a kernel on its stream in CUDA memory, queued before its release).
    fn frame(&mut self, frame: &ReadSlot<'_, M>) -> Result<(), String> {
        M::stamp(frame, &self.latencies)?;
        self.frames += 1;
        self.lost += frame.lag();
        if self.shape.is_none() {
            self.shape = frame_shape(frame.header());
        }
        let right = self.shape.is_some_and(|(h, w)| {
            frame.len() == h as usize * w as usize * 4
                && frame.header().get(..40) == Some(&frame_header(h, w, frame.seq())[..])
        });
        match right {
            true => M::check(&self.checker, frame).map_err(|e| e.to_string()),
            false => {
                self.bad_frames += 1;
                Ok(())
            }
        }
    }

    /// Prints the line per second, if one is due.
    fn tick(&mut self) -> Result<(), String> {
        let now = Instant::now();
        if !self.progress || now < self.next_line {
            return Ok(());
        }
        let bad_bytes = M::mismatches(&self.checker).map_err(|e| e.to_string())?;
        println!(
            "{}: t={:5.1}s  {} frames (+{}), {} dropped, {} bad frames, {bad_bytes} bad bytes",
            self.who,
            self.start.elapsed().as_secs_f64(),
            self.frames,
            self.frames - self.frames_at_last_line,
            self.lost,
            self.bad_frames,
        );
        self.frames_at_last_line = self.frames;
        while self.next_line <= now {
            self.next_line += Duration::from_secs(1);
        }
        Ok(())
    }

    /// Prints the summary and how the stream ended; the exit code (see the top of the file).
    fn finish(self, end: End) -> Result<ExitCode, String> {
        let (who, frames, lost, bad_frames) = (self.who, self.frames, self.lost, self.bad_frames);
        let bad_bytes = M::mismatches(&self.checker).map_err(|e| e.to_string())?;
        let mut l = std::mem::take(&mut *self.latencies.lock().unwrap_or_else(|p| p.into_inner()));
        l.sort_by(f64::total_cmp);
        let pct = |p: f64| l.get(((l.len() as f64 - 1.0) * p) as usize).copied().unwrap_or(0.0);
        println!(
            "{who} (pid {}): {frames} frames, {:.1} fps, {lost} dropped, {bad_frames} bad frames, {bad_bytes} bad bytes, {} p50 {:.1} us p99 {:.1} us",
            std::process::id(),
            frames as f64 / self.start.elapsed().as_secs_f64(),
            M::LATENCY,
            pct(0.5),
            pct(0.99),
        );
        let how = match end {
            End::Ring(e) => format!("{} ({e})", e.name()),
            End::Stopped => "stopped (SIGTERM or SIGINT)".to_string(),
        };
        println!("{who}: ended: {how}");
        Ok(match end {
            _ if bad_frames > 0 || bad_bytes > 0 => failure(),
            End::Ring(Ended::Died) => ExitCode::from(EXIT_PRODUCER_DIED),
            End::Ring(Ended::ContextLost) => ExitCode::from(EXIT_PRODUCER_LOST),
            End::Ring(Ended::Closed) if frames == 0 => failure(),
            End::Ring(Ended::Closed) | End::Stopped => ExitCode::SUCCESS,
        })
    }
}

/// How this process's async waits that found a frame were woken: by the doorbell (the
/// producer's knock), or by the timer that bounds each wait so that liveness is still
/// checked. Only a build with the test support (`--features test-support`, which `cli`
/// brings) counts them.
#[cfg(all(feature = "tokio", feature = "test-support"))]
fn async_wakes() -> String {
    let w = gpuring::testing::async_wakes();
    format!("; woken {} times by the doorbell, {} by the timer", w.doorbell, w.timer)
}

#[cfg(all(feature = "tokio", not(feature = "test-support")))]
fn async_wakes() -> String {
    String::new()
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
