//! GPU bench: gpuring's CUDA ring against floors measured in the same run. Built as the example
//! `gpu_bench` (see Cargo.toml for why not a `[[bench]]`).
//!
//! Run on a machine with a CUDA GPU (see docs/performance.md for MPS and the full command):
//!
//! ```text
//! cargo run --release --features test-support --example gpu_bench -- --label mps-off --json gpu.json --md gpu.md
//! target/gpu-bundle/bin/gpu_bench --label mps-on ...  (the same bench as an example, shipped by
//!                                                      ../shared/gpu-bundle)
//! ```
//!
//! It measures, in order:
//! 1. floors: `%globaltimer` step, D2D copy bandwidth (the roofline), the bench kernels' own
//!    bandwidth, and a raw CUDA IPC handoff (no ring) per frame size;
//! 2. paced 1→1 latency through a one-slot ring (the ring's version of the raw handoff);
//! 3. the matrix: consumers × frame sizes × policies, each consumer a process reading every byte.
//!
//! `--compare-sharing` runs instead a paced comparison of the two sharing modes (legacy IPC
//! against VMM) over the consumer counts and frame sizes given, and prints their ratios.
//! `--peers` measures consumers on a second GPU (benches/gpu/peers.rs).
//!
//! Consumer processes are this binary again, with `GPURING_GPU_BENCH_ROLE` set.

mod floors;
// The size parser of the `gpuring` command, so both read "64K" and "8M" alike.
mod kernels;
mod peers;
mod report;
mod ring;
mod sharing;
#[path = "../../src/bin/gpuring/size.rs"]
mod size;
mod trace;

use std::collections::HashMap;
use std::io::Read;
use std::process::Child;
use std::time::Duration;

use clap::Parser;
use gpuring::cuda::{Context, Stream};
use gpuring::Policy;
use size::parse_size;

/// `ROLE:NAME:SIZE:INDEX` in a child process.
pub const ROLE: &str = "GPURING_GPU_BENCH_ROLE";

#[derive(Parser, Debug, Clone)]
#[command(about = "gpuring GPU bench: ring vs D2D and raw CUDA IPC floors")]
pub struct Opts {
    /// Consumer counts of the matrix.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8")]
    consumers: Vec<usize>,
    /// Frame sizes of the matrix (K and M suffixes: KiB, MiB).
    #[arg(long, value_delimiter = ',', default_value = "64K,1M,8M,32M", value_parser = parse_size)]
    sizes: Vec<usize>,
    /// Policies of the matrix.
    #[arg(long, value_delimiter = ',', default_value = "block,overwrite")]
    policies: Vec<String>,
    /// Ring capacity of the matrix.
    #[arg(long, default_value_t = 8)]
    capacity: u32,
    /// Measured seconds per cell.
    #[arg(long, default_value = "1.0", value_parser = parse_secs)]
    seconds: Duration,
    /// Warm-up seconds per cell.
    #[arg(long, default_value = "0.3", value_parser = parse_secs)]
    warmup: Duration,
    /// CUDA device.
    #[arg(long, default_value_t = 0)]
    device: i32,
    /// A label for this run (for example `mps-on`), kept in the JSON and the table title.
    #[arg(long, default_value = "")]
    label: String,
    /// Write the results as JSON here.
    #[arg(long)]
    json: Option<String>,
    /// Write the markdown tables here.
    #[arg(long)]
    md: Option<String>,
    /// Skip the matrix (floors and latency only).
    #[arg(long)]
    no_matrix: bool,
    /// Skip the floors and the latency rows (the matrix only).
    #[arg(long)]
    no_floors: bool,
    /// The rings' `gpu_poll` window, producer and consumers, in µs (default: the library's).
    #[arg(long, value_parser = parse_us)]
    gpu_poll: Option<Duration>,
    /// The rings' fence: `auto` (the library's default), `events` or `memory`.
    #[arg(long, default_value = "auto")]
    fence: String,
    /// How the rings share their memory: `legacy` (IPC handles; `--fence` picks events
    /// or memory words, or lets the library pick) or `vmm` (fds, memory-word fences).
    #[arg(long, default_value = "legacy")]
    sharing: String,
    /// Compare the sharing modes (paced, legacy then VMM per cell, as ratios) instead of the
    /// floors and the matrix.
    #[arg(long)]
    compare_sharing: bool,
    /// The devices the consumers read on, in turn (consumer i on the i-th modulo their
    /// number); default: all on `--device`. A device other than the ring's reads its memory
    /// across the link (peer access).
    #[arg(long, value_delimiter = ',')]
    consumer_devices: Vec<i32>,
    /// Measure consumers on a second GPU instead (needs two GPUs with peer access): GB/s a GPU
    /// 1 consumer reads from a GPU 0 ring against the peer-copy floor, and frames/s 1→4 with
    /// two consumers on each GPU.
    #[arg(long)]
    peers: bool,
}

