//! `gpuring.Producer`: publishes tensors (CUDA rings: a device-to-device copy on the caller's
//! stream, then publish) or buffers (host rings: a copy into the shared slot).

use std::time::Instant;

use gpuring::cuda::Stream;
use gpuring::gpu::GpuAcquireError;
use gpuring::tensor::TensorHeader;
use gpuring::{AcquireTimeoutError, GpuProducer, Policy, Producer as RingProducer};
use pyo3::buffer::PyBuffer;
use pyo3::exceptions::{PyAttributeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::bound::{deadline, tick, SameThread, ThreadBound};
use crate::consumer::stream_handle;
use crate::errors::{error, timeout};
use crate::layout::dtype_named;

// One long-lived value per producer: the variants' sizes do not matter (and issue 16's single
// producer type removes this enum).
#[allow(clippy::large_enum_variant)]
enum Tx {
    Host(RingProducer),
    Gpu(GpuProducer),
}

/// Producer(name, slot_size, *, capacity=8, header_size=64, memory="auto", device=0,
///          policy="block", max_consumers=None)
///
/// Creates ring `name` and publishes into it. `memory`: "cuda" (slots on GPU `device`),
/// "host", or "auto" (CUDA where a GPU is usable). `policy`: "block" (wait for the slowest
/// consumer) or "overwrite" (never wait; slow consumers lose messages). The ring is removed
/// when the producer is closed or freed.
#[pyclass(module = "gpuring")]
pub struct Producer {
    /// None once closed. Bound to the thread that made it (see `held`).
    tx: ThreadBound<Option<Tx>>,
    name: String,
}

#[pymethods]
impl Producer {
    #[new]
    #[pyo3(signature = (name, slot_size, *, capacity=8, header_size=64, memory="auto", device=0, policy="block", max_consumers=None))]
    #[allow(clippy::too_many_arguments)] // Python keyword arguments
    fn new(
        name: &str,
        slot_size: usize,
        capacity: u32,
        header_size: u32,
        memory: &str,
        device: i32,
        policy: &str,
        max_consumers: Option<u32>,
    ) -> PyResult<Producer> {
        let policy = match policy {
            "block" => Policy::Block,
            "overwrite" => Policy::Overwrite,
            other => {
                return Err(PyValueError::new_err(format!(
                    "policy={other:?}: use \"block\" or \"overwrite\""
                )))
            }
        };
        let mut builder = RingProducer::builder(name)
            .slot_size(slot_size)
            .capacity(capacity)
            .user_header_size(header_size)
            .policy(policy);
        if let Some(n) = max_consumers {
            builder = builder.max_consumers(n);
        }
        let cuda = match memory {
            "cuda" => true,
            "host" => false,
            "auto" => gpuring::cuda::available().is_ok(),
            other => {
                return Err(PyValueError::new_err(format!(
                    "memory={other:?}: use \"auto\", \"cuda\" or \"host\""
                )))
            }
        };
        let tx = if cuda {
            builder.create_gpu(device).map(Tx::Gpu)
        } else {
            builder.create().map(Tx::Host)
        };
        let tx = tx.map_err(|e| error(format!("cannot create ring {name:?}: {e}")))?;
        Ok(Producer { tx: ThreadBound::new(Some(tx)), name: name.to_owned() })
    }

    /// send(data, header=None, *, stream=None, timeout=None) -> int
    ///
    /// Copies `data` into the next slot and publishes it; returns its sequence number.
    ///
    /// - CUDA rings: `data` is a contiguous CUDA tensor or array (anything with
    ///   `__cuda_array_interface__`, such as a torch tensor without grad) on the ring's GPU. The
    ///   copy goes on `stream` (an int handle or a `torch.cuda.Stream`; default: for a torch
    ///   tensor torch's current stream on its device, else the legacy default stream), so it
    ///   follows the work that produced `data`, and the message is ready for consumers when
    ///   the copy is done. The CPU does not wait.
    /// - Host rings: `data` is any contiguous buffer (bytes, numpy array, memoryview) or a
    ///   torch CPU tensor.
    ///
    /// `header`: the user header (bytes). Default: the tensor header of `data`'s type and
    /// shape, when the ring's header has room, so consumers' tensors get them.
    /// `timeout`: seconds to wait for a free slot (None: as long as it takes); then
    /// `TimeoutError`.
    #[pyo3(signature = (data, header=None, *, stream=None, timeout=None))]
    fn send(
        &mut self,
        py: Python<'_>,
        data: &Bound<'_, PyAny>,
        header: Option<Vec<u8>>,
        stream: Option<&Bound<'_, PyAny>>,
        timeout: Option<f64>,
    ) -> PyResult<u64> {
        let deadline = deadline(timeout)?;
        let name = self.name.clone();
        let tx = self.tx.get_mut()?.as_mut();
        let tx = tx.ok_or_else(|| error(format!("producer of {name:?} is closed")))?;
        match tx {
            Tx::Gpu(tx) => send_gpu(py, tx, data, header, stream, deadline),
            Tx::Host(tx) => send_host(py, tx, data, header, deadline),
        }
    }

    /// Closes the ring: consumers receive what was published, then `gpuring.Disconnected`.
    ///
    /// A CUDA producer first waits (up to its linger, 5 s) for consumers to finish reading,
    /// without holding the GIL.
    fn close(&mut self, py: Python<'_>) -> PyResult<()> {
        self.tx.close(py)
    }

    fn __enter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(
        &mut self,
        py: Python<'_>,
        _args: &Bound<'_, pyo3::types::PyTuple>,
    ) -> PyResult<bool> {
        self.close(py)?;
        Ok(false)
    }

    /// The ring's name.
    #[getter]
    fn name(&self) -> &str {
        &self.name
    }

    /// "cuda" or "host".
    #[getter]
    fn memory(&self) -> PyResult<&'static str> {
        Ok(match self.tx()? {
            Tx::Host(_) => "host",
            Tx::Gpu(_) => "cuda",
        })
    }

    /// Messages published so far.
    #[getter]
    fn published(&self) -> PyResult<u64> {
        Ok(match self.tx()? {
            Tx::Host(tx) => tx.published(),
            Tx::Gpu(tx) => tx.published(),
        })
    }

    /// Consumers currently joined.
    #[getter]
    fn consumer_count(&self) -> PyResult<usize> {
        Ok(match self.tx()? {
            Tx::Host(tx) => tx.consumer_count(),
            Tx::Gpu(tx) => tx.consumer_count(),
        })
    }

    /// Largest message in bytes.
    #[getter]
    fn slot_size(&self) -> PyResult<usize> {
        Ok(match self.tx()? {
            Tx::Host(tx) => tx.slot_size(),
            Tx::Gpu(tx) => tx.slot_size(),
        })
    }

    fn __repr__(&self) -> String {
        let memory = self.memory().unwrap_or("closed");
        format!("<gpuring.Producer {:?} {memory}>", self.name)
    }
}

