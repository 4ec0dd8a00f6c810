//! What differs between the two memory kinds, and nothing else: [`Kind`], implemented once for
//! host memory and once for CUDA memory. The consumer, its messages and the producer are
//! written once over it (`held`, `producer`); the Python classes, which cannot be generic,
//! hold them as trait objects, chosen when the ring is opened or created.

use std::time::Duration;

use gpuring::cuda::Stream;
use gpuring::tensor::TensorHeader;
use gpuring::{
    AcquireTimeoutError, Consumer, Cuda, Host, Memory, Producer, ReadSlot, RecvTimeoutError,
    WriteSlot,
};
use pyo3::buffer::PyBuffer;
use pyo3::exceptions::{PyAttributeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::consumer::stream_handle;
use crate::errors::error;
use crate::layout::dtype_named;
use crate::producer::checked_header;

/// A memory kind as the bindings use it.
pub trait Kind: Memory {
    /// "cuda" or "host".
    const NAME: &'static str;

    /// What a consumer reads on: its stream `S` (CUDA), nothing (host).
    type Stream: 'static;

    /// What `send` copies a message from.
    type Source;

    /// The stream `rx` reads on: `raw` (a handle the caller passed), else the legacy default
    /// stream (PyTorch's default). Ready waits and releases go on it.
    fn reader_stream(rx: &Consumer<Self>, raw: Option<u64>) -> Self::Stream;

    /// The CUDA stream in `on`, if any.
    fn cuda_stream(on: &Self::Stream) -> Option<&Stream>;

    /// The GPU `rx` reads on; None for host memory.
    fn device(rx: &Consumer<Self>) -> Option<i32>;

    /// The next message within `wait`, read on `on`.
    fn recv_timeout<'a>(
        rx: &'a Consumer<Self>,
        on: &'a Self::Stream,
        wait: Duration,
    ) -> Result<ReadSlot<'a, Self>, RecvTimeoutError>;

    /// What `send(data, header, stream=stream)` publishes through `tx`, checked (a payload
    /// that fits a slot, a header that fits the ring's) and ready to copy.
    fn source(
        py: Python<'_>,
        tx: &Producer<Self>,
        data: &Bound<'_, PyAny>,
        header: Option<Vec<u8>>,
        stream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Outgoing<Self::Source>>;

    /// A free slot within `wait`, to be written as `src` needs.
    fn acquire_timeout<'a>(
        tx: &'a mut Producer<Self>,
        src: &'a Self::Source,
        wait: Duration,
    ) -> Result<WriteSlot<'a, Self>, AcquireTimeoutError>;

    /// Copies the first `len` bytes of `src` into `slot`.
    fn write(
        py: Python<'_>,
        slot: &mut WriteSlot<'_, Self>,
        src: &Self::Source,
        len: usize,
    ) -> PyResult<()>;
}

/// A message to send: its payload's source and length, and its user header.
pub struct Outgoing<S> {
    pub src: S,
    pub len: usize,
    pub header: Vec<u8>,
}

impl Kind for Host {
    const NAME: &'static str = "host";
    type Stream = ();
    /// The caller's bytes (a read-only view of any contiguous buffer).
    type Source = PyBuffer<u8>;

    fn reader_stream(_: &Consumer<Host>, _: Option<u64>) {}

    fn cuda_stream(_: &()) -> Option<&Stream> {
        None
    }

    fn device(_: &Consumer<Host>) -> Option<i32> {
        None
    }

    fn recv_timeout<'a>(
        rx: &'a Consumer<Host>,
        _: &(),
        wait: Duration,
    ) -> Result<ReadSlot<'a, Host>, RecvTimeoutError> {
        rx.recv_timeout(wait)
    }

    /// `data` is any contiguous buffer (bytes, numpy array, memoryview) or a torch CPU tensor;
    /// `stream` is not used.
    fn source(
        py: Python<'_>,
        tx: &Producer<Host>,
        data: &Bound<'_, PyAny>,
        header: Option<Vec<u8>>,
        _: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Outgoing<PyBuffer<u8>>> {
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
        Ok(Outgoing { src, len, header })
    }

    fn acquire_timeout<'a>(
        tx: &'a mut Producer<Host>,
        _: &PyBuffer<u8>,
        wait: Duration,
    ) -> Result<WriteSlot<'a, Host>, AcquireTimeoutError> {
        tx.acquire_timeout(wait)
    }

    fn write(
        py: Python<'_>,
        slot: &mut WriteSlot<'_, Host>,
        src: &PyBuffer<u8>,
        len: usize,
    ) -> PyResult<()> {
        src.copy_to_slice(py, &mut slot[..len])
    }
}

