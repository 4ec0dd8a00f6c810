//! The commands: list, inspect and remove rings, and a quick bench.
//!
//! ```text
//! gpuring [--dir DIR] COMMAND ...       (every command; default $GPURING_DIR, else /dev/shm)
//! gpuring list [--json]
//! gpuring stat NAME [--watch] [--json]
//! gpuring rm NAME [--force] [--json]
//! gpuring doctor [--json] [--quick]
//! gpuring bench [--memory auto|host|cuda] [--consumers N] [--size BYTES] [--seconds S]
//!               [--capacity N] [--spares N] [--policy block|overwrite]
//!               [--mode lossless|queue|latest] [--slow-hold-ms MS] [--json]
//! ```
//!
//! Errors are one line on stderr and exit status 1.

use std::process::ExitCode;

use crate::bench;
use crate::doctor;
use crate::exporter;
use std::thread;
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};
use gpuring::inspect::{self, BlockedOn, RemoveError, RingStatus};
use gpuring::{MemoryKind, Mode, Policy};
use serde::Serialize;

#[derive(Parser)]
#[command(name = "gpuring", version, about = "List, inspect and remove gpuring rings")]
struct Cli {
    /// The ring directory: where rings and their sockets live. Default: $GPURING_DIR, else
    /// /dev/shm. Containers that share a directory (a volume) pass it here on both sides.
    #[arg(long, global = true, value_name = "DIR")]
    dir: Option<std::path::PathBuf>,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Every ring in the ring directory: memory, capacity, slot size, policy, producer,
    /// consumers.
    List {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// One ring's counters: published messages and rate, producer blocked time, buffers held,
    /// and per consumer its pid, mode, liveness, lag, received, lost and what it holds.
    Stat {
        /// The ring's name (as given to `Producer::builder`).
        name: String,
        /// Refresh in place once a second until interrupted.
        #[arg(long)]
        watch: bool,
        /// Print JSON instead of text (with --watch: one object per line).
        #[arg(long)]
        json: bool,
    },
    /// Remove a ring's file (and its sockets) from the ring directory. Refused while its
    /// producer is alive, in whatever container it runs.
    Rm {
        /// The ring's name.
        name: String,
        /// Remove it even though its producer is alive (or its segment unreadable).
        #[arg(long)]
        force: bool,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// A quick self-contained 1 -> N run (consumers are child processes): frames/s and
    /// publish -> recv latency per consumer; every byte is checked.
    Bench(bench::Options),
    /// Why this setup is slow or broken: CUDA driver, GPUs, MPS (and a measured handoff),
    /// /dev/shm, namespaces, memlock, peer access, stale rings; each with a verdict and a fix.
    Doctor(doctor::Options),
    /// Batch K camera rings into one ring of `[K, frame...]` tensors, until SIGINT or SIGTERM
    /// (docs/batching.md).
    Batch(crate::batch::Options),
    /// Serve Prometheus metrics of every ring (or of NAMES) at http://ADDR/metrics.
    Exporter(exporter::Options),
    /// Carry a ring to other hosts over Zenoh: export a ring, or import a key into a ring.
    #[cfg(feature = "zenoh")]
    #[command(subcommand)]
    Bridge(crate::bridge::Options),
    /// The echo process of `doctor`'s handoff measurement (started by it).
    #[command(hide = true)]
    DoctorEcho(doctor::EchoOptions),
    /// A consumer process of `bench` (started by it).
    #[command(hide = true)]
    BenchConsumer {
        name: String,
        #[arg(long)]
        memory: String,
        /// Hold each message this long (ms) before releasing it.
        #[arg(long, default_value_t = 0)]
        hold_ms: u64,
        /// Delivery mode (default: the ring's policy's).
        #[arg(long, value_parser = parse_mode)]
        mode: Option<Mode>,
    },
}

/// What `list` and `stat` print as JSON.
#[derive(Serialize)]
struct RingJson {
    name: String,
    /// The ring directory, as this process sees it.
    dir: String,
    memory: &'static str,
    capacity: u32,
    spares: u32,
    held_buffers: usize,
    slot_size: u64,
    user_header_size: u32,
    max_consumers: u32,
    policy: &'static str,
    producer_pid: u32,
    producer_alive: bool,
    /// The kinds of namespace the producer runs in apart from us ("pid", "network", ...).
    producer_elsewhere: Vec<String>,
    closed: bool,
    /// The producer closed the ring because its GPU context was lost.
    context_lost: bool,
    epoch: u64,
    published: u64,
    /// Messages per second over the sampling interval (`stat` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    rate: Option<f64>,
    blocked_ns: u64,
    /// Share of the sampling interval the producer spent blocked (`stat` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    blocked_share: Option<f64>,
    /// The producer's wait going on now (null when it is not waiting).
    blocked_now: Option<BlockedNowJson>,
    /// Consumers evicted for a failure attributable to their own entry.
    evictions: u64,
    /// Dead consumers whose entries and slots the producer took back.
    reclaims: u64,
    /// CUDA rings: "legacy" or "vmm" (null for host rings).
    sharing: Option<&'static str>,
    /// CUDA rings: "events" or "memory" (null for host rings).
    fence: Option<&'static str>,
    consumers: Vec<ConsumerJson>,
}

#[derive(Serialize)]
struct BlockedNowJson {
    /// Seconds it has waited so far.
    seconds: f64,
    /// "consumers" (a lossless consumer is behind) or "held" (consumers hold the buffers).
    on: &'static str,
    /// The consumer it waits on: its entry and pid.
    entry: Option<usize>,
    pid: Option<u32>,
}

#[derive(Serialize)]
struct ConsumerJson {
    index: usize,
    pid: u32,
    /// lossless, queue or latest ("invalid" for a damaged entry).
    mode: &'static str,
    alive: bool,
    lag: u64,
    received: u64,
    lost: u64,
    holding: u64,
    /// The oldest message it holds (what a producer waiting for a buffer waits on).
    oldest_held: Option<u64>,
    parked: bool,
    evicted: bool,
}

fn memory_name(m: MemoryKind) -> &'static str {
    match m {
        MemoryKind::Host => "host",
        MemoryKind::Cuda => "cuda",
    }
}

fn mode_name(m: Option<Mode>) -> &'static str {
    m.map_or("invalid", Mode::name)
}