impl Producer {
    fn tx(&self) -> PyResult<&Tx> {
        let tx = self.tx.get()?.as_ref();
        tx.ok_or_else(|| error(format!("producer of {:?} is closed", self.name)))
    }
}

/// The user header to publish: the caller's, else the tensor header of `layout` if it fits.
fn header_for(
    given: Option<Vec<u8>>,
    layout: Option<TensorHeader>,
    room: usize,
) -> PyResult<Vec<u8>> {
    if let Some(h) = given {
        if h.len() > room {
            return Err(PyValueError::new_err(format!(
                "header of {} bytes; the ring has {room} bytes of user header",
                h.len()
            )));
        }
        return Ok(h);
    }
    let Some(t) = layout.filter(|t| t.encoded_len() <= room) else { return Ok(Vec::new()) };
    let mut h = vec![0u8; t.encoded_len()];
    t.write(&mut h).map_err(|e| PyValueError::new_err(e.to_string()))?;
    Ok(h)
}

/// A CUDA array's address, byte length and layout, from `__cuda_array_interface__`, and the
/// stream it says its data is ready on.
struct CudaArray {
    ptr: u64,
    len: usize,
    layout: Option<TensorHeader>,
    stream: Option<u64>,
}

fn cuda_array(data: &Bound<'_, PyAny>) -> PyResult<CudaArray> {
    let cai = data.getattr("__cuda_array_interface__").map_err(|e| {
        if e.is_instance_of::<PyAttributeError>(data.py()) {
            PyTypeError::new_err(
                "a CUDA ring sends CUDA tensors (objects with __cuda_array_interface__)",
            )
        } else {
            e // the object's own reason, such as torch's for a tensor that requires grad
        }
    })?;
    let cai = cai.cast::<PyDict>()?;
    let get = |k: &str| -> PyResult<Bound<'_, PyAny>> {
        cai.get_item(k)?
            .ok_or_else(|| PyValueError::new_err(format!("__cuda_array_interface__ has no {k:?}")))
    };
    let (ptr, _readonly): (u64, bool) = get("data")?.extract()?;
    let shape: Vec<u64> = get("shape")?.extract()?;
    let typestr: String = get("typestr")?.extract()?;
    let item: usize = typestr
        .get(2..)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| PyValueError::new_err(format!("typestr {typestr:?}")))?;
    if let Some(strides) = cai.get_item("strides")?.filter(|s| !s.is_none()) {
        let strides: Vec<i64> = strides.extract()?;
        let mut want = item as i64;
        for (s, d) in strides.iter().zip(&shape).rev() {
            if *d > 1 && *s != want {
                return Err(PyValueError::new_err(
                    "the tensor is not contiguous: call .contiguous()",
                ));
            }
            want *= *d as i64;
        }
    }
    let len = shape.iter().product::<u64>() as usize * item;
    let stream =
        cai.get_item("stream")?.filter(|s| !s.is_none()).map(|s| s.extract()).transpose()?;
    Ok(CudaArray {
        ptr,
        len,
        layout: dtype_named(&typestr).map(|t| TensorHeader::new(t, &shape)),
        stream,
    })
}

