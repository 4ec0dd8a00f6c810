//! Per-frame traces of the ring cells, for scripts/gpu-profile.sh: with
//! `GPURING_GPU_BENCH_TRACE=DIR` set, the producer and each consumer write one file into DIR
//! with, per measured frame, its sequence number, the GPU's start and end of the frame's
//! kernel (`bench_fill` or `bench_read`, %globaltimer) and four CPU moments around the ring's
//! calls, moved onto the GPU's clock (`Kernels::clock_offset`). All in ns.
//!
//! Producer (`fill.tsv`): seq, fill start, fill end, acquire called, acquire returned, fill
//! launched, publish returned. Consumer (`read-INDEX.tsv`): seq, read start, read end, recv
//! called, recv returned, read launched, release returned.

use std::io::Write;
use std::path::PathBuf;

use gpuring::cuda::Stream;

use crate::kernels::{realtime_ns, Kernels, TRACE_CAP, TRACE_ENV};

/// The CPU moments of the frames of one process, kept when tracing.
#[derive(Default)]
pub struct Recorder {
    on: bool,
    /// seq, then four `CLOCK_REALTIME` moments.
    rows: Vec<[u64; 5]>,
}

impl Recorder {
    pub fn new(k: &Kernels) -> Recorder {
        Recorder { on: k.tracing(), rows: Vec::new() }
    }

    /// Now, if tracing (0 otherwise: no clock read).
    pub fn now(&self) -> u64 {
        if self.on {
            realtime_ns()
        } else {
            0
        }
    }

    pub fn push(&mut self, seq: u64, moments: [u64; 4]) {
        if self.on {
            let [a, b, c, d] = moments;
            self.rows.push([seq, a, b, c, d]);
        }
    }

    /// Writes `file` into the trace folder: the last frames recorded (at most the device
    /// trace's capacity), with their kernel's GPU start and end, CPU moments on the GPU clock.
    pub fn write(&self, k: &Kernels, stream: &Stream, file: &str) {
        let Some(dir) = std::env::var_os(TRACE_ENV).filter(|_| self.on) else { return };
        let offset = k.clock_offset(stream);
        let keep = &self.rows[self.rows.len().saturating_sub(TRACE_CAP as usize / 2)..];
        let pairs = k.trace_pairs(stream, keep.iter().map(|r| r[0]));
        let path = PathBuf::from(dir).join(file);
        let mut out = std::io::BufWriter::new(std::fs::File::create(&path).unwrap());
        let gpu = |t: u64| (t as i64 + offset) as u64;
        for (r, (start, end)) in keep.iter().zip(pairs) {
            writeln!(
                out,
                "{}\t{start}\t{end}\t{}\t{}\t{}\t{}",
                r[0],
                gpu(r[1]),
                gpu(r[2]),
                gpu(r[3]),
                gpu(r[4])
            )
            .unwrap();
        }
    }
}
