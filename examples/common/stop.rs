//! Stopping on SIGTERM and SIGINT: `docker stop` (and `docker compose down`) sends SIGTERM,
//! Ctrl-C sends SIGINT. The handler only raises a flag; the loops of the pipeline look at it
//! between waits, which are bounded (at most [`SLICE`]), and end cleanly: the producer closes
//! the ring, so that its consumers see it end as closed rather than as a dead producer, and a
//! consumer leaves the ring and prints its summary.
//!
//! A process that installs no handler and runs as a container's pid 1 ignores SIGTERM (the
//! kernel drops signals that pid 1 does not handle), which is why docker/compose.yaml runs
//! each service under `init: true` as well.

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// The longest a loop of the pipeline waits before it looks at the flag again.
pub const SLICE: Duration = Duration::from_millis(100);

/// Raised by the handler.
static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    // Relaxed: a flag read by polling; nothing else is published through it.
    STOP.store(true, Ordering::Relaxed);
}

/// Installs the handler for SIGTERM and SIGINT, with `SA_RESTART` (the library's waits go on
/// after the handler, until their own timeout).
pub fn install() -> io::Result<()> {
    for signal in [libc::SIGTERM, libc::SIGINT] {
        // SAFETY: an all-zero `sigaction` is a valid value (no flags, an empty mask).
        let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
        action.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
        action.sa_flags = libc::SA_RESTART;
        // SAFETY: `action` is initialised, and its handler only stores to an atomic, which is
        // async-signal-safe; the old action is not asked for (null).
        if unsafe { libc::sigaction(signal, &action, std::ptr::null_mut()) } != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Whether SIGTERM or SIGINT came.
pub fn requested() -> bool {
    // Relaxed: see `on_signal`.
    STOP.load(Ordering::Relaxed)
}
