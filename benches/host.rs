//! Host-memory benches across processes: round-trip latency and throughput, 1→1 and 1→4, for
//! 64 B, 4 KiB and 1 MiB messages, with the raw shared-memory spin ping-pong floor measured in the
//! same run (the cases live in `benches/handoff/mod.rs`, shared with the iceoryx2 peer bench in
//! `benches/peers/iceoryx2/`).
//!
//! Run: `cargo bench --bench host --no-default-features` (add `-- --quick` for a short run). At
//! the end it prints every gpuring round trip as a ratio to the floor, from criterion's medians.

#[path = "handoff/mod.rs"]
mod handoff;

use criterion::Throughput;
use handoff::{
    bench, FloorRoundTrip, RingRoundTrip, RingSameThread, RingThroughput, FANOUTS, SIZES,
};

fn main() {
    if let Some(args) = handoff::child_args() {
        assert!(handoff::run_child(&args), "unknown bench role {}", args.role);
        return;
    }
    let mut c = handoff::criterion();
    {
        let mut g = c.benchmark_group("same_thread");
        g.throughput(Throughput::Elements(1));
        for size in SIZES {
            bench(&mut g, "gpuring", &handoff::size_label(size), RingSameThread::new(size));
        }
        g.finish();
    }
    for n in FANOUTS {
        let mut g = c.benchmark_group(format!("roundtrip_1to{n}"));
        g.throughput(Throughput::Elements(1));
        for size in SIZES {
            let label = handoff::size_label(size);
            bench(&mut g, "floor", &label, FloorRoundTrip::new(n, size));
            bench(&mut g, "gpuring", &label, RingRoundTrip::new(n, size));
        }
        g.finish();
        let mut g = c.benchmark_group(format!("throughput_1to{n}"));
        g.throughput(Throughput::Elements(1));
        for size in SIZES {
            bench(&mut g, "gpuring", &handoff::size_label(size), RingThroughput::new(n, size));
        }
        g.finish();
    }
    c.final_summary();
    report();
}

fn report() {
    println!("\n== gpuring send + recv in one thread (the protocol's CPU cost per message) ==");
    for size in SIZES {
        let l = handoff::size_label(size);
        if let Some(ns) = handoff::median_ns(&format!("same_thread/gpuring/{l}")) {
            println!("{l:>5}: {ns:.0} ns per message");
        }
    }
    println!(
        "\n== host round trip, gpuring vs the raw spin floor (criterion medians, same run) =="
    );
    println!("| fan-out | size | floor | gpuring | gpuring/floor | gpuring msgs/s per consumer |");
    println!("|---|---|---|---|---|---|");
    for n in FANOUTS {
        for size in SIZES {
            let l = handoff::size_label(size);
            let floor = handoff::median_ns(&format!("roundtrip_1to{n}/floor/{l}"));
            let ours = handoff::median_ns(&format!("roundtrip_1to{n}/gpuring/{l}"));
            let tp = handoff::median_ns(&format!("throughput_1to{n}/gpuring/{l}"));
            let ns = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.0} ns"));
            let ratio = match (floor, ours) {
                (Some(f), Some(o)) => format!("{:.2}x", o / f),
                _ => "-".into(),
            };
            let rate = tp.map_or("-".into(), |t| format!("{:.2} M", 1e3 / t));
            println!("| 1->{n} | {l} | {} | {} | {ratio} | {rate} |", ns(floor), ns(ours));
        }
    }
}
