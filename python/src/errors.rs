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
pub fn open_error(name: &str, e: gpuring::OpenError) -> PyErr {
    match e {
        gpuring::OpenError::NotFound => {
            PyFileNotFoundError::new_err(format!("no ring named {name:?}"))
        }
        gpuring::OpenError::Disconnected => {
            Disconnected::new_err(format!("ring {name:?}: producer gone"))
        }
        e @ gpuring::OpenError::TimedOut => PyTimeoutError::new_err(format!("ring {name:?}: {e}")),
        e @ gpuring::OpenError::PeerRefused { .. } => {
            PyPermissionError::new_err(format!("ring {name:?}: {e}"))
        }
        e => Error::new_err(format!("ring {name:?}: {e}")),
    }
}

/// A wait that ran out.
pub fn timeout(what: &str) -> PyErr {
    PyTimeoutError::new_err(what.to_string())
}
