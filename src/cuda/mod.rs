//! The CUDA layer, driver only: thin wrappers over `cudarc::driver::sys` ([`driver`]) and RAII
//! owners of what they create or open ([`Context`], [`Stream`], [`DevicePool`], [`IpcMapping`],
//! [`IpcEvent`], and for VMM sharing [`VmmPool`], [`VmmMapping`], [`HostRegistration`]). What a
//! CUDA ring does with them is in `crate::memory::cuda`.
//!
//! The driver is loaded lazily (cudarc's `dynamic-loading`), so this builds and runs on machines
//! without CUDA; [`driver::available`] says whether it can be used, and no CUDA call is made
//! before it said yes.

// Raw driver wrappers: public for the tests and benches (and documented in docs/gpu.md), not as
// API. The segment's CUDA tables are in `crate::format::gpu`, the test kernels in
// `crate::testing::kernels`.
#[doc(hidden)]
pub mod driver;
mod ipc;
mod pool;
mod staging;
mod stream;
mod vmm;

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

pub use driver::{
    available, DriverError, IPC_EVENT_OPENS, IPC_EXPORTS, IPC_MEM_CLOSES, IPC_MEM_OPENS,
    VMM_EXPORTS, VMM_IMPORTS,
};
// The IPC owners serve the ring's own CUDA layer; the bench and tests use them directly.
#[doc(hidden)]
pub use ipc::{IpcEvent, IpcMapping};
// The VMM owners likewise, for rings that share their memory as fds (`Sharing::Vmm`).
pub use pool::{DevicePool, POOL_ALIGN};
pub use staging::StagingBuffer;
pub use stream::Stream;
#[doc(hidden)]
pub use vmm::{export_raw_fd, HostRegistration, VmmImportError, VmmMapping, VmmPool};

/// Why a CUDA operation failed.
///
/// ```no_run
/// use gpuring::cuda::{Context, CudaError};
///
/// match Context::new(0) {
///     Ok(ctx) => println!("using GPU {}", ctx.ordinal()),
///     Err(CudaError::Unavailable(why)) => println!("no GPU, using host memory: {why}"),
///     Err(e) => return Err(e.into()),
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CudaError {
    /// No usable driver or device on this machine.
    Unavailable(String),
    /// A driver call failed.
    Driver(DriverError),
    /// NVRTC could not compile or the module could not be loaded.
    Compile(String),
    /// A copy longer than the slot it goes to.
    TooLong {
        /// Bytes asked for.
        len: usize,
        /// The slot's size.
        capacity: usize,
    },
    /// A stream of another device than the one the ring is used on here was passed in.
    ForeignStream {
        /// The stream's device ordinal.
        stream: i32,
        /// The device this process uses the ring on: the producer's, or the one a consumer
        /// reads on (which may be another than the ring's memory's).
        ring: i32,
    },
}

impl fmt::Display for CudaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CudaError::Unavailable(why) => write!(f, "CUDA unavailable: {why}"),
            CudaError::Driver(e) => e.fmt(f),
            CudaError::Compile(why) => write!(f, "kernel compilation: {why}"),
            CudaError::TooLong { len, capacity } => {
                write!(f, "{len} bytes do not fit in a slot of {capacity}")
            }
            CudaError::ForeignStream { stream, ring } => {
                write!(f, "the stream is on device {stream}, but this process uses the ring on device {ring}")
            }
        }
    }
}

impl std::error::Error for CudaError {}

impl From<DriverError> for CudaError {
    fn from(e: DriverError) -> Self {
        CudaError::Driver(e)
    }
}

/// A GPU's UUID as `nvidia-smi -L` prints it and `CUDA_VISIBLE_DEVICES` takes it: `GPU-` and
/// 32 hex digits in groups of 8, 4, 4, 4 and 12. Unlike an ordinal, it names the same GPU in
/// every process.
///
/// ```
/// let uuid = [0x8a, 0x1b, 0x2c, 0x3d, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 0xff];
/// assert_eq!(gpuring::cuda::uuid_string(uuid), "GPU-8a1b2c3d-0001-0203-0405-060708090aff");
/// ```
pub fn uuid_string(uuid: [u8; 16]) -> String {
    let h: String = uuid.iter().map(|b| format!("{b:02x}")).collect();
    format!("GPU-{}-{}-{}-{}-{}", &h[..8], &h[8..12], &h[12..16], &h[16..20], &h[20..])
}

