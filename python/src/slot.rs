//! `gpuring.Slot`: one received message, its attributes, and three ways to read it without a
//! copy: DLPack (`torch.from_dlpack(slot)`, `numpy.from_dlpack(slot)`), the CUDA array
//! interface (v3, CUDA rings) and the buffer protocol (host rings).
//!
//! Lifetime rule (docs/python.md): the message stays held, so the producer cannot overwrite
//! it, while the slot is unreleased or anything made from it lives:
//! - `release()` (or leaving a `with` block) ends the slot's own hold; from then on making a
//!   tensor, array or buffer from it raises `gpuring.ReleasedError`;
//! - a DLPack tensor holds the message until the tensor is freed;
//! - a buffer (memoryview, numpy array) holds it until the buffer is released;
//! - `__cuda_array_interface__` gives no notice of its end, but its users keep a reference to
//!   the slot: once read, the message stays held until the slot object itself is freed.
//!
//! Read-only rule: the message is the ring's memory itself, shared with every other consumer
//! and with the producer, and must not be written. Only the buffer protocol says so
//! (`readonly`, which numpy honours). The CUDA array interface exports its read-only flag as
//! False, because torch refuses True and CuPy and Numba ignore it; legacy DLPack has no flag
//! (`dlpack`). The rule is documented on `Slot` and in docs/python.md.

use std::cell::RefCell;
use std::ffi::c_int;
use std::sync::Arc;

use gpuring::cuda::Stream;
use pyo3::exceptions::{PyAttributeError, PyBufferError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyTuple};
use pyo3::{ffi, IntoPyObjectExt};

use crate::bound::{Here, ThreadBound};
use crate::dlpack;
use crate::errors::{ring_error, ReleasedError};
use crate::held::Held;
use crate::layout::{Layout, Wanted};

/// A held message, shared by its slot and every DLPack export made from it: the message is
/// released when the last of them lets go. Bound to the consumer's thread: used elsewhere it
/// raises `RuntimeError`, and freed elsewhere (the last holder a tensor freed on a worker
/// thread, say) it is released at that thread's next gpuring call. An export takes a
/// reference (an atomic increment), not a binding of its own.
type Shared = Arc<ThreadBound<Claim>>;

/// A held message, and the streams other than the consumer's that it was exported to.
pub struct Claim {
    held: Held,
    /// Streams that read the message besides the consumer's stream `S` (DLPack `stream=`
    /// arguments): `S` waits for each before the release is recorded on it.
    joins: RefCell<Vec<Stream>>,
}

impl Drop for Claim {
    fn drop(&mut self) {
        if let Some(s) = self.held.stream() {
            for x in self.joins.get_mut().drain(..) {
                // Without the GPU-side wait, wait on the CPU: the release must not come
                // before `x`'s reads (an error path, not the steady state).
                if s.wait_for(&x).is_err() {
                    let _ = x.synchronize();
                }
            }
        }
        // Then `held` drops: the release is recorded on `S` and the slot freed.
    }
}

/// Normalises a CUDA stream handle as DLPack and the CUDA array interface spell it: 0 (the
/// null stream) is the legacy default stream, 1.
pub fn stream_number(raw: u64) -> u64 {
    if raw == 0 {
        1
    } else {
        raw
    }
}

/// The CUDA array interface (version 3) dict of a C-contiguous array of `layout` at device
/// address `ptr`, ready on stream `stream` (DLPack numbering; None for no stream).
///
/// `data` is `(ptr, False)`: the read-only flag is False although the memory must not be
/// written (module doc), because torch raises on True ("the read only flag is not
/// supported, should always be False") and CuPy and Numba ignore it.
fn cuda_array_interface<'py>(
    py: Python<'py>,
    ptr: u64,
    layout: &Layout,
    stream: Option<u64>,
) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("shape", PyTuple::new(py, layout.shape())?)?;
    d.set_item("typestr", layout.typestr()?)?;
    d.set_item("data", (ptr, false))?;
    d.set_item("strides", py.None())?;
    d.set_item("version", 3)?;
    d.set_item("stream", stream.into_py_any(py)?)?;
    Ok(d)
}

