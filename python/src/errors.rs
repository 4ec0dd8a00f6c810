//! Exception types, and how the ring's errors become them.

use gpuring::cuda::{CudaError, DriverError};
use gpuring::ContextLost;
use pyo3::create_exception;
use pyo3::exceptions::{
    PyBufferError, PyException, PyFileNotFoundError, PyPermissionError, PyTimeoutError,
};
use pyo3::PyErr;

create_exception!(
    gpuring,
    Error,
    PyException,
    "Something went wrong in a ring: it could not be created or opened, it is corrupt, or a CUDA call failed."
);
create_exception!(
    gpuring,
    Disconnected,
    Error,
    "The producer closed the ring (or died) and every message was received."
);
create_exception!(
    gpuring,
    ContextLostError,
    Error,
    "The GPU context of this process is lost: a kernel of it faulted or, under MPS, another client of the GPU crashed. No GPU work can run in the process any more: let the exception propagate, exit with gpuring.EXIT_CONTEXT_LOST (75) and have a supervisor restart the process."
);
create_exception!(
    gpuring,
    ReleasedError,
    PyBufferError,
    "The slot was released: no new tensor, array or buffer can be made from it."
);

/// `gpuring.Error` with `what` as message.
pub fn error(what: impl std::fmt::Display) -> PyErr {
    Error::new_err(what.to_string())
}

/// What an error of the ring (or of a CUDA call) becomes: `gpuring.ContextLostError` when it
/// says, or this process knows, that the GPU context is lost (its message is the Rust
/// `ContextLost`'s, the same from every call), else `gpuring.Error` with `prefix` and the
/// error's message.
pub fn ring_error(prefix: &str, e: &(dyn std::error::Error + 'static)) -> PyErr {
    match lost_in(e) {
        Some(lost) => context_lost_error(&lost),
        None => Error::new_err(format!("{prefix}{e}")),
    }
}

/// `gpuring.ContextLostError` for `lost`.
pub fn context_lost_error(lost: &ContextLost) -> PyErr {
    ContextLostError::new_err(lost.to_string())
}

/// The lost context that `e` reports: a `ContextLost` in its chain, a driver error that loses
/// the context (a CUDA call of this package's own), or, after any failure, the loss this
/// process already knows of (the failure was most likely the loss, seen under another name).
fn lost_in(e: &(dyn std::error::Error + 'static)) -> Option<ContextLost> {
    let mut next = Some(e);
    while let Some(e) = next {
        if let Some(lost) = e.downcast_ref::<ContextLost>() {
            return Some(lost.clone());
        }
        let driver = match e.downcast_ref::<CudaError>() {
            Some(CudaError::Driver(d)) => Some(*d),
            _ => e.downcast_ref::<DriverError>().copied(),
        };
        if let Some(d) = driver.filter(DriverError::loses_process_context) {
            return Some(d.into());
        }
        next = e.source();
    }
    gpuring::context_lost()
}

/// What a failed open becomes: `FileNotFoundError` for a ring that does not exist (so
/// `except FileNotFoundError` works as for files), `gpuring.Disconnected` for one whose
/// producer is gone, `TimeoutError` for one not ready within the wait, `PermissionError` for a
/// VMM producer that refused to share its memory with this process, `ContextLostError` when
/// this process's GPU context is lost, `gpuring.Error` otherwise.
/// The message is the Rust error's, word for word.
pub fn open_error(e: gpuring::OpenError) -> PyErr {
    use gpuring::OpenErrorKind as K;
    let text = e.to_string();
    match e.kind() {
        K::NotFound => PyFileNotFoundError::new_err(text),
        K::Disconnected => Disconnected::new_err(text),
        K::TimedOut => PyTimeoutError::new_err(text),
        K::PeerRefused { .. } => PyPermissionError::new_err(text),
        K::ContextLost(lost) => context_lost_error(lost),
        _ => ring_error("", &e),
    }
}

/// A wait that ran out.
pub fn timeout(what: &str) -> PyErr {
    PyTimeoutError::new_err(what.to_string())
}

/// context_lost() -> str | None
///
/// Whether this process's GPU context is lost: None while it is not, else the message that
/// `gpuring.ContextLostError` carries. Once lost it stays lost: the process must exit (with
/// `gpuring.EXIT_CONTEXT_LOST`) and be restarted. Every gpuring call checks it too.
#[pyo3::pyfunction]
pub fn context_lost() -> Option<String> {
    gpuring::context_lost().map(|lost| lost.to_string())
}

/// _lose_context_after(n: int) -> None
///
/// Test builds only (feature `test-support`): after `n` more ring operations (an acquire, a
/// publish, a receive...), this process's GPU context counts as lost, for good, as after a
/// sticky CUDA error.
#[cfg(feature = "test-support")]
#[pyo3::pyfunction]
pub fn _lose_context_after(n: u64) {
    gpuring::lose_context_after(n);
}
