//! `gpuring batch`: K camera rings into one ring of batch tensors, until SIGINT or SIGTERM.

use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use gpuring::batch::{Batcher, Fill, Timing};
use gpuring::tensor::{DType, TensorHeader};
use gpuring::{Mode, Policy};

use crate::cli::{parse_mode, parse_policy};

#[derive(Args)]
pub struct Options {
    /// The camera rings, comma-separated: camera k is the batch's index k.
    #[arg(long, value_delimiter = ',', required = true)]
    inputs: Vec<String>,
    /// The batch ring to make.
    #[arg(long)]
    ring: String,
    /// A batch goes out when every live camera has a new frame, or this long (ms) after its
    /// first new frame.
    #[arg(long, default_value_t = 50, conflicts_with = "rate")]
    max_wait_ms: u64,
    /// A batch goes out this many times a second instead, whatever came.
    #[arg(long)]
    rate: Option<f64>,
    /// What a camera with no new frame holds: previous (its frame in the last batch) or zeros.
    #[arg(long, default_value = "previous", value_parser = parse_fill)]
    fill: Fill,
    /// The cameras' delivery: latest (each batch takes a camera's newest frame) or lossless.
    #[arg(long, default_value = "latest", value_parser = parse_mode)]
    mode: Mode,
    /// Every camera's element type (numpy's names: uint8, float16, ...), with --shape; else the
    /// first frame's tensor header says.
    #[arg(long, requires = "shape")]
    dtype: Option<String>,
    /// Every camera's frame shape, comma-separated (720,1280,3), with --dtype.
    #[arg(long, value_delimiter = ',', requires = "dtype")]
    shape: Option<Vec<u64>>,
    /// Batches the ring holds.
    #[arg(long, default_value_t = 4)]
    capacity: u32,
    /// Spare buffers of the batch ring (at least 2).
    #[arg(long, default_value_t = 4)]
    spares: u32,
    /// The batch ring's policy: block or overwrite.
    #[arg(long, value_parser = parse_policy)]
    policy: Option<Policy>,
    /// The rings' memory: host, or cuda (the cameras' rings and the batch ring alike).
    #[arg(long, default_value = "host", value_parser = ["host", "cuda"])]
    memory: String,
    /// The GPU of a CUDA batcher: the batch ring is made there, the cameras' rings read there.
    #[arg(long, default_value_t = 0)]
    device: i32,
}

fn parse_fill(s: &str) -> Result<Fill, String> {
    match s {
        "previous" => Ok(Fill::Previous),
        "zeros" => Ok(Fill::Zeros),
        _ => Err(format!("{s}: expected previous or zeros")),
    }
}

/// Runs the batcher until SIGINT or SIGTERM.
pub fn run(o: &Options) -> ExitCode {
    let stop = match crate::cli::serve("gpuring batch") {
        Ok(stop) => stop,
        Err(code) => return code,
    };
    let timing = match o.rate {
        Some(r) if r > 0.0 && r.is_finite() => {
            Timing::Rate { period: Duration::from_secs_f64(1.0 / r) }
        }
        Some(r) => {
            eprintln!("gpuring batch: --rate {r}: expected a positive number of batches a second");
            return ExitCode::from(2);
        }
        None => Timing::AllFresh { max_wait: Duration::from_millis(o.max_wait_ms) },
    };
    let mut b = Batcher::builder(&o.ring, &o.inputs)
        .timing(timing)
        .fill(o.fill)
        .mode(o.mode)
        .capacity(o.capacity)
        .spare_buffers(o.spares)
        .device(o.device);
    if let Some(p) = o.policy {
        b = b.policy(p);
    }
    if let (Some(dtype), Some(shape)) = (&o.dtype, &o.shape) {
        let Some(dtype) = DType::from_name(dtype) else {
            eprintln!("gpuring batch: --dtype {dtype}: not an element type (uint8, float16, ...)");
            return ExitCode::from(2);
        };
        b = b.frame(TensorHeader::new(dtype, shape));
    }
    let batcher = match b.build() {
        Ok(b) => b,
        Err(e) => {
            eprintln!("gpuring batch: {e}");
            return ExitCode::from(2);
        }
    };
    let done = {
        eprintln!(
            "gpuring batch: {} cameras into ring {:?} ({} memory)",
            o.inputs.len(),
            o.ring,
            o.memory
        );
        match o.memory.as_str() {
            #[cfg(feature = "cuda")]
            "cuda" => batcher.run_in::<gpuring::Cuda>(stop),
            #[cfg(not(feature = "cuda"))]
            "cuda" => {
                eprintln!("gpuring batch: built without CUDA (feature cuda)");
                std::process::exit(2);
            }
            _ => batcher.run(stop),
        }
    };
    if let Ok(t) = &done {
        eprintln!("gpuring batch: stopped, {} batches", t.batches);
        for (k, [present, stale, absent, refused]) in t.cameras.iter().enumerate() {
            eprintln!(
                "  camera {k} ({}): present {present}, stale {stale}, absent {absent}, refused {refused}",
                o.inputs[k]
            );
        }
    }
    gpuring::service::exit("gpuring batch", done.map(|_| ()))
}