/// A received message.
///
/// The message is held (the producer cannot overwrite it) until the slot is released and
/// every tensor or buffer made from it is freed.
///
/// Tensors, arrays and buffers made from it are the ring's memory itself, shared with every
/// other consumer and the producer: treat them as read-only. Writing through them corrupts
/// the frame that other consumers read. Only the buffer protocol enforces it, and numpy
/// marks its arrays read-only (from the buffer protocol or DLPack); torch tensors and
/// CuPy and Numba arrays are writable.
#[pyclass(module = "gpuring")]
pub struct Slot {
    /// None once released and no buffer or CUDA array interface needs it any more (DLPack
    /// exports hold their own references).
    claim: Option<Shared>,
    released: bool,
    /// The consumer's thread, for the check above once `claim` is gone.
    here: Here,
    /// The consumer's `dtype` and `shape`.
    wanted: Wanted,
    /// The layout `view` chose, if it was called (boxed: rarely set).
    view: Option<Box<Layout>>,
    /// `__cuda_array_interface__` was read: hold until this object is freed.
    cai_read: bool,
    /// Live buffer-protocol exports.
    buffers: usize,
    seq: u64,
    timestamp_ns: u64,
    lag: u64,
    len: usize,
    /// "cuda" or "host".
    memory: &'static str,
    device: i32,
}

impl Slot {
    pub fn new(held: Held, wanted: Wanted, device: Option<i32>) -> Slot {
        let m = held.message();
        let (seq, timestamp_ns, lag, len) = (m.seq(), m.timestamp_ns(), m.lag(), m.len());
        let claim = Claim { held, joins: RefCell::new(Vec::new()) };
        Slot {
            seq,
            timestamp_ns,
            lag,
            len,
            memory: if device.is_some() { "cuda" } else { "host" },
            device: device.unwrap_or(0),
            claim: Some(Arc::new(ThreadBound::new(claim))),
            released: false,
            here: Here::new(),
            wanted,
            view: None,
            cai_read: false,
            buffers: 0,
        }
    }

    /// The claim, unless released; on another thread than the consumer's, `RuntimeError`.
    fn live(&self) -> PyResult<&Claim> {
        self.live_shared().map(|(_, claim)| claim)
    }

    /// [`live`](Self::live), with the reference to it that exports share.
    fn live_shared(&self) -> PyResult<(&Shared, &Claim)> {
        match (&self.claim, self.released) {
            (Some(shared), false) => Ok((shared, shared.get()?)),
            _ => {
                // Another thread (or a forked child) is told so first, released or not.
                self.here.check()?;
                Err(ReleasedError::new_err(format!(
                    "message {} was released: tensors must be made before release()",
                    self.seq
                )))
            }
        }
    }

    /// The layout exports use: `view`'s, else the consumer's, resolved once per layout (the
    /// consumer keeps the last one).
    fn layout_of(&self, claim: &Claim) -> PyResult<Layout> {
        match &self.view {
            Some(layout) => Ok(**layout),
            None => {
                let header = claim.held.message().header();
                claim.held.layouts().resolve(&self.wanted, header, self.len)
            }
        }
    }

    fn layout(&self) -> PyResult<Layout> {
        self.layout_of(self.live()?)
    }

    /// Drops the slot's reference to the claim once nothing of ours needs it; the message is
    /// released when no DLPack export holds it either.
    fn settle(&mut self) {
        if self.released && self.buffers == 0 && !self.cai_read {
            // If it was the last reference and this is another thread: at the owner's next call.
            self.claim = None;
        }
    }

    fn is_cuda(&self) -> bool {
        self.memory == "cuda"
    }
}

#[pymethods]
impl Slot {
    /// Sequence number of the message (0 for the producer's first).
    #[getter]
    fn seq(&self) -> u64 {
        self.seq
    }

    /// When the producer published it, in CLOCK_MONOTONIC nanoseconds.
    #[getter]
    fn timestamp_ns(&self) -> u64 {
        self.timestamp_ns
    }

