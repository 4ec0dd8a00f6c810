//! `gpuring bench`: a self-contained 1→N run. This process produces; each consumer is this
//! binary again (`gpuring bench-consumer`, hidden), which prints one JSON line of results.
//!
//! One generic run per memory kind (`gpuring::testing::payload`): host memory writes each
//! frame's test pattern on the CPU and each consumer checks every byte on the CPU; CUDA memory
//! does both with kernels, a consumer's on its stream. Latency is publish → `recv` returning
//! (CLOCK_MONOTONIC, CPU side), not the GPU's.
//!
//! With `--slow-hold-ms`, it runs twice on fresh rings: first the fast consumers alone, then
//! with one more consumer that holds each message that long (an inference process reading a
//! frame in place), and reports how the producer's and the fast consumers' rates compare.

use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use gpuring::testing::payload::Payload;
use gpuring::StartAt;

use crate::cli::{parse_mode, parse_policy};
use crate::size::parse_size;
use gpuring::{monotonic_ns, Consumer, Host, Mode, Policy, Producer, RecvError};
use serde::{Deserialize, Serialize};

/// What a consumer process reports.
#[derive(Serialize, Deserialize)]
pub struct ConsumerResult {
    frames: u64,
    seconds: f64,
    lost: u64,
    p50_ns: u64,
    p99_ns: u64,
    /// Bytes that differed from the producer's pattern (CUDA: checked by a kernel).
    bad_bytes: u64,
    /// Messages whose sequence number did not follow from the previous one and the loss it
    /// reported (received + lost must be every message published since it joined).
    accounting_errors: u64,
}

/// One run, as `gpuring bench` prints it with `--json`.
#[derive(Serialize)]
struct BenchResult {
    memory: &'static str,
    /// How CUDA memory was shared: "legacy" or "vmm" ("legacy" for host memory, which shares
    /// the segment itself).
    sharing: String,
    /// How the CUDA ring's GPU work was ordered across processes, as its segment says: "events"
    /// or "memory" (always "memory" with VMM sharing; what `--fence auto` picked); null for
    /// host memory, which has no GPU fences.
    fence: Option<&'static str>,
    policy: &'static str,
    /// The consumers' delivery mode.
    mode: &'static str,
    capacity: u32,
    spares: u32,
    consumers: usize,
    /// How long the slow consumer (the last one) holds each message, in ms; 0: none.
    slow_hold_ms: u64,
    frame_bytes: usize,
    seconds: f64,
    producer_fps: f64,
    consumer_fps: Vec<f64>,
    lost: Vec<u64>,
    p50_ns: Vec<u64>,
    p99_ns: Vec<u64>,
    bad_bytes: u64,
    accounting_errors: u64,
}

/// What `--slow-hold-ms` prints with `--json`: both runs, and the ratios.
#[derive(Serialize)]
struct SlowResult {
    without_slow: BenchResult,
    with_slow: BenchResult,
    /// Producer frames/s with the slow consumer / without it.
    producer_ratio: f64,
    /// The fast consumers' mean frames/s with the slow consumer / without it.
    fast_consumer_ratio: f64,
}

