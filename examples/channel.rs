// Run: cargo run --example channel --features tokio -- [--events 2000] [--rate 1000]
//
// gpuring as a channel between two tokio services in two processes. The "ingest" service (this
// process) reads sensor events at a fixed rate and sends each one into the ring with
// `send_async`; it spawns the "worker" service (this binary again, `--worker`), which reads
// them with `Consumer::stream` while its own timer prints a report every half second, all on
// one task. Neither side spins or blocks a thread: a waiting side parks its task and the other
// side rings its doorbell. Ctrl-C stops the ingest early; the worker sees the channel close,
// prints its summary and exits.
//
// Each event is a 24-byte record (sensor id, reading, send time); the user header carries its
// kind. The worker checks that events arrive in order and none is missing.

use std::process::{Command, ExitCode};
use std::time::Duration;

use clap::Parser;
use futures_util::StreamExt;
use gpuring::{monotonic_ns, Consumer, Policy, Producer, StartAt};

#[derive(Parser, Debug)]
#[command(about = "A tokio service sending events to another over a gpuring channel")]
struct Args {
    /// Events to send (0: until Ctrl-C).
    #[arg(long, default_value_t = 2000)]
    events: u64,
    /// Events per second.
    #[arg(long, default_value_t = 1000)]
    rate: u32,
    /// Internal: run as the worker service on ring NAME.
    #[arg(long, hide = true)]
    worker: Option<String>,
}

/// One event on the wire: sensor, reading, send time (CLOCK_MONOTONIC ns), little-endian.
struct Event {
    sensor: u32,
    reading: f64,
    sent_ns: u64,
}

impl Event {
    const LEN: usize = 24;

    fn encode(&self) -> [u8; Event::LEN] {
        let mut out = [0u8; Event::LEN];
        out[0..4].copy_from_slice(&self.sensor.to_le_bytes());
        out[8..16].copy_from_slice(&self.reading.to_le_bytes());
        out[16..24].copy_from_slice(&self.sent_ns.to_le_bytes());
        out
    }

    fn decode(b: &[u8]) -> Option<Event> {
        let b: &[u8; Event::LEN] = b.try_into().ok()?;
        Some(Event {
            sensor: u32::from_le_bytes(b[0..4].try_into().ok()?),
            reading: f64::from_le_bytes(b[8..16].try_into().ok()?),
            sent_ns: u64::from_le_bytes(b[16..24].try_into().ok()?),
        })
    }
}

// A current-thread runtime is enough for a service built around one consumer; the consumer's
// futures are `Send`, so a multi-threaded runtime and `tokio::spawn` work as well.
#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .init();
    let args = Args::parse();
    let result = match &args.worker {
        Some(name) => worker(name).await,
        None => ingest(&args).await,
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("channel: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The ingest service: owns the ring, starts the worker, sends events.
async fn ingest(args: &Args) -> Result<(), Box<dyn std::error::Error>> {
    let name = format!("channel-{}", std::process::id());
    // 256 slots of 64 bytes: a burst of a quarter second at 1000 events/s fits without waiting.
    let mut tx =
        Producer::builder(&name).capacity(256).slot_size(64).policy(Policy::Block).create()?;
    let mut worker = Command::new(std::env::current_exe()?).args(["--worker", &name]).spawn()?;
    while tx.consumer_count() == 0 {
        if let Some(status) = worker.try_wait()? {
            return Err(format!("worker exited before joining: {status}").into());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    println!("ingest: ring {name}, worker pid {} joined", worker.id());
    let mut tick =
        tokio::time::interval(Duration::from_secs_f64(1.0 / f64::from(args.rate.max(1))));
    let mut sent = 0u64;
    loop {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {
                println!("ingest: Ctrl-C, closing the channel");
                break;
            }
            _ = tick.tick() => {
                let event = Event {
                    sensor: (sent % 4) as u32,
                    reading: 20.0 + (sent as f64 * 0.1).sin(),
                    sent_ns: monotonic_ns(),
                };
                // Waits (without blocking the thread) only if the worker is a full ring behind.
                tx.send_async(&event.encode(), b"temperature").await?;
                sent += 1;
                if sent == args.events {
                    break;
                }
            }
        }
    }
    // Dropping the producer closes the channel: the worker drains what is left, then its
    // stream ends.
    drop(tx);
    println!("ingest: sent {sent} events");
    let status = tokio::task::spawn_blocking(move || worker.wait()).await??;
    if !status.success() {
        return Err(format!("worker failed: {status}").into());
    }
    Ok(())
}

/// The worker service: receives events and reports on a timer, on one task.
async fn worker(name: &str) -> Result<(), Box<dyn std::error::Error>> {
    let rx =
        Consumer::builder(name).start_at(StartAt::Oldest).open_timeout(Duration::from_secs(5))?;
    let mut events = rx.messages();
    let mut report = tokio::time::interval(Duration::from_millis(500));
    let (mut received, mut sum, mut worst_us) = (0u64, 0.0, 0.0f64);
    let mut per_sensor = [0u64; 4];
    loop {
        tokio::select! {
            next = events.next() => {
                let Some(msg) = next else { break };
                let msg = msg?;
                let event = Event::decode(&msg).ok_or("malformed event")?;
                if msg.seq() != received {
                    return Err(format!("event {} arrived as number {received}", msg.seq()).into());
                }
                if !msg.header().starts_with(b"temperature") {
                    return Err("unexpected event kind".into());
                }
                received += 1;
                sum += event.reading;
                worst_us = worst_us.max((monotonic_ns() - event.sent_ns) as f64 / 1e3);
                per_sensor[event.sensor as usize % 4] += 1;
            }
            _ = report.tick() => {
                if received > 0 {
                    println!(
                        "worker: {received} events, mean reading {:.3}, worst latency {worst_us:.0} µs",
                        sum / received as f64
                    );
                }
            }
        }
    }
    println!(
        "worker: channel closed after {received} events, all in order; per sensor {per_sensor:?}"
    );
    Ok(())
}
