//! The sharing modes side by side: for each consumer count and frame size, a paced cell (one
//! frame in flight, the latency the fences add) and a free-running one (Block, the matrix's
//! capacity: the rate), first with legacy IPC sharing, then with VMM sharing, in one run. The
//! table gives each mode's figures and VMM's as a ratio of legacy's. Every side uses the default
//! `gpu_poll` (or `--gpu-poll`).

use gpuring::Policy;

use crate::kernels::Kernels;
use crate::ring::{run_cell, Cell};
use crate::{gpu_poll, Opts};

/// Runs the comparison and returns it as a markdown table.
pub fn compare(o: &Opts, k: &Kernels) -> String {
    let mut md = format!(
        "## Sharing modes: legacy IPC vs VMM ({})\n\n\
         Paced: one frame in flight (publish → every consumer took it); rate in frames/s per \
         consumer, latency p50/p99 in µs from publish to the consumer kernel's start. Free: \
         Block, capacity {}, as fast as the slowest consumer. Ratio: VMM ÷ legacy (rate: higher \
         is better; latency: lower is better). Opens/syncs: IPC opens and CPU syncs in the \
         measured window, all processes.\n\n\
         | consumers | size | paced legacy fps, p50/p99 | paced VMM fps, p50/p99 | paced fps ratio | p50 ratio | free legacy fps | free VMM fps | free ratio | opens, syncs (legacy; VMM) |\n\
         |---|---|---|---|---|---|---|---|---|---|\n",
        if o.label.is_empty() { "unlabelled run" } else { &o.label },
        o.capacity
    );
    for &n in &o.consumers {
        for &size in &o.sizes {
            let run = |sharing: &str, paced: bool| -> Cell {
                let o = Opts { sharing: sharing.into(), ..o.clone() };
                let capacity = if paced { 1 } else { o.capacity };
                run_cell(&o, k, n, size, Policy::Block, capacity, paced, gpu_poll())
            };
            let (pl, pv) = (run("legacy", true), run("vmm", true));
            let (fl, fv) = (run("legacy", false), run("vmm", false));
            let line = format!(
                "| {n} | {} | {:.0}, {:.1}/{:.1} | {:.0}, {:.1}/{:.1} | {:.2}× | {:.2}× | {:.0} | {:.0} | {:.2}× | {}, {}; {}, {} |\n",
                size_name(size),
                pl.mean_fps(),
                pl.lat_p50 as f64 / 1e3,
                pl.lat_p99 as f64 / 1e3,
                pv.mean_fps(),
                pv.lat_p50 as f64 / 1e3,
                pv.lat_p99 as f64 / 1e3,
                pv.mean_fps() / pl.mean_fps(),
                pv.lat_p50 as f64 / pl.lat_p50.max(1) as f64,
                fl.mean_fps(),
                fv.mean_fps(),
                fv.mean_fps() / fl.mean_fps(),
                pl.opens + fl.opens,
                pl.syncs + fl.syncs,
                pv.opens + fv.opens,
                pv.syncs + fv.syncs,
            );
            eprint!("sharing {line}");
            md.push_str(&line);
        }
    }
    md
}

pub fn size_name(size: usize) -> String {
    match size {
        s if s >= 1 << 20 && s % (1 << 20) == 0 => format!("{} MiB", s >> 20),
        s if s >= 1 << 10 && s % (1 << 10) == 0 => format!("{} KiB", s >> 10),
        s => format!("{s} B"),
    }
}