/// The options of `gpuring bench`.
#[derive(clap::Args)]
pub struct Options {
    /// Where the slots live: host, cuda, or auto (cuda if a GPU is usable).
    #[arg(long, default_value = "auto")]
    pub memory: String,
    /// How CUDA memory reaches the consumers: legacy (IPC handles) or vmm (file descriptors,
    /// uid-checked; see docs/gpu.md, "Sharing modes").
    #[arg(long, default_value = "legacy", value_parser = ["legacy", "vmm"])]
    pub sharing: String,
    /// How CUDA rings order GPU work across processes: auto (memory where the device can use
    /// 64-bit stream memory operations, else events), events (interprocess CUDA events) or
    /// memory (sequence words in the ring's segment; works for consumers in containers with
    /// their own /dev/shm, see docs/containers.md). VMM sharing always fences with memory.
    #[arg(long, default_value = "auto", value_parser = ["auto", "events", "memory"])]
    pub fence: String,
    /// Consumer processes.
    #[arg(long, default_value_t = 2)]
    pub consumers: usize,
    /// Frame size in bytes (K and M suffixes: KiB, MiB).
    #[arg(long, default_value = "64K", value_parser = parse_size)]
    pub size: usize,
    /// Measured seconds (after 0.2 s of warm-up).
    #[arg(long, default_value_t = 2.0)]
    pub seconds: f64,
    /// Slots in the ring.
    #[arg(long, default_value_t = 16)]
    pub capacity: u32,
    /// Spare buffers (see `ProducerBuilder::spare_buffers`).
    #[arg(long, default_value_t = 8)]
    pub spares: u32,
    /// The ring's policy: block (consumers default to lossless) or overwrite (to queue).
    #[arg(long, default_value = "block", value_parser = parse_policy)]
    pub policy: Policy,
    /// The consumers' delivery mode: lossless, queue or latest (default: the policy's).
    #[arg(long, value_parser = parse_mode)]
    pub mode: Option<Mode>,
    /// Add one slow consumer that holds each message this long (ms) while it "works", and
    /// run the bench first without it: the report compares the producer's and the other
    /// consumers' rates with and without it.
    #[arg(long, default_value_t = 0)]
    pub slow_hold_ms: u64,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

const WARMUP: Duration = Duration::from_millis(200);

fn use_cuda(memory: &str) -> Result<bool, String> {
    match memory {
        "host" => Ok(false),
        #[cfg(feature = "cuda")]
        "cuda" => Ok(true),
        #[cfg(feature = "cuda")]
        "auto" => Ok(gpuring::cuda::driver::available().is_ok()),
        #[cfg(not(feature = "cuda"))]
        "auto" => Ok(false),
        other => Err(format!("--memory {other}: expected host, cuda or auto")),
    }
}

fn spawn(name: &str, memory: &str, hold: Duration, mode: Mode) -> Result<Child, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    Command::new(exe)
        .args(["bench-consumer", name, "--memory", memory])
        .args(["--hold-ms", &hold.as_millis().to_string(), "--mode", mode.name()])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("starting a consumer: {e}"))
}

fn collect(mut child: Child) -> Result<ConsumerResult, String> {
    let mut out = String::new();
    child.stdout.take().expect("piped").read_to_string(&mut out).map_err(|e| e.to_string())?;
    let status = child.wait().map_err(|e| e.to_string())?;
    if !status.success() {
        return Err(format!("a consumer failed ({status})"));
    }
    serde_json::from_str(out.trim()).map_err(|e| format!("a consumer's result: {e}"))
}

/// Runs the bench and prints its result; with a `slow_hold`, twice (see the module docs).
pub fn run(o: &Options) -> Result<(), String> {
    let slow_hold = Duration::from_millis(o.slow_hold_ms);
    if o.consumers == 0 || o.size < 16 || o.seconds <= 0.0 || o.capacity == 0 {
        return Err("need --consumers >= 1, --size >= 16, --seconds > 0, --capacity >= 1".into());
    }
    #[cfg(feature = "cuda")]
    if use_cuda(&o.memory)? {
        return run_all::<gpuring::Cuda>(o, "cuda", slow_hold);
    }
    run_all::<Host>(o, "host", slow_hold)
}

/// Every run the options ask for, in memory kind `M`, and the report.
fn run_all<M: Payload>(
    o: &Options,
    memory: &'static str,
    slow_hold: Duration,
) -> Result<(), String> {
    if slow_hold.is_zero() {
        let r = run_in::<M>(o, memory, None)?;
        if o.json {
            println!("{}", serde_json::to_string_pretty(&r).map_err(|e| e.to_string())?);
        } else {
            print(&r);
        }
        return check(&r);
    }
    let without_slow = run_in::<M>(o, memory, None)?;
    let with_slow = run_in::<M>(o, memory, Some(slow_hold))?;
    let fast =
        |r: &BenchResult| r.consumer_fps[..o.consumers].iter().sum::<f64>() / o.consumers as f64;
    let s = SlowResult {
        producer_ratio: with_slow.producer_fps / without_slow.producer_fps.max(1e-9),
        fast_consumer_ratio: fast(&with_slow) / fast(&without_slow).max(1e-9),
        without_slow,
        with_slow,
    };
    if o.json {
        println!("{}", serde_json::to_string_pretty(&s).map_err(|e| e.to_string())?);
    } else {
        print(&s.without_slow);
        print(&s.with_slow);
        println!(
            "with the slow consumer / without: producer {:.2}x, fast consumers {:.2}x",
            s.producer_ratio, s.fast_consumer_ratio
        );
    }
    check(&s.without_slow)?;
    check(&s.with_slow)
}

