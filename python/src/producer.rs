//! `gpuring.Producer`: publishes tensors (CUDA rings: a device-to-device copy on the caller's
//! stream, then publish) or buffers (host rings: a copy into the shared slot).

use std::path::{Path, PathBuf};
use std::time::Instant;

use gpuring::any::AnyProducer;
use gpuring::tensor::TensorHeader;
use gpuring::{
    AcquireTimeoutError, Fence, MemoryKind, PeerPolicy, Policy, Producer as RingProducer, Sharing,
};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::bound::{deadline, tick, SameThread, ThreadBound};
use crate::errors::{context_lost_error, error, ring_error, timeout};
use crate::kind::outgoing;

/// Producer(name, slot_size, *, capacity=8, header_size=64, memory="auto", device=0,
///          policy="block", max_consumers=None, spares=None, sharing="legacy",
///          fence="auto", allow_uids=None, allow_gids=None, permissions=None, dir=None)
///
/// Creates ring `name` and publishes into it. `memory`: "cuda" (slots on GPU `device`),
/// "host", or "auto" (CUDA where a GPU is usable). `policy`: the delivery mode of consumers
/// that do not choose one: "block" (lossless: the producer waits for the slowest) or
/// "overwrite" (queue: no wait for slow readers; they lose messages). `spares`: spare buffers
/// the producer swaps in when it laps a message a consumer still holds, so a consumer that
/// holds frames never slows it down; only when consumers hold every spare does it wait (default
/// 8, fewer where the ring's limits leave less room). `sharing` (CUDA rings): "legacy" (IPC
/// handles in the ring, which any process that can read it may map) or "vmm" (memory handed
/// out by file descriptor to processes of this uid only, or also of the uids in `allow_uids`
/// and the groups in `allow_gids`; a refused consumer gets `PermissionError`). `fence` (CUDA
/// rings): how GPU work is ordered across processes: "auto" (memory words where the GPU can use
/// 64-bit stream memory operations, else events), "events" (interprocess CUDA events) or
/// "memory" (sequence words in the ring's segment; no IPC event is made, so consumers in
/// containers with their own /dev/shm or pid namespace can read the ring). VMM sharing always
/// fences with memory words, whatever `fence` says. `dir`: the directory (a `str` or
/// `os.PathLike`) the ring's file and sockets go in; default the `GPURING_DIR` environment
/// variable if set, else `/dev/shm`. Consumers must pass the same directory (as they see it).
/// The ring is removed when the producer is closed or freed. Creating one installs gpuring's
/// SIGTERM handler (see `handle_sigterm`), and a producer still open at exit is closed then.
#[pyclass(module = "gpuring", weakref)]
pub struct Producer {
    /// None once closed. Bound to the thread that made it (see `bound`).
    tx: ThreadBound<Option<AnyProducer>>,
    name: String,
    /// The ring directory the ring was created in.
    dir: PathBuf,
}

impl Drop for Producer {
    fn drop(&mut self) {
        crate::sigterm::closed(&self.dir, &self.name);
    }
}

