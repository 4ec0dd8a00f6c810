//! Stopping on SIGTERM and SIGINT: `docker stop` (and `docker compose down`) sends SIGTERM,
//! Ctrl-C sends SIGINT. [`gpuring::service::Shutdown`]'s handler only raises a flag; the loops
//! of the pipeline look at it between waits, which are bounded (at most [`SLICE`]), and end
//! cleanly: the producer closes the ring, so that its consumers see it end as closed rather
//! than as a dead producer, and a consumer leaves the ring (after the GPU's reads of what it
//! held) and prints its summary.
//!
//! A process that installs no handler and runs as a container's pid 1 ignores SIGTERM (the
//! kernel drops signals that pid 1 does not handle), which is why docker/compose.yaml runs
//! each service under `init: true` as well.

use std::io;
use std::sync::OnceLock;
use std::time::Duration;

use gpuring::service::Shutdown;

/// The longest a loop of the pipeline waits before it looks at the flag again.
pub const SLICE: Duration = Duration::from_millis(100);

/// The installed handler.
static STOP: OnceLock<Shutdown> = OnceLock::new();

/// Installs the handler for SIGTERM and SIGINT.
pub fn install() -> io::Result<()> {
    let stop = Shutdown::install()?;
    let _ = STOP.set(stop);
    Ok(())
}

/// Whether SIGTERM or SIGINT came.
pub fn requested() -> bool {
    STOP.get().is_some_and(Shutdown::requested)
}
