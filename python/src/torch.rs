//! `slot.torch()`: a torch tensor of a message through torch's own DLPack import. It does what
//! `torch.from_dlpack(slot)` does for a CUDA or host message (order torch's current stream
//! after the message's writes, then import the capsule) without that function's Python on
//! every call (a device object, a stream object, probing the exporter's signature), which
//! costs more than the whole receive.

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;

/// What `slot.torch()` calls of torch, looked up once.
pub struct Torch {
    /// `torch._C._from_dlpack`: a tensor from a DLPack capsule.
    from_dlpack: Py<PyAny>,
    /// `torch._C._cuda_getCurrentRawStream`: the raw handle of torch's current stream on a
    /// device (0: the legacy default stream); `None` in a torch built without CUDA.
    raw_stream: Option<Py<PyAny>>,
}

static TORCH: PyOnceLock<Torch> = PyOnceLock::new();

/// torch's entry points, imported on first use (`ImportError` without torch).
pub fn get(py: Python<'_>) -> PyResult<&Torch> {
    TORCH.get_or_try_init(py, || {
        let c = py.import("torch")?.getattr("_C")?;
        let raw_stream = c.getattr("_cuda_getCurrentRawStream").ok().map(Bound::unbind);
        Ok(Torch { from_dlpack: c.getattr("_from_dlpack")?.unbind(), raw_stream })
    })
}

impl Torch {
    /// torch's current stream on CUDA device `device`, numbered as DLPack numbers streams
    /// (the legacy default stream is 1, as `torch.from_dlpack` passes it).
    pub fn current_stream(&self, py: Python<'_>, device: i32) -> PyResult<i64> {
        let Some(raw_stream) = &self.raw_stream else {
            return Err(pyo3::exceptions::PyRuntimeError::new_err(
                "this torch has no CUDA support: it cannot take a CUDA message",
            ));
        };
        let raw: i64 = raw_stream.call1(py, (device,))?.extract(py)?;
        Ok(if raw == 0 { 1 } else { raw })
    }

    /// The tensor of `capsule`.
    pub fn tensor<'py>(
        &self,
        py: Python<'py>,
        capsule: Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.from_dlpack.bind(py).call1((capsule,))
    }
}