#[pymethods]
impl Producer {
    #[new]
    #[pyo3(signature = (name, slot_size, *, capacity=8, header_size=64, memory="auto", device=0, policy="block", max_consumers=None, spares=None, sharing="legacy", fence="auto", allow_uids=None, allow_gids=None, permissions=None, dir=None))]
    #[allow(clippy::too_many_arguments)] // Python keyword arguments
    fn new(
        py: Python<'_>,
        name: &str,
        slot_size: usize,
        capacity: u32,
        header_size: u32,
        memory: &str,
        device: i32,
        policy: &str,
        max_consumers: Option<u32>,
        spares: Option<u32>,
        sharing: &str,
        fence: &str,
        allow_uids: Option<Vec<u32>>,
        allow_gids: Option<Vec<u32>>,
        permissions: Option<u32>,
        dir: Option<PathBuf>,
    ) -> PyResult<Py<Producer>> {
        let policy = Policy::from_name(policy).ok_or_else(|| {
            PyValueError::new_err(format!("policy={policy:?}: use \"block\" or \"overwrite\""))
        })?;
        let mut builder = RingProducer::builder(name)
            .slot_size(slot_size)
            .capacity(capacity)
            .user_header_size(header_size)
            .policy(policy);
        if let Some(n) = max_consumers {
            builder = builder.max_consumers(n);
        }
        if let Some(n) = spares {
            builder = builder.spare_buffers(n);
        }
        if let Some(mode) = permissions {
            builder = builder.mode(mode);
        }
        let dir = crate::ring_dir(dir);
        builder = builder.dir(&dir);
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
        let (uids, gids) = (allow_uids.unwrap_or_default(), allow_gids.unwrap_or_default());
        let sharing =
            match sharing {
                "legacy" if uids.is_empty() && gids.is_empty() => Sharing::Legacy,
                "legacy" => return Err(PyValueError::new_err(
                    "allow_uids and allow_gids apply to sharing=\"vmm\" (legacy sharing checks \
                     no peer)",
                )),
                "vmm" if uids.is_empty() && gids.is_empty() => Sharing::Vmm(PeerPolicy::SameUid),
                "vmm" => Sharing::Vmm(PeerPolicy::Allow { uids, gids }),
                other => {
                    return Err(PyValueError::new_err(format!(
                        "sharing={other:?}: use \"legacy\" or \"vmm\""
                    )))
                }
            };
        if !cuda && sharing != Sharing::Legacy {
            return Err(PyValueError::new_err(
                "sharing=\"vmm\" shares CUDA memory: use memory=\"cuda\" (or \"auto\" on a GPU machine)",
            ));
        }
        let fence = Fence::from_name(fence).ok_or_else(|| {
            PyValueError::new_err(format!(
                "fence={fence:?}: use \"auto\", \"events\" or \"memory\""
            ))
        })?;
        if !cuda && fence == Fence::Memory {
            return Err(PyValueError::new_err(
                "fence=\"memory\" orders CUDA work: use memory=\"cuda\" (or \"auto\" on a GPU machine)",
            ));
        }
        let builder = builder.device(device).sharing(sharing).fence(fence);
        let kind = if cuda { MemoryKind::Cuda } else { MemoryKind::Host };
        let tx = AnyProducer::create(builder, kind).map_err(|e| ring_error("", &e))?;
        crate::sigterm::created(&dir, name);
        let tx =
            Py::new(py, Producer { tx: ThreadBound::new(Some(tx)), name: name.to_owned(), dir })?;
        crate::sigterm::track(tx.bind(py).as_any())?;
        Ok(tx)
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
        send(tx, py, data, header, stream, deadline)
    }

    /// Closes the ring: consumers receive what was published, then `gpuring.Disconnected`.
    ///
    /// A CUDA producer first waits (up to its linger, 5 s) for consumers to finish reading,
    /// without holding the GIL.
    fn close(&mut self, py: Python<'_>) -> PyResult<()> {
        self.tx.close(py)?;
        crate::bound::drain();
        crate::sigterm::closed(&self.dir, &self.name);
        Ok(())
    }

    fn __enter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    #[pyo3(signature = (*args))]
    fn __exit__(
        &mut self,
        py: Python<'_>,
        args: &Bound<'_, pyo3::types::PyTuple>,
    ) -> PyResult<bool> {
        // Left by an exception: the stream was cut, and consumers are told so.
        let failed = args.get_item(0).is_ok_and(|t| !t.is_none());
        if failed {
            self.abort(py)?;
        } else {
            self.close(py)?;
        }
        Ok(false)
    }

    /// Closes the ring as cut: consumers receive what was published, then
    /// `gpuring.Disconnected`, and their `ended` says "died", not "closed" (for a job that
    /// failed part-way). Leaving a `with` block by an exception does the same.
    fn abort(&mut self, py: Python<'_>) -> PyResult<()> {
        // SAFETY: the closure runs on this thread, and the producer is bound to it.
        let tx = unsafe { SameThread::new(self.tx.get_mut()?.take()) };
        py.detach(move || {
            if let Some(tx) = tx.into_inner() {
                tx.abort();
            }
        });
        crate::sigterm::closed(&self.dir, &self.name);
        Ok(())
    }

    /// The ring's name.
    #[getter]
    fn name(&self) -> &str {
        &self.name
    }

    /// The ring directory the ring was created in (absolute, a `pathlib.Path`).
    #[getter]
    fn dir(&self) -> &Path {
        &self.dir
    }

    /// "cuda" or "host".
    #[getter]
    fn memory(&self) -> PyResult<&'static str> {
        Ok(self.tx()?.memory().name())
    }

    /// Messages published so far.
    #[getter]
    fn published(&self) -> PyResult<u64> {
        Ok(self.tx()?.published())
    }

    /// wait_for_consumers(n, timeout=None) -> int
    ///
    /// Waits until at least `n` consumers have joined (messages sent before a consumer joins
    /// never reach it: a lossless job starts its consumers first and waits here), at most
    /// `timeout` seconds (None: as long as it takes), then `TimeoutError`. Returns how many
    /// joined.
    #[pyo3(signature = (n, timeout=None))]
    fn wait_for_consumers(
        &mut self,
        py: Python<'_>,
        n: usize,
        timeout: Option<f64>,
    ) -> PyResult<usize> {
        let deadline = deadline(timeout)?;
        let name = self.name.clone();
        let tx = self.tx.get_mut()?.as_mut();
        let tx = tx.ok_or_else(|| error(format!("producer of {name:?} is closed")))?;
        wait_for_consumers(tx, py, n, deadline)
    }

    /// Consumers currently joined.
    #[getter]
    fn consumer_count(&self) -> PyResult<usize> {
        Ok(self.tx()?.consumer_count())
    }

    /// Largest message in bytes.
    #[getter]
    fn slot_size(&self) -> PyResult<usize> {
        Ok(self.tx()?.slot_size())
    }

    fn __repr__(&self) -> String {
        let memory = self.memory().unwrap_or("closed");
        format!("<gpuring.Producer {:?} {memory}>", self.name)
    }
}