    /// Messages lost just before this one (overwritten before this consumer read them).
    #[getter]
    fn lag(&self) -> u64 {
        self.lag
    }

    /// The message's user header, as the producer wrote it.
    #[getter]
    fn header<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        Ok(PyBytes::new(py, self.live()?.held.message().header()))
    }

    /// Length of the message in bytes.
    fn __len__(&self) -> usize {
        self.len
    }

    /// A slot is true even when its message is empty (`if slot := rx.try_recv():`).
    fn __bool__(&self) -> bool {
        true
    }

    /// "cuda" or "host".
    #[getter]
    fn memory(&self) -> &'static str {
        self.memory
    }

    /// Address of the message's first byte (device address for CUDA rings).
    #[getter]
    fn ptr(&self) -> PyResult<u64> {
        Ok(self.live()?.held.message().ptr())
    }

    /// The CUDA stream the message is ready on (and its release is recorded on), as DLPack
    /// numbers it (1: the legacy default stream); None for host rings.
    #[getter]
    fn stream(&self) -> PyResult<Option<u64>> {
        Ok(self.live()?.held.stream().map(|s| stream_number(s.raw() as u64)))
    }

    /// Element type the exports use (see `view`).
    #[getter]
    fn dtype(&self) -> PyResult<&'static str> {
        Ok(self.layout()?.dtype.name())
    }

    /// Shape the exports use (see `view`).
    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, self.layout()?.shape())
    }

    /// Whether `release()` was called.
    #[getter]
    fn released(&self) -> bool {
        self.released
    }

    /// view(dtype=None, shape=None) -> Slot
    ///
    /// Sets the element type and shape that tensors, arrays and buffers made from this slot
    /// will have (one dimension may be -1), and returns the slot:
    /// `torch.from_dlpack(slot.view("uint8", (1080, 1920, 4)))`.
    #[pyo3(signature = (dtype=None, shape=None))]
    fn view<'py>(
        mut slf: PyRefMut<'py, Self>,
        dtype: Option<&Bound<'py, PyAny>>,
        shape: Option<Vec<i64>>,
    ) -> PyResult<PyRefMut<'py, Self>> {
        let wanted = Wanted::from_args(dtype, shape)?;
        let layout = wanted.resolve(slf.live()?.held.message().header(), slf.len)?;
        slf.view = Some(Box::new(layout));
        Ok(slf)
    }

    /// Ends this slot's hold on the message. Tensors and buffers made from it before keep it
    /// held until they are freed; new ones are refused. Calling it twice is harmless.
    fn release(&mut self) {
        self.released = true;
        self.settle();
    }

    fn __enter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    // Positional parameters rather than `*args`: no tuple is made per `with` block.
    #[pyo3(signature = (_exc_type=None, _exc=None, _tb=None))]
    fn __exit__(
        &mut self,
        _exc_type: Option<&Bound<'_, PyAny>>,
        _exc: Option<&Bound<'_, PyAny>>,
        _tb: Option<&Bound<'_, PyAny>>,
    ) -> bool {
        self.release();
        false
    }

    /// __dlpack__(*, stream=None, max_version=None, dl_device=None, copy=None)
    ///
    /// A DLPack capsule of the message, for `torch.from_dlpack` / `numpy.from_dlpack`. On a
    /// CUDA ring, work on `stream` (a CUDA stream handle; None or 1 for the legacy default
    /// stream, -1 for no ordering at all) is ordered after the producer's writes, and the
    /// release waits for work queued on it.
    //
    // Each call makes a new capsule (one is single-use), in one allocation, from the layout
    // the consumer already resolved; for the consumer's own stream nothing is queued.
    #[pyo3(signature = (*, stream=None, max_version=None, dl_device=None, copy=None))]
    fn __dlpack__<'py>(
        &self,
        py: Python<'py>,
        stream: Option<i64>,
        max_version: Option<&Bound<'py, PyAny>>,
        dl_device: Option<(i32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyAny>> {
        // Not read: we export the unversioned form, which every consumer accepts.
        let _ = max_version;
        if copy == Some(true) {
            return Err(PyBufferError::new_err("gpuring exports without copying (copy=True)"));
        }
        let device = self.__dlpack_device__();
        if dl_device.is_some_and(|d| d != device) {
            return Err(PyBufferError::new_err(format!("the message is on device {device:?}")));
        }
        let (shared, claim) = self.live_shared()?;
        let layout = self.layout_of(claim)?;
        if self.is_cuda() {
            self.order_stream(claim, stream)?;
        } else if stream.is_some() {
            return Err(PyBufferError::new_err("a host message has no stream: pass stream=None"));
        }
        dlpack::capsule(py, claim.held.message().ptr(), device, &layout, Arc::clone(shared))
    }

    /// torch() -> torch.Tensor
    ///
    /// The message as a torch tensor, without a copy: the tensor `torch.from_dlpack(slot)`
    /// makes, ordered as it orders it (on a CUDA ring, torch's current stream of the message's
    /// device waits for the producer's writes, and the release waits for the work queued
    /// there), at a fraction of its cost: torch's own DLPack import is called directly.
    /// Raises `ImportError` without torch.
    fn torch<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let torch = crate::torch::get(py)?;
        let stream =
            if self.is_cuda() { Some(torch.current_stream(py, self.device)?) } else { None };
        let capsule = self.__dlpack__(py, stream, None, None, None)?;
        torch.tensor(py, capsule)
    }

    /// __dlpack_device__() -> (device_type, device_id): (2, ordinal) for CUDA, (1, 0) for host.
    fn __dlpack_device__(&self) -> (i32, i32) {
        if self.is_cuda() {
            (dlpack::CUDA, self.device)
        } else {
            (dlpack::CPU, 0)
        }
    }

    /// `numpy.asarray(slot)` and `numpy.array(slot)`: numpy takes a host slot through the
    /// buffer protocol first; this is where it falls back when that refuses. A released slot
    /// raises `ReleasedError` here (without this method numpy would quietly make an object
    /// array of it), and a CUDA slot says to use DLPack. A live host slot gives the same
    /// zero-copy view as the buffer protocol (`copy=True`: a copy; `dtype`: converted).
    #[pyo3(signature = (dtype=None, copy=None))]
    fn __array__<'py>(
        slf: Bound<'py, Self>,
        dtype: Option<Bound<'py, PyAny>>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyAny>> {
        {
            let this = slf.borrow();
            this.live()?;
            if this.is_cuda() {
                return Err(PyBufferError::new_err(
                    "device memory cannot become a numpy array: use torch.from_dlpack(slot) or \
                     cupy.from_dlpack(slot)",
                ));
            }
        }
        let py = slf.py();
        let view = pyo3::types::PyMemoryView::from(slf.as_any())?;
        let array = py.import("numpy")?.call_method1("asarray", (view,))?;
        let array = match dtype {
            Some(d) => array.call_method1("astype", (d,))?,
            None => array,
        };
        match copy {
            Some(true) => array.call_method0("copy"),
            _ => Ok(array),
        }
    }

    /// The CUDA array interface (version 3) of the message: CUDA rings only. Once read, the
    /// message stays held until this slot object is freed (its readers keep a reference).
    ///
    /// `data` is `(ptr, False)`: not flagged read-only, since torch refuses the flag and CuPy
    /// and Numba ignore it, but the memory is shared with every other consumer and the
    /// producer, so do not write to it: that corrupts the frame the others read.
    #[getter]
    fn __cuda_array_interface__<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        if !self.is_cuda() {
            return Err(PyAttributeError::new_err(
                "__cuda_array_interface__: a host message (use the buffer protocol or DLPack)",
            ));
        }
        let claim = self.live()?;
        let layout = self.layout_of(claim)?;
        let stream = claim.held.stream().map(|s| stream_number(s.raw() as u64));
        let d = cuda_array_interface(py, claim.held.message().ptr(), &layout, stream)?;
        self.cai_read = true;
        Ok(d)
    }

    /// The buffer protocol, read-only: host rings only.
    ///
    /// # Safety
    /// Called by Python with a valid `view`.
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        let mut this = slf
            .try_borrow_mut()
            .map_err(|_| PyBufferError::new_err("the slot is in use (re-entered)"))?;
        if this.is_cuda() {
            return Err(PyBufferError::new_err(
                "device memory has no buffer protocol: use torch.from_dlpack(slot)",
            ));
        }
        if flags & ffi::PyBUF_WRITABLE == ffi::PyBUF_WRITABLE {
            return Err(PyBufferError::new_err("messages are read-only"));
        }
        let claim = this.live()?;
        let (data, len) = (claim.held.message().ptr(), claim.held.message().len());
        // Typed (format, shape, strides) when the requester takes a format and a shape;
        // else plain bytes, one dimension.
        let has = |f: c_int| flags & f == f;
        let typed = has(ffi::PyBUF_FORMAT) && has(ffi::PyBUF_ND);
        let layout = if typed { this.layout_of(claim)? } else { Layout::bytes(len) };
        // Our buffers are C-contiguous: Fortran order only where the two agree (1-D).
        let multi = layout.shape().iter().filter(|d| **d > 1).count() > 1;
        if has(ffi::PyBUF_F_CONTIGUOUS) && !has(ffi::PyBUF_C_CONTIGUOUS) && multi {
            return Err(PyBufferError::new_err("messages are C-contiguous, not Fortran"));
        }
        let format = if typed { layout.format()?.as_ptr() } else { std::ptr::null() };
        let item = layout.dtype.size() as isize;
        // shape, then strides in bytes; freed in __releasebuffer__.
        let mut dims: Vec<isize> = layout.shape().iter().map(|d| *d as isize).collect();
        dims.extend(layout.strides().iter().map(|s| *s as isize * item));
        let ndim = layout.shape().len();
        let dims = Box::into_raw(dims.into_boxed_slice()).cast::<isize>();
        // SAFETY: `view` is valid by the contract; every pointer stored stays valid until
        // __releasebuffer__ (the message is held while `buffers` > 0, `dims` is freed there,
        // `format` is static).
        unsafe {
            (*view).buf = data as *mut std::ffi::c_void;
            (*view).obj = slf.clone().into_any().into_ptr();
            (*view).len = len as isize;
            (*view).readonly = 1;
            (*view).itemsize = item;
            (*view).format = format.cast_mut();
            (*view).ndim = ndim as c_int;
            let nd = flags & ffi::PyBUF_ND == ffi::PyBUF_ND;
            let strided = flags & ffi::PyBUF_STRIDES == ffi::PyBUF_STRIDES;
            (*view).shape = if nd { dims } else { std::ptr::null_mut() };
            (*view).strides = if strided { dims.add(ndim) } else { std::ptr::null_mut() };
            (*view).suboffsets = std::ptr::null_mut();
            (*view).internal = dims.cast();
        }
        this.buffers += 1;
        Ok(())
    }

    /// # Safety
    /// Called by Python with a view filled by `__getbuffer__`.
    unsafe fn __releasebuffer__(mut slf: PyRefMut<'_, Self>, view: *mut ffi::Py_buffer) {
        // SAFETY: `internal` is the boxed slice of 2 * ndim isizes made in __getbuffer__.
        unsafe {
            let ndim = (*view).ndim as usize;
            let dims =
                std::ptr::slice_from_raw_parts_mut((*view).internal.cast::<isize>(), 2 * ndim);
            drop(Box::from_raw(dims));
        }
        slf.buffers -= 1;
        slf.settle();
    }

    fn __repr__(&self) -> String {
        let state = if self.released { ", released" } else { "" };
        format!("<gpuring.Slot seq={} len={} {}{state}>", self.seq, self.len, self.memory)
    }
}

