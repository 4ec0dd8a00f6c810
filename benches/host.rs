//! Host-memory benches: ping-pong round trip and throughput, in-process threads and across
//! processes, with a raw shared-memory spin ping-pong floor measured in the same run.
//!
//! Run: `cargo bench --bench host` (add `-- --quick` for a short run). At the end it prints each
//! gpuring figure as a ratio to the floor, from criterion's own estimates.
//!
//! Cross-process cases re-execute this binary with `GPURING_BENCH_ROLE` set.

use std::hint::spin_loop;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput};
use gpuring::{Consumer, OpenError, Policy, Producer, RecvError, StartAt};

const ROLE: &str = "GPURING_BENCH_ROLE";
const MSG: usize = 64;

fn main() {
    if let Ok(role) = std::env::var(ROLE) {
        child(&role, &std::env::var("GPURING_BENCH_RING").unwrap());
        return;
    }
    let mut c = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .configure_from_args();
    roundtrip(&mut c);
    throughput(&mut c);
    c.final_summary();
    report_ratios();
}

// ---- Children ------------------------------------------------------------------------------

fn spawn_child(role: &str, ring: &str) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .env(ROLE, role)
        .env("GPURING_BENCH_RING", ring)
        .stdin(Stdio::null())
        .spawn()
        .unwrap()
}

fn open_retry(name: &str, start: StartAt) -> Consumer {
    let t = Instant::now();
    loop {
        match Consumer::builder(name).start_at(start).open() {
            Ok(c) => return c,
            Err(OpenError::NotFound | OpenError::NotInitialized) if t.elapsed().as_secs() < 10 => {
                thread::sleep(Duration::from_millis(1))
            }
            Err(e) => panic!("open {name}: {e}"),
        }
    }
}

fn wait_consumers(tx: &Producer, n: usize) {
    while tx.consumer_count() < n {
        thread::sleep(Duration::from_millis(1));
    }
}

fn child(role: &str, ring: &str) {
    match role {
        "floor-echo" => {
            let map = FloorMap::open(ring);
            floor_echo(map.words());
        }
        "echo" => {
            let mut tx =
                Producer::builder(&format!("{ring}-pong")).slot_size(MSG).create().unwrap();
            let rx = open_retry(&format!("{ring}-ping"), StartAt::Next);
            echo(&rx, &mut tx);
        }
        "sink" => {
            let rx = open_retry(ring, StartAt::Next);
            sink(&rx);
        }
        _ => panic!("unknown role {role}"),
    }
}

// ---- Floor: raw spin ping-pong on two shared words ------------------------------------------

/// Two u64 words on separate 128-byte lines of a /dev/shm file.
struct FloorMap {
    map: memmap2::MmapRaw,
    path: String,
    owner: bool,
}

impl FloorMap {
    fn create(name: &str) -> FloorMap {
        let path = format!("/dev/shm/{name}");
        let f =
            std::fs::File::options().create_new(true).read(true).write(true).open(&path).unwrap();
        f.set_len(4096).unwrap();
        FloorMap { map: memmap2::MmapRaw::map_raw(&f).unwrap(), path, owner: true }
    }

    fn open(name: &str) -> FloorMap {
        let path = format!("/dev/shm/{name}");
        let f = std::fs::File::options().read(true).write(true).open(&path).unwrap();
        FloorMap { map: memmap2::MmapRaw::map_raw(&f).unwrap(), path, owner: false }
    }

    fn words(&self) -> (&AtomicU64, &AtomicU64) {
        // SAFETY: the map is 4096 bytes, page-aligned; offsets 0 and 128 hold aligned u64s,
        // which AtomicU64 may view.
        unsafe {
            let base = self.map.as_mut_ptr();
            (&*(base as *const AtomicU64), &*(base.add(128) as *const AtomicU64))
        }
    }
}

