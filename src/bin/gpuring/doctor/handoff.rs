//! The handoff round trip of `gpuring doctor`: this process publishes a small frame on a
//! "ping" ring; a child (`gpuring doctor-echo`, hidden) receives it and publishes one back on
//! a "pong" ring; this process receives that. Real rings, real processes, both memory kinds.
//!
//! Each side writes the test pattern into its slot (CUDA: a kernel on the slot's stream) and
//! checks what it receives (CUDA: a kernel on its stream), then reads its mismatch counter,
//! which waits for that check kernel. So one round trip includes two GPU handoffs between
//! processes, each finished on the GPU before the next hop starts: without MPS each one waits
//! for a time slice, which is what the figure shows.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use gpuring::testing::payload::Payload;
use gpuring::{Consumer, Host, OpenErrorKind, Producer, RecvTimeoutError, StartAt};

/// Bytes per frame: small, so that the figure is the handoff, not the copy.
const FRAME: usize = 4096;
/// Round trips run before the measured ones (kernel compilation, first faults).
const WARMUP: u64 = 20;
/// How long one side waits for the other at any step before it gives up.
const PATIENCE: Duration = Duration::from_secs(10);

/// The p50 of `frames` measured round trips (ns), in CUDA memory if `cuda`, else in host
/// memory.
pub fn measure(cuda: bool, frames: u64) -> Result<u64, String> {
    #[cfg(feature = "cuda")]
    if cuda {
        return round_trips::<gpuring::Cuda>("cuda", frames);
    }
    let _ = cuda;
    round_trips::<Host>("host", frames)
}

/// Kills the echo child if the measurement stops early (it would otherwise wait
/// [`PATIENCE`] for a frame that never comes).
struct Echo(Child);

impl Drop for Echo {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            let _ = self.0.kill();
        }
        let _ = self.0.wait();
    }
}

/// The measurement in memory kind `M`, which `memory` names for the echo process.
fn round_trips<M: Payload>(memory: &str, frames: u64) -> Result<u64, String> {
    let base = format!("gpuring-doctor-{}", std::process::id());
    let (ping, pong) = (format!("{base}-ping"), format!("{base}-pong"));
    let mut tx = Producer::builder(&ping)
        .capacity(4)
        .slot_size(FRAME)
        .create_in::<M>()
        .map_err(|e| format!("creating ring {ping}: {e}"))?;
    let w = M::writer(&tx).map_err(|e| e.to_string())?;
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut echo = Echo(
        Command::new(exe)
            .args(["doctor-echo", &ping, &pong, "--memory", memory])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .map_err(|e| format!("starting the echo process: {e}"))?,
    );
    let rx = open_retrying::<M>(&pong, Some(&mut echo.0))?;
    let t = Instant::now();
    while tx.consumer_count() < 1 {
        if t.elapsed() > PATIENCE {
            return Err("the echo process did not join".into());
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let c = M::checker(&rx).map_err(|e| e.to_string())?;
    let mut lat = Vec::with_capacity(frames as usize);
    for seq in 0..WARMUP + frames {
        let t = Instant::now();
        let mut slot = tx.acquire().map_err(|e| e.to_string())?;
        M::fill(&w, &mut slot, FRAME, seq).map_err(|e| e.to_string())?;
        slot.publish(FRAME, b"").map_err(|e| e.to_string())?;
        let m = rx.recv_timeout(PATIENCE).map_err(|e| format!("receiving the echo: {e}"))?;
        M::check(&c, &m).map_err(|e| e.to_string())?;
        drop(m);
        // Waits for the check (CUDA: its kernel), so the hop is done on the GPU.
        M::mismatches(&c, &rx).map_err(|e| e.to_string())?;
        if seq >= WARMUP {
            lat.push(t.elapsed().as_nanos() as u64);
        }
    }
    drop(tx);
    let status = echo.0.wait().map_err(|e| e.to_string())?;
    if !status.success() {
        return Err(format!("the echo process failed ({status})"));
    }
    let bad = M::mismatches(&c, &rx).map_err(|e| e.to_string())?;
    if bad != 0 {
        return Err(format!("{bad} bytes came back different from what was sent"));
    }
    lat.sort_unstable();
    Ok(lat[lat.len() / 2])
}

/// Opens ring `name` as a consumer, waiting for its producer to create it (and giving up early
/// if `child`, who creates it, exited).
fn open_retrying<M: Payload>(
    name: &str,
    mut child: Option<&mut Child>,
) -> Result<Consumer<M>, String> {
    let t = Instant::now();
    loop {
        match Consumer::builder(name).start_at(StartAt::Next).open_in::<M>() {
            Ok(rx) => return Ok(rx),
            // Not there yet, or half-built (between the echo's shm_open and its ftruncate).
            Err(e)
                if matches!(
                    e.kind(),
                    OpenErrorKind::NotFound
                        | OpenErrorKind::NotInitialized
                        | OpenErrorKind::Truncated { .. }
                ) && t.elapsed() < PATIENCE =>
            {
                if let Some(Ok(Some(status))) = child.as_mut().map(|c| c.try_wait()) {
                    return Err(format!("the echo process exited early ({status})"));
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(e) => return Err(e.to_string()),
        }
    }
}

/// `gpuring doctor-echo PING PONG --memory M`: creates `pong`, then sends back on it every
/// frame received on `ping` (pattern checked) until `ping`'s producer leaves.
pub fn echo(ping: &str, pong: &str, memory: &str) -> Result<(), String> {
    match memory {
        #[cfg(feature = "cuda")]
        "cuda" => echo_in::<gpuring::Cuda>(ping, pong),
        "host" => echo_in::<Host>(ping, pong),
        other => Err(format!("--memory {other}: expected host or cuda")),
    }
}

fn echo_in<M: Payload>(ping: &str, pong: &str) -> Result<(), String> {
    let mut tx = Producer::builder(pong)
        .capacity(4)
        .slot_size(FRAME)
        .create_in::<M>()
        .map_err(|e| format!("creating ring {pong}: {e}"))?;
    let w = M::writer(&tx).map_err(|e| e.to_string())?;
    let rx = open_retrying::<M>(ping, None)?;
    let c = M::checker(&rx).map_err(|e| e.to_string())?;
    for seq in 0.. {
        match rx.recv_timeout(PATIENCE) {
            Ok(m) => {
                M::check(&c, &m).map_err(|e| e.to_string())?;
                drop(m);
                M::mismatches(&c, &rx).map_err(|e| e.to_string())?;
            }
            Err(RecvTimeoutError::Disconnected) => break,
            Err(e) => return Err(format!("receiving a frame: {e}")),
        }
        let mut slot = tx.acquire().map_err(|e| e.to_string())?;
        M::fill(&w, &mut slot, FRAME, seq).map_err(|e| e.to_string())?;
        slot.publish(FRAME, b"").map_err(|e| e.to_string())?;
    }
    match M::mismatches(&c, &rx).map_err(|e| e.to_string())? {
        0 => Ok(()),
        bad => Err(format!("{bad} bytes differed from what was sent")),
    }
}
