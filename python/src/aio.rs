//! `await rx.recv_async()` and `async for slot in rx`: the coroutines are written in Python
//! (`aio.py`, compiled into the extension), on the event loop's own reader for the consumer's
//! doorbell; this module loads them once.

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyModule;

static AIO: PyOnceLock<Py<PyModule>> = PyOnceLock::new();

/// The compiled `aio.py`.
pub fn module(py: Python<'_>) -> PyResult<&Bound<'_, PyModule>> {
    let m = AIO.get_or_try_init(py, || {
        PyModule::from_code(
            py,
            pyo3::ffi::c_str!(include_str!("aio.py")),
            c"gpuring/aio.py",
            c"gpuring._aio",
        )
        .map(Bound::unbind)
    })?;
    Ok(m.bind(py))
}