impl Slot {
    /// Orders work on DLPack stream `stream` after the message's writes, and the release
    /// after that work (through `Claim::joins`). Queues nothing for the consumer's own stream,
    /// for `-1`, or for a stream this message was already exported to.
    fn order_stream(&self, claim: &Claim, stream: Option<i64>) -> PyResult<()> {
        let s = claim.held.stream().expect("a CUDA message has the consumer's stream");
        let Some(x) = stream_to_order(stream, stream_number(s.raw() as u64))? else {
            return Ok(());
        };
        let mut joins = claim.joins.borrow_mut();
        if joins.iter().any(|j| stream_number(j.raw() as u64) == x) {
            // Already waits for `S` as it was after the ready wait: nothing more to order.
            return Ok(());
        }
        let raw = x as usize as gpuring::cuda::driver::CUstream;
        // SAFETY: DLPack's contract, as `Stream::from_raw` needs it: `stream` is a live stream
        // of the consumer's device that stays live until this message's release (which waits
        // for it before `S` records).
        let theirs = unsafe { Stream::from_raw(s.context(), raw) };
        theirs.wait_for(s).map_err(|e| ring_error("", &e))?;
        joins.push(theirs); // one join per stream, however many exports
        Ok(())
    }
}

/// The stream (DLPack numbering) that an export with DLPack argument `stream` must order
/// after the message's writes, when the consumer's stream is `ours`: None when nothing is to
/// be queued: `ours` itself (the ready wait and the release are already there), or `-1` (the
/// caller orders its reads itself). None and 0 name the legacy default stream, 1.
fn stream_to_order(stream: Option<i64>, ours: u64) -> PyResult<Option<u64>> {
    let x = match stream {
        Some(-1) => return Ok(None),
        None => 1,
        Some(x) if x < 0 => {
            return Err(PyValueError::new_err(format!("stream {x}: not a CUDA stream")))
        }
        Some(x) => stream_number(x as u64),
    };
    Ok((x != ours).then_some(x))
}