fn parse_us(s: &str) -> Result<Duration, String> {
    s.parse::<f64>().map(|us| Duration::from_secs_f64(us / 1e6)).map_err(|e| format!("µs {s}: {e}"))
}

fn parse_secs(s: &str) -> Result<Duration, String> {
    s.parse::<f64>().map(Duration::from_secs_f64).map_err(|e| format!("seconds {s}: {e}"))
}

/// Reads a child's `RESULT k=v ...` line and waits for it; panics if it failed.
pub fn child_result(mut child: Child) -> HashMap<String, f64> {
    let mut out = String::new();
    child.stdout.take().unwrap().read_to_string(&mut out).unwrap();
    let status = child.wait().unwrap();
    assert!(status.success(), "bench child failed: {status}");
    let line = out.lines().find(|l| l.starts_with("RESULT ")).expect("child printed no RESULT");
    line[7..]
        .split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.parse().unwrap()))
        .collect()
}

fn print_result(r: HashMap<&'static str, f64>) {
    let kv: Vec<String> = r.iter().map(|(k, v)| format!("{k}={v}")).collect();
    println!("RESULT {}", kv.join(" "));
}

fn main() {
    if let Ok(role) = std::env::var(ROLE) {
        let parts: Vec<&str> = role.splitn(4, ':').collect();
        let (name, size) = (parts[1], parts[2].parse().unwrap());
        let device = std::env::var("GPURING_GPU_BENCH_DEVICE").map_or(0, |d| d.parse().unwrap());
        match parts[0] {
            "consumer" => print_result(ring::consumer(name, size, device)),
            "launcher" => print_result(floors::launcher(name.parse().unwrap(), size, device)),
            "raw-consumer" => {
                let fence = floors::Fence::from_index(parts[3]);
                print_result(floors::raw_consumer(name, size, fence, device))
            }
            r => panic!("unknown role {r}"),
        }
        return;
    }
    let o = Opts::parse();
    std::env::set_var("GPURING_GPU_BENCH_DEVICE", o.device.to_string());
    if let Some(p) = o.gpu_poll {
        std::env::set_var("GPURING_GPU_BENCH_POLL_NS", p.as_nanos().to_string());
    }
    if let Err(e) = gpuring::cuda::driver::available() {
        eprintln!("gpu bench: no usable CUDA driver ({e}); nothing measured");
        std::process::exit(2);
    }
    let ctx = Context::new(o.device).unwrap();
    ctx.make_current().unwrap(); // the raw driver calls below run in it
    let stream = Stream::new(&ctx).unwrap();
    let k = kernels::Kernels::load(&ctx, &stream);
    let mut rep = report::Report::new(&o);
    if o.fence == "auto" {
        // What `Fence::Auto` picks on this device, as the library decides it.
        let words = o.sharing == "vmm" || floors::mem_ops_supported(&ctx);
        rep.fence = format!("auto ({})", if words { "memory" } else { "events" });
    }

    rep.timer_step = k.timer_step(&stream);
    if o.peers {
        let md = peers::run(&o, &ctx, &k);
        println!("{md}");
        if let Some(path) = &o.md {
            std::fs::write(path, &md).unwrap();
        }
        return;
    }
    if o.compare_sharing {
        let md = sharing::compare(&o, &k);
        println!("{md}");
        if let Some(path) = &o.md {
            std::fs::write(path, &md).unwrap();
        }
        return;
    }
    if !o.no_floors {
        floors_and_latency(&o, &ctx, &stream, &k, &mut rep);
    }
    if !o.no_matrix {
        matrix(&o, &k, &mut rep);
    }
    let md = rep.markdown();
    println!("{md}");
    if let Some(path) = &o.md {
        std::fs::write(path, &md).unwrap();
    }
    if let Some(path) = &o.json {
        std::fs::write(path, rep.json()).unwrap();
    }
}

/// The rings' fence for this run.
pub fn fence(o: &Opts) -> gpuring::Fence {
    gpuring::Fence::from_name(&o.fence)
        .unwrap_or_else(|| panic!("unknown fence {} (auto, events or memory)", o.fence))
}

