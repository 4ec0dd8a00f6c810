//! Exception types, and how the ring's errors become them.

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
    ReleasedError,
    PyBufferError,
    "The slot was released: no new tensor, array or buffer can be made from it."
);

/// `gpuring.Error` with `what` as message.
pub fn error(what: impl std::fmt::Display) -> PyErr {
    Error::new_err(what.to_string())
}

/// What a failed open becomes: `FileNotFoundError` for a ring that does not exist (so
/// `except FileNotFoundError` works as for files), `gpuring.Disconnected` for one whose
/// producer is gone, `TimeoutError` for one not ready within the wait, `PermissionError` for a
/// VMM producer that refused to share its memory
/// with this process, `gpuring.Error` otherwise.
/// The message is the Rust error's, word for word.
pub fn open_error(e: gpuring::OpenError) -> PyErr {
    use gpuring::OpenErrorKind as K;
    let text = e.to_string();
    match e.kind() {
        K::NotFound => PyFileNotFoundError::new_err(text),
        K::Disconnected => Disconnected::new_err(text),
        K::TimedOut => PyTimeoutError::new_err(text),
        K::PeerRefused { .. } => PyPermissionError::new_err(text),
        _ => Error::new_err(text),
    }
}

/// A wait that ran out.
pub fn timeout(what: &str) -> PyErr {
    PyTimeoutError::new_err(what.to_string())
}
