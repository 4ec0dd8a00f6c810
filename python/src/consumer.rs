//! `gpuring.Consumer`: opens a ring of either memory kind and receives `Slot`s. Blocking waits
//! release the GIL and wake at least every 100 ms to let Ctrl-C and SIGTERM (and other
//! signals) through: their Python handlers run in the main thread, between those slices.

use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::{Duration, Instant};

use gpuring::{
    Consumer as RingConsumer, Mode, OpenError, OpenErrorKind, RecvTimeoutError, StartAt,
};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::aio;
use crate::bound::{deadline, tick, SameThread, ThreadBound};
use crate::errors::{error, open_error, ring_error, timeout, Disconnected};
use crate::held::{Held, Reader};
use crate::layout::Wanted;
use crate::slot::{stream_number, Slot};

/// Consumer(name, stream=None, *, dtype=None, shape=None, device=None, start="newest", mode=None,
///          wait=0.0, allow_foreign_owner=False, dir=None)
///
/// Opens ring `name` as a consumer, in whatever memory (CUDA or host) the producer chose.
///
/// - `stream` (CUDA rings): the stream, as an int handle or an object with `cuda_stream`
///   (a `torch.cuda.Stream`), that waits for each message and records its release. Default:
///   the legacy default stream, which is PyTorch's current stream unless you changed it.
/// - `dtype`, `shape`: the layout of every message's tensors (one dimension may be -1);
///   default: the message's tensor header, else a 1-D uint8 array of its bytes.
/// - `device` (CUDA rings): the GPU to read on; default the ring's.
/// - `start`: "newest" (default, the newest message still in the ring), "next" (only
///   messages published after joining) or "oldest".
/// - `mode`: how it receives. "lossless" (every message; the producer waits for it), "queue"
///   (every message while it keeps up; when lapped it loses the oldest and `lag` says how
///   many) or "latest" (each receive returns the newest message, skipping older unread ones,
///   counted in `lag`: what a live inference consumer wants). Default: the ring's policy's
///   ("block": lossless, "overwrite": queue).
/// - `wait`: seconds to wait for the ring to appear (or for a live producer to replace a dead
///   one's).
/// - `allow_foreign_owner`: open a ring whose segment another user owns (its producer made it
///   readable and writable for us with `permissions=`). Refused by default.
/// - `dir`: the directory (a `str` or `os.PathLike`) to find the ring in, as this process sees
///   the producer's; default the `GPURING_DIR` environment variable if set, else `/dev/shm`.
///
/// Opening one installs gpuring's SIGTERM handler (see `handle_sigterm`), and a consumer
/// still open at exit is closed then.
#[pyclass(module = "gpuring", weakref)]
pub struct Consumer {
    /// None once closed. Bound to the thread that opened it (see `bound`).
    shared: ThreadBound<Option<Rc<Reader>>>,
    name: String,
    /// The ring directory it was opened in.
    dir: PathBuf,
    wanted: Wanted,
    /// The GPU the consumer reads on; None for host rings.
    device: Option<i32>,
}