/// One run in memory kind `M` (`memory` names it for the consumers and the report), with one
/// more consumer holding each message for `slow_hold` if given.
fn run_in<M: Payload>(
    o: &Options,
    memory: &'static str,
    slow_hold: Option<Duration>,
) -> Result<BenchResult, String> {
    let name = format!("gpuring-bench-{}", std::process::id());
    let builder = Producer::builder(&name)
        .capacity(o.capacity)
        .spare_buffers(o.spares)
        .policy(o.policy)
        .slot_size(o.size)
        .user_header_size(8);
    if memory == "host" && o.sharing != "legacy" {
        return Err("--sharing vmm shares CUDA memory: use --memory cuda".into());
    }
    if memory == "host" && o.fence == "memory" {
        return Err("--fence memory fences CUDA work: use --memory cuda".into());
    }
    #[cfg(feature = "cuda")]
    let builder =
        builder.sharing(gpuring::Sharing::from_name(&o.sharing).expect("checked by clap"));
    #[cfg(feature = "cuda")]
    let builder = builder.fence(gpuring::Fence::from_name(&o.fence).expect("checked by clap"));
    let err = |e: gpuring::CreateError| format!("creating the bench ring: {e}");
    let mut tx = builder.create_in::<M>().map_err(err)?;
    // The fence in use, as the segment says (what `auto` picked).
    let fence = gpuring::inspect::status(&name).ok().and_then(|s| s.cuda).map(|c| c.fence);
    let w = M::writer(&tx).map_err(|e| format!("preparing the pattern writer: {e}"))?;
    // Publishes message `seq` (the test pattern, `len` bytes), `phase` in the user header.
    let publish = |tx: &mut Producer<M>, seq: u64, phase: u8| -> Result<(), String> {
        let mut slot = tx.acquire().map_err(|e| e.to_string())?;
        M::fill(&w, &mut slot, o.size, seq).map_err(|e| e.to_string())?;
        slot.publish(o.size, &[phase, 0, 0, 0, 0, 0, 0, 0]).map_err(|e| e.to_string())?;
        Ok(())
    };
    let mode = o.mode.unwrap_or(o.policy.default_mode());
    let holds = (0..o.consumers).map(|_| Duration::ZERO).chain(slow_hold);
    let children = holds.map(|h| spawn(&name, memory, h, mode)).collect::<Result<Vec<_>, _>>()?;
    let consumers = children.len();
    let t = Instant::now();
    while tx.consumer_count() < consumers {
        if t.elapsed() > Duration::from_secs(30) {
            return Err("the consumers did not join within 30 s".into());
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    let warm = Instant::now();
    let mut seq = 0u64;
    while warm.elapsed() < WARMUP {
        publish(&mut tx, seq, 0)?;
        seq += 1;
    }
    let t0 = Instant::now();
    let mut frames = 0u64;
    while t0.elapsed().as_secs_f64() < o.seconds {
        publish(&mut tx, seq, 1)?;
        seq += 1;
        frames += 1;
    }
    let producer_fps = frames as f64 / t0.elapsed().as_secs_f64();
    drop(tx);
    let results = children.into_iter().map(collect).collect::<Result<Vec<_>, _>>()?;
    Ok(BenchResult {
        memory,
        sharing: o.sharing.clone(),
        fence,
        policy: o.policy.name(),
        mode: mode.name(),
        capacity: o.capacity,
        spares: o.spares,
        consumers,
        slow_hold_ms: slow_hold.map_or(0, |h| h.as_millis() as u64),
        frame_bytes: o.size,
        seconds: o.seconds,
        producer_fps,
        consumer_fps: results.iter().map(|c| c.frames as f64 / c.seconds.max(1e-9)).collect(),
        lost: results.iter().map(|c| c.lost).collect(),
        p50_ns: results.iter().map(|c| c.p50_ns).collect(),
        p99_ns: results.iter().map(|c| c.p99_ns).collect(),
        bad_bytes: results.iter().map(|c| c.bad_bytes).sum(),
        accounting_errors: results.iter().map(|c| c.accounting_errors).sum(),
    })
}

/// Prints one run for a person.
fn print(r: &BenchResult) {
    let slow = match r.slow_hold_ms {
        0 => String::new(),
        ms => format!(", the last holding each message {ms} ms"),
    };
    let sharing = match r.fence {
        Some(fence) => format!(" ({} sharing, {fence} fences)", r.sharing),
        None => String::new(),
    };
    println!(
        "{} memory{sharing}, {} policy, {} consumers, {} slots + {} spares, 1 -> {}{slow}, {} B frames, \
         {:.1} s: producer {:.0} frames/s",
        r.memory,
        r.policy,
        r.mode,
        r.capacity,
        r.spares,
        r.consumers,
        r.frame_bytes,
        r.seconds,
        r.producer_fps
    );
    for i in 0..r.consumers {
        println!(
            "  consumer {i}: {:.0} frames/s, publish -> recv p50 {:.1} us, p99 {:.1} us, lost {}",
            r.consumer_fps[i],
            r.p50_ns[i] as f64 / 1e3,
            r.p99_ns[i] as f64 / 1e3,
            r.lost[i],
        );
    }
    println!("  bad bytes {}, accounting errors {}", r.bad_bytes, r.accounting_errors);
}

/// Fails a run whose consumers saw bytes other than those published, or whose received and
/// lost counts do not add up.
fn check(r: &BenchResult) -> Result<(), String> {
    if r.bad_bytes != 0 {
        return Err(format!("{} bytes differed from what was published", r.bad_bytes));
    }
    if r.accounting_errors != 0 {
        return Err(format!("{} messages did not add up (received + lost)", r.accounting_errors));
    }
    Ok(())
}

fn percentiles(mut v: Vec<u64>) -> (u64, u64) {
    if v.is_empty() {
        return (0, 0);
    }
    v.sort_unstable();
    (v[v.len() / 2], v[(v.len() * 99 / 100).min(v.len() - 1)])
}

/// `gpuring bench-consumer NAME`: receives until the producer leaves, holding each message
/// for `hold`, and prints one JSON line.
pub fn consumer(
    name: &str,
    memory: &str,
    hold: Duration,
    mode: Option<Mode>,
) -> Result<(), String> {
    #[cfg(feature = "cuda")]
    if use_cuda(memory)? {
        return consume_in::<gpuring::Cuda>(name, hold, mode);
    }
    let _ = use_cuda(memory)?;
    consume_in::<Host>(name, hold, mode)
}

/// The consumer in memory kind `M`: checks every byte of every message and that its sequence
/// number follows from the previous one and the loss reported with it, and holds each for
/// `hold` before releasing it.
fn consume_in<M: Payload>(name: &str, hold: Duration, mode: Option<Mode>) -> Result<(), String> {
    let builder = Consumer::builder(name).start_at(StartAt::Next);
    let builder = match mode {
        Some(mode) => builder.mode(mode),
        None => builder,
    };
    let rx = builder.open_in_timeout::<M>(Duration::from_secs(10)).map_err(|e| e.to_string())?;
    let checker = M::checker(&rx).map_err(|e| e.to_string())?;
    let mut lat = Vec::new();
    let (mut frames, mut lost, mut accounting_errors) = (0u64, 0u64, 0u64);
    let mut start = None;
    let mut prev: Option<u64> = None;
    loop {
        match rx.recv() {
            Ok(m) => {
                if prev.is_some_and(|p| p + 1 + m.lag() != m.seq()) {
                    accounting_errors += 1;
                }
                prev = Some(m.seq());
                if m.header().first() == Some(&1) {
                    start.get_or_insert_with(Instant::now);
                    lat.push(monotonic_ns().saturating_sub(m.timestamp_ns()));
                    frames += 1;
                    lost += m.lag();
                }
                M::check(&checker, &m).map_err(|e| e.to_string())?;
                if !hold.is_zero() {
                    // "Working" on the message in place: it stays held, and released after.
                    std::thread::sleep(hold);
                }
                drop(m);
            }
            Err(RecvError::Disconnected) => break,
            Err(e) => return Err(format!("recv: {e}")),
        }
    }
    let bad_bytes = M::mismatches(&checker, &rx).map_err(|e| e.to_string())?;
    let seconds = start.map_or(0.0, |s| s.elapsed().as_secs_f64());
    let (p50_ns, p99_ns) = percentiles(lat);
    let r = ConsumerResult { frames, seconds, lost, p50_ns, p99_ns, bad_bytes, accounting_errors };
    println!("{}", serde_json::to_string(&r).map_err(|e| e.to_string())?);
    Ok(())
}