/// For a torch tensor, torch's current stream on its device: the stream its producing work
/// was most likely queued on, and the one torch's allocator reuses its memory on.
fn torch_current_stream(py: Python<'_>, data: &Bound<'_, PyAny>) -> PyResult<Option<u64>> {
    let module: String = data.get_type().getattr("__module__")?.extract()?;
    if !module.starts_with("torch") {
        return Ok(None);
    }
    let cuda = py.import("torch")?.getattr("cuda")?;
    let stream = cuda.call_method1("current_stream", (data.getattr("device")?,))?;
    Ok(Some(stream.getattr("cuda_stream")?.extract()?))
}

fn send_gpu(
    py: Python<'_>,
    tx: &mut GpuProducer,
    data: &Bound<'_, PyAny>,
    header: Option<Vec<u8>>,
    stream: Option<&Bound<'_, PyAny>>,
    deadline: Option<Instant>,
) -> PyResult<u64> {
    let src = cuda_array(data)?;
    // A tensor on another GPU would be read through peer access, or fail in the driver: say
    // so first where the object tells its device (torch tensors do).
    if let Ok(index) = data.getattr("device").and_then(|d| d.getattr("index")) {
        let ring = tx.context().ordinal();
        if let Ok(Some(d)) = index.extract::<Option<i32>>() {
            if d != ring {
                return Err(PyValueError::new_err(format!(
                    "the tensor is on cuda:{d}, the ring's memory on cuda:{ring}"
                )));
            }
        }
    }
    if src.len > tx.slot_size() {
        return Err(PyValueError::new_err(format!(
            "{} bytes do not fit in a slot of {}",
            src.len,
            tx.slot_size()
        )));
    }
    let header = header_for(header, src.layout, tx.user_header_size())?;
    let raw = match stream.filter(|s| !s.is_none()) {
        None => torch_current_stream(py, data)?.unwrap_or(0),
        Some(s) => stream_handle(s)?,
    };
    // SAFETY: the caller's stream (a live stream of the ring's GPU, by send's contract) or
    // the null stream; the wrapper does not outlive this call.
    let ours =
        unsafe { Stream::from_raw(tx.context(), raw as usize as gpuring::cuda::driver::CUstream) };
    if let Some(theirs) = src.stream.filter(|s| *s != raw.max(1)) {
        // SAFETY: the array says its data is ready on this stream, of the same device.
        let theirs = unsafe { Stream::from_raw(tx.context(), theirs as usize as _) };
        ours.wait_for(&theirs).map_err(error)?;
    }
    loop {
        let tick = tick();
        let left = deadline.map_or(tick, |d| d.saturating_duration_since(Instant::now()));
        // SAFETY: the closure runs on this thread, and the producer is bound to it.
        let job = unsafe { SameThread::new((&mut *tx, &ours)) };
        let got = py.detach(move || {
            let (tx, ours) = job.into_inner();
            // SAFETY: as above: handed straight back to this thread.
            unsafe { SameThread::new(tx.acquire_on_timeout(ours, left.min(tick))) }
        });
        match got.into_inner() {
            Ok(slot) => {
                // SAFETY: `src` is `len` bytes of device memory on the ring's GPU (its
                // interface says so), not one of our slots; work that wrote it is ordered
                // before `ours` (the caller's stream, which also waits for the array's); it
                // stays allocated until the copy runs if it was made on `ours`, or the caller
                // keeps it (send's contract, docs/python.md).
                unsafe { slot.copy_from(src.ptr, src.len) }.map_err(error)?;
                return slot.publish(src.len, &header).map_err(error);
            }
            Err(GpuAcquireError::Timeout) => {
                if deadline.is_some_and(|d| Instant::now() >= d) {
                    return Err(timeout("no free slot: consumers are behind"));
                }
                py.check_signals()?;
            }
            Err(e) => return Err(error(e)),
        }
    }
}

