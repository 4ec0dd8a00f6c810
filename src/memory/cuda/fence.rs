//! The one GPU-side ordering step both sides take: make a stream's next work run after the work
//! behind another process's event, as cheaply as possible.

use std::time::{Duration, Instant};

use crate::cuda::driver::{self, CUdeviceptr, DriverError};
use crate::cuda::{Context, IpcEvent, Stream};

/// Polls `ev` with `cuEventQuery` for up to `window` (nothing when it is zero). Returns
/// whether it completed.
fn poll_until_complete(ev: &IpcEvent, window: Duration) -> Result<bool, DriverError> {
    if window.is_zero() {
        return Ok(false);
    }
    let start = Instant::now();
    loop {
        if ev.is_complete()? {
            return Ok(true);
        }
        if start.elapsed() >= window {
            return Ok(false);
        }
        std::hint::spin_loop();
    }
}

/// Makes work queued on `stream` from now on run after the work before `ev`'s last record:
/// nothing if that completed (seen within the `poll` window), else a GPU-side wait, on the
/// event, or with `Fence::Memory` (`word` is `Some((address, value))`) until the device word at
/// `address` is at least `value`. The other side writes that word before it records the event,
/// so a completed event means a written word.
///
/// # Safety
/// 1. With `word`, `address` must be an 8-byte device word readable from `ctx` until the wait
///    has run, which the other side sets to at least `value` after the work `ev` marks.
pub(crate) unsafe fn order_after(
    ev: &IpcEvent,
    word: Option<(CUdeviceptr, u64)>,
    poll: Duration,
    ctx: &Context,
    stream: &Stream,
) -> Result<(), DriverError> {
    if poll_until_complete(ev, poll)? {
        return Ok(());
    }
    match word {
        None => {
            ev.wait_if_pending(stream)?;
        }
        Some((address, value)) if !ev.is_complete()? => {
            let _bound = ctx.bind()?;
            // SAFETY: the word by (1); the stream is live while borrowed.
            unsafe { driver::stream_wait_value64(stream.raw(), address, value) }?;
        }
        Some(_) => {}
    }
    Ok(())
}