impl Drop for FloorMap {
    fn drop(&mut self) {
        if self.owner {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

fn floor_echo((ping, pong): (&AtomicU64, &AtomicU64)) {
    let mut last = 0;
    loop {
        let v = loop {
            // Acquire/Release: the floor pays the same ordering a real handoff needs.
            let v = ping.load(Ordering::Acquire);
            if v != last {
                break v;
            }
            spin_loop();
        };
        if v == u64::MAX {
            return;
        }
        last = v;
        pong.store(v, Ordering::Release);
    }
}

fn floor_roundtrips((ping, pong): (&AtomicU64, &AtomicU64), start: u64, iters: u64) -> Duration {
    let t = Instant::now();
    for i in start..start + iters {
        ping.store(i, Ordering::Release);
        while pong.load(Ordering::Acquire) != i {
            spin_loop();
        }
    }
    t.elapsed()
}

// ---- gpuring ping-pong ------------------------------------------------------------------------

fn echo(rx: &Consumer, tx: &mut Producer) {
    loop {
        let m = match rx.recv() {
            Ok(m) => m,
            Err(RecvError::Disconnected) => return,
            Err(e) => panic!("{e}"),
        };
        let mut out = tx.acquire().unwrap();
        out[..m.len()].copy_from_slice(&m);
        let len = m.len();
        drop(m);
        out.publish(len, b"").unwrap();
    }
}

fn sink(rx: &Consumer) {
    let mut sum = 0u64;
    loop {
        match rx.recv() {
            Ok(m) => sum = sum.wrapping_add(m[0] as u64),
            Err(RecvError::Disconnected) => break,
            Err(e) => panic!("{e}"),
        }
    }
    std::hint::black_box(sum);
}

fn gpuring_roundtrips(tx: &mut Producer, rx: &Consumer, iters: u64) -> Duration {
    let payload = [7u8; MSG];
    let t = Instant::now();
    for _ in 0..iters {
        tx.send(&payload, b"").unwrap();
        let m = rx.recv().unwrap();
        std::hint::black_box(m[0]);
    }
    t.elapsed()
}

fn unique(tag: &str) -> String {
    format!("bench-{tag}-{}", std::process::id())
}

fn roundtrip(c: &mut Criterion) {
    let mut g = c.benchmark_group("roundtrip");
    g.throughput(Throughput::Elements(1));

    // Floor, threads.
    {
        let map = FloorMap::create(&unique("floor-t"));
        let words = map.words();
        let mut next = 1;
        thread::scope(|s| {
            s.spawn(|| floor_echo(words));
            g.bench_function("floor/threads", |b| {
                b.iter_custom(|iters| {
                    let d = floor_roundtrips(words, next, iters);
                    next += iters;
                    d
                })
            });
            words.0.store(u64::MAX, Ordering::Release);
        });
    }
    // Floor, processes.
    {
        let name = unique("floor-p");
        let map = FloorMap::create(&name);
        let mut child = spawn_child("floor-echo", &name);
        let mut next = 1;
        g.bench_function("floor/procs", |b| {
            b.iter_custom(|iters| {
                let d = floor_roundtrips(map.words(), next, iters);
                next += iters;
                d
            })
        });
        map.words().0.store(u64::MAX, Ordering::Release);
        child.wait().unwrap();
    }
    // gpuring, threads.
    {
        let name = unique("rt-t");
        let mut ping = Producer::builder(&format!("{name}-ping")).slot_size(MSG).create().unwrap();
        let mut pong = Producer::builder(&format!("{name}-pong")).slot_size(MSG).create().unwrap();
        let pong_rx =
            Consumer::builder(&format!("{name}-pong")).start_at(StartAt::Next).open().unwrap();
        let ping_rx =
            Consumer::builder(&format!("{name}-ping")).start_at(StartAt::Next).open().unwrap();
        thread::scope(|s| {
            s.spawn(move || echo(&ping_rx, &mut pong));
            g.bench_function("gpuring/threads", |b| {
                b.iter_custom(|iters| gpuring_roundtrips(&mut ping, &pong_rx, iters))
            });
            drop(ping);
        });
    }
    // gpuring, processes.
    {
        let name = unique("rt-p");
        let mut ping = Producer::builder(&format!("{name}-ping")).slot_size(MSG).create().unwrap();
        let child = spawn_child("echo", &name);
        let pong_rx = open_retry(&format!("{name}-pong"), StartAt::Next);
        wait_consumers(&ping, 1);
        g.bench_function("gpuring/procs", |b| {
            b.iter_custom(|iters| gpuring_roundtrips(&mut ping, &pong_rx, iters))
        });
        drop(ping);
        wait_child(child);
    }
    g.finish();
}

fn wait_child(mut child: Child) {
    let status = child.wait().unwrap();
    assert!(status.success(), "bench child failed: {status}");
}

// ---- Throughput ------------------------------------------------------------------------------

fn publish_n(tx: &mut Producer, iters: u64) -> Duration {
    let t = Instant::now();
    for i in 0..iters {
        let mut slot = tx.acquire().unwrap();
        slot[0] = i as u8;
        slot.publish(MSG, b"").unwrap();
    }
    t.elapsed()
}

fn throughput(c: &mut Criterion) {
    let mut g = c.benchmark_group("throughput");
    g.throughput(Throughput::Elements(1));
    for consumers in [1usize, 4] {
        // Threads.
        {
            let name = unique(&format!("tp-t{consumers}"));
            let mut tx = Producer::builder(&name).capacity(64).slot_size(MSG).create().unwrap();
            let rxs: Vec<_> = (0..consumers)
                .map(|_| Consumer::builder(&name).start_at(StartAt::Next).open().unwrap())
                .collect();
            thread::scope(|s| {
                for rx in rxs {
                    s.spawn(move || sink(&rx));
                }
                let id = BenchmarkId::new(format!("1to{consumers}"), "threads");
                g.bench_function(id, |b| b.iter_custom(|iters| publish_n(&mut tx, iters)));
                drop(tx);
            });
        }
        // Processes.
        {
            let name = unique(&format!("tp-p{consumers}"));
            let mut tx = Producer::builder(&name)
                .capacity(64)
                .slot_size(MSG)
                .policy(Policy::Block)
                .create()
                .unwrap();
            let children: Vec<_> = (0..consumers).map(|_| spawn_child("sink", &name)).collect();
            wait_consumers(&tx, consumers);
            let id = BenchmarkId::new(format!("1to{consumers}"), "procs");
            g.bench_function(id, |b| b.iter_custom(|iters| publish_n(&mut tx, iters)));
            drop(tx);
            children.into_iter().for_each(wait_child);
        }
    }
    g.finish();
}

// ---- Ratios ------------------------------------------------------------------------------------

/// Criterion's point estimate of the median, in ns, for benchmark `id` (its folder path).
fn median_ns(id: &str) -> Option<f64> {
    let dir = std::env::var("CARGO_TARGET_DIR").unwrap_or_else(|_| "target".into());
    let text = std::fs::read_to_string(format!("{dir}/criterion/{id}/new/estimates.json")).ok()?;
    let at = text.find("\"median\"")?;
    let rest = &text[at..];
    let pe = rest.find("\"point_estimate\":")? + "\"point_estimate\":".len();
    let num: String = rest[pe..]
        .chars()
        .skip_while(|c| c.is_whitespace())
        .take_while(|c| c.is_ascii_digit() || *c == '.' || *c == 'e' || *c == '-')
        .collect();
    num.parse().ok()
}

fn report_ratios() {
    println!("\n== host ring vs the raw spin floor (median round trip, same run) ==");
    for mode in ["threads", "procs"] {
        let floor = median_ns(&format!("roundtrip/floor_{mode}"));
        let ours = median_ns(&format!("roundtrip/gpuring_{mode}"));
        match (floor, ours) {
            (Some(f), Some(o)) => {
                println!("{mode:8} floor {f:8.0} ns  gpuring {o:8.0} ns  ratio {:.2}x", o / f)
            }
            _ => println!("{mode:8} (not measured in this run)"),
        }
    }
    for n in [1, 4] {
        for mode in ["threads", "procs"] {
            if let Some(ns) = median_ns(&format!("throughput/1to{n}/{mode}")) {
                println!("throughput 1->{n} {mode:8} {:8.2} M msgs/s per consumer", 1e3 / ns);
            }
        }
    }
}
