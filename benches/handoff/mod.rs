//! Cross-process host handoff cases shared by `benches/host.rs` and the peer benches in
//! `benches/peers/` (which include this file with `#[path]`), so that gpuring, the raw spin floor
//! and a peer are measured by the same loops in one run.
//!
//! Every case is a parent (the criterion process) and `n` children, which are this same binary
//! re-executed with [`ROLE`] set. [`run_child`] runs a child role; [`RoundTrip`] and
//! [`Throughput`] are the parent sides.
//!
//! - Round trip, 1→n: the parent writes a `size`-byte message; every child copies it into its own
//!   reply; the parent waits for all `n` replies. One iteration is one full round trip.
//! - Throughput, 1→n: the parent publishes `size`-byte messages (Block policy, so nothing is
//!   lost); every child receives each one and touches its first and last byte.

#![allow(dead_code)] // each including bench uses a different subset

use std::hint::spin_loop;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use gpuring::{Consumer, Policy, Producer, RecvError, StartAt};

/// Environment variable that turns a bench binary into a child: `ROLE:NAME:SIZE:INDEX`.
pub const ROLE: &str = "GPURING_BENCH_ROLE";
/// Payload sizes of the host benches.
pub const SIZES: [usize; 3] = [64, 4096, 1 << 20];
/// Fan-outs of the host benches.
pub const FANOUTS: [usize; 2] = [1, 4];

/// Depth of every round trip's channels, the same for each peer: a gpuring ring's capacity, an
/// iceoryx2 subscriber's buffer. 4 unless `GPURING_BENCH_DEPTH` says otherwise (children
/// inherit it).
pub fn roundtrip_depth() -> u32 {
    std::env::var("GPURING_BENCH_DEPTH").ok().and_then(|d| d.parse().ok()).unwrap_or(4)
}

/// Where each process of a case runs: `GPURING_BENCH_CPUS`, a comma-separated list of CPU
/// numbers, puts the parent on the first and child `i` on entry `i + 1` (wrapping). Unset, the
/// scheduler places them, and where two processes land (one core's hyperthreads, one socket or
/// two) changes a round trip's time; placed, every peer's case runs on the same cores. (On the
/// 16-core GPU machine, one socket without hyperthreads, it did not narrow the run-to-run
/// spread: docs/performance.md.)
pub fn bench_cpus() -> Vec<usize> {
    let list = std::env::var("GPURING_BENCH_CPUS").unwrap_or_default();
    list.split(',').filter(|c| !c.trim().is_empty()).map(|c| c.trim().parse().unwrap()).collect()
}

/// Runs the calling thread on CPU `which` of [`bench_cpus`] (0: the parent, `i + 1`: child
/// `i`), if a list is set.
pub fn place(which: usize) {
    let cpus = bench_cpus();
    if cpus.is_empty() {
        return;
    }
    let cpu = cpus[which % cpus.len()];
    // SAFETY: `set` is a plain bit mask, zeroed, then one bit set below its size; the call
    // reads it and changes only this thread's affinity.
    let rc = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
    };
    assert_eq!(rc, 0, "cannot run on CPU {cpu}: {}", std::io::Error::last_os_error());
}

/// The parent side of a case: `run(iters)` does `iters` round trips (or messages) and returns
/// the time they took.
pub trait Case {
    fn run(&mut self, iters: u64) -> Duration;
}

/// What [`ROLE`] holds, if this process is a child.
pub struct ChildArgs {
    pub role: String,
    pub name: String,
    pub size: usize,
    pub index: usize,
}

/// Parses [`ROLE`]; `None` in the parent.
pub fn child_args() -> Option<ChildArgs> {
    let v = std::env::var(ROLE).ok()?;
    let args = parse_role(&v)?;
    place(args.index + 1);
    Some(args)
}

fn parse_role(v: &str) -> Option<ChildArgs> {
    let mut it = v.splitn(4, ':');
    let role = it.next()?.to_string();
    let name = it.next()?.to_string();
    let size = it.next()?.parse().ok()?;
    let index = it.next()?.parse().ok()?;
    Some(ChildArgs { role, name, size, index })
}

/// Starts this binary again as child `index` with `role` on ring (or file) `name`.
pub fn spawn(role: &str, name: &str, size: usize, index: usize) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .env(ROLE, format!("{role}:{name}:{size}:{index}"))
        .stdin(Stdio::null())
        .spawn()
        .unwrap()
}

