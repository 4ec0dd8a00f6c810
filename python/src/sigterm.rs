//! Stopping gracefully: on SIGTERM, the way systemd, Docker and Kubernetes stop services, and
//! at interpreter exit.
//!
//! Python's default for SIGTERM ends the process at once, without running `finally` clauses,
//! `close()` or finalizers. That left ring names in their directory until the next create
//! reclaimed them, and it killed the process's GPU work mid-kernel: under MPS a client that
//! ends with kernels running (torch kernels reading a ring slot, say) faults every other
//! client of the GPU.
//!
//! - **The handler.** When this process creates its first producer or opens its first
//!   consumer on the main thread, and SIGTERM still has its default action, the package
//!   installs a handler (unless `gpuring.handle_sigterm(False)` or `GPURING_SIGTERM=0` opted
//!   out; an application's own handler is never replaced). On SIGTERM it removes the names of
//!   the rings this process's live producers created (only those whose producer is still this
//!   process), then raises `SystemExit(143)` (128 + SIGTERM) in the main thread: `with` blocks
//!   and `finally` clauses run, and the interpreter exits through its `atexit` hooks. Blocking
//!   calls release the GIL in slices of at most 100 ms (`bound::tick`) and check for signals
//!   between them, so a `recv` or `send` blocked in the main thread gives way within about
//!   100 ms.
//! - **Forked children** inherit the handler. Until a child makes gpuring objects of its own,
//!   the handler ends it as SIGTERM's default action would, as a `multiprocessing` worker
//!   expects.
//! - **At exit** ([`at_exit`], an `atexit` hook registered at import, so it runs after the
//!   hooks the application registers later): every producer and consumer still open is closed,
//!   consumers first (a CUDA consumer waits for its queued reads before its mappings go), then
//!   producers (aborted when the exit is SIGTERM's: the stream was cut); then
//!   `gpuring::cuda::finish_gpu_work` waits until no GPU work of this process runs, so none is
//!   still running when the CUDA context goes. Failures there are ignored (a lost context has
//!   nothing left to wait for). The registry of open objects ([`OPEN`]) holds weak references:
//!   it keeps nothing alive.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Mutex;

use pyo3::exceptions::PySystemExit;
use pyo3::prelude::*;
use pyo3::types::{PyWeakrefMethods, PyWeakrefReference};

use crate::consumer::Consumer;
use crate::errors::{context_lost_error, ring_error};
use crate::producer::Producer;

/// Rings created by this process's live producers: their directories and names.
static LIVE: Mutex<Vec<(PathBuf, String)>> = Mutex::new(Vec::new());

/// Weak references to the producers and consumers made in this process (and, in a forked
/// child, in its parent): what [`at_exit`] closes. Pruned of dead ones at each addition.
static OPEN: Mutex<Vec<Py<PyWeakrefReference>>> = Mutex::new(Vec::new());

/// The process that last made a producer or consumer: the handler stops gracefully only
/// there (a forked child that made none is ended as by default), and only there is GPU work
/// waited for at exit.
static MADE_IN: AtomicU32 = AtomicU32::new(0);

/// Set by the handler: the exit is SIGTERM's, and producers still open at exit are aborted.
static TERMINATED: AtomicBool = AtomicBool::new(false);

/// Whether the handler may be installed (`handle_sigterm`, `GPURING_SIGTERM`).
static ENABLED: Mutex<Option<bool>> = Mutex::new(None);

/// The exit status of a process stopped by SIGTERM through the handler: 128 + SIGTERM, what
/// a shell reports for a process that SIGTERM killed.
const EXIT_SIGTERM: i32 = 128 + libc::SIGTERM;

/// Registers [`at_exit`] with `atexit`. Called once, at import.
pub fn register_at_exit(py: Python<'_>) -> PyResult<()> {
    py.import("atexit")?.call_method1("register", (wrap_pyfunction!(at_exit, py)?,))?;
    Ok(())
}

/// Records `obj`, a producer or consumer just made, for [`at_exit`], and installs the
/// handler if it may be.
pub fn track(obj: &Bound<'_, PyAny>) -> PyResult<()> {
    let weak = PyWeakrefReference::new(obj)?.unbind();
    {
        let mut open = OPEN.lock().unwrap_or_else(|p| p.into_inner());
        open.retain(|w| w.bind(obj.py()).upgrade().is_some());
        open.push(weak);
    }
    MADE_IN.store(std::process::id(), Ordering::Relaxed);
    if enabled() {
        // A handler that cannot be installed leaves SIGTERM as it was: no reason to refuse
        // the producer or consumer.
        let _ = install(obj.py());
    }
    Ok(())
}

