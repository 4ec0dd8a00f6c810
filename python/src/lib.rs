//! The `gpuring` Python module: consumers whose slots export zero-copy tensors (DLPack,
//! `__cuda_array_interface__`, the buffer protocol), and a producer that publishes tensors.
//! User documentation: docs/python.md. Layout of this crate:
//!
//! - `kind`: what `Producer.send` reads a message from, which differs between host and CUDA
//!   memory; the producer and consumer themselves are `gpuring::any`'s, one type for both;
//! - `consumer`: `gpuring.Consumer`, which opens a ring of either memory kind and receives;
//! - `aio`: its asyncio coroutines (`aio.py`), on the event loop's reader for its doorbell;
//! - `held`: the consumer (either kind) and the stream it reads on, and a received message
//!   together with the consumer it borrows;
//! - `bound`: objects bound to their thread and process, and how they are dropped when
//!   Python frees them elsewhere;
//! - `slot`: `gpuring.Slot`, its attributes, `release` and the three export protocols;
//! - `dlpack`: the DLPack C structures and capsule;
//! - `layout`: element type and shape (arguments, the tensor header, or bytes);
//! - `producer`: `gpuring.Producer`;
//! - `sigterm`: stopping gracefully on SIGTERM and at interpreter exit;
//! - `errors`: the exception types and how Rust errors map to them, and a lost GPU context.

use pyo3::prelude::*;

mod aio;
mod batch;
mod bound;
mod consumer;
mod dlpack;
mod errors;
mod held;
mod kind;
mod layout;
mod producer;
mod sigterm;
mod slot;
mod torch;

/// The ring directory of a `dir=` argument: the library's default (`GPURING_DIR`, else
/// `/dev/shm`) when None, made absolute now, so that the `dir` property and the SIGTERM
/// cleanup name the same directory after a change of working directory or environment.
fn ring_dir(dir: Option<std::path::PathBuf>) -> std::path::PathBuf {
    let dir = dir.unwrap_or_else(gpuring::shm::default_dir);
    // Fails only for an empty path (or no working directory): left for the open to report.
    std::path::absolute(&dir).unwrap_or(dir)
}

/// The `gpuring` module.
#[pymodule]
#[pyo3(name = "gpuring")]
fn gpuring_module(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    // Before any gpuring object exists: a fork() must not copy our locks held.
    bound::register_fork_handlers()?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_class::<consumer::Consumer>()?;
    m.add_class::<slot::Slot>()?;
    m.add_class::<producer::Producer>()?;
    m.add_class::<batch::Batcher>()?;
    m.add("Error", py.get_type::<errors::Error>())?;
    m.add("Disconnected", py.get_type::<errors::Disconnected>())?;
    m.add("ReleasedError", py.get_type::<errors::ReleasedError>())?;
    m.add("ContextLostError", py.get_type::<errors::ContextLostError>())?;
    m.add("EXIT_CONTEXT_LOST", gpuring::EXIT_CONTEXT_LOST)?;
    m.add_function(wrap_pyfunction!(errors::context_lost, m)?)?;
    #[cfg(feature = "test-support")]
    m.add_function(wrap_pyfunction!(errors::_lose_context_after, m)?)?;
    m.add_function(wrap_pyfunction!(layout::tensor_header, m)?)?;
    m.add_function(wrap_pyfunction!(batch::batch_table, m)?)?;
    m.add_function(wrap_pyfunction!(sigterm::handle_sigterm, m)?)?;
    m.add_function(wrap_pyfunction!(sigterm::finish_gpu_work, m)?)?;
    // At import, so that it runs after the `atexit` hooks the application registers later.
    sigterm::register_at_exit(py)?;
    Ok(())
}
