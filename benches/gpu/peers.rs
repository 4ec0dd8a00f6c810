//! Consumers on a second GPU (`--peers`): what reading a GPU 0 ring from GPU 1 costs, against
//! floors taken in the same run.
//!
//! The ring is on `--device` (GPU 0 below), the other consumers on the next GPU (GPU 1).
//!
//! 1. Bandwidth, per frame size: the floors are `cuMemcpyPeerAsync` from GPU 0 to GPU 1 (the
//!    copy engines) and `bench_read` on GPU 1 reading a GPU 0 buffer directly (the SMs over the
//!    link, what a consumer's kernel does), with `bench_read` of GPU 1's own memory for scale.
//!    The ring rows are one consumer process free-running on a Block ring of `--capacity`
//!    slots, reading every byte with `bench_read`: on GPU 1 (across the link) and on GPU 0, in
//!    both sharing modes.
//! 2. Fan-out, per frame size: 1→4 with two consumers on each GPU against 1→4 all on GPU 0.
//!
//! Latency is not reported across GPUs: the stamp is GPU 0's `%globaltimer`, which GPU 1's
//! clock need not match.

use std::sync::Arc;
use std::time::{Duration, Instant};

use gpuring::cuda::driver;
use gpuring::cuda::{Context, DevicePool, Stream};
use gpuring::Policy;

use crate::kernels::Kernels;
use crate::ring::{consumer_device, run_cell, Cell};
use crate::sharing::size_name;
use crate::{gpu_poll, Opts};

/// How long each floor is timed.
const FLOOR_TIME: Duration = Duration::from_millis(500);

/// Bytes per second of `op` moving `size` bytes per call, run back to back on `stream` for
/// about [`FLOOR_TIME`] after a warm-up.
fn rate(stream: &Stream, size: usize, op: &dyn Fn()) -> f64 {
    for _ in 0..4 {
        op();
    }
    stream.synchronize().unwrap();
    let (t, mut n) = (Instant::now(), 0u64);
    while t.elapsed() < FLOOR_TIME {
        for _ in 0..16 {
            op();
        }
        n += 16;
        stream.synchronize().unwrap();
    }
    (size as u64 * n) as f64 / t.elapsed().as_secs_f64()
}

/// The floors for `size`-byte frames: (peer copy GPU 0 → 1, GPU 1 kernel reading GPU 0's
/// memory, GPU 1 kernel reading its own), in bytes per second.
struct Floors {
    copy: f64,
    peer_read: f64,
    local_read: f64,
}

fn floors(ring_ctx: &Arc<Context>, other: &Arc<Context>, k1: &Kernels, size: usize) -> Floors {
    let src = DevicePool::new(ring_ctx, size).unwrap();
    let dst = DevicePool::new(other, size).unwrap();
    let stream = Stream::new(other).unwrap();
    let _bound = other.bind().unwrap();
    let copy = rate(&stream, size, &|| {
        // SAFETY: two live allocations of `size` bytes in their contexts; the stream is live in
        // the current one (`other`).
        unsafe {
            driver::memcpy_peer_async(
                dst.ptr(),
                other.raw(),
                src.ptr(),
                ring_ctx.raw(),
                size,
                stream.raw(),
            )
        }
        .unwrap()
    });
    let len = (size as u64) & !15;
    // SAFETY: `src` is GPU 0 memory that GPU 1 may read (peer access enabled in `run`), `len`
    // bytes, live until the stream is synchronised in `rate`.
    let peer_read = rate(&stream, size, &|| unsafe { k1.read(&stream, src.ptr(), len, None) });
    // SAFETY: `dst` is GPU 1's own memory, as above.
    let local_read = rate(&stream, size, &|| unsafe { k1.read(&stream, dst.ptr(), len, None) });
    Floors { copy, peer_read, local_read }
}

/// GB/s the consumers of `cell` read, each: frames/s × size.
fn gbps(fps: f64, size: usize) -> f64 {
    fps * size as f64 / 1e9
}

