//! gpuring cells: one producer (this process) and `n` consumer processes on a CUDA ring.
//!
//! The producer fills every frame with `bench_fill` (which stamps it) and publishes it; each
//! consumer reads every byte with `bench_read` on its stream (which records stamp-to-start
//! latency). The user header's first byte says whether a frame is warm-up (0) or measured (1).

use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use gpuring::cuda::{Context, Stream};
use gpuring::RecvError;
use gpuring::{Consumer, Policy, Producer};

use crate::kernels::{percentiles, Kernels};
use crate::trace::Recorder;
use crate::{child_result, Opts, ROLE};

/// Counts of IPC opens/closes (and VMM imports) and CPU syncs made by this process so far.
pub fn counters() -> (u64, u64) {
    use gpuring::cuda::driver::{CPU_SYNCS, VMM_IMPORTS};
    use gpuring::cuda::{IPC_EVENT_OPENS, IPC_MEM_CLOSES, IPC_MEM_OPENS};
    let opens = IPC_MEM_OPENS.load(Ordering::Relaxed)
        + IPC_EVENT_OPENS.load(Ordering::Relaxed)
        + IPC_MEM_CLOSES.load(Ordering::Relaxed)
        + VMM_IMPORTS.load(Ordering::Relaxed);
    (opens, CPU_SYNCS.load(Ordering::Relaxed))
}

/// What one cell measured.
#[derive(Clone, Debug, Default)]
pub struct Cell {
    pub consumers: usize,
    pub size: usize,
    pub policy: &'static str,
    pub capacity: u32,
    /// Frames/s the producer published in the measured window.
    pub producer_fps: f64,
    /// Frames/s each consumer read, from first measured frame to its stream's completion.
    pub consumer_fps: Vec<f64>,
    /// Frames consumers skipped (Overwrite lag), all consumers.
    pub lost: u64,
    /// Median of the consumers' p50 latencies; worst consumer p99 (ns).
    pub lat_p50: u64,
    pub lat_p99: u64,
    /// IPC opens/closes and CPU syncs in the measured window, all processes.
    pub opens: u64,
    pub syncs: u64,
    /// µs per frame the producer spent in acquire, the fill launch and publish.
    pub producer_us: [f64; 3],
    /// µs per frame a consumer spent (mean over consumers) in recv (waiting included), the
    /// read launch and the slot's release.
    pub consumer_us: [f64; 3],
}

impl Cell {
    pub fn mean_fps(&self) -> f64 {
        self.consumer_fps.iter().sum::<f64>() / self.consumer_fps.len().max(1) as f64
    }
}

/// The device consumer `index` reads on: `--consumer-devices` in turn, else `--device`.
pub fn consumer_device(o: &Opts, index: usize) -> i32 {
    match o.consumer_devices.len() {
        0 => o.device,
        n => o.consumer_devices[index % n],
    }
}

