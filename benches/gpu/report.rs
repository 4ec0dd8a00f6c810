//! The bench's results as markdown tables and JSON (written by hand: a few flat records).

use crate::floors::RawIpc;
use crate::ring::Cell;
use crate::Opts;

/// One size of the paced comparison: raw with events, raw with device-word and host-word
/// memory ops (where supported), the one-slot ring with `gpu_poll` 0 and with the run's
/// `gpu_poll`, and the ring writing ahead.
pub type LatencyRow = (RawIpc, Option<RawIpc>, Option<RawIpc>, Cell, Cell, Cell);

#[derive(Default)]
pub struct Report {
    pub label: String,
    pub device: String,
    pub seconds: f64,
    pub capacity: u32,
    /// The rings' `gpu_poll` window, ns.
    pub gpu_poll_ns: u128,
    /// The rings' fence (`events` or `memory`; `auto (memory)` or `auto (events)`: the default,
    /// and what it picked).
    pub fence: String,
    pub timer_step: u64,
    /// Bytes read + written per second by a device-to-device copy.
    pub d2d: f64,
    pub fill_bw: f64,
    pub read_bw: f64,
    /// ns per driver call, in this process.
    pub calls: Vec<(&'static str, f64)>,
    /// ns of GPU time per frame of a backlogged stream: a 64 KiB read, with each fence
    /// operation after it (`floors::stream_op_costs`).
    pub stream_ops: Vec<(&'static str, f64)>,
    /// Per size: the raw handoff with events, with stream memory ops (if supported), and the
    /// paced ring, 1→1.
    pub latency: Vec<LatencyRow>,
    /// (processes, size, kernels/s): the GPU's kernel rate from that many launching processes.
    /// The fourth: the same with one fence write (`cuStreamWriteValue64`) after each kernel,
    /// what a ring's process pays per frame at least.
    pub ceilings: Vec<(usize, usize, f64, f64)>,
    pub cells: Vec<Cell>,
}

fn us(ns: u64) -> String {
    format!("{:.1}", ns as f64 / 1e3)
}

fn size_label(size: usize) -> String {
    match size {
        s if s >= 1 << 20 && s % (1 << 20) == 0 => format!("{} MiB", s >> 20),
        s if s >= 1 << 10 && s % (1 << 10) == 0 => format!("{} KiB", s >> 10),
        s => format!("{s} B"),
    }
}

impl Report {
    pub fn new(o: &Opts) -> Report {
        let device = std::process::Command::new("nvidia-smi")
            .args(["--query-gpu=name,driver_version", "--format=csv,noheader", "-i"])
            .arg(o.device.to_string())
            .output()
            .ok()
            .map(|out| String::from_utf8_lossy(&out.stdout).trim().to_string())
            .unwrap_or_default();
        Report {
            label: o.label.clone(),
            device,
            seconds: o.seconds.as_secs_f64(),
            capacity: o.capacity,
            gpu_poll_ns: crate::gpu_poll().as_nanos(),
            fence: o.fence.clone(),
            ..Report::default()
        }
    }

    /// Bytes moved per second by a cell (the producer's writes plus every consumer's reads) as a
    /// fraction of the D2D roofline.
    pub fn roofline(&self, c: &Cell) -> f64 {
        let frames = c.producer_fps + c.consumer_fps.iter().sum::<f64>();
        frames * c.size as f64 / self.d2d
    }

    /// [`roofline`](Self::roofline) as a percentage, or `-` where D2D was not measured.
    pub fn roofline_pct(&self, c: &Cell) -> String {
        if self.d2d > 0.0 {
            format!("{:.0}%", 100.0 * self.roofline(c))
        } else {
            "-".into()
        }
    }

    /// A cell's kernels per second (one per frame in each process) as a share of the launch
    /// ceiling measured for that many processes and that frame size, and of the fenced one.
    pub fn ceiling(&self, c: &Cell) -> String {
        let kernels = c.producer_fps + c.consumer_fps.iter().sum::<f64>();
        self.ceilings.iter().find(|(p, s, ..)| *p == c.consumers + 1 && *s == c.size).map_or(
            "-".into(),
            |(_, _, kps, fenced)| {
                format!("{:.0}% / {:.0}%", 100.0 * kernels / kps, 100.0 * kernels / fenced)
            },
        )
    }

    pub fn markdown(&self) -> String {
        let mut s = format!(
            "### GPU bench {} ({})\n\nFloors: D2D copy {:.0} GB/s (read + write), bench_fill \
             {:.0} GB/s, bench_read {:.0} GB/s, %globaltimer step {} ns. {} s measured per \
             cell, ring capacity {}, gpu_poll {} µs, fence {}.\n\n",
            self.label,
            self.device,
            self.d2d / 1e9,
            self.fill_bw / 1e9,
            self.read_bw / 1e9,
            self.timer_step,
            self.seconds,
            self.capacity,
            self.gpu_poll_ns as f64 / 1e3,
            self.fence,
        );
        s += "Driver calls (ns per call, this process):";
        for (call, ns) in &self.calls {
            s += &format!(" {call} {ns:.0};");
        }
        if let Some((raw, ..)) = self.latency.first() {
            s += &format!(
                " cuEventQuery on an event opened from another process {:.0}; \
                 cuStreamWaitEvent on it {:.0}.",
                raw.opened_query_ns, raw.opened_wait_ns
            );
        }
        if !self.stream_ops.is_empty() {
            s += "\n\nGPU time per frame of a stream that never waits for work (ns; a 64 KiB \
                  read, then the fence operation named):";
            for (op, ns) in &self.stream_ops {
                s += &format!(" {op} {ns:.0};");
            }
        }
        s += "\n\nPaced 1→1 handoff, publish (the fill's last block) → consumer-kernel start. \
              Raw: no ring, one buffer, IPC events (the floor), or stream memory ops on words in \
              device memory or in page-locked shared host memory; ring: \
              gpuring with one slot (the same dependencies as raw), `gpu_poll` 0 (every wait on \
              the GPU) and this run's `gpu_poll`; ring ahead: capacity 4, the producer waiting \
              for the consumer to take each frame but free to write the next slot at once:\n\n";
        s += "| size | raw events: round trips/s | p50 µs | p99 µs | raw mem-ops (device): round \
              trips/s | p50 µs | raw mem-ops (host): round trips/s | p50 µs | ring, poll 0: round \
              trips/s | p50 µs | p99 µs | ring/raw p50 | ring, poll: round trips/s | p50 µs | \
              ring/raw p50 | ring ahead: p50 µs | p99 µs |\n\
              |---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
        let memop_cells = |m: &Option<RawIpc>| -> String {
            m.as_ref().map_or("- | -".into(), |m| format!("{:.0} | {}", m.round_trips, us(m.p50)))
        };
        for (raw, memop, host, ring, polled, ahead) in &self.latency {
            s += &format!(
                "| {} | {:.0} | {} | {} | {} | {} | {:.0} | {} | {} | {:.2}x | {:.0} | {} | {:.2}x | \
                 {} | {} |\n",
                size_label(raw.size),
                raw.round_trips,
                us(raw.p50),
                us(raw.p99),
                memop_cells(memop),
                memop_cells(host),
                ring.producer_fps,
                us(ring.lat_p50),
                us(ring.lat_p99),
                ring.lat_p50 as f64 / raw.p50.max(1) as f64,
                polled.producer_fps,
                us(polled.lat_p50),
                polled.lat_p50 as f64 / raw.p50.max(1) as f64,
                us(ahead.lat_p50),
                us(ahead.lat_p99),
            );
        }
        if self.cells.is_empty() {
            return s;
        }
        s += "\nMatrix (each consumer a process reading every byte; fps per consumer is the \
              mean, min in brackets):\n\n";
        s += "| consumers | size | policy | producer fps | fps/consumer | GB/s/consumer | \
              roofline | launch ceiling / fenced | p50 µs | p99 µs | lost | IPC opens, CPU syncs |\n\
              |---|---|---|---|---|---|---|---|---|---|---|---|\n";
        for c in &self.cells {
            let min = c.consumer_fps.iter().cloned().fold(f64::INFINITY, f64::min);
            s += &format!(
                "| {} | {} | {} | {:.0} | {:.0} ({:.0}) | {:.1} | {} | {} | {} | {} | {} | {}, {} |\n",
                c.consumers,
                size_label(c.size),
                c.policy,
                c.producer_fps,
                c.mean_fps(),
                min,
                c.mean_fps() * c.size as f64 / 1e9,
                self.roofline_pct(c),
                self.ceiling(c),
                us(c.lat_p50),
                us(c.lat_p99),
                c.lost,
                c.opens,
                c.syncs
            );
        }
        s += "\nWhere the CPU time goes (µs per frame; producer: acquire, fill launch, publish; \
              consumer, mean: recv including waiting, read launch, release):\n\n\
              | consumers | size | policy | acquire | fill | publish | recv | read | release |\n\
              |---|---|---|---|---|---|---|---|---|\n";
        for c in &self.cells {
            let (p, q) = (c.producer_us, c.consumer_us);
            s += &format!(
                "| {} | {} | {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} |\n",
                c.consumers,
                size_label(c.size),
                c.policy,
                p[0],
                p[1],
                p[2],
                q[0],
                q[1],
                q[2]
            );
        }
        s
    }

    pub fn json(&self) -> String {
        let esc = |t: &str| t.replace('\\', "\\\\").replace('"', "\\\"");
        let mut s = format!(
            "{{\n  \"label\": \"{}\",\n  \"device\": \"{}\",\n  \"seconds\": {},\n  \
             \"capacity\": {},\n  \"gpu_poll_ns\": {},\n  \"fence\": \"{}\",\n  \"timer_step_ns\": {},\n  \"d2d_bytes_per_s\": {:.0},\n  \
             \"fill_bytes_per_s\": {:.0},\n  \"read_bytes_per_s\": {:.0},\n",
            esc(&self.label),
            esc(&self.device),
            self.seconds,
            self.capacity,
            self.gpu_poll_ns,
            esc(&self.fence),
            self.timer_step,
            self.d2d,
            self.fill_bw,
            self.read_bw
        );
        let lat: Vec<String> = self
            .latency
            .iter()
            .map(|(r, m, h, c, p, a)| {
                let (m_rt, m_p50, m_p99) =
                    m.as_ref().map_or((0.0, 0, 0), |m| (m.round_trips, m.p50, m.p99));
                let (h_rt, h_p50) = h.as_ref().map_or((0.0, 0), |h| (h.round_trips, h.p50));
                format!(
                    "    {{\"size\": {}, \"raw_round_trips\": {:.1}, \"raw_p50_ns\": {}, \
                     \"raw_p99_ns\": {}, \"memop_round_trips\": {:.1}, \"memop_p50_ns\": {}, \
                     \"memop_p99_ns\": {}, \"host_memop_round_trips\": {:.1}, \
                     \"host_memop_p50_ns\": {}, \"ring_round_trips\": {:.1}, \"ring_p50_ns\": {}, \
                     \"ring_p99_ns\": {}, \"polled_round_trips\": {:.1}, \"polled_p50_ns\": {}, \
                     \"polled_p99_ns\": {}, \"ahead_p50_ns\": {}, \"ahead_p99_ns\": {}}}",
                    r.size,
                    r.round_trips,
                    r.p50,
                    r.p99,
                    m_rt,
                    m_p50,
                    m_p99,
                    h_rt,
                    h_p50,
                    c.producer_fps,
                    c.lat_p50,
                    c.lat_p99,
                    p.producer_fps,
                    p.lat_p50,
                    p.lat_p99,
                    a.lat_p50,
                    a.lat_p99
                )
            })
            .collect();
        let ceilings: Vec<String> = self
            .ceilings
            .iter()
            .map(|(p, sz, k, f)| {
                format!(
                    "{{\"processes\": {p}, \"size\": {sz}, \"kernels_per_s\": {k:.0}, \
                     \"fenced_kernels_per_s\": {f:.0}}}"
                )
            })
            .collect();
        s += &format!("  \"launch_ceilings\": [{}],\n", ceilings.join(", "));
        let calls: Vec<String> =
            self.calls.iter().map(|(c, ns)| format!("\"{}\": {ns:.0}", esc(c))).collect();
        s += "  \"call_ns\": {";
        s += &calls.join(", ");
        s += "},\n  \"latency\": [\n";
        s += &lat.join(",\n");
        s += "\n  ],\n  \"cells\": [\n";
        let cells: Vec<String> = self
            .cells
            .iter()
            .map(|c| {
                let fps: Vec<String> = c.consumer_fps.iter().map(|f| format!("{f:.1}")).collect();
                format!(
                    "    {{\"consumers\": {}, \"size\": {}, \"policy\": \"{}\", \"capacity\": {}, \
                     \"producer_fps\": {:.1}, \"consumer_fps\": [{}], \"roofline\": {:.4}, \
                     \"p50_ns\": {}, \"p99_ns\": {}, \"lost\": {}, \"ipc_opens\": {}, \
                     \"cpu_syncs\": {}, \"producer_us\": {:?}, \"consumer_us\": {:?}}}",
                    c.consumers,
                    c.size,
                    c.policy,
                    c.capacity,
                    c.producer_fps,
                    fps.join(", "),
                    if self.d2d > 0.0 { self.roofline(c) } else { 0.0 },
                    c.lat_p50,
                    c.lat_p99,
                    c.lost,
                    c.opens,
                    c.syncs,
                    c.producer_us,
                    c.consumer_us
                )
            })
            .collect();
        s += &cells.join(",\n");
        s += "\n  ]\n}\n";
        s
    }
}