fn to_json(s: &RingStatus, rate: Option<f64>, blocked_share: Option<f64>) -> RingJson {
    RingJson {
        name: s.name.clone(),
        dir: s.dir.display().to_string(),
        memory: memory_name(s.memory),
        capacity: s.capacity,
        spares: s.spares,
        held_buffers: s.held_buffers,
        slot_size: s.slot_size,
        user_header_size: s.user_header_size,
        max_consumers: s.max_consumers,
        policy: s.policy.name(),
        producer_pid: s.producer_pid,
        producer_alive: s.producer_alive,
        producer_elsewhere: s.producer_elsewhere().iter().map(|k| k.to_string()).collect(),
        closed: s.closed,
        context_lost: s.context_lost,
        epoch: s.epoch,
        published: s.published,
        rate,
        blocked_ns: s.blocked_ns,
        blocked_share,
        blocked_now: s.blocked_now.as_ref().map(|b| BlockedNowJson {
            seconds: b.for_ns as f64 / 1e9,
            on: match b.on {
                BlockedOn::Consumers => "consumers",
                BlockedOn::Held => "held",
            },
            entry: b.waiting_on.map(|w| w.0),
            pid: b.waiting_on.map(|w| w.1),
        }),
        evictions: s.evictions,
        reclaims: s.reclaims,
        sharing: s.cuda.map(|c| c.sharing),
        fence: s.cuda.map(|c| c.fence),
        consumers: s
            .consumers
            .iter()
            .map(|c| ConsumerJson {
                index: c.index,
                pid: c.pid,
                mode: mode_name(c.mode),
                alive: c.alive,
                lag: c.lag,
                received: c.received,
                lost: c.lost,
                holding: c.holding,
                oldest_held: c.oldest_held,
                parked: c.parked,
                evicted: c.evicted,
            })
            .collect(),
    }
}