/// Runs both tables and returns them as markdown.
pub fn run(o: &Opts, ring_ctx: &Arc<Context>, k0: &Kernels) -> String {
    // The ring on `--device`, the other consumers on the next GPU.
    let gpus = driver::device_count().unwrap();
    let (ring_dev, other_dev) = (o.device, (o.device + 1) % gpus.max(1));
    if gpus < 2 {
        eprintln!("gpu bench --peers: this machine has {gpus} GPU; nothing measured");
        std::process::exit(2);
    }
    let (d0, d1) = (driver::device(ring_dev).unwrap(), driver::device(other_dev).unwrap());
    if !driver::can_access_peer(d1, d0).unwrap() {
        eprintln!("gpu bench --peers: GPU {other_dev} has no peer access to GPU {ring_dev}");
        std::process::exit(2);
    }
    let other = Context::new(other_dev).unwrap();
    {
        // Before any floor: a peer copy without it may be staged through the host.
        let _bound = other.bind().unwrap();
        // SAFETY: `other` is current; `ring_ctx` is live.
        unsafe { driver::ctx_enable_peer_access(ring_ctx.raw()) }.unwrap();
    }
    let stream1 = Stream::new(&other).unwrap();
    let k1 = Kernels::load(&other, &stream1);
    stream1.synchronize().unwrap();
    let cell = |size: usize, sharing: &str, devices: Vec<i32>| -> Cell {
        let o = Opts {
            sharing: sharing.into(),
            device: ring_dev,
            consumer_devices: devices,
            ..o.clone()
        };
        let n = o.consumer_devices.len();
        run_cell(&o, k0, n, size, Policy::Block, o.capacity, false, gpu_poll())
    };
    let label = if o.label.is_empty() { "unlabelled run" } else { &o.label };
    let mut md = format!(
        "## A GPU {other_dev} consumer reading a GPU {ring_dev} ring ({label})\n\n\
         GB/s one consumer process reads, every byte by `bench_read` (Block, capacity {}). \
         Floors from the same run: `cuMemcpyPeerAsync` GPU {ring_dev} → {other_dev}, and `bench_read` on \
         GPU {other_dev} of a GPU {ring_dev} buffer (peer) and of its own (local). Ratio: the ring on GPU \
         {other_dev} ÷ the peer-read floor, the fair one since consumers read with the same kernel \
         (and ÷ the peer-copy floor).\n\n\
         | size | peer copy floor | peer read floor | local read | legacy, on GPU {other_dev} | \
         ratio | VMM, on GPU {other_dev} | ratio | legacy, on GPU {ring_dev} |\n\
         |---|---|---|---|---|---|---|---|---|\n",
        o.capacity
    );
    for &size in &o.sizes {
        let f = floors(ring_ctx, &other, &k1, size);
        let legacy = gbps(cell(size, "legacy", vec![other_dev]).mean_fps(), size);
        let vmm = gbps(cell(size, "vmm", vec![other_dev]).mean_fps(), size);
        let local = gbps(cell(size, "legacy", vec![ring_dev]).mean_fps(), size);
        let (copy, peer) = (f.copy / 1e9, f.peer_read / 1e9);
        let line = format!(
            "| {} | {copy:.1} | {peer:.1} | {:.1} | {legacy:.1} | {:.2}× ({:.2}×) | {vmm:.1} | \
             {:.2}× ({:.2}×) | {local:.1} |\n",
            size_name(size),
            f.local_read / 1e9,
            legacy / peer,
            legacy / copy,
            vmm / peer,
            vmm / copy,
        );
        eprint!("peers {line}");
        md.push_str(&line);
    }
    md.push_str(&format!(
        "\n## 1→4: two consumers on each GPU ({label})\n\n\
         Frames/s per consumer (mean of each GPU's), Block, capacity {}, legacy sharing, ring \
         on GPU {ring_dev}. The baseline is 1→4 with all four on GPU {ring_dev}, in the same run.\n\n\
         | size | all on GPU {ring_dev}: fps | split: fps on GPU {ring_dev} | split: fps on GPU {other_dev} | \
         split ÷ all (slowest GPU) | GB/s across the link |\n|---|---|---|---|---|---|\n",
        o.capacity
    ));
    for &size in &o.sizes {
        let all = cell(size, "legacy", vec![ring_dev; 4]);
        let split_devices = vec![ring_dev, ring_dev, other_dev, other_dev];
        let split = cell(size, "legacy", split_devices.clone());
        let split_o = Opts { consumer_devices: split_devices, ..o.clone() };
        let on = |d: i32| {
            let fps: Vec<f64> = (0..4)
                .filter(|&i| consumer_device(&split_o, i) == d)
                .map(|i| split.consumer_fps[i])
                .collect();
            fps.iter().sum::<f64>() / fps.len() as f64
        };
        let (f0, f1) = (on(ring_dev), on(other_dev));
        let line = format!(
            "| {} | {:.0} | {f0:.0} | {f1:.0} | {:.2}× | {:.1} |\n",
            size_name(size),
            all.mean_fps(),
            f0.min(f1) / all.mean_fps(),
            gbps(2.0 * f1, size),
        );
        eprint!("fan-out {line}");
        md.push_str(&line);
    }
    md
}