#[pymethods]
impl Consumer {
    #[new]
    #[allow(clippy::too_many_arguments)] // Python keyword arguments
    #[pyo3(signature = (name, stream=None, *, dtype=None, shape=None, device=None, start="newest", mode=None, wait=0.0, allow_foreign_owner=false, dir=None))]
    fn new(
        py: Python<'_>,
        name: &str,
        stream: Option<&Bound<'_, PyAny>>,
        dtype: Option<&Bound<'_, PyAny>>,
        shape: Option<Vec<i64>>,
        device: Option<i32>,
        start: &str,
        mode: Option<&str>,
        wait: f64,
        allow_foreign_owner: bool,
        dir: Option<PathBuf>,
    ) -> PyResult<Py<Consumer>> {
        let dir = crate::ring_dir(dir);
        let wanted = Wanted::from_args(dtype, shape)?;
        let start = match start {
            "newest" => StartAt::Newest,
            "next" => StartAt::Next,
            "oldest" => StartAt::Oldest,
            other => {
                return Err(PyValueError::new_err(format!(
                    "start={other:?}: use \"newest\", \"next\" or \"oldest\""
                )))
            }
        };
        let mode = mode
            .map(|m| {
                Mode::from_name(m).ok_or_else(|| {
                    PyValueError::new_err(format!(
                        "mode={m:?}: use \"lossless\", \"queue\" or \"latest\""
                    ))
                })
            })
            .transpose()?;
        let stream = stream.filter(|s| !s.is_none()).map(stream_handle).transpose()?;
        let until = deadline(Some(wait))?;
        let rx = loop {
            match open(name, &dir, start, mode, device, stream, allow_foreign_owner) {
                // Not there yet, still being built, or a dead producer's ring that its
                // successor will replace: what `open_when_ready` waits through too.
                Err(e)
                    if matches!(
                        e.kind(),
                        OpenErrorKind::NotFound
                            | OpenErrorKind::NotInitialized
                            | OpenErrorKind::Truncated { .. }
                            | OpenErrorKind::Disconnected
                    ) && until.is_none_or(|d| Instant::now() < d) =>
                {
                    // A process that waits for a producer makes no GPU call: it must still
                    // learn that its context was lost (under MPS a faulted process that
                    // lingers keeps the new producer from getting a context).
                    if let Some(lost) = gpuring::context_lost() {
                        return Err(crate::errors::context_lost_error(&lost));
                    }
                    py.detach(|| std::thread::sleep(Duration::from_millis(10)));
                    py.check_signals()?;
                }
                // A ring that appeared but was never ready in time: a timeout, not corruption.
                Err(e)
                    if matches!(
                        e.kind(),
                        OpenErrorKind::NotInitialized | OpenErrorKind::Truncated { .. }
                    ) && wait > 0.0 =>
                {
                    let e = OpenError::in_dir(name, &dir, OpenErrorKind::TimedOut);
                    break Err(open_error(e))?;
                }
                other => break other.map_err(open_error)?,
            }
        };
        let device = rx.consumer().device();
        let shared = ThreadBound::new(Some(rx));
        let rx = Py::new(py, Consumer { shared, name: name.to_owned(), dir, wanted, device })?;
        crate::sigterm::track(rx.bind(py).as_any())?;
        Ok(rx)
    }