/// Waits for a child and fails loudly if it failed.
pub fn reap(mut child: Child) {
    let status = child.wait().unwrap();
    assert!(status.success(), "bench child failed: {status}");
}

/// A name unique to this process and case.
pub fn unique(tag: &str) -> String {
    format!("bench-{tag}-{}", std::process::id())
}

/// Runs the child roles defined here (`floor-echo`, `echo`, `sink`). Returns false for a role
/// it does not know (a peer bench's own role).
pub fn run_child(a: &ChildArgs) -> bool {
    match a.role.as_str() {
        "floor-echo" => {
            let map = FloorMap::open(&a.name);
            floor_echo(&map, a.index, a.size);
        }
        "echo" => {
            let mut tx = Producer::builder(&format!("{}-pong{}", a.name, a.index))
                .slot_size(a.size)
                .capacity(roundtrip_depth())
                .create()
                .unwrap();
            let rx = open_retry(&format!("{}-ping", a.name));
            echo(&rx, &mut tx);
        }
        "sink" => sink(&open_retry(&a.name)),
        _ => return false,
    }
    true
}

// ---- Floor: raw spin ping-pong over shared words and payload buffers --------------------------

/// A /dev/shm file: the ping word at 0, child `i`'s pong word at `128 * (i + 1)`, then page-
/// aligned payload buffers: the parent's, then one per child.
pub struct FloorMap {
    map: memmap2::MmapRaw,
    path: String,
    owner: bool,
}

const FLOOR_WORDS: usize = 4096;

impl FloorMap {
    fn len(n: usize, size: usize) -> usize {
        FLOOR_WORDS + (n + 1) * size.next_multiple_of(4096)
    }

    pub fn create(name: &str, n: usize, size: usize) -> FloorMap {
        let path = format!("/dev/shm/{name}");
        let f =
            std::fs::File::options().create_new(true).read(true).write(true).open(&path).unwrap();
        f.set_len(Self::len(n, size) as u64).unwrap();
        FloorMap { map: memmap2::MmapRaw::map_raw(&f).unwrap(), path, owner: true }
    }

    pub fn open(name: &str) -> FloorMap {
        let path = format!("/dev/shm/{name}");
        let f = std::fs::File::options().read(true).write(true).open(&path).unwrap();
        FloorMap { map: memmap2::MmapRaw::map_raw(&f).unwrap(), path, owner: false }
    }

    /// Word `i`: 0 is the ping, `i + 1` is child `i`'s pong.
    fn word(&self, i: usize) -> &AtomicU64 {
        assert!(128 * (i + 1) <= FLOOR_WORDS);
        // SAFETY: the map is at least FLOOR_WORDS bytes and page-aligned; offset 128 * i holds an
        // aligned u64 inside it, which AtomicU64 may view; every access to it is atomic.
        unsafe { &*(self.map.as_mut_ptr().add(128 * i) as *const AtomicU64) }
    }

    /// Payload buffer `i`: 0 is the parent's, `i + 1` is child `i`'s reply.
    fn buf(&self, i: usize, size: usize) -> *mut u8 {
        let off = FLOOR_WORDS + i * size.next_multiple_of(4096);
        assert!(off + size <= self.map.len());
        // SAFETY: in bounds of the map (checked above).
        unsafe { self.map.as_mut_ptr().add(off) }
    }
}