/// A CUDA message's source, as `Cuda::source` checked it.
pub struct CudaSource {
    /// Invariant: `len` bytes (`Outgoing::len`) of device memory on the ring's GPU (the
    /// caller's array says so), not one of our slots.
    ptr: u64,
    /// The stream the copy goes on: the caller's, which waits for the array's own.
    on: Stream,
}

impl Kind for Cuda {
    const NAME: &'static str = "cuda";
    type Stream = Stream;
    type Source = CudaSource;

    fn reader_stream(rx: &Consumer<Cuda>, raw: Option<u64>) -> Stream {
        let raw = raw.unwrap_or(0) as usize as gpuring::cuda::driver::CUstream;
        // SAFETY: the caller's stream (a live stream of the consumer's device, kept alive
        // while the consumer is used, as documented), or the null stream.
        unsafe { Stream::from_raw(rx.context(), raw) }
    }

    fn cuda_stream(on: &Stream) -> Option<&Stream> {
        Some(on)
    }

    fn device(rx: &Consumer<Cuda>) -> Option<i32> {
        Some(rx.context().ordinal())
    }

    fn recv_timeout<'a>(
        rx: &'a Consumer<Cuda>,
        on: &'a Stream,
        wait: Duration,
    ) -> Result<ReadSlot<'a, Cuda>, RecvTimeoutError> {
        rx.recv_on_timeout(on, wait)
    }

    /// `data` is a contiguous CUDA tensor or array (`__cuda_array_interface__`) on the ring's
    /// GPU. The copy goes on `stream` (default: for a torch tensor torch's current stream on
    /// its device, else the legacy default stream), made to wait for the array's own stream.
    fn source(
        py: Python<'_>,
        tx: &Producer<Cuda>,
        data: &Bound<'_, PyAny>,
        header: Option<Vec<u8>>,
        stream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Outgoing<CudaSource>> {
        let array = cuda_array(data)?;
        // A tensor on another GPU would be read through peer access, or fail in the driver:
        // say so first where the object tells its device (torch tensors do).
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
        let header = checked_header(tx, array.len, array.layout, header)?;
        let raw = match stream.filter(|s| !s.is_none()) {
            None => torch_current_stream(py, data)?.unwrap_or(0),
            Some(s) => stream_handle(s)?,
        };
        // SAFETY: the caller's stream (a live stream of the ring's GPU, by send's contract)
        // or the null stream; the wrapper does not outlive the send.
        let on = unsafe {
            Stream::from_raw(tx.context(), raw as usize as gpuring::cuda::driver::CUstream)
        };
        if let Some(theirs) = array.stream.filter(|s| *s != raw.max(1)) {
            // SAFETY: the array says its data is ready on this stream, of the same device.
            let theirs = unsafe { Stream::from_raw(tx.context(), theirs as usize as _) };
            on.wait_for(&theirs).map_err(error)?;
        }
        let src = CudaSource { ptr: array.ptr, on };
        Ok(Outgoing { src, len: array.len, header })
    }

    fn acquire_timeout<'a>(
        tx: &'a mut Producer<Cuda>,
        src: &'a CudaSource,
        wait: Duration,
    ) -> Result<WriteSlot<'a, Cuda>, AcquireTimeoutError> {
        tx.acquire_on_timeout(&src.on, wait)
    }

    fn write(
        _: Python<'_>,
        slot: &mut WriteSlot<'_, Cuda>,
        src: &CudaSource,
        len: usize,
    ) -> PyResult<()> {
        // SAFETY: `src.ptr` is `len` bytes of device memory on the ring's GPU, not one of our
        // slots (`CudaSource`'s invariant); work that wrote it is ordered before the slot's
        // stream (`src.on`, the caller's, which also waits for the array's); it stays
        // allocated until the copy runs if it was made on that stream, or the caller keeps it
        // (send's contract, docs/python.md).
        unsafe { slot.copy_from(src.ptr, len) }.map_err(error)
    }
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