    /// recv(timeout=None) -> Slot
    ///
    /// The next message, waiting at most `timeout` seconds (None: as long as it takes).
    /// Raises `TimeoutError` when the time is up, `gpuring.Disconnected` once the producer
    /// has closed the ring (or died) and every message was received.
    #[pyo3(signature = (timeout=None))]
    fn recv(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Slot> {
        let until = deadline(timeout)?;
        loop {
            let tick = tick();
            let left = until.map_or(tick, |d| d.saturating_duration_since(Instant::now()));
            match self.receive(py, Some(left.min(tick)))? {
                Some(slot) => return Ok(slot),
                None if until.is_some_and(|d| Instant::now() >= d) => {
                    return Err(timeout_error(&self.name, timeout))
                }
                None => py.check_signals()?,
            }
        }
    }

    /// try_recv() -> Slot | None
    ///
    /// The next message if one is waiting, else None.
    fn try_recv(&self, py: Python<'_>) -> PyResult<Option<Slot>> {
        self.receive(py, None)
    }

    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    /// recv_async(timeout=None) -> Slot (a coroutine)
    ///
    /// `recv` for asyncio: awaits the next message without blocking the event loop or
    /// starting a thread. The consumer's doorbell (a socket the producer knocks on after a
    /// publish) is watched by the running loop (`loop.add_reader`). Raises `TimeoutError` and
    /// `gpuring.Disconnected` as `recv` does. Cancelling it loses no message. Call it on the
    /// thread that opened the consumer (the loop's).
    #[pyo3(signature = (timeout=None))]
    fn recv_async<'py>(
        slf: &Bound<'py, Self>,
        timeout: Option<f64>,
    ) -> PyResult<Bound<'py, PyAny>> {
        deadline(timeout)?; // checks the value now, not at the first await
        aio::module(slf.py())?.getattr("recv")?.call1((slf, timeout))
    }

    /// `async for slot in consumer`: yields messages until the producer closes the ring (or
    /// dies: then `consumer.ended` says so).
    fn __aiter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __anext__<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        aio::module(py)?.getattr("anext")?.call1((slf, py.get_type::<Disconnected>()))
    }

    /// The doorbell's descriptor (-1: none could be bound), for `aio.py`.
    fn _doorbell(&self) -> PyResult<i32> {
        Ok(self.shared()?.consumer().doorbell_fd().map_or(-1, |fd| fd.as_raw_fd()))
    }

    /// Arms the doorbell, for `aio.py`.
    fn _arm(&self) -> PyResult<()> {
        self.shared()?.consumer().arm_doorbell();
        Ok(())
    }

    /// Disarms and empties the doorbell, for `aio.py`. A closed consumer has nothing to disarm.
    fn _disarm(&self) -> PyResult<()> {
        if let Ok(rx) = self.shared() {
            rx.consumer().disarm_doorbell();
        }
        Ok(())
    }

    /// Seconds between the producer liveness checks of a wait, for `aio.py`.
    fn _liveness(&self) -> PyResult<f64> {
        Ok(self.shared()?.consumer().liveness_interval().as_secs_f64())
    }

    /// The `TimeoutError` of a wait of `timeout` seconds, worded as `recv`'s, for `aio.py`.
    fn _timeout(&self, timeout: Option<f64>) -> PyErr {
        timeout_error(&self.name, timeout)
    }

    /// How the stream ended: None while the producer is live, "closed" if it closed the ring
    /// (the stream is complete), "died" if its process ended without closing it (the stream
    /// was cut), "context lost" if its GPU context was lost (the stream was cut; a restarted
    /// producer makes the ring anew). Ask after iteration ends or `recv` raised
    /// `gpuring.Disconnected` (whose `reason` says the same).
    #[getter]
    fn ended(&self) -> PyResult<Option<&'static str>> {
        Ok(self.shared()?.consumer().ended().map(gpuring::Ended::name))
    }

    /// Iterating yields messages until the producer closes the ring.
    fn __next__(&self, py: Python<'_>) -> PyResult<Option<Slot>> {
        match self.recv(py, None) {
            Ok(slot) => Ok(Some(slot)),
            Err(e) if e.is_instance_of::<Disconnected>(py) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Leaves the ring. Slots still held keep it open until they are released.
    ///
    /// A CUDA consumer first waits for its queued reads (and, rarely, for a busy producer),
    /// without holding the GIL.
    fn close(&mut self, py: Python<'_>) -> PyResult<()> {
        self.shared.close(py)
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

    /// The ring directory the ring was opened in (absolute, a `pathlib.Path`).
    #[getter]
    fn dir(&self) -> &Path {
        &self.dir
    }

    /// "cuda" or "host".
    #[getter]
    fn memory(&self) -> &'static str {
        if self.device.is_some() {
            "cuda"
        } else {
            "host"
        }
    }

    /// The GPU this consumer reads on; None for host rings.
    #[getter]
    fn device(&self) -> Option<i32> {
        self.device
    }

    /// Slots in the ring.
    #[getter]
    fn capacity(&self) -> PyResult<u32> {
        Ok(self.shared()?.consumer().capacity())
    }

    /// This consumer's delivery mode: "lossless", "queue" or "latest".
    #[getter]
    fn mode(&self) -> PyResult<&'static str> {
        Ok(self.shared()?.consumer().mode().name())
    }

    /// Largest message in bytes.
    #[getter]
    fn slot_size(&self) -> PyResult<usize> {
        Ok(self.shared()?.consumer().slot_size())
    }

    /// Bytes of user header per message.
    #[getter]
    fn header_size(&self) -> PyResult<usize> {
        Ok(self.shared()?.consumer().user_header_size())
    }

    /// The stream messages are ready on (DLPack numbering: 1 is the legacy default stream);
    /// None for host rings.
    #[getter]
    fn stream(&self) -> PyResult<Option<u64>> {
        Ok(self.shared()?.stream().map(|s| stream_number(s.raw() as u64)))
    }

    fn __repr__(&self) -> String {
        let open = self.shared.get().map(|s| s.is_some()).unwrap_or(true);
        let state = if open { "" } else { ", closed" };
        format!("<gpuring.Consumer {:?} {}{state}>", self.name, self.memory())
    }
}

