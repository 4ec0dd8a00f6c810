//! What `Producer.send` copies a message from, as the ring's memory kind takes it
//! ([`outgoing`]): any contiguous buffer for a host ring, a CUDA array on the ring's GPU for a
//! CUDA ring. The producer itself is one type for both kinds (`gpuring::any`).

use std::time::Duration;

use gpuring::any::{AnyProducer, AnyWriteSlot};
use gpuring::cuda::{Context, Stream};
use gpuring::tensor::TensorHeader;
use gpuring::AcquireTimeoutError;
use pyo3::buffer::PyBuffer;
use pyo3::exceptions::{PyAttributeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::consumer::stream_handle;
use crate::errors::{error, ring_error};
use crate::layout::dtype_named;
use crate::producer::checked_header;

/// A message to send, checked (a payload that fits a slot, a header that fits the ring's) and
/// ready to copy.
pub struct Outgoing {
    payload: Payload,
    /// CUDA rings: the stream the copy goes on, the caller's, which waits for the array's own.
    on: Option<Stream>,
    /// The payload's length in bytes.
    pub len: usize,
    /// The user header.
    pub header: Vec<u8>,
}

/// Where a message's payload is.
enum Payload {
    /// Host rings: the caller's bytes (a read-only view of any contiguous buffer).
    Bytes(PyBuffer<u8>),
    /// CUDA rings. Invariant: `len` bytes (`Outgoing::len`) of device memory on the ring's GPU
    /// (the caller's array says so), not one of our slots.
    Device(u64),
}

/// What `send(data, header, stream=stream)` publishes through `tx`.
pub fn outgoing(
    py: Python<'_>,
    tx: &AnyProducer,
    data: &Bound<'_, PyAny>,
    header: Option<Vec<u8>>,
    stream: Option<&Bound<'_, PyAny>>,
) -> PyResult<Outgoing> {
    match tx.context() {
        None => from_buffer(py, tx, data, header),
        Some(ctx) => from_cuda_array(py, tx, ctx, data, header, stream),
    }
}

impl Outgoing {
    /// A free slot within `wait`, to be written as the payload needs (CUDA: on `on`).
    pub fn acquire_timeout<'a>(
        &'a self,
        tx: &'a mut AnyProducer,
        wait: Duration,
    ) -> Result<AnyWriteSlot<'a>, AcquireTimeoutError> {
        match &self.on {
            Some(on) => tx.acquire_on_timeout(on, wait),
            None => tx.acquire_timeout(wait),
        }
    }

    /// Copies the payload into `slot`, a slot of the ring it was checked against.
    pub fn write(&self, py: Python<'_>, slot: &mut AnyWriteSlot<'_>) -> PyResult<()> {
        match &self.payload {
            Payload::Bytes(src) => {
                let bytes = slot.bytes_mut().ok_or_else(|| error("not a host-memory slot"))?;
                src.copy_to_slice(py, &mut bytes[..self.len])
            }
            Payload::Device(ptr) => {
                let slot = slot.cuda().ok_or_else(|| error("not a CUDA slot"))?;
                // SAFETY: `ptr` is `len` bytes of device memory on the ring's GPU, not one of
                // our slots (`Payload::Device`'s invariant); work that wrote it is ordered
                // before the slot's stream (`on`, the caller's, which also waits for the
                // array's); it stays allocated until the copy runs if it was made on that
                // stream, or the caller keeps it (send's contract, docs/python.md).
                unsafe { slot.copy_from(*ptr, self.len) }.map_err(|e| ring_error("", &e))
            }
        }
    }
}

/// A host ring's message: `data` is any contiguous buffer (bytes, numpy array, memoryview) or
/// a torch CPU tensor; `stream` is not used.
fn from_buffer(
    py: Python<'_>,
    tx: &AnyProducer,
    data: &Bound<'_, PyAny>,
    header: Option<Vec<u8>>,
) -> PyResult<Outgoing> {
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
    let src = PyBuffer::<u8>::get(&view.call_method1("cast", ("B",))?)?;
    let len = src.len_bytes();
    let header = checked_header(tx, len, layout, header)?;
    Ok(Outgoing { payload: Payload::Bytes(src), on: None, len, header })
}

/// A CUDA ring's message: `data` is a contiguous CUDA tensor or array
/// (`__cuda_array_interface__`) on the ring's GPU. The copy goes on `stream` (default: for a
/// torch tensor torch's current stream on its device, else the legacy default stream), made to
/// wait for the array's own stream.
fn from_cuda_array(
    py: Python<'_>,
    tx: &AnyProducer,
    ctx: &std::sync::Arc<Context>,
    data: &Bound<'_, PyAny>,
    header: Option<Vec<u8>>,
    stream: Option<&Bound<'_, PyAny>>,
) -> PyResult<Outgoing> {
    let array = cuda_array(data)?;
    // A tensor on another GPU would be read through peer access, or fail in the driver:
    // say so first where the object tells its device (torch tensors do).
    if let Ok(index) = data.getattr("device").and_then(|d| d.getattr("index")) {
        let ring = ctx.ordinal();
        if let Ok(Some(d)) = index.extract::<Option<i32>>() {
            if d != ring {
                return Err(PyValueError::new_err(format!(
                    "the tensor is on cuda:{d}, the ring's memory on cuda:{ring}"
                )));
            }
        }
    }
    let header = checked_header(tx, array.len, array.layout, header)?;
    let raw = match stream.filter(|s| !s.is_none()) {
        None => torch_current_stream(py, data)?.unwrap_or(0),
        Some(s) => stream_handle(s)?,
    };
    // SAFETY: the caller's stream (a live stream of the ring's GPU, by send's contract) or
    // the null stream; the wrapper does not outlive the send.
    let on = unsafe { Stream::from_raw(ctx, raw as usize as gpuring::cuda::driver::CUstream) };
    if let Some(theirs) = array.stream.filter(|s| *s != raw.max(1)) {
        // SAFETY: the array says its data is ready on this stream, of the same device.
        let theirs = unsafe { Stream::from_raw(ctx, theirs as usize as _) };
        on.wait_for(&theirs).map_err(|e| ring_error("", &e))?;
    }
    Ok(Outgoing { payload: Payload::Device(array.ptr), on: Some(on), len: array.len, header })
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