fn bytes(n: u64) -> String {
    match n {
        n if n >= 1 << 30 && n % (1 << 30) == 0 => format!("{} GiB", n >> 30),
        n if n >= 1 << 20 => format!("{:.1} MiB", n as f64 / (1 << 20) as f64),
        n if n >= 1 << 10 => format!("{:.1} KiB", n as f64 / 1024.0),
        n => format!("{n} B"),
    }
}

fn producer_state(s: &RingStatus) -> &'static str {
    match (s.closed, s.producer_alive) {
        (true, _) if s.context_lost => "closed: its GPU context was lost (restart it)",
        (true, _) => "closed",
        (false, true) => "alive",
        (false, false) => "dead",
    }
}

fn list(json: bool) -> Result<(), String> {
    let dir = gpuring::shm::default_dir();
    let names = inspect::ring_names().map_err(|e| format!("reading {}: {e}", dir.display()))?;
    let mut rings = Vec::new();
    let mut unreadable = Vec::new();
    for name in names {
        match inspect::status(&name) {
            Ok(s) => rings.push(s),
            Err(e) => unreadable.push((name, e.to_string())),
        }
    }
    if json {
        let out: Vec<RingJson> = rings.iter().map(|s| to_json(s, None, None)).collect();
        println!("{}", serde_json::to_string_pretty(&out).map_err(|e| e.to_string())?);
    } else {
        println!(
            "{:<24} {:<6} {:>8} {:>11} {:<10} {:>8} {:<7} {:>9}",
            "NAME", "MEMORY", "CAPACITY", "SLOT", "POLICY", "PRODUCER", "STATE", "CONSUMERS"
        );
        for s in &rings {
            println!(
                "{:<24} {:<6} {:>8} {:>11} {:<10} {:>8} {:<7} {:>9}",
                s.name,
                memory_name(s.memory),
                s.capacity,
                bytes(s.slot_size),
                s.policy.name(),
                s.producer_pid,
                producer_state(s),
                s.consumers.len()
            );
        }
    }
    for (name, why) in unreadable {
        eprintln!("gpuring: {name}: {why}");
    }
    Ok(())
}