/// A device's primary context, retained for as long as this lives.
///
/// ```no_run
/// let ctx = gpuring::cuda::Context::new(0)?;
/// let (major, minor) = ctx.compute_capability()?;
/// println!("GPU {} has compute capability {major}.{minor}", ctx.ordinal());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// Invariant: `ctx` is `dev`'s primary context, retained once by this value.
pub struct Context {
    dev: driver::CUdevice,
    ordinal: i32,
    ctx: driver::CUcontext,
}

// SAFETY: a CUDA context handle may be used from any thread (made current there with `bind`).
unsafe impl Send for Context {}
// SAFETY: as above; the driver synchronises its own use of contexts.
unsafe impl Sync for Context {}

impl Context {
    /// Retains device `ordinal`'s primary context. The thread's current context is left as it
    /// was (PyTorch's, another device's, or none): every gpuring call binds its context around
    /// its own driver calls ([`bind`](Self::bind)). Call [`make_current`](Self::make_current) to
    /// run driver calls of your own in it.
    ///
    /// ```no_run
    /// let ctx = gpuring::cuda::Context::new(0)?; // GPU 0
    /// let stream = gpuring::cuda::Stream::new(&ctx)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// Under MPS, a server that is still cleaning up after a client's fault refuses new
    /// clients (`CUDA_ERROR_MPS_SERVER_NOT_READY`) until every faulted one has exited: that is
    /// waited out here, with backoff, for up to [`MPS_READY_WAIT`], so that a process
    /// restarted after a fault does not exit again at once (a crash loop).
    pub fn new(ordinal: i32) -> Result<Arc<Context>, CudaError> {
        driver::available().map_err(CudaError::Unavailable)?;
        let dev = driver::device(ordinal)?;
        let ctx = driver::when_mps_ready(|| driver::primary_ctx_retain(dev))?;
        USED_BY.store(std::process::id(), Ordering::Relaxed);
        USED.fetch_or(1 << (ordinal & 63), Ordering::Relaxed);
        Ok(Arc::new(Context { dev, ordinal, ctx }))
    }

    /// Waits for every stream of this context: all GPU work this process queued on the
    /// device, gpuring's and (in the primary context, which PyTorch uses too) the
    /// application's. See [`finish_gpu_work`].
    ///
    /// ```no_run
    /// let ctx = gpuring::cuda::Context::new(0)?;
    /// ctx.synchronize()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn synchronize(&self) -> Result<(), DriverError> {
        let _bound = self.bind()?;
        // SAFETY: `_bound` makes this context current on this thread.
        unsafe { driver::ctx_synchronize() }
    }

    /// Makes this context current on the calling thread, and leaves it so.
    ///
    /// ```no_run
    /// let ctx = gpuring::cuda::Context::new(0)?;
    /// std::thread::spawn(move || {
    ///     ctx.make_current()?; // a new thread has no current context
    ///     // ... CUDA calls from other libraries now run on GPU 0 ...
    ///     Ok::<(), gpuring::cuda::DriverError>(())
    /// }).join().unwrap()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn make_current(&self) -> Result<(), DriverError> {
        // SAFETY: `ctx` is retained by self, so it is live.
        unsafe { driver::ctx_set_current(self.ctx) }
    }

    /// Makes this context current on the calling thread until the returned guard drops, which
    /// restores the thread's previous context. Every RAII type here calls it around its driver
    /// calls, so they work from any thread and leave the caller's own context (another device's,
    /// PyTorch's...) as it was. Free when this context is already current.
    ///
    /// ```no_run
    /// let ctx = gpuring::cuda::Context::new(0)?;
    /// {
    ///     let _bound = ctx.bind()?;
    ///     // ... CUDA calls here run in `ctx` ...
    /// } // the thread's previous context is current again
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn bind(&self) -> Result<Bound, DriverError> {
        let previous = driver::ctx_get_current()?;
        if previous == self.ctx {
            return Ok(Bound { previous: None });
        }
        self.make_current()?;
        Ok(Bound { previous: Some(previous) })
    }

    /// The raw `CUcontext`, for driver calls of your own that name a context (a peer copy
    /// with [`driver::memcpy_2d_peer_async`], say). It stays valid while this value lives.
    ///
    /// ```no_run
    /// let ctx = gpuring::cuda::Context::new(0)?;
    /// assert!(!ctx.raw().is_null());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn raw(&self) -> driver::CUcontext {
        self.ctx
    }

    /// The device ordinal.
    ///
    /// ```no_run
    /// let ctx = gpuring::cuda::Context::new(0)?;
    /// assert_eq!(ctx.ordinal(), 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn ordinal(&self) -> i32 {
        self.ordinal
    }

    /// The device's UUID.
    ///
    /// ```no_run
    /// let ctx = gpuring::cuda::Context::new(0)?;
    /// let hex: String = ctx.uuid()?.iter().map(|b| format!("{b:02x}")).collect();
    /// println!("GPU 0 is GPU-{hex}");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn uuid(&self) -> Result<[u8; 16], DriverError> {
        driver::device_uuid(self.dev)
    }

    /// The device's compute capability.
    ///
    /// ```no_run
    /// let ctx = gpuring::cuda::Context::new(0)?;
    /// let (major, minor) = ctx.compute_capability()?;
    /// println!("sm_{major}{minor}"); // sm_90 on an H100
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn compute_capability(&self) -> Result<(i32, i32), DriverError> {
        driver::compute_capability(self.dev)
    }
}

