//! `gpuring bench`: a self-contained 1→N run. This process produces; each consumer is this
//! binary again (`gpuring bench-consumer`, hidden), which prints one JSON line of results.
//!
//! One generic run per memory kind (`gpuring::testing::payload`): host memory writes each
//! frame's test pattern on the CPU and each consumer checks every byte on the CPU; CUDA memory
//! does both with kernels, a consumer's on its stream. Latency is publish → `recv` returning (CLOCK_MONOTONIC, CPU side), not the GPU's.

use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use gpuring::testing::payload::Payload;
use gpuring::{monotonic_ns, Consumer, Host, OpenError, Producer, RecvError, StartAt};
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
}

/// What `gpuring bench` prints with `--json`.
#[derive(Serialize)]
struct BenchResult {
    memory: &'static str,
    consumers: usize,
    frame_bytes: usize,
    seconds: f64,
    producer_fps: f64,
    consumer_fps: Vec<f64>,
    p50_ns: Vec<u64>,
    p99_ns: Vec<u64>,
    bad_bytes: u64,
}

/// The options of `gpuring bench`.
pub struct Options {
    pub memory: String,
    pub consumers: usize,
    pub size: usize,
    pub seconds: f64,
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

fn spawn(name: &str, memory: &str) -> Result<Child, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    Command::new(exe)
        .args(["bench-consumer", name, "--memory", memory])
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

/// Runs the bench and prints its result.
pub fn run(o: &Options) -> Result<(), String> {
    if o.consumers == 0 || o.size < 16 || o.seconds <= 0.0 {
        return Err("need --consumers >= 1, --size >= 16, --seconds > 0".into());
    }
    #[cfg(feature = "cuda")]
    if use_cuda(&o.memory)? {
        return run_in::<gpuring::Cuda>(o, "cuda");
    }
    run_in::<Host>(o, "host")
}

/// The bench in memory kind `M` (`memory` names it for the consumers and the report).
fn run_in<M: Payload>(o: &Options, memory: &'static str) -> Result<(), String> {
    let name = format!("gpuring-bench-{}", std::process::id());
    let builder = Producer::builder(&name).capacity(16).slot_size(o.size).user_header_size(8);
    let err = |e: gpuring::CreateError| format!("creating the bench ring: {e}");
    let mut tx = builder.create_in::<M>().map_err(err)?;
    let w = M::writer(&tx).map_err(|e| format!("preparing the pattern writer: {e}"))?;
    // Publishes message `seq` (the test pattern, `len` bytes), `phase` in the user header.
    let publish = |tx: &mut Producer<M>, seq: u64, phase: u8| -> Result<(), String> {
        let mut slot = tx.acquire().map_err(|e| e.to_string())?;
        M::fill(&w, &mut slot, o.size, seq).map_err(|e| e.to_string())?;
        slot.publish(o.size, &[phase, 0, 0, 0, 0, 0, 0, 0]).map_err(|e| e.to_string())?;
        Ok(())
    };
    let children = (0..o.consumers).map(|_| spawn(&name, memory)).collect::<Result<Vec<_>, _>>()?;
    let t = Instant::now();
    while tx.consumer_count() < o.consumers {
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
    let r = BenchResult {
        memory,
        consumers: o.consumers,
        frame_bytes: o.size,
        seconds: o.seconds,
        producer_fps,
        consumer_fps: results.iter().map(|c| c.frames as f64 / c.seconds.max(1e-9)).collect(),
        p50_ns: results.iter().map(|c| c.p50_ns).collect(),
        p99_ns: results.iter().map(|c| c.p99_ns).collect(),
        bad_bytes: results.iter().map(|c| c.bad_bytes).sum(),
    };
    if o.json {
        println!("{}", serde_json::to_string_pretty(&r).map_err(|e| e.to_string())?);
    } else {
        println!(
            "{} memory, 1 -> {}, {} B frames, {:.1} s: producer {:.0} frames/s",
            r.memory, r.consumers, r.frame_bytes, r.seconds, r.producer_fps
        );
        for (i, c) in results.iter().enumerate() {
            println!(
                "  consumer {i}: {:.0} frames/s, publish -> recv p50 {:.1} us, p99 {:.1} us, \
                 lost {}, bad bytes {}",
                r.consumer_fps[i],
                c.p50_ns as f64 / 1e3,
                c.p99_ns as f64 / 1e3,
                c.lost,
                c.bad_bytes
            );
        }
    }
    if r.bad_bytes != 0 {
        return Err(format!("{} bytes differed from what was published", r.bad_bytes));
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

/// `gpuring bench-consumer NAME`: receives until the producer leaves, prints one JSON line.
pub fn consumer(name: &str, memory: &str) -> Result<(), String> {
    #[cfg(feature = "cuda")]
    if use_cuda(memory)? {
        return consume_in::<gpuring::Cuda>(name);
    }
    let _ = use_cuda(memory)?;
    consume_in::<Host>(name)
}

/// The consumer in memory kind `M`: checks every byte of every message.
fn consume_in<M: Payload>(name: &str) -> Result<(), String> {
    let t = Instant::now();
    let rx = loop {
        match Consumer::builder(name).start_at(StartAt::Next).open_in::<M>() {
            Ok(rx) => break rx,
            Err(OpenError::NotFound | OpenError::NotInitialized)
                if t.elapsed() < Duration::from_secs(10) =>
            {
                std::thread::sleep(Duration::from_millis(1))
            }
            Err(e) => return Err(format!("open {name}: {e}")),
        }
    };
    let checker = M::checker(&rx).map_err(|e| e.to_string())?;
    let mut lat = Vec::new();
    let (mut frames, mut lost) = (0u64, 0u64);
    let mut start = None;
    loop {
        match rx.recv() {
            Ok(m) => {
                if m.header().first() == Some(&1) {
                    start.get_or_insert_with(Instant::now);
                    lat.push(monotonic_ns().saturating_sub(m.timestamp_ns()));
                    frames += 1;
                    lost += m.lag();
                }
                M::check(&checker, &m).map_err(|e| e.to_string())?;
            }
            Err(RecvError::Disconnected) => break,
            Err(e) => return Err(format!("recv: {e}")),
        }
    }
    let bad = M::mismatches(&checker, &rx).map_err(|e| e.to_string())?;
    report(frames, start, lost, lat, bad)
}

fn report(
    frames: u64,
    start: Option<Instant>,
    lost: u64,
    lat: Vec<u64>,
    bad_bytes: u64,
) -> Result<(), String> {
    let seconds = start.map_or(0.0, |s| s.elapsed().as_secs_f64());
    let (p50_ns, p99_ns) = percentiles(lat);
    let r = ConsumerResult { frames, seconds, lost, p50_ns, p99_ns, bad_bytes };
    println!("{}", serde_json::to_string(&r).map_err(|e| e.to_string())?);
    Ok(())
}
