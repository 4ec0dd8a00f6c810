//! Cleaning up on SIGTERM, the way systemd and Docker stop services: Python's default for
//! SIGTERM ends the process at once, without running `close()` or finalizers, which left the
//! ring's name in its directory (`/dev/shm`, or the producer's `dir`) until the next create
//! reclaimed it.
//!
//! When a process creates its first producer on the main thread and SIGTERM still has its
//! default action, the package installs a handler that removes the names of the rings this
//! process's live producers created (only those whose producer is still this process), then
//! lets SIGTERM end the process as it would have. Consumers keep what they mapped and see the
//! producer gone ("died": the stream was cut). An application that handles SIGTERM itself
//! keeps its handler; `gpuring.handle_sigterm(False)` (or `GPURING_SIGTERM=0`) opts out.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use pyo3::prelude::*;

/// Rings created by this process's live producers: their directories and names.
static LIVE: Mutex<Vec<(PathBuf, String)>> = Mutex::new(Vec::new());

/// Whether the handler may be installed (`handle_sigterm`, `GPURING_SIGTERM`).
static ENABLED: Mutex<Option<bool>> = Mutex::new(None);

/// Records ring `name` of directory `dir`, just created, and installs the handler if it may be.
pub fn created(py: Python<'_>, dir: &Path, name: &str) -> PyResult<()> {
    LIVE.lock().unwrap_or_else(|p| p.into_inner()).push((dir.to_owned(), name.to_owned()));
    if enabled() {
        // A handler that cannot be installed leaves SIGTERM as it was: no reason to refuse
        // the producer.
        let _ = install(py);
    }
    Ok(())
}

/// Forgets ring `name` of directory `dir`: its producer closed it (or was dropped).
pub fn closed(dir: &Path, name: &str) {
    LIVE.lock()
        .unwrap_or_else(|p| p.into_inner())
        .retain(|(d, n)| (d.as_path(), n.as_str()) != (dir, name));
}

fn enabled() -> bool {
    let mut e = ENABLED.lock().unwrap_or_else(|p| p.into_inner());
    *e.get_or_insert_with(|| std::env::var("GPURING_SIGTERM").map_or(true, |v| v != "0"))
}

/// Installs the handler, if SIGTERM has its default action and this is the main thread (the
/// only one Python lets set handlers). Leaves an application's own handler alone.
fn install(py: Python<'_>) -> PyResult<()> {
    let signal = py.import("signal")?;
    let threading = py.import("threading")?;
    if !threading.call_method0("current_thread")?.is(&threading.call_method0("main_thread")?) {
        return Ok(());
    }
    let sigterm = signal.getattr("SIGTERM")?;
    if !signal.call_method1("getsignal", (&sigterm,))?.is(&signal.getattr("SIG_DFL")?) {
        return Ok(());
    }
    let handler = wrap_pyfunction!(on_sigterm, py)?;
    signal.call_method1("signal", (sigterm, handler))?;
    Ok(())
}

/// The handler: removes this process's rings' names, then ends the process by SIGTERM.
#[pyfunction]
#[pyo3(signature = (_signum, _frame))]
fn on_sigterm(py: Python<'_>, _signum: i32, _frame: &Bound<'_, PyAny>) -> PyResult<()> {
    let me = std::process::id();
    let names = std::mem::take(&mut *LIVE.lock().unwrap_or_else(|p| p.into_inner()));
    for (dir, name) in names {
        // Only a ring this process still produces: never a successor's of the same name.
        if gpuring::inspect::status_in(&dir, &name).is_ok_and(|s| s.producer_pid == me) {
            let _ = gpuring::inspect::remove_in(&dir, &name, true);
        }
    }
    let signal = py.import("signal")?;
    let sigterm = signal.getattr("SIGTERM")?;
    signal.call_method1("signal", (&sigterm, signal.getattr("SIG_DFL")?))?;
    py.import("os")?.call_method1("kill", (me, sigterm))?;
    Ok(())
}

/// handle_sigterm(enable: bool) -> None
///
/// Whether gpuring installs its SIGTERM handler when this process creates a producer (default
/// True, or `GPURING_SIGTERM=0` in the environment for False). The handler removes the names
/// of the rings this process's producers created, then lets SIGTERM end the process; it is
/// never installed over a handler of the application's own. Call before creating producers.
#[pyfunction]
pub fn handle_sigterm(enable: bool) {
    *ENABLED.lock().unwrap_or_else(|p| p.into_inner()) = Some(enable);
}
