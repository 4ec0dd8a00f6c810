// Run: cargo run --release --example recv_loop -- NAME [--dir DIR] [--frames 20000]
//                                                 [--warmup 500] [--mode lossless|queue|latest]
//                                                 [--backlog [--pause-ms 5] [--stop-pid PID]]
//
// The bare receive loop: opens an existing ring as a consumer, in whatever memory its producer
// chose (host or CUDA), and receives `--frames` messages as fast as it can, dropping each at
// once (receive and release, nothing else). It prints one JSON line, the time per message
// over the frames after `--warmup`:
//
//   {"frames":20000,"us_per_frame":0.21,"memory":"host"}
//
// It is what benches/python_recv.py measures a Python consumer's receive against: start a
// producer that runs free, then this, for example
//
//   pipeline --consumers 0 --external 1 --name cam0 --fps 0 --width 320 --height 240 --seconds 0 &
//   recv_loop cam0 --frames 20000
//
// The consumer joins with `StartAt::Next`, so it receives every frame published from then on.
// By default the time is the loop's: when the producer is the slower side it is the
// producer's period. `--backlog` times the consumer's own work instead: the loop sleeps until
// the ring has filled (a lossless consumer a ring behind makes the producer wait), then
// receives what is waiting with `try_recv`, timing only that, until it has `--frames`. With
// `--stop-pid` (the producer's pid) it stops that process (SIGSTOP) while it times a backlog,
// and lets it go on after (SIGCONT), so that nothing else runs meanwhile.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use gpuring::any::AnyConsumer;
use gpuring::{Consumer, Mode, RecvError, StartAt, TryRecvError};
use rustix::process::{kill_process, Pid, Signal};

#[derive(Parser, Debug)]
#[command(
    about = "Receives from an existing ring as fast as it can and prints the time per message"
)]
struct Args {
    /// The ring's name.
    name: String,
    /// Ring directory (default: GPURING_DIR, else /dev/shm).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Messages to time.
    #[arg(long, default_value_t = 20_000)]
    frames: u64,
    /// Messages received before the timing starts.
    #[arg(long, default_value_t = 500)]
    warmup: u64,
    /// Delivery mode: lossless, queue or latest (default: the ring's policy's).
    #[arg(long)]
    mode: Option<String>,
    /// Time only messages that were already waiting: let the ring fill, then drain it.
    #[arg(long)]
    backlog: bool,
    /// With `--backlog`: how long to sleep while the ring fills, in milliseconds.
    #[arg(long, default_value_t = 5.0)]
    pause_ms: f64,
    /// With `--backlog`: a process to stop while each backlog is timed (the producer).
    #[arg(long)]
    stop_pid: Option<i32>,
    /// Seconds to wait for the ring to appear.
    #[arg(long, default_value_t = 30.0)]
    wait: f64,
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok((frames, took, memory)) => {
            let us = took.as_secs_f64() * 1e6 / frames.max(1) as f64;
            println!(r#"{{"frames":{frames},"us_per_frame":{us:.4},"memory":"{memory}"}}"#);
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("recv_loop: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Opens the ring, receives, and returns the messages timed, the time they took and the
/// ring's memory kind.
fn run(args: &Args) -> Result<(u64, Duration, &'static str), String> {
    let mut builder = Consumer::builder(&args.name).start_at(StartAt::Next);
    if let Some(dir) = &args.dir {
        builder = builder.dir(dir);
    }
    if let Some(m) = &args.mode {
        let mode = Mode::from_name(m).ok_or(format!("--mode {m}: lossless, queue or latest"))?;
        builder = builder.mode(mode);
    }
    let wait = Duration::try_from_secs_f64(args.wait).map_err(|e| format!("--wait: {e}"))?;
    let rx = AnyConsumer::open_when_ready(builder, None, wait).map_err(|e| e.to_string())?;
    let memory = if rx.is_cuda() { "cuda" } else { "host" };
    for _ in 0..args.warmup {
        rx.recv().map_err(ended)?;
    }
    let took = if args.backlog {
        let pause = Duration::try_from_secs_f64(args.pause_ms / 1e3)
            .map_err(|e| format!("--pause-ms: {e}"))?;
        let stop = args.stop_pid.map(|p| Pid::from_raw(p).ok_or("--stop-pid: not a pid"));
        backlog(&rx, args.frames, pause, stop.transpose()?)?
    } else {
        free(&rx, args.frames)?
    };
    Ok((args.frames, took, memory))
}

/// Receives `frames` messages back to back: the loop's time.
fn free(rx: &AnyConsumer, frames: u64) -> Result<Duration, String> {
    let start = Instant::now();
    for _ in 0..frames {
        drop(rx.recv().map_err(ended)?);
    }
    Ok(start.elapsed())
}

/// Receives `frames` messages that were waiting when asked for: sleeps `pause` while the ring
/// fills, then times `try_recv` until nothing is left (the last, empty, look included), and
/// again. `stop` is stopped meanwhile.
fn backlog(
    rx: &AnyConsumer,
    frames: u64,
    pause: Duration,
    stop: Option<Pid>,
) -> Result<Duration, String> {
    let signal = |sig| match stop {
        Some(pid) => kill_process(pid, sig).map_err(|e| format!("--stop-pid: {e}")),
        None => Ok(()),
    };
    let (mut got, mut took) = (0, Duration::ZERO);
    while got < frames {
        std::thread::sleep(pause);
        signal(Signal::STOP)?;
        let start = Instant::now();
        // A consumer slower than the producer would never find the ring empty: bound a burst.
        let drained = drain(rx, (frames - got).min(4096));
        took += start.elapsed();
        signal(Signal::CONT)?;
        got += drained?;
    }
    Ok(took)
}

/// Receives and drops at most `most` messages, as long as one is waiting.
fn drain(rx: &AnyConsumer, most: u64) -> Result<u64, String> {
    for n in 0..most {
        match rx.try_recv() {
            Ok(m) => drop(m),
            Err(TryRecvError::Empty) => return Ok(n),
            Err(e) => return Err(e.to_string()),
        }
    }
    Ok(most)
}

fn ended(e: RecvError) -> String {
    format!("{e} before every frame was received (a longer producer run, or fewer --frames)")
}
