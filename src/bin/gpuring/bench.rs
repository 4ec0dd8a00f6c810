//! `gpuring bench`: a self-contained 1→N run. This process produces; each consumer is this
//! binary again (`gpuring bench-consumer`, hidden), which prints one JSON line of results.
//!
//! Host memory: each frame is copied into its slot; a consumer reads its first and last byte.
//! CUDA memory: a kernel fills each frame; each consumer checks every byte with a kernel on its
//! stream. Latency is publish → `recv` returning (CLOCK_MONOTONIC, CPU side), not the GPU's.

use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use gpuring::{monotonic_ns, Consumer, OpenError, Producer, RecvError, StartAt};
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

fn spawn(name: &str, cuda: bool) -> Result<Child, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let memory = if cuda { "cuda" } else { "host" };
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
    let cuda = use_cuda(&o.memory)?;
    let name = format!("gpuring-bench-{}", std::process::id());
    let builder = Producer::builder(&name).capacity(16).slot_size(o.size).user_header_size(8);
    let mut producer = Publisher::new(builder, cuda)?;
    let children = (0..o.consumers).map(|_| spawn(&name, cuda)).collect::<Result<Vec<_>, _>>()?;
    let t = Instant::now();
    while producer.consumer_count() < o.consumers {
        if t.elapsed() > Duration::from_secs(30) {
            return Err("the consumers did not join within 30 s".into());
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    let warm = Instant::now();
    let mut seq = 0u64;
    while warm.elapsed() < WARMUP {
        producer.publish(seq, 0, o.size)?;
        seq += 1;
    }
    let t0 = Instant::now();
    let mut frames = 0u64;
    while t0.elapsed().as_secs_f64() < o.seconds {
        producer.publish(seq, 1, o.size)?;
        seq += 1;
        frames += 1;
    }
    let producer_fps = frames as f64 / t0.elapsed().as_secs_f64();
    drop(producer);
    let results = children.into_iter().map(collect).collect::<Result<Vec<_>, _>>()?;
    let r = BenchResult {
        memory: if cuda { "cuda" } else { "host" },
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

/// The producer of either memory kind.
// One long-lived value per producer: the variants' sizes do not matter (and issue 16's single
// producer type removes this enum).
#[allow(clippy::large_enum_variant)]
enum Publisher {
    Host(Producer),
    #[cfg(feature = "cuda")]
    Cuda(gpuring::GpuProducer, std::sync::Arc<gpuring::cuda::kernels::PatternKernels>),
}

impl Publisher {
    fn new(b: gpuring::ProducerBuilder, cuda: bool) -> Result<Publisher, String> {
        let err = |e: gpuring::CreateError| format!("creating the bench ring: {e}");
        #[cfg(feature = "cuda")]
        if cuda {
            let tx = b.create_gpu(0).map_err(err)?;
            let k = gpuring::cuda::kernels::PatternKernels::get(tx.context())
                .map_err(|e| format!("compiling the pattern kernels: {e}"))?;
            return Ok(Publisher::Cuda(tx, k));
        }
        let _ = cuda;
        Ok(Publisher::Host(b.create().map_err(err)?))
    }

    fn consumer_count(&self) -> usize {
        match self {
            Publisher::Host(tx) => tx.consumer_count(),
            #[cfg(feature = "cuda")]
            Publisher::Cuda(tx, _) => tx.consumer_count(),
        }
    }

    /// Publishes message `seq` (the test pattern, `len` bytes), `phase` in the user header.
    fn publish(&mut self, seq: u64, phase: u8, len: usize) -> Result<(), String> {
        let header = [phase, 0, 0, 0, 0, 0, 0, 0];
        match self {
            Publisher::Host(tx) => {
                let mut slot = tx.acquire().map_err(|e| e.to_string())?;
                gpuring::pattern::fill(&mut slot[..len], seq);
                slot.publish(len, &header).map_err(|e| e.to_string())?;
            }
            #[cfg(feature = "cuda")]
            Publisher::Cuda(tx, k) => {
                let slot = tx.acquire().map_err(|e| e.to_string())?;
                // SAFETY: the slot holds at least `len` writable bytes until published.
                unsafe { k.fill(slot.stream(), slot.ptr(), len as u64, seq) }
                    .map_err(|e| e.to_string())?;
                slot.publish(len, &header).map_err(|e| e.to_string())?;
            }
        }
        Ok(())
    }
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
    let cuda = use_cuda(memory)?;
    let t = Instant::now();
    let retry = |e: &OpenError| {
        matches!(e, OpenError::NotFound | OpenError::NotInitialized)
            && t.elapsed() < Duration::from_secs(10)
    };
    let mut lat = Vec::new();
    let (mut frames, mut lost, mut bad) = (0u64, 0u64, 0u64);
    let mut start = None;
    let mut on_frame = |header: &[u8], ts: u64, lag: u64| -> bool {
        let measured = header.first() == Some(&1);
        if measured {
            start.get_or_insert_with(Instant::now);
            lat.push(monotonic_ns().saturating_sub(ts));
            frames += 1;
            lost += lag;
        }
        measured
    };
    #[cfg(feature = "cuda")]
    if cuda {
        use gpuring::cuda::kernels::{MismatchCounter, PatternKernels};
        use gpuring::gpu::GpuRecvError;
        let rx = loop {
            match Consumer::builder(name).start_at(StartAt::Next).open_gpu() {
                Ok(rx) => break rx,
                Err(e) if retry(&e) => std::thread::sleep(Duration::from_millis(1)),
                Err(e) => return Err(format!("open {name}: {e}")),
            }
        };
        let k = PatternKernels::get(rx.context()).map_err(|e| e.to_string())?;
        let counter = MismatchCounter::new(rx.stream()).map_err(|e| e.to_string())?;
        loop {
            match rx.recv() {
                Ok(m) => {
                    on_frame(m.header(), m.timestamp_ns(), m.lag());
                    // SAFETY: the message's bytes stay readable on its stream until it is
                    // released, which dropping `m` records after this kernel.
                    unsafe {
                        k.check(m.stream(), m.ptr(), m.len() as u64, m.seq(), counter.ptr(), 0)
                    }
                    .map_err(|e| e.to_string())?;
                }
                Err(GpuRecvError::Disconnected) => break,
                Err(e) => return Err(format!("recv: {e}")),
            }
        }
        bad = counter.read(rx.stream()).map_err(|e| e.to_string())?;
        return report(frames, start, lost, lat, bad);
    }
    let _ = cuda;
    let rx = loop {
        match Consumer::builder(name).start_at(StartAt::Next).open() {
            Ok(rx) => break rx,
            Err(e) if retry(&e) => std::thread::sleep(Duration::from_millis(1)),
            Err(e) => return Err(format!("open {name}: {e}")),
        }
    };
    loop {
        match rx.recv() {
            Ok(m) => {
                on_frame(m.header(), m.timestamp_ns(), m.lag());
                bad += gpuring::pattern::mismatches(&m, m.seq());
            }
            Err(RecvError::Disconnected) => break,
            Err(e) => return Err(format!("recv: {e}")),
        }
    }
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