fn spawn_consumer(name: &str, size: usize, index: usize, poll: Duration, device: i32) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .env(ROLE, format!("consumer:{name}:{size}:{index}"))
        .env("GPURING_GPU_BENCH_POLL_NS", poll.as_nanos().to_string())
        .env("GPURING_GPU_BENCH_DEVICE", device.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Runs one cell: `n` consumers, `size`-byte frames, `policy`, a ring of `capacity` slots.
/// `paced`: after each publish, wait until every consumer has taken the frame (one frame in
/// flight, like the raw handoff's ack) before acquiring the next. `poll`: every side's
/// `gpu_poll` window.
#[allow(clippy::too_many_arguments)]
pub fn run_cell(
    o: &Opts,
    k: &Kernels,
    n: usize,
    size: usize,
    policy: Policy,
    capacity: u32,
    paced: bool,
    poll: Duration,
) -> Cell {
    let name = format!("gpubench-{}-{n}-{size}-{capacity}", std::process::id());
    let mut tx = Producer::builder(&name)
        .capacity(capacity)
        .slot_size(size)
        .max_consumers(8)
        .user_header_size(8)
        .policy(policy)
        .gpu_poll(poll)
        .fence(crate::fence(o))
        .sharing(crate::sharing(o))
        .create_gpu(o.device)
        .expect("create the CUDA ring");
    let children: Vec<Child> =
        (0..n).map(|i| spawn_consumer(&name, size, i, poll, consumer_device(o, i))).collect();
    let t = Instant::now();
    while tx.consumer_count() < n {
        assert!(t.elapsed() < Duration::from_secs(60), "consumers did not join");
        std::thread::sleep(Duration::from_millis(2));
    }
    let mut seq = 0u64;
    // Time spent in acquire, the fill launch and publish (ns, measured frames only).
    let mut spent = [0u64; 3];
    let mut rec = Recorder::new(k);
    let mut publish = |tx: &mut gpuring::GpuProducer, phase: u8| {
        let c0 = rec.now();
        let t0 = Instant::now();
        let slot = tx.acquire().expect("acquire");
        let t1 = Instant::now();
        let c1 = rec.now();
        // SAFETY: the slot holds `size` writable bytes until published; its stream is the
        // producer's one stream, as the fill ticket needs.
        unsafe { k.fill(slot.stream(), slot.ptr(), size as u64, seq) };
        let t2 = Instant::now();
        let c2 = rec.now();
        slot.publish(size, &[phase, 0, 0, 0, 0, 0, 0, 0]).expect("publish");
        if phase == 1 {
            rec.push(seq, [c0, c1, c2, rec.now()]);
            let t3 = Instant::now();
            spent[0] += (t1 - t0).as_nanos() as u64;
            spent[1] += (t2 - t1).as_nanos() as u64;
            spent[2] += (t3 - t2).as_nanos() as u64;
        }
        seq += 1;
        while paced && tx.consumers().iter().any(|c| c.cursor < seq) {
            std::hint::spin_loop();
        }
    };
    let warm = Instant::now();
    while warm.elapsed() < o.warmup {
        publish(&mut tx, 0);
    }
    let (opens0, syncs0) = counters();
    let t0 = Instant::now();
    let mut frames = 0u64;
    while t0.elapsed() < o.seconds {
        publish(&mut tx, 1);
        frames += 1;
    }
    let producer_fps = frames as f64 / t0.elapsed().as_secs_f64();
    let (opens1, syncs1) = counters();
    drop(tx);
    rec.write(k, &Stream::new(k.context()).unwrap(), "fill.tsv");
    let mut cell = Cell {
        consumers: n,
        size,
        policy: if policy == Policy::Block { "block" } else { "overwrite" },
        capacity,
        producer_fps,
        opens: opens1 - opens0,
        syncs: syncs1 - syncs0,
        producer_us: spent.map(|ns| ns as f64 / frames.max(1) as f64 / 1e3),
        ..Cell::default()
    };
    let mut p50s = Vec::new();
    for child in children {
        let r = child_result(child);
        cell.consumer_fps.push(r["frames"] / r["seconds"]);
        cell.lost += r["lost"] as u64;
        p50s.push(r["p50"] as u64);
        cell.lat_p99 = cell.lat_p99.max(r["p99"] as u64);
        cell.opens += r["opens"] as u64;
        for (i, key) in ["recv_ns", "read_ns", "release_ns"].iter().enumerate() {
            cell.consumer_us[i] += r[*key] / r["frames"].max(1.0) / 1e3 / n as f64;
        }
        cell.syncs += r["syncs"] as u64;
    }
    cell.lat_p50 = percentiles(p50s).0;
    cell
}

/// The consumer process of a cell: prints one `RESULT` line.
pub fn consumer(name: &str, size: usize, device: i32) -> HashMap<&'static str, f64> {
    let ctx = Context::new(device).unwrap();
    ctx.make_current().unwrap(); // the raw driver calls below run in it
    let setup = Stream::new(&ctx).unwrap();
    let k = Kernels::load(&ctx, &setup);
    setup.synchronize().unwrap();
    let b = Consumer::builder(name).device(device).gpu_poll(crate::gpu_poll());
    let rx = b.open_in_timeout(Duration::from_secs(30)).unwrap_or_else(|e| panic!("{e}"));
    let (mut frames, mut lost) = (0u64, 0u64);
    let mut start: Option<(Instant, u64, u64)> = None;
    let mut spent = [0u64; 3];
    let mut rec = Recorder::new(&k);
    loop {
        let c0 = rec.now();
        let t0 = Instant::now();
        match rx.recv() {
            Ok(slot) => {
                let t1 = Instant::now();
                let c1 = rec.now();
                assert_eq!(slot.len(), size, "frame length");
                let measured = slot.header()[0] == 1;
                if measured {
                    if start.is_none() {
                        let (o, s) = counters();
                        start = Some((Instant::now(), o, s));
                    }
                    lost += slot.lag();
                }
                let sample = measured.then_some(frames);
                let frame = k.tracing().then_some(slot.seq());
                // SAFETY: the slot's `len` bytes are readable on its stream until released,
                // and the release is queued after this kernel.
                unsafe {
                    k.read_traced(slot.stream(), slot.ptr(), slot.len() as u64, sample, frame)
                };
                let t2 = Instant::now();
                let (c2, seq) = (rec.now(), slot.seq());
                drop(slot);
                if measured {
                    rec.push(seq, [c0, c1, c2, rec.now()]);
                    let t3 = Instant::now();
                    spent[0] += (t1 - t0).as_nanos() as u64;
                    spent[1] += (t2 - t1).as_nanos() as u64;
                    spent[2] += (t3 - t2).as_nanos() as u64;
                }
                frames += measured as u64;
            }
            Err(RecvError::Disconnected) => break,
            Err(e) => panic!("recv: {e}"),
        }
    }
    let (t0, opens0, syncs0) = start.expect("no measured frame arrived");
    let (opens1, syncs1) = counters();
    rx.stream().synchronize().unwrap();
    let seconds = t0.elapsed().as_secs_f64();
    let (p50, p99) = percentiles(k.latencies(rx.stream(), frames));
    let index = std::env::var(ROLE).unwrap_or_default();
    let index = index.rsplit(':').next().unwrap_or("0");
    rec.write(&k, rx.stream(), &format!("read-{index}.tsv"));
    HashMap::from([
        ("frames", frames as f64),
        ("seconds", seconds),
        ("lost", lost as f64),
        ("p50", p50 as f64),
        ("p99", p99 as f64),
        ("opens", (opens1 - opens0) as f64),
        ("syncs", (syncs1 - syncs0) as f64),
        ("recv_ns", spent[0] as f64),
        ("read_ns", spent[1] as f64),
        ("release_ns", spent[2] as f64),
    ])
}