/// How long [`Context::new`] waits for an MPS server that is not ready (it is cleaning up
/// after a faulted client, until every faulted client has exited) before it gives up with
/// `CUDA_ERROR_MPS_SERVER_NOT_READY`.
///
/// ```
/// assert_eq!(gpuring::cuda::MPS_READY_WAIT.as_secs(), 120);
/// ```
pub const MPS_READY_WAIT: std::time::Duration = driver::MPS_READY_WAIT;

/// Devices (bit = ordinal, up to 63) whose primary context this process retained: the ones
/// [`finish_gpu_work`] waits for.
static USED: AtomicU64 = AtomicU64::new(0);
/// The process that set [`USED`] (a forked child inherits the bits, not the CUDA state).
static USED_BY: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// How often [`probe`] asks the driver at most; between two asks it answers what the last
/// one found.
///
/// ```
/// assert_eq!(gpuring::cuda::PROBE_EVERY.as_millis(), 50);
/// ```
pub const PROBE_EVERY: std::time::Duration = std::time::Duration::from_millis(50);

/// Whether this process's GPU context is lost, asked of the driver now: for each device whose
/// primary context gpuring retained and that is still active, a plain event is created and
/// queried there, and a private stream created and queried, which a faulted context refuses
/// with its sticky error (and so latches it, see [`driver::lost`]). At most once per
/// [`PROBE_EVERY`]; never waits for GPU work; in the relaxed capture mode, so that a stream
/// capture in progress on another thread is left alone.
///
/// A process that only waits (a consumer between frames, or waiting for a restarted
/// producer) makes no other CUDA call, so it would never see that its context was lost; under
/// MPS such a faulted client that lingers keeps every other process from getting a context.
/// gpuring's waits call this through [`crate::context_lost`]. Only devices used through
/// gpuring count: a process that uses CUDA only through another library asks that library.
///
/// ```no_run
/// assert!(gpuring::cuda::probe().is_none());
/// ```
pub fn probe() -> Option<DriverError> {
    if let Some(e) = driver::lost() {
        return Some(e);
    }
    let used = USED.load(Ordering::Relaxed);
    if used == 0 {
        return None;
    }
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    // Nanoseconds since START of the last probe, plus one (0: none yet).
    static LAST: AtomicU64 = AtomicU64::new(0);
    let now = START.get_or_init(std::time::Instant::now).elapsed().as_nanos() as u64 + 1;
    let last = LAST.load(Ordering::Relaxed);
    // One caller per interval probes; the others answer with the latch. Relaxed: LAST only
    // spaces the probes out, and the latch is a OnceLock (its own synchronisation).
    if last != 0 && now.saturating_sub(last) < PROBE_EVERY.as_nanos() as u64
        || LAST.compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed).is_err()
    {
        return driver::lost();
    }
    // A forked child inherits USED but no usable CUDA state: it makes no driver call.
    // Relaxed: USED_BY is stored before USED's bit (program order of `Context::new`), and a
    // stale read only skips a probe.
    if USED_BY.load(Ordering::Relaxed) != std::process::id() {
        return None;
    }
    for ordinal in (0..64).filter(|i| used & (1 << i) != 0) {
        probe_device(ordinal);
    }
    driver::lost()
}

