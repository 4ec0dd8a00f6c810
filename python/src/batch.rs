//! `gpuring.Batcher`: K camera rings into one ring of batches (docs/batching.md), and
//! `gpuring.batch_table`: the table a batcher writes in each batch's user header, as Python
//! values.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use gpuring::batch::{BatchTable, Fill, RunError, Timing, Totals};
use gpuring::tensor::TensorHeader;
use gpuring::Mode;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use crate::layout::parse_dtype;

/// batch_table(header) -> dict | None
///
/// The batch table of user header `header` (a batch's `slot.header`): `{"batch", "closed_ns",
/// "cameras": [{"seq", "timestamp_ns", "skipped", "epoch", "state"}, ...]}`, `state` one of
/// "present", "stale", "absent", "refused"; None if the message is not a batch; ValueError if
/// the table is damaged.
#[pyfunction]
pub fn batch_table<'py>(py: Python<'py>, header: &[u8]) -> PyResult<Option<Bound<'py, PyDict>>> {
    let Some(t) = BatchTable::read(header).map_err(|e| PyValueError::new_err(e.to_string()))?
    else {
        return Ok(None);
    };
    let cameras = PyList::empty(py);
    for c in &t.cameras {
        let d = PyDict::new(py);
        d.set_item("seq", c.seq)?;
        d.set_item("timestamp_ns", c.timestamp_ns)?;
        d.set_item("skipped", c.skipped)?;
        d.set_item("epoch", c.epoch)?;
        d.set_item("state", c.state.name())?;
        cameras.append(d)?;
    }
    let d = PyDict::new(py);
    d.set_item("batch", t.batch)?;
    d.set_item("closed_ns", t.closed_ns)?;
    d.set_item("cameras", cameras)?;
    Ok(Some(d))
}

/// Batcher(ring, inputs, *, max_wait=0.05, rate=None, fill="previous", mode="latest",
/// memory="host", device=0, dtype=None, shape=None, capacity=4, spares=4, dir=None)
///
/// Batches camera rings `inputs` into ring `ring` (docs/batching.md) on a thread of its own
/// until `stop()` (or the end of a `with` block); `stop()` returns what it did.
#[pyclass(module = "gpuring")]
pub struct Batcher {
    /// Set by `stop`: the batcher's thread ends within 50 ms.
    stop: Arc<AtomicBool>,
    /// The batcher's thread until it was joined.
    thread: Option<JoinHandle<Result<Totals, RunError>>>,
}

#[pymethods]
impl Batcher {
    #[new]
    #[pyo3(signature = (ring, inputs, *, max_wait=0.05, rate=None, fill="previous", mode="latest", memory="host", device=0, dtype=None, shape=None, capacity=4, spares=4, dir=None))]
    #[allow(clippy::too_many_arguments)] // Python keyword arguments
    fn new(
        ring: &str,
        inputs: Vec<String>,
        max_wait: f64,
        rate: Option<f64>,
        fill: &str,
        mode: &str,
        memory: &str,
        device: i32,
        dtype: Option<&Bound<'_, PyAny>>,
        shape: Option<Vec<u64>>,
        capacity: u32,
        spares: u32,
        dir: Option<PathBuf>,
    ) -> PyResult<Batcher> {
        let bad = |what: String| PyValueError::new_err(what);
        let seconds = |s: f64, what: &str| {
            Duration::try_from_secs_f64(s).map_err(|_| bad(format!("{what}={s}: seconds, >= 0")))
        };
        let timing = match rate {
            Some(r) if r > 0.0 => Timing::Rate { period: seconds(1.0 / r, "rate")? },
            Some(r) => return Err(bad(format!("rate={r}: batches a second, > 0"))),
            None => Timing::AllFresh { max_wait: seconds(max_wait, "max_wait")? },
        };
        let fill = match fill {
            "previous" => Fill::Previous,
            "zeros" => Fill::Zeros,
            f => return Err(bad(format!("fill={f:?}: use \"previous\" or \"zeros\""))),
        };
        let mode = Mode::from_name(mode)
            .ok_or_else(|| bad(format!("mode={mode:?}: use \"latest\" or \"lossless\"")))?;
        let cuda = match memory {
            "cuda" => true,
            "host" => false,
            m => return Err(bad(format!("memory={m:?}: use \"host\" or \"cuda\""))),
        };
        let mut b = gpuring::batch::Batcher::builder(ring, &inputs)
            .timing(timing)
            .fill(fill)
            .mode(mode)
            .device(device)
            .capacity(capacity)
            .spare_buffers(spares)
            .dir(crate::ring_dir(dir));
        match (dtype, shape) {
            (Some(d), Some(s)) => b = b.frame(TensorHeader::new(parse_dtype(d)?, &s)),
            (None, None) => {}
            _ => return Err(bad("dtype and shape go together".into())),
        }
        let batcher = b.build().map_err(|e| bad(e.to_string()))?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("gpuring-batch".into())
            .spawn(move || match cuda {
                true => batcher.run_in::<gpuring::Cuda>(&flag),
                false => batcher.run(&flag),
            })
            .map_err(|e| crate::errors::error(format!("starting the batcher: {e}")))?;
        Ok(Batcher { stop, thread: Some(thread) })
    }

    /// stop() -> dict
    ///
    /// Stops the batcher (within 50 ms) and returns what it did: `{"batches": N, "cameras":
    /// [{"present", "stale", "absent", "refused"}, ...]}`, the batches each camera was in per
    /// state. Raises `gpuring.Error` if the batcher had stopped on a failure of its own (its
    /// ring could not be made, say). A second call returns None.
    fn stop<'py>(&mut self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        let Some(thread) = self.thread.take() else { return Ok(None) };
        // Relaxed: a flag; nothing is published with it.
        self.stop.store(true, Ordering::Relaxed);
        let done = py.detach(|| thread.join());
        let totals = match done {
            Ok(Ok(t)) => t,
            Ok(Err(e)) => return Err(crate::errors::ring_error("batcher: ", &e)),
            Err(_) => return Err(crate::errors::error("the batcher's thread panicked")),
        };
        let cameras = PyList::empty(py);
        for [p, s, a, r] in &totals.cameras {
            let d = PyDict::new(py);
            d.set_item("present", p)?;
            d.set_item("stale", s)?;
            d.set_item("absent", a)?;
            d.set_item("refused", r)?;
            cameras.append(d)?;
        }
        let d = PyDict::new(py);
        d.set_item("batches", totals.batches)?;
        d.set_item("cameras", cameras)?;
        Ok(Some(d))
    }

    /// Whether the batcher still runs (False once stopped, or once it failed).
    #[getter]
    fn running(&self) -> bool {
        self.thread.as_ref().is_some_and(|t| !t.is_finished())
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(
        &mut self,
        py: Python<'_>,
        _args: &Bound<'_, pyo3::types::PyTuple>,
    ) -> PyResult<bool> {
        self.stop(py)?;
        Ok(false)
    }
}

impl Drop for Batcher {
    fn drop(&mut self) {
        if let Some(t) = self.thread.take() {
            // Relaxed: as in `stop`. The thread needs no GIL: joining it here cannot deadlock.
            self.stop.store(true, Ordering::Relaxed);
            let _ = t.join();
        }
    }
}