#[cfg(test)]
mod tests {
    use gpuring::tensor::DType;

    use super::*;

    /// torch passes its current stream; when that is the consumer's, an export queues nothing.
    #[test]
    fn exports_on_the_consumers_stream_order_nothing() {
        Python::initialize();
        let order = |stream, ours| stream_to_order(stream, ours).unwrap();
        // The legacy default stream, however it is spelled, on a default consumer.
        assert_eq!(order(None, 1), None);
        assert_eq!(order(Some(1), 1), None);
        assert_eq!(order(Some(0), 1), None);
        // The consumer's own stream; and -1, which orders nothing.
        assert_eq!(order(Some(0x5000), 0x5000), None);
        assert_eq!(order(Some(-1), 1), None);
        // Another stream waits.
        assert_eq!(order(Some(0x5000), 1), Some(0x5000));
        assert_eq!(order(None, 0x5000), Some(1));
        assert!(stream_to_order(Some(-2), 1).is_err());
    }

    /// The dict torch, CuPy and Numba read: `data`'s flag must be False (torch refuses True:
    /// "the read only flag is not supported, should always be False").
    #[test]
    fn cuda_array_interface_is_what_torch_cupy_and_numba_accept() {
        Python::initialize();
        Python::attach(|py| {
            let layout = Layout::new(DType::F32, &[64, 32]).unwrap();
            let d = cuda_array_interface(py, 0x7f00_dead_0000, &layout, Some(1)).unwrap();
            let get = |k: &str| d.get_item(k).unwrap().unwrap_or_else(|| panic!("no {k}"));
            assert_eq!(get("data").extract::<(u64, bool)>().unwrap(), (0x7f00_dead_0000, false));
            assert_eq!(get("shape").extract::<Vec<u64>>().unwrap(), vec![64, 32]);
            assert_eq!(get("typestr").extract::<String>().unwrap(), "<f4");
            assert!(get("strides").is_none());
            assert_eq!(get("version").extract::<u32>().unwrap(), 3);
            assert_eq!(get("stream").extract::<Option<u64>>().unwrap(), Some(1));
            assert_eq!(d.len(), 6);
            // No stream: the key is there, with None.
            let d = cuda_array_interface(py, 1, &Layout::bytes(8), None).unwrap();
            assert!(d.get_item("stream").unwrap().unwrap().is_none());
            // bfloat16 has no typestr: TypeError, not a dict with a wrong type.
            let bf16 = Layout::new(DType::BF16, &[4]).unwrap();
            assert!(cuda_array_interface(py, 1, &bf16, None).is_err());
        });
    }
}