impl Consumer {
    /// Closes it at interpreter exit (`sigterm::at_exit`): as `close` on its own thread; else
    /// dropped as `bound` says (at once if its thread ended, never in a forked child).
    pub fn close_at_exit(&mut self, py: Python<'_>) {
        if self.shared.get().is_ok() {
            let _ = self.shared.close(py);
        } else {
            self.shared.clear();
        }
    }

    fn shared(&self) -> PyResult<&Rc<Reader>> {
        let shared = self.shared.get()?.as_ref();
        shared.ok_or_else(|| error(format!("consumer of {:?} is closed", self.name)))
    }

    /// One receive attempt: `Ok(None)` if nothing came in `wait`. On a host ring, a message
    /// already waiting is taken with the GIL held: that look never waits, and letting go of
    /// the GIL and taking it back would cost more than it. A CUDA message's placing can wait
    /// (for its ready fence within `gpu_poll`, or to map a pool the producer added), so a
    /// CUDA receive, and every wait, runs without the GIL.
    fn receive(&self, py: Python<'_>, wait: Option<Duration>) -> PyResult<Option<Slot>> {
        let shared = self.shared()?;
        let detached = |wait| {
            // SAFETY: the closure runs on this thread, and the consumer's graph is bound to it.
            let job = unsafe { SameThread::new(shared.clone()) };
            let got = py.detach(move || {
                let shared = job.into_inner();
                // SAFETY: as above: handed straight back to this thread.
                unsafe { SameThread::new(Held::try_new(shared, |s| s.recv(wait))) }
            });
            got.into_inner()
        };
        let got = if self.device.is_some() {
            detached(wait)
        } else {
            match Held::try_new(shared.clone(), |s| s.recv(None)) {
                Err(RecvTimeoutError::Timeout) if wait.is_some_and(|w| !w.is_zero()) => {
                    detached(wait)
                }
                got => got,
            }
        };
        match got {
            Ok(held) => Ok(Some(Slot::new(held, self.wanted, self.device))),
            Err(RecvTimeoutError::Timeout) => Ok(None),
            Err(RecvTimeoutError::Disconnected) => {
                let ended = self.shared()?.consumer().ended();
                let (why, reason) = match ended {
                    Some(e) => (e.to_string(), e.name()),
                    None => ("the producer closed the ring or died".to_owned(), "gone"),
                };
                let err = Disconnected::new_err(format!("ring {:?}: {why}", self.name));
                err.value(py).setattr("reason", reason)?;
                Err(err)
            }
            Err(e) => Err(ring_error(&format!("ring {:?}: ", self.name), &e)),
        }
    }
}

fn timeout_error(name: &str, secs: Option<f64>) -> PyErr {
    timeout(&format!("no message on ring {name:?} within {} s", secs.unwrap_or(0.0)))
}

/// A CUDA stream handle from an int or an object with `cuda_stream` (torch.cuda.Stream).
pub fn stream_handle(obj: &Bound<'_, PyAny>) -> PyResult<u64> {
    if let Ok(raw) = obj.extract::<u64>() {
        return Ok(raw);
    }
    obj.getattr("cuda_stream")?.extract::<u64>()
}

/// Opens `name` of ring directory `dir` as whichever kind of consumer its memory needs.
fn open(
    name: &str,
    dir: &Path,
    start: StartAt,
    mode: Option<Mode>,
    device: Option<i32>,
    stream: Option<u64>,
    allow_foreign_owner: bool,
) -> Result<Rc<Reader>, OpenError> {
    let builder = RingConsumer::builder(name)
        .dir(dir)
        .start_at(start)
        .allow_foreign_owner(allow_foreign_owner);
    let builder = match mode {
        Some(m) => builder.mode(m),
        None => builder,
    };
    let builder = match device {
        Some(d) => builder.device(d),
        None => builder,
    };
    Reader::open(builder, stream)
}