impl Producer {
    /// Closes it at interpreter exit (`sigterm::at_exit`): on its own thread as `close`, or
    /// as `abort` when `cut` (the exit is SIGTERM's); else dropped as `bound` says (at once if
    /// its thread ended, never in a forked child).
    pub fn close_at_exit(&mut self, py: Python<'_>, cut: bool) {
        if self.tx.get().is_err() {
            self.tx.clear();
        } else if cut {
            let _ = self.abort(py);
        } else {
            let _ = self.close(py);
        }
    }

    fn tx(&self) -> PyResult<&AnyProducer> {
        let tx = self.tx.get()?.as_ref();
        tx.ok_or_else(|| error(format!("producer of {:?} is closed", self.name)))
    }
}

/// `Producer.wait_for_consumers`: waits for `n` consumers to join, until `deadline` (None: no
/// limit).
fn wait_for_consumers(
    tx: &mut AnyProducer,
    py: Python<'_>,
    n: usize,
    deadline: Option<Instant>,
) -> PyResult<usize> {
    loop {
        let tick = tick();
        let left = deadline.map_or(tick, |d| d.saturating_duration_since(Instant::now()));
        // SAFETY: the closure runs on this thread, and the producer is bound to it.
        let job = unsafe { SameThread::new(&mut *tx) };
        let got = py.detach(move || {
            let tx = job.into_inner();
            tx.wait_for_consumers(n, left.min(tick))
        });
        match got {
            Ok(joined) => return Ok(joined),
            Err(gpuring::WaitForConsumersError::ContextLost(lost)) => {
                return Err(context_lost_error(&lost));
            }
            Err(e) if deadline.is_some_and(|d| Instant::now() >= d) => {
                return Err(timeout(&e.to_string()));
            }
            Err(_) => {
                // No consumer can be served any more: waiting on would keep a faulted process
                // (and, under MPS, every client of the GPU) from the restart it needs.
                if let Some(lost) = gpuring::context_lost() {
                    return Err(context_lost_error(&lost));
                }
                py.check_signals()?
            }
        }
    }
}

/// `Producer.send`, with `deadline` for the wait for a free slot.
fn send(
    tx: &mut AnyProducer,
    py: Python<'_>,
    data: &Bound<'_, PyAny>,
    header: Option<Vec<u8>>,
    stream: Option<&Bound<'_, PyAny>>,
    deadline: Option<Instant>,
) -> PyResult<u64> {
    let out = outgoing(py, tx, data, header, stream)?;
    loop {
        let tick = tick();
        let left = deadline.map_or(tick, |d| d.saturating_duration_since(Instant::now()));
        // SAFETY: the closure runs on this thread, and the producer is bound to it.
        let job = unsafe { SameThread::new((&mut *tx, &out)) };
        let got = py.detach(move || {
            let (tx, out) = job.into_inner();
            // SAFETY: as above: handed straight back to this thread.
            unsafe { SameThread::new(out.acquire_timeout(tx, left.min(tick))) }
        });
        match got.into_inner() {
            Ok(mut slot) => {
                out.write(py, &mut slot)?;
                return slot.publish(out.len, &out.header).map_err(|e| ring_error("", &e));
            }
            Err(AcquireTimeoutError::Timeout) => {
                if deadline.is_some_and(|d| Instant::now() >= d) {
                    return Err(timeout("no free slot: consumers are behind"));
                }
                py.check_signals()?;
            }
            Err(e) => return Err(ring_error("", &e)),
        }
    }
}

/// The user header to publish with a payload of `len` bytes and layout `layout`, once both
/// are known to fit `tx`'s ring: the caller's header (`given`), else the tensor header of
/// `layout` if it fits.
pub fn checked_header(
    tx: &AnyProducer,
    len: usize,
    layout: Option<TensorHeader>,
    given: Option<Vec<u8>>,
) -> PyResult<Vec<u8>> {
    if len > tx.slot_size() {
        return Err(PyValueError::new_err(format!(
            "{len} bytes do not fit in a slot of {}",
            tx.slot_size()
        )));
    }
    header_for(given, layout, tx.user_header_size())
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
