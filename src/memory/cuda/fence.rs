//! The one GPU-side ordering step both sides take: make a stream's next work run after the work
//! another process signalled, as cheaply as possible: nothing if the signal is already there
//! (seen within a short CPU poll), else one GPU-side wait.

use std::time::{Duration, Instant};

use crate::cuda::driver::{self, CUdeviceptr, DriverError};
use crate::cuda::{Context, IpcEvent, Stream};

/// Asks `done` at least once, and again until `window` has passed. Returns whether it said yes.
fn poll_until_done(
    mut done: impl FnMut() -> Result<bool, DriverError>,
    window: Duration,
) -> Result<bool, DriverError> {
    let start = Instant::now();
    loop {
        if done()? {
            return Ok(true);
        }
        if start.elapsed() >= window {
            return Ok(false);
        }
        std::hint::spin_loop();
    }
}

/// What the other side's work is signalled by.
pub(crate) enum Signal<'a> {
    /// Event fences: its interprocess event.
    Event(&'a IpcEvent),
    /// Memory fences: a page-locked host word (`cpu`, mapped at device address `device`) that
    /// the other side's GPU sets to at least `value` after the work.
    Word { cpu: &'a std::sync::atomic::AtomicU64, device: CUdeviceptr, value: u64 },
}

impl Signal<'_> {
    fn is_done(&self) -> Result<bool, DriverError> {
        match self {
            Signal::Event(ev) => ev.is_complete(),
            // Acquire: the GPU wrote the word after the work, with a system-wide barrier; what
            // the CPU then does (skip the wait, reuse the buffer) comes after.
            Signal::Word { cpu, value, .. } => {
                Ok(cpu.load(std::sync::atomic::Ordering::Acquire) >= *value)
            }
        }
    }
}

/// Makes work queued on `stream` from now on run after the work `signal` marks: nothing if it
/// completed (seen at once or within the `poll` window), else a GPU-side wait on the event or the word
/// (`cuStreamWaitValue64`, greater or equal in the driver's cyclic sense: see
/// `driver::stream_wait_value64`).
///
/// # Safety
/// 1. `Signal::Word`'s word must be an 8-byte word readable from `ctx`'s device until the
///    wait has run, which the other side sets to at least its value after the work.
pub(crate) unsafe fn order_after(
    signal: Signal<'_>,
    poll: Duration,
    ctx: &Context,
    stream: &Stream,
) -> Result<(), DriverError> {
    // An event with no poll window goes straight to `wait_if_pending`, which queries it once
    // itself; a word is one load, always worth a look first.
    let look = !poll.is_zero() || matches!(signal, Signal::Word { .. });
    if look && poll_until_done(|| signal.is_done(), poll)? {
        return Ok(());
    }
    let (device, value) = match signal {
        Signal::Event(ev) => return ev.wait_if_pending(stream).map(drop),
        Signal::Word { device, value, .. } => (device, value),
    };
    let _bound = ctx.bind()?;
    // SAFETY: the word by (1); the stream is live while borrowed.
    unsafe { driver::stream_wait_value64(stream.raw(), device, value) }
}