impl Drop for FloorMap {
    fn drop(&mut self) {
        if self.owner {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// One step of a floor wait: spin, and after 128 spins yield the core (as gpuring's waits do;
/// on a machine with fewer cores than processes a pure spin would wait out whole time slices).
fn relax(spins: &mut u32) {
    *spins += 1;
    if *spins < 128 {
        spin_loop();
    } else {
        thread::yield_now();
    }
}

fn floor_echo(map: &FloorMap, index: usize, size: usize) {
    let (ping, pong) = (map.word(0), map.word(index + 1));
    let mut last = 0;
    loop {
        let mut spins = 0;
        let v = loop {
            // Acquire: pairs with the parent's Release store; the payload is visible after it.
            let v = ping.load(Ordering::Acquire);
            if v != last {
                break v;
            }
            relax(&mut spins);
        };
        if v == u64::MAX {
            return;
        }
        last = v;
        // SAFETY: both buffers are `size` bytes inside the map and do not overlap; the parent
        // does not write buffer 0 until every child answered this ping (the protocol).
        unsafe { std::ptr::copy_nonoverlapping(map.buf(0, size), map.buf(index + 1, size), size) };
        // Release: the reply is visible before the pong.
        pong.store(v, Ordering::Release);
    }
}

/// The floor: the same messages and copies as a ring round trip, over two spinning words.
pub struct FloorRoundTrip {
    map: FloorMap,
    children: Vec<Child>,
    payload: Vec<u8>,
    next: u64,
}

impl FloorRoundTrip {
    pub fn new(n: usize, size: usize) -> FloorRoundTrip {
        let name = unique(&format!("floor{n}-{size}"));
        let map = FloorMap::create(&name, n, size);
        let children = (0..n).map(|i| spawn("floor-echo", &name, size, i)).collect();
        FloorRoundTrip { map, children, payload: vec![7u8; size], next: 1 }
    }
}

impl Case for FloorRoundTrip {
    fn run(&mut self, iters: u64) -> Duration {
        let (n, size) = (self.children.len(), self.payload.len());
        let t = Instant::now();
        for i in self.next..self.next + iters {
            // SAFETY: buffer 0 is `size` bytes inside the map; every child answered the previous
            // ping, so none reads it now.
            unsafe {
                std::ptr::copy_nonoverlapping(self.payload.as_ptr(), self.map.buf(0, size), size)
            };
            // Release: the payload is visible before the ping.
            self.map.word(0).store(i, Ordering::Release);
            for c in 0..n {
                let mut spins = 0;
                // Acquire: the child's reply is visible after its pong.
                while self.map.word(c + 1).load(Ordering::Acquire) != i {
                    relax(&mut spins);
                }
                // SAFETY: child c's buffer, complete (its pong was seen).
                std::hint::black_box(unsafe { *self.map.buf(c + 1, size) });
            }
        }
        self.next += iters;
        t.elapsed()
    }
}

impl Drop for FloorRoundTrip {
    fn drop(&mut self) {
        // Release: nothing to publish; MAX tells the children to stop.
        self.map.word(0).store(u64::MAX, Ordering::Release);
        self.children.drain(..).for_each(reap);
    }
}

// ---- gpuring ---------------------------------------------------------------------------------

/// Opens ring `name`, retrying while its producer is still starting.
pub fn open_retry(name: &str) -> Consumer {
    let b = Consumer::builder(name).start_at(StartAt::Next);
    b.open_timeout(Duration::from_secs(10)).unwrap_or_else(|e| panic!("{e}"))
}

fn wait_consumers(tx: &Producer, n: usize) {
    let t = Instant::now();
    while tx.consumer_count() < n {
        assert!(t.elapsed().as_secs() < 10, "bench children did not join");
        thread::sleep(Duration::from_millis(1));
    }
}

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
            Ok(m) => sum = sum.wrapping_add(m[0] as u64 + m[m.len() - 1] as u64),
            Err(RecvError::Disconnected) => break,
            Err(e) => panic!("{e}"),
        }
    }
    std::hint::black_box(sum);
}

/// gpuring round trip: a ping ring to `n` echo children, each answering on its own pong ring.
pub struct RingRoundTrip {
    ping: Option<Producer>,
    pongs: Vec<Consumer>,
    children: Vec<Child>,
    payload: Vec<u8>,
}

impl RingRoundTrip {
    pub fn new(n: usize, size: usize) -> RingRoundTrip {
        let name = unique(&format!("rt{n}-{size}"));
        let ping = Producer::builder(&format!("{name}-ping"))
            .slot_size(size)
            .capacity(roundtrip_depth())
            .create()
            .unwrap();
        let children = (0..n).map(|i| spawn("echo", &name, size, i)).collect();
        let pongs = (0..n).map(|i| open_retry(&format!("{name}-pong{i}"))).collect();
        wait_consumers(&ping, n);
        RingRoundTrip { ping: Some(ping), pongs, children, payload: vec![7u8; size] }
    }
}

impl Case for RingRoundTrip {
    fn run(&mut self, iters: u64) -> Duration {
        let ping = self.ping.as_mut().unwrap();
        let t = Instant::now();
        for _ in 0..iters {
            ping.send(&self.payload, b"").unwrap();
            for rx in &self.pongs {
                let m = rx.recv().unwrap();
                std::hint::black_box(m[0]);
            }
        }
        t.elapsed()
    }
}