fn send_host(
    py: Python<'_>,
    tx: &mut RingProducer,
    data: &Bound<'_, PyAny>,
    header: Option<Vec<u8>>,
    deadline: Option<Instant>,
) -> PyResult<u64> {
    let memoryview = py.import("builtins")?.getattr("memoryview")?;
    let view = match memoryview.call1((data,)) {
        Ok(view) => view,
        // A torch CPU tensor has no buffer protocol; its numpy view does (same memory).
        Err(_) if data.hasattr("numpy")? => memoryview.call1((data.call_method0("numpy")?,))?,
        Err(e) => return Err(e),
    };
    if !view.getattr("c_contiguous")?.extract::<bool>()? {
        return Err(PyValueError::new_err("the buffer is not C-contiguous"));
    }
    let format: String = view.getattr("format")?.extract()?;
    let shape: Vec<u64> = view.getattr("shape")?.extract()?;
    let layout = dtype_named(&format).map(|t| TensorHeader::new(t, &shape));
    let bytes = PyBuffer::<u8>::get(&view.call_method1("cast", ("B",))?)?;
    let len = bytes.len_bytes();
    if len > tx.slot_size() {
        return Err(PyValueError::new_err(format!(
            "{len} bytes do not fit in a slot of {}",
            tx.slot_size()
        )));
    }
    let header = header_for(header, layout, tx.user_header_size())?;
    loop {
        let tick = tick();
        let left = deadline.map_or(tick, |d| d.saturating_duration_since(Instant::now()));
        // SAFETY: the closure runs on this thread, and the producer is bound to it.
        let job = unsafe { SameThread::new(&mut *tx) };
        let got = py.detach(move || {
            let tx = job.into_inner();
            // SAFETY: as above: handed straight back to this thread.
            unsafe { SameThread::new(tx.acquire_timeout(left.min(tick))) }
        });
        match got.into_inner() {
            Ok(mut slot) => {
                bytes.copy_to_slice(py, &mut slot[..len])?;
                return slot.publish(len, &header).map_err(error);
            }
            Err(AcquireTimeoutError::Timeout) => {
                if deadline.is_some_and(|d| Instant::now() >= d) {
                    return Err(timeout("no free slot: consumers are behind"));
                }
                py.check_signals()?;
            }
            Err(e) => return Err(error(e)),
        }
    }
}