/// The rings' sharing for this run.
pub fn sharing(o: &Opts) -> gpuring::Sharing {
    gpuring::Sharing::from_name(&o.sharing)
        .unwrap_or_else(|| panic!("unknown sharing {} (legacy or vmm)", o.sharing))
}

/// The producer's and consumers' `gpu_poll` for this run.
pub fn gpu_poll() -> Duration {
    std::env::var("GPURING_GPU_BENCH_POLL_NS")
        .map_or(gpuring::DEFAULT_GPU_POLL, |ns| Duration::from_nanos(ns.parse().unwrap()))
}

fn floors_and_latency(
    o: &Opts,
    ctx: &std::sync::Arc<Context>,
    stream: &Stream,
    k: &kernels::Kernels,
    rep: &mut report::Report,
) {
    rep.d2d = floors::d2d_bandwidth(ctx, stream);
    (rep.fill_bw, rep.read_bw) = floors::kernel_bandwidth(ctx, stream, k);
    eprintln!(
        "floors: timer step {} ns, D2D {:.0} GB/s, fill {:.0} GB/s, read {:.0} GB/s",
        rep.timer_step,
        rep.d2d / 1e9,
        rep.fill_bw / 1e9,
        rep.read_bw / 1e9
    );
    rep.calls = floors::call_costs(ctx, stream, k);
    if floors::mem_ops_supported(ctx) {
        rep.stream_ops = floors::stream_op_costs(ctx, k);
    }
    for (call, ns) in &rep.calls {
        eprintln!("call {call}: {ns:.0} ns");
    }
    let mem_ops = floors::mem_ops_supported(ctx);
    for &size in &o.sizes {
        let raw = floors::raw_ipc(o, ctx, k, size, floors::Fence::Event);
        let memop = mem_ops.then(|| floors::raw_ipc(o, ctx, k, size, floors::Fence::MemOp));
        let host = mem_ops.then(|| floors::raw_ipc(o, ctx, k, size, floors::Fence::HostMemOp));
        if mem_ops {
            let dual = floors::raw_ipc(o, ctx, k, size, floors::Fence::DualMemOp);
            eprintln!(
                "raw {size:>9} B mem-ops on device words mirrored to host words: {:.0}/s p50 {} \
                 ns p99 {} ns (device words alone: p50 {} ns; host words: p50 {} ns)",
                dual.round_trips,
                dual.p50,
                dual.p99,
                memop.as_ref().map_or(0, |m| m.p50),
                host.as_ref().map_or(0, |m| m.p50)
            );
        }
        let ring = ring::run_cell(o, k, 1, size, Policy::Block, 1, false, Duration::ZERO);
        let polled = ring::run_cell(o, k, 1, size, Policy::Block, 1, false, gpu_poll());
        let ahead = ring::run_cell(o, k, 1, size, Policy::Block, 4, true, gpu_poll());
        eprintln!(
            "latency {size:>9} B: raw {:.0}/s p50 {} ns | mem-op {:.0}/s p50 {} ns | ring {:.0}/s \
             p50 {} ns",
            raw.round_trips,
            raw.p50,
            memop.as_ref().map_or(0.0, |m| m.round_trips),
            memop.as_ref().map_or(0, |m| m.p50),
            ring.producer_fps,
            ring.lat_p50
        );
        rep.latency.push((raw, memop, host, ring, polled, ahead));
    }
    if !o.no_matrix {
        for &n in &o.consumers {
            for &size in &o.sizes {
                let kps = floors::launch_ceiling(o, n + 1, size, false);
                let fenced = floors::launch_ceiling(o, n + 1, size, mem_ops);
                eprintln!(
                    "launch ceiling {} processes {size:>9} B: {kps:.0} kernels/s, {fenced:.0} \
                     with a fence write after each",
                    n + 1
                );
                rep.ceilings.push((n + 1, size, kps, fenced));
            }
        }
    }
}

fn matrix(o: &Opts, k: &kernels::Kernels, rep: &mut report::Report) {
    for &n in &o.consumers {
        for &size in &o.sizes {
            for p in &o.policies {
                let policy = match p.as_str() {
                    "block" => Policy::Block,
                    "overwrite" => Policy::Overwrite,
                    other => panic!("unknown policy {other}"),
                };
                let cell = ring::run_cell(o, k, n, size, policy, o.capacity, false, gpu_poll());
                eprintln!(
                    "1->{n} {size:>9} B {p:9}: {:.0} fps/consumer, p50 {} ns, lost {}",
                    cell.mean_fps(),
                    cell.lat_p50,
                    cell.lost
                );
                rep.cells.push(cell);
            }
        }
    }
}