/// Prints one `stat` frame: `now` against `before` (taken `dt` earlier) for rates.
fn print_stat(
    now: &RingStatus,
    before: &RingStatus,
    dt: Duration,
    json: bool,
) -> Result<(), String> {
    let secs = dt.as_secs_f64().max(1e-9);
    let rate = now.published.saturating_sub(before.published) as f64 / secs;
    let blocked = now.blocked_ns.saturating_sub(before.blocked_ns) as f64 / 1e9 / secs;
    let batch = gpuring::batch::BatchStatus::read(&now.dir, &now.name)
        .map_err(|e| format!("ring {}'s batch status: {e}", now.name))?;
    if json {
        let j = to_json(now, Some(rate), Some(blocked.min(1.0)));
        let mut j = serde_json::to_value(&j).map_err(|e| e.to_string())?;
        if let Some(b) = &batch {
            j["batch"] = batch_json(b);
        }
        println!("{}", serde_json::to_string(&j).map_err(|e| e.to_string())?);
        return Ok(());
    }
    println!(
        "ring {}: {} memory, {} slots + {} spares of {}, {}, producer pid {} ({}), epoch {:#x}",
        now.name,
        memory_name(now.memory),
        now.capacity,
        now.spares,
        bytes(now.slot_size),
        now.policy.name(),
        now.producer_pid,
        producer_state(now),
        now.epoch
    );
    if let Some(c) = now.cuda {
        println!(
            "CUDA: {} sharing, {} fences (docs/containers.md says where each works)",
            c.sharing, c.fence
        );
    }
    let elsewhere = now.producer_elsewhere();
    if !elsewhere.is_empty() {
        println!(
            "the producer runs {} (its pid is its own namespace's; liveness is its lock on the \
             ring's file)",
            gpuring::shm::ns::describe(&elsewhere)
        );
    }
    println!(
        "published {} ({:.0}/s), producer blocked {:.1} % of the time ({:.3} s in all)",
        now.published,
        rate,
        100.0 * blocked.min(1.0),
        now.blocked_ns as f64 / 1e9
    );
    if let Some(b) = &now.blocked_now {
        let who = b
            .waiting_on
            .map_or_else(String::new, |(e, pid)| format!(", waiting on entry {e} (pid {pid})"));
        println!(
            "producer blocked now, for {:.3} s, on {}{who}",
            b.for_ns as f64 / 1e9,
            b.on.name()
        );
    }
    println!(
        "buffers held {} of {} (the producer waits when consumers hold every spare), \
         dead consumers reclaimed {}, consumers evicted {}",
        now.held_buffers,
        now.capacity + now.spares,
        now.reclaims,
        now.evictions
    );
    println!(
        "{:>5} {:>8} {:<8} {:<5} {:>8} {:>12} {:>9} {:>10} {:>5} {:>12}  WAIT",
        "ENTRY", "PID", "MODE", "ALIVE", "LAG", "RECEIVED", "RATE/S", "LOST", "HELD", "OLDEST HELD"
    );
    for c in &now.consumers {
        let prev = before.consumers.iter().find(|p| p.index == c.index && p.pid == c.pid);
        let rate_c = prev.map_or(0.0, |p| c.received.saturating_sub(p.received) as f64 / secs);
        let oldest = c.oldest_held.map_or_else(|| "-".to_owned(), |s| format!("#{s}"));
        println!(
            "{:>5} {:>8} {:<8} {:<5} {:>8} {:>12} {:>9.0} {:>10} {:>5} {:>12}  {}",
            c.index,
            c.pid,
            mode_name(c.mode),
            if c.alive { "yes" } else { "no" },
            c.lag,
            c.received,
            rate_c,
            c.lost,
            c.holding,
            oldest,
            if c.evicted {
                "EVICTED"
            } else if c.parked {
                "async"
            } else {
                "-"
            }
        );
    }
    if now.consumers.is_empty() {
        println!("(no consumers)");
    }
    if let Some(b) = &batch {
        print_batch(b);
    }
    Ok(())
}

/// A batcher's cameras (`gpuring batch`), from its status file.
fn print_batch(b: &gpuring::batch::BatchStatus) {
    let age = gpuring::monotonic_ns().saturating_sub(b.updated_ns) as f64 / 1e9;
    println!(
        "batches of {} cameras: {} published, as of {age:.1} s ago",
        b.inputs.len(),
        b.batches
    );
    println!(
        "{:>6} {:<24} {:<8} {:>18} {:>10} {:>9} {:>9} {:>9} {:>9}",
        "CAMERA", "RING", "STATE", "EPOCH", "SEQ", "PRESENT", "STALE", "ABSENT", "REFUSED"
    );
    for (k, i) in b.inputs.iter().enumerate() {
        let [p, s, a, r] = i.counts;
        println!(
            "{k:>6} {:<24} {:<8} {:>#18x} {:>10} {p:>9} {s:>9} {a:>9} {r:>9}",
            i.ring,
            i.state.name(),
            i.epoch,
            i.seq
        );
    }
}

/// The same as JSON.
fn batch_json(b: &gpuring::batch::BatchStatus) -> serde_json::Value {
    let inputs: Vec<_> = b
        .inputs
        .iter()
        .map(|i| {
            serde_json::json!({
                "ring": i.ring, "state": i.state.name(), "epoch": i.epoch, "seq": i.seq,
                "timestamp_ns": i.timestamp_ns, "present": i.counts[0], "stale": i.counts[1],
                "absent": i.counts[2], "refused": i.counts[3],
            })
        })
        .collect();
    serde_json::json!({ "batches": b.batches, "updated_ns": b.updated_ns, "cameras": inputs })
}