impl Drop for RingRoundTrip {
    fn drop(&mut self) {
        self.ping = None; // the children see Disconnected and exit
        self.children.drain(..).for_each(reap);
    }
}

/// Ring capacity of the throughput case: 64 slots, but no more than 8 MiB of them, so that
/// large messages cycle through memory that stays in cache (a ring visits every slot in turn; a
/// 64 MiB ring of 1 MiB slots would measure DRAM, not the handoff).
pub fn throughput_capacity(size: usize) -> u32 {
    (8usize << 20).div_ceil(size).clamp(4, 64) as u32
}

/// gpuring throughput: `n` sink children on one Block ring of [`throughput_capacity`] slots.
pub struct RingThroughput {
    tx: Option<Producer>,
    children: Vec<Child>,
    payload: Vec<u8>,
}

impl RingThroughput {
    pub fn new(n: usize, size: usize) -> RingThroughput {
        let name = unique(&format!("tp{n}-{size}"));
        let tx = Producer::builder(&name)
            .capacity(throughput_capacity(size))
            .slot_size(size)
            .policy(Policy::Block)
            .create()
            .unwrap();
        let children = (0..n).map(|i| spawn("sink", &name, size, i)).collect();
        wait_consumers(&tx, n);
        RingThroughput { tx: Some(tx), children, payload: vec![7u8; size] }
    }
}

impl Case for RingThroughput {
    fn run(&mut self, iters: u64) -> Duration {
        let tx = self.tx.as_mut().unwrap();
        let t = Instant::now();
        for i in 0..iters {
            let mut slot = tx.acquire().unwrap();
            let len = self.payload.len();
            slot[..len].copy_from_slice(&self.payload);
            slot[0] = i as u8;
            slot.publish(len, b"").unwrap();
        }
        t.elapsed()
    }
}

impl Drop for RingThroughput {
    fn drop(&mut self) {
        self.tx = None;
        self.children.drain(..).for_each(reap);
    }
}

/// gpuring's own CPU cost: a producer and a consumer in one thread, `send` then `recv` of one
/// message. Nothing crosses a core, so this is the protocol's work per message with warm caches;
/// a cross-process round trip is two messages plus the cache-line transfers between cores.
pub struct RingSameThread {
    tx: Producer,
    rx: Consumer,
    payload: Vec<u8>,
}

impl RingSameThread {
    pub fn new(size: usize) -> RingSameThread {
        let name = unique(&format!("same-{size}"));
        let tx = Producer::builder(&name).slot_size(size).capacity(4).create().unwrap();
        let rx = Consumer::builder(&name).start_at(StartAt::Next).open().unwrap();
        RingSameThread { tx, rx, payload: vec![7u8; size] }
    }
}

impl Case for RingSameThread {
    fn run(&mut self, iters: u64) -> Duration {
        let t = Instant::now();
        for _ in 0..iters {
            self.tx.send(&self.payload, b"").unwrap();
            let m = self.rx.recv().unwrap();
            std::hint::black_box(m[0]);
        }
        t.elapsed()
    }
}

// ---- Criterion ------------------------------------------------------------------------------

/// The criterion settings every host handoff bench uses (command-line flags still apply).
pub fn criterion() -> criterion::Criterion {
    place(0);
    criterion::Criterion::default()
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(2))
        .configure_from_args()
}

/// Benchmarks `case` as `name/label` in group `g`.
pub fn bench<M: criterion::measurement::Measurement<Value = Duration>>(
    g: &mut criterion::BenchmarkGroup<'_, M>,
    name: &str,
    label: &str,
    mut case: impl Case,
) {
    let id = criterion::BenchmarkId::new(name, label);
    g.bench_function(id, |b| b.iter_custom(|iters| case.run(iters)));
}

// ---- Reading criterion's results -------------------------------------------------------------

/// Criterion's point estimate of the median, in ns, for benchmark `id` (its folder path under
/// `target/criterion`, with `/` between group, function and parameter).
pub fn median_ns(id: &str) -> Option<f64> {
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

/// A size as criterion's parameter and a table label: `64B`, `4KiB`, `1MiB`.
pub fn size_label(size: usize) -> String {
    match size {
        s if s >= 1 << 20 && s % (1 << 20) == 0 => format!("{}MiB", s >> 20),
        s if s >= 1 << 10 && s % (1 << 10) == 0 => format!("{}KiB", s >> 10),
        s => format!("{s}B"),
    }
}