/// Records ring `name` of directory `dir`, just created, for the handler to remove.
pub fn created(dir: &Path, name: &str) {
    LIVE.lock().unwrap_or_else(|p| p.into_inner()).push((dir.to_owned(), name.to_owned()));
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
/// only one Python lets set handlers). Leaves an application's own handler alone, and ours
/// (installed already, or inherited from the parent of a fork) as it is.
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

/// The handler: removes this process's rings' names, then raises `SystemExit(143)`. In a
/// forked child that made no gpuring object, ends the process by SIGTERM instead.
#[pyfunction]
#[pyo3(signature = (_signum, _frame))]
fn on_sigterm(py: Python<'_>, _signum: i32, _frame: &Bound<'_, PyAny>) -> PyResult<()> {
    let me = std::process::id();
    if MADE_IN.load(Ordering::Relaxed) != me {
        let signal = py.import("signal")?;
        let sigterm = signal.getattr("SIGTERM")?;
        signal.call_method1("signal", (&sigterm, signal.getattr("SIG_DFL")?))?;
        py.import("os")?.call_method1("kill", (me, sigterm))?;
        return Ok(());
    }
    TERMINATED.store(true, Ordering::Relaxed);
    let names = std::mem::take(&mut *LIVE.lock().unwrap_or_else(|p| p.into_inner()));
    for (dir, name) in names {
        // Only a ring this process still produces: never a successor's of the same name.
        if gpuring::inspect::status_in(&dir, &name).is_ok_and(|s| s.producer_pid == me) {
            let _ = gpuring::inspect::remove_in(&dir, &name, true);
        }
    }
    Err(PySystemExit::new_err(EXIT_SIGTERM))
}

/// The `atexit` hook: closes every producer and consumer still open, consumers first, then
/// waits for this process's GPU work. Objects of another thread are dropped as `bound` says
/// (now, if their thread ended; never, while it runs on as a daemon); a forked child leaves
/// its parent's alone.
#[pyfunction]
fn at_exit(py: Python<'_>) {
    let open = std::mem::take(&mut *OPEN.lock().unwrap_or_else(|p| p.into_inner()));
    let live: Vec<Bound<'_, PyAny>> = open.iter().filter_map(|w| w.bind(py).upgrade()).collect();
    // One that is borrowed is in use by a thread that still runs: it stays as it is.
    for rx in live.iter().filter_map(|obj| obj.cast::<Consumer>().ok()) {
        if let Ok(mut rx) = rx.try_borrow_mut() {
            rx.close_at_exit(py);
        }
    }
    let cut = TERMINATED.load(Ordering::Relaxed);
    for tx in live.iter().filter_map(|obj| obj.cast::<Producer>().ok()) {
        if let Ok(mut tx) = tx.try_borrow_mut() {
            tx.close_at_exit(py, cut);
        }
    }
    if MADE_IN.load(Ordering::Relaxed) == std::process::id() && gpuring::context_lost().is_none() {
        let _ = py.detach(gpuring::cuda::finish_gpu_work);
    }
}

/// handle_sigterm(enable: bool) -> None
///
/// Whether gpuring installs its SIGTERM handler when this process creates a producer or opens
/// a consumer (default True, or `GPURING_SIGTERM=0` in the environment for False). Call it
/// before creating either.
///
/// The handler is installed only on the main thread, and only while SIGTERM has its default
/// action: never over a handler of the application's own. On SIGTERM it removes the names of
/// the rings this process's producers created, then raises `SystemExit(143)` in the main
/// thread, so that `with` blocks and `finally` clauses run and the process exits with status
/// 143 (128 + SIGTERM) instead of dying mid-kernel; a `recv` or `send` blocked in the main
/// thread gives way within about 100 ms. At exit, gpuring closes the producers and consumers
/// still open and waits until no GPU work of the process runs (`finish_gpu_work`), whether or
/// not the handler is installed. An application with a SIGTERM handler of its own should do
/// the same before it exits: close its consumers and producers, then call
/// `gpuring.finish_gpu_work()`.
#[pyfunction]
pub fn handle_sigterm(enable: bool) {
    *ENABLED.lock().unwrap_or_else(|p| p.into_inner()) = Some(enable);
}

/// finish_gpu_work() -> None
///
/// Waits until every GPU this process used through gpuring has no work of this process left
/// running: gpuring's and, since PyTorch works in the same (primary) CUDA context, torch's.
/// The last step of a graceful stop, after closing consumers and producers: a process that
/// exits while its kernels run has them torn down mid-flight, and under MPS that faults every
/// other client of the GPU. gpuring does it at exit; call it from a SIGTERM handler of your
/// own before exiting. Returns at once where no GPU was used. Raises
/// `gpuring.ContextLostError` if the context is lost (then nothing runs any more), and
/// `gpuring.Error` if a CUDA call fails.
#[pyfunction]
pub fn finish_gpu_work(py: Python<'_>) -> PyResult<()> {
    if let Some(lost) = gpuring::context_lost() {
        return Err(context_lost_error(&lost));
    }
    py.detach(gpuring::cuda::finish_gpu_work).map_err(|e| ring_error("", &e))
}