fn stat(name: &str, watch: bool, json: bool) -> Result<(), String> {
    let read = || inspect::status(name).map_err(|e| e.to_string());
    let mut before = read()?;
    let mut t = Instant::now();
    let interval = if watch { Duration::from_secs(1) } else { Duration::from_millis(250) };
    loop {
        thread::sleep(interval);
        let now = read()?;
        let dt = t.elapsed();
        t = Instant::now();
        if watch && !json {
            // Home the cursor and clear the screen: the frame is redrawn in place.
            print!("\x1b[H\x1b[2J");
        }
        print_stat(&now, &before, dt, json)?;
        if !watch {
            return Ok(());
        }
        before = now;
    }
}

fn rm(name: &str, force: bool, json: bool) -> Result<(), String> {
    inspect::remove(name, force).map_err(|e| match e {
        RemoveError::NotFound => {
            format!("no ring named {name:?} in {}", gpuring::shm::default_dir().display())
        }
        RemoveError::Open(e) => e.to_string(),
        e => format!("ring {name:?}: {e}"),
    })?;
    if json {
        println!("{}", serde_json::json!({ "removed": name }));
    } else {
        println!("removed {name}");
    }
    Ok(())
}

/// `--mode`: lossless, queue or latest.
pub(crate) fn parse_mode(s: &str) -> Result<Mode, String> {
    Mode::from_name(s).ok_or_else(|| format!("{s}: expected lossless, queue or latest"))
}

/// What a command that runs until SIGINT or SIGTERM (`batch`, `bridge`) does first: print the
/// library's `tracing` events on stderr (filtered by RUST_LOG, default `gpuring=info`) and
/// install the handler whose flag those signals raise. `Err`: the exit status, the reason
/// printed (`who` names the command).
pub(crate) fn serve(who: &str) -> Result<&'static std::sync::atomic::AtomicBool, ExitCode> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("gpuring=info")),
        )
        .with_writer(std::io::stderr)
        .init();
    gpuring::service::Shutdown::install().map(|s| s.flag()).map_err(|e| {
        eprintln!("{who}: cannot handle SIGINT and SIGTERM: {e}");
        ExitCode::FAILURE
    })
}

/// `--policy`: block or overwrite.
pub(crate) fn parse_policy(s: &str) -> Result<Policy, String> {
    Policy::from_name(s).ok_or_else(|| format!("{s}: expected block or overwrite"))
}

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Some(dir) = &cli.dir {
        // Before any thread starts: the library's default ring directory, for this process and
        // the processes it starts (bench consumers, doctor's echo).
        std::env::set_var(gpuring::shm::DIR_ENV, dir);
    }
    let result = match cli.cmd {
        Cmd::List { json } => list(json),
        Cmd::Stat { name, watch, json } => stat(&name, watch, json),
        Cmd::Rm { name, force, json } => rm(&name, force, json),
        Cmd::Bench(o) => bench::run(&o),
        Cmd::Doctor(o) => return doctor::run(&o),
        Cmd::Exporter(o) => return exporter::run(&o),
        Cmd::Batch(o) => return crate::batch::run(&o),
        #[cfg(feature = "zenoh")]
        Cmd::Bridge(o) => return crate::bridge::run(&o),
        Cmd::DoctorEcho(o) => doctor::echo(&o),
        Cmd::BenchConsumer { name, memory, hold_ms, mode } => {
            bench::consumer(&name, &memory, Duration::from_millis(hold_ms), mode)
        }
    };
    // The rings are dropped by now: `exit` waits for our GPU work, and exits 75 if the GPU
    // context was lost (docs/gpu.md), so that a supervisor restarts the command.
    gpuring::service::exit("gpuring", result)
}