/// [`probe`] for device `ordinal`. A failure that is not a sticky error of a call on the
/// context says nothing of a loss, and is let go.
fn probe_device(ordinal: i32) {
    let Ok(dev) = driver::device(ordinal) else { return };
    if !driver::primary_ctx_active(dev).unwrap_or(false) {
        return;
    }
    // Active: retaining it again makes no context (should the last other holder release it
    // just now, the retain makes one, released at once below). Not through `Context::new`,
    // which would wait for an MPS server that is not ready.
    let Ok(ctx) = driver::primary_ctx_retain(dev) else { return };
    let ctx = Context { dev, ordinal, ctx };
    let Ok(_bound) = ctx.bind() else { return };
    use driver::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED as RELAXED;
    let Ok(mode) = driver::thread_exchange_capture_mode(RELAXED) else { return };
    // SAFETY: `_bound` makes the retained context current on this thread; the event and the
    // stream are this context's and destroyed before it is released. A sticky error latches
    // in the calls.
    unsafe {
        if let Ok(ev) = driver::event_create() {
            let _ = driver::event_query(ev);
            let _ = driver::event_destroy(ev);
        }
        if let Ok(s) = driver::stream_create() {
            let _ = driver::stream_query(s);
            let _ = driver::stream_destroy(s);
        }
    }
    let _ = driver::thread_exchange_capture_mode(mode);
}

/// How long [`finish_gpu_work`] waits for a device's work before it gives up.
///
/// ```
/// // Within the stop grace period of deploy/systemd/ and docker/compose.yaml (30 s).
/// assert!(gpuring::cuda::FINISH_PATIENCE.as_secs() < 30);
/// ```
pub const FINISH_PATIENCE: std::time::Duration = std::time::Duration::from_secs(20);

/// Waits until every device this process used through gpuring has no GPU work left running in
/// its primary context (gpuring's, and that of other libraries there, such as PyTorch): the last
/// step of a graceful stop, before the process exits. A process that exits with kernels still
/// running has them torn down mid-flight, and under MPS that faults every other client of the
/// GPU (docs/gpu.md, "MPS or not").
///
/// Makes no context: a device whose primary context nobody holds any more has nothing
/// running there. Does nothing once the context is lost: such a process must exit at once.
/// Gives up on a device after
/// [`FINISH_PATIENCE`] (work waiting on a fence nobody will raise), with an error, within the
/// stop grace period of the supervisors (30 s in deploy/systemd/ and docker/compose.yaml);
/// returns the first failure.
///
/// ```no_run
/// // ... the service's loop ended (SIGTERM), its consumers and producers are dropped ...
/// gpuring::cuda::finish_gpu_work()?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn finish_gpu_work() -> Result<(), CudaError> {
    // A process whose context is lost exits at once: under MPS the server takes no new client
    // until it is gone, and a synchronisation of a faulted client is not known to return.
    // (In a process that also used a healthy device, that device's work is not waited for.)
    if probe().is_some() {
        return Ok(());
    }
    let used = USED.load(Ordering::Relaxed);
    let mut first = Ok(());
    for ordinal in (0..64).filter(|i| used & (1 << i) != 0) {
        let r = finish_device(ordinal);
        if first.is_ok() {
            first = r;
        }
    }
    first
}

/// [`finish_gpu_work`] for device `ordinal`.
fn finish_device(ordinal: i32) -> Result<(), CudaError> {
    if !driver::primary_ctx_active(driver::device(ordinal)?)? {
        return Ok(());
    }
    // Active: retaining it again makes no context (and no new MPS client).
    let ctx = Context::new(ordinal)?;
    let (done, finished) = std::sync::mpsc::channel();
    // On a thread of its own, so that work that never ends cannot hold the exit.
    std::thread::spawn(move || {
        let _ = done.send(ctx.synchronize());
    });
    match finished.recv_timeout(FINISH_PATIENCE) {
        Ok(r) => Ok(r?),
        Err(_) => Err(CudaError::Unavailable(format!(
            "GPU {ordinal} still had work running after {} s",
            FINISH_PATIENCE.as_secs()
        ))),
    }
}

/// Restores the thread's previous context when dropped. See [`Context::bind`].
///
/// ```no_run
/// let ctx = gpuring::cuda::Context::new(0)?;
/// let bound: gpuring::cuda::Bound = ctx.bind()?; // `ctx` is current now
/// drop(bound); // and the previous context again
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// Invariant: `previous`, if set, was current on this thread when the guard was made, and is
/// live or null (a context the caller keeps alive while it is current).
#[must_use = "the context is current only while the guard lives"]
pub struct Bound {
    previous: Option<driver::CUcontext>,
}

impl Drop for Bound {
    fn drop(&mut self) {
        if let Some(previous) = self.previous {
            // SAFETY: by the invariant, `previous` is null or a live context.
            let _ = unsafe { driver::ctx_set_current(previous) };
        }
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: retained once by `new`; every RAII type holds an Arc<Context>, so nothing
        // created in it outlives this.
        let _ = unsafe { driver::primary_ctx_release(self.dev) };
    }
}

impl fmt::Debug for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Context").field("ordinal", &self.ordinal).finish()
    }
}
