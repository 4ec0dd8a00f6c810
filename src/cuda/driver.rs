//! `result`-style wrappers over `cudarc::driver::sys`: each turns a `CUresult` into a
//! `Result`, and each unsafe one lists its preconditions. Nothing here owns anything; the RAII
//! types ([`super::DevicePool`], [`super::IpcMapping`], [`super::IpcEvent`], [`super::Stream`],
//! and for VMM sharing [`super::VmmPool`], [`super::VmmMapping`], [`super::HostRegistration`]) do.

use std::ffi::{c_int, c_void, CStr};
use std::fmt;
use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use cudarc::driver::sys;

pub use sys::CUmemGenericAllocationHandle;
pub use sys::{
    CUcontext, CUdevice, CUdeviceptr, CUevent, CUipcEventHandle, CUipcMemHandle, CUresult,
    CUstream, CUstreamCaptureMode,
};

/// A CUDA driver call that failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DriverError {
    /// The driver function.
    pub call: &'static str,
    /// Its result code.
    pub code: sys::CUresult,
}

impl DriverError {
    /// Whether the error means the context is lost for good: a fault of its work (sticky:
    /// every later call fails the same way), its teardown, or its MPS server gone. Other
    /// failures (a stream capture refusing a query, say) leave its work running, and so does
    /// `CUDA_ERROR_MPS_SERVER_NOT_READY` ([`mps_not_ready`](Self::mps_not_ready): no context
    /// was made, try again) and `CUDA_ERROR_MPS_MAX_CLIENTS_REACHED`.
    ///
    /// ```
    /// use gpuring::cuda::driver::{CUresult, DriverError};
    ///
    /// let fault = DriverError { call: "cuStreamQuery", code: CUresult::CUDA_ERROR_ILLEGAL_ADDRESS };
    /// assert!(fault.context_lost());
    /// let capture =
    ///     DriverError { call: "cuStreamQuery", code: CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED };
    /// assert!(!capture.context_lost());
    /// ```
    pub fn context_lost(&self) -> bool {
        use sys::CUresult::*;
        matches!(
            self.code,
            CUDA_ERROR_ILLEGAL_ADDRESS
                | CUDA_ERROR_LAUNCH_FAILED
                | CUDA_ERROR_LAUNCH_TIMEOUT
                | CUDA_ERROR_ASSERT
                | CUDA_ERROR_ILLEGAL_INSTRUCTION
                | CUDA_ERROR_MISALIGNED_ADDRESS
                | CUDA_ERROR_HARDWARE_STACK_ERROR
                | CUDA_ERROR_INVALID_PC
                | CUDA_ERROR_ECC_UNCORRECTABLE
                | CUDA_ERROR_CONTEXT_IS_DESTROYED
                | CUDA_ERROR_DEINITIALIZED
                | CUDA_ERROR_MPS_CONNECTION_FAILED
                | CUDA_ERROR_MPS_RPC_FAILURE
                | CUDA_ERROR_MPS_CLIENT_TERMINATED
        )
    }

    /// Whether the error ends this process's GPU work for good, as gpuring counts it
    /// ([`lost`]): a [`context_lost`](Self::context_lost) error of a call on a context the
    /// process has. Not from a call that makes the context (an MPS server that refuses a
    /// client says nothing of a context that never was: the process may fall back to host
    /// memory), nor a context torn down at exit or destroyed by its owner (no fault of the
    /// GPU's).
    ///
    /// ```
    /// use gpuring::cuda::driver::{CUresult, DriverError};
    ///
    /// let fault = DriverError { call: "cuStreamQuery", code: CUresult::CUDA_ERROR_ILLEGAL_ADDRESS };
    /// assert!(fault.loses_process_context());
    /// let refused = DriverError { call: "cuInit", code: CUresult::CUDA_ERROR_MPS_CONNECTION_FAILED };
    /// assert!(refused.context_lost() && !refused.loses_process_context());
    /// ```
    pub fn loses_process_context(&self) -> bool {
        use sys::CUresult::{CUDA_ERROR_CONTEXT_IS_DESTROYED, CUDA_ERROR_DEINITIALIZED};
        let made_none =
            matches!(self.call, "cuInit" | "cuDevicePrimaryCtxRetain" | "cuCtxCreate_v2");
        let teardown =
            matches!(self.code, CUDA_ERROR_DEINITIALIZED | CUDA_ERROR_CONTEXT_IS_DESTROYED);
        self.context_lost() && !made_none && !teardown
    }

    /// Whether the MPS server refused a new client because a fault of another client is not
    /// cleaned up yet: it takes new clients again once every faulted one has exited, so the
    /// caller waits and tries again ([`super::Context::new`] does).
    ///
    /// ```
    /// use gpuring::cuda::driver::{CUresult, DriverError};
    ///
    /// let e = DriverError { call: "cuDevicePrimaryCtxRetain", code: CUresult::CUDA_ERROR_MPS_SERVER_NOT_READY };
    /// assert!(e.mps_not_ready() && !e.context_lost());
    /// ```
    pub fn mps_not_ready(&self) -> bool {
        self.code == sys::CUresult::CUDA_ERROR_MPS_SERVER_NOT_READY
    }

    /// The driver's name of the error code (`CUDA_ERROR_ILLEGAL_ADDRESS`...), or its number
    /// where the driver has no name for it.
    ///
    /// ```no_run
    /// use gpuring::cuda::driver::{CUresult, DriverError};
    ///
    /// let e = DriverError { call: "cuStreamQuery", code: CUresult::CUDA_ERROR_ILLEGAL_ADDRESS };
    /// assert_eq!(e.name(), "CUDA_ERROR_ILLEGAL_ADDRESS");
    /// ```
    pub fn name(&self) -> String {
        let mut name: *const std::ffi::c_char = std::ptr::null();
        // SAFETY: only probes for the library (a DriverError made by hand on a machine
        // without CUDA must not load it); no CUDA call. (Not `available`: formatting its own
        // failure would re-enter it.)
        let ok = unsafe { sys::is_culib_present() }
            // SAFETY: cuGetErrorName writes a pointer to a static string or fails (it needs no
            // cuInit); we pass a valid out-pointer, and the library is present.
            && unsafe { sys::cuGetErrorName(self.code, &mut name) } == sys::CUresult::CUDA_SUCCESS;
        if ok && !name.is_null() {
            // SAFETY: on success `name` is a NUL-terminated static string.
            unsafe { CStr::from_ptr(name) }.to_string_lossy().into_owned()
        } else {
            format!("{:?}", self.code)
        }
    }
}

impl fmt::Display for DriverError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} failed: {}", self.call, self.name())
    }
}

impl std::error::Error for DriverError {}

/// Result of a driver call.
pub type DriverResult<T> = Result<T, DriverError>;

fn check(call: &'static str, code: sys::CUresult) -> DriverResult<()> {
    if code == sys::CUresult::CUDA_SUCCESS {
        return Ok(());
    }
    Err(failed(call, code))
}

/// The error of driver call `call`, which failed with `code`; remembered ([`lost`]) if it lost
/// this process's context. Not for the calls that make a context (an MPS server that refuses
/// a client says nothing of a context that never was), and not for a context torn down at
/// exit or destroyed by its owner: those are no fault of the GPU's.
fn failed(call: &'static str, code: sys::CUresult) -> DriverError {
    let e = DriverError { call, code };
    if e.loses_process_context() {
        let _ = LOST.set(e);
    }
    e
}

/// The first error of this process that lost its context ([`DriverError::context_lost`]): set
/// once by whichever driver call saw it, for good (the errors are sticky).
static LOST: OnceLock<DriverError> = OnceLock::new();

/// The first driver error by which this process's CUDA context was lost, if one was: after it
/// no CUDA work runs in the process (gpuring's calls then return `ContextLost`).
///
/// ```
/// assert!(gpuring::cuda::driver::lost().is_none());
/// ```
#[inline]
pub fn lost() -> Option<DriverError> {
    LOST.get().copied()
}

/// IPC memory handles opened and closed by this process, for tests that prove steady state
/// makes no such calls.
pub static IPC_MEM_OPENS: AtomicU64 = AtomicU64::new(0);
/// IPC event handles opened by this process.
pub static IPC_EVENT_OPENS: AtomicU64 = AtomicU64::new(0);
/// IPC memory handles closed by this process.
pub static IPC_MEM_CLOSES: AtomicU64 = AtomicU64::new(0);
/// IPC handles (memory and event) made by this process, for tests that prove a VMM ring makes
/// no legacy IPC call.
pub static IPC_EXPORTS: AtomicU64 = AtomicU64::new(0);
/// VMM allocations imported from fds by this process ([`mem_import_fd`]), for tests that prove
/// the steady state imports nothing.
pub static VMM_IMPORTS: AtomicU64 = AtomicU64::new(0);
/// fds exported for VMM allocations by this process ([`mem_export_fd`]).
pub static VMM_EXPORTS: AtomicU64 = AtomicU64::new(0);
/// Stream and event synchronisations (the CPU waiting for the GPU) made by this process, for
/// tests that prove the steady state never makes one.
pub static CPU_SYNCS: AtomicU64 = AtomicU64::new(0);
/// GPU-side waits queued by this process ([`stream_wait_event`], [`stream_wait_value64`]), for
/// tests that must show a fence was really waited on by the GPU, not seen complete on the CPU.
pub static GPU_WAITS: AtomicU64 = AtomicU64::new(0);

/// Why CUDA cannot be used here, or `Ok` once the driver is loaded and initialised with at
/// least one device. Checked once per process; never panics on a machine without CUDA.
pub fn available() -> Result<(), String> {
    static STATE: OnceLock<Result<(), String>> = OnceLock::new();
    STATE
        .get_or_init(|| {
            // SAFETY: only probes for the library with dlopen; no CUDA call is made.
            if !unsafe { sys::is_culib_present() } {
                return Err("the CUDA driver library (libcuda.so) is not installed".into());
            }
            // SAFETY: the library is present; cuInit takes flags 0.
            when_mps_ready(|| check("cuInit", unsafe { sys::cuInit(0) }))
                .map_err(|e| e.to_string())?;
            let mut n = 0;
            // SAFETY: valid out-pointer; the driver is initialised.
            check("cuDeviceGetCount", unsafe { sys::cuDeviceGetCount(&mut n) })
                .map_err(|e| e.to_string())?;
            if n == 0 {
                return Err("no CUDA device".into());
            }
            Ok(())
        })
        .clone()
}

/// `Ok` once [`available`] said yes; otherwise the driver's "not initialised" error, so that
/// no driver call is made (cudarc would panic looking up a function of a missing library).
fn initialised() -> DriverResult<()> {
    available().map_err(|_| DriverError {
        call: "cuInit",
        code: sys::CUresult::CUDA_ERROR_NOT_INITIALIZED,
    })
}

/// Device `ordinal`. [`available`] must have returned `Ok` (otherwise this returns the
/// driver's "not initialised" error).
pub fn device(ordinal: i32) -> DriverResult<CUdevice> {
    initialised()?;
    let mut dev = 0;
    // SAFETY: driver initialised by `available`; valid out-pointer.
    check("cuDeviceGet", unsafe { sys::cuDeviceGet(&mut dev, ordinal) })?;
    Ok(dev)
}

/// Number of devices. [`available`] must have returned `Ok`.
pub fn device_count() -> DriverResult<i32> {
    initialised()?;
    let mut n = 0;
    // SAFETY: driver initialised by `available`; valid out-pointer.
    check("cuDeviceGetCount", unsafe { sys::cuDeviceGetCount(&mut n) })?;
    Ok(n)
}

/// Device `ordinal`'s UUID. [`available`] must have returned `Ok`.
pub fn ordinal_uuid(ordinal: i32) -> DriverResult<[u8; 16]> {
    device_uuid(device(ordinal)?)
}

/// The device's UUID.
pub fn device_uuid(dev: CUdevice) -> DriverResult<[u8; 16]> {
    let mut uuid = MaybeUninit::<sys::CUuuid>::uninit();
    // SAFETY: `dev` came from `device`; valid out-pointer.
    check("cuDeviceGetUuid", unsafe { sys::cuDeviceGetUuid(uuid.as_mut_ptr(), dev) })?;
    // SAFETY: initialised by the successful call.
    let uuid = unsafe { uuid.assume_init() };
    Ok(uuid.bytes.map(|b| b as u8))
}

/// Whether device `dev` can map and read the memory of device `peer` (`cuDeviceCanAccessPeer`):
/// what a consumer on `dev` of a ring on `peer` needs. A device is never its own peer (the
/// driver says no), so callers ask only for two distinct devices.
pub fn can_access_peer(dev: CUdevice, peer: CUdevice) -> DriverResult<bool> {
    let mut v = 0;
    // SAFETY: both came from `device`; valid out-pointer.
    check("cuDeviceCanAccessPeer", unsafe { sys::cuDeviceCanAccessPeer(&mut v, dev, peer) })?;
    Ok(v != 0)
}

/// Lets the current context read and write the memory allocated in `peer`, another device's
/// context of this process (`cuCtxEnablePeerAccess`). Enabling it twice is not an error here.
/// Consumers never need it: an IPC mapping enables access itself, a VMM one is granted per
/// device. Benches and tests use it to read another device's buffers directly.
///
/// # Safety
/// 1. A context must be current on this thread, and `peer` must be live.
pub unsafe fn ctx_enable_peer_access(peer: CUcontext) -> DriverResult<()> {
    // SAFETY: by (1); flags must be 0.
    let code = unsafe { sys::cuCtxEnablePeerAccess(peer, 0) };
    if code == sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED {
        return Ok(());
    }
    check("cuCtxEnablePeerAccess", code)
}

/// (major, minor) compute capability.
pub fn compute_capability(dev: CUdevice) -> DriverResult<(i32, i32)> {
    use sys::CUdevice_attribute::*;
    let (mut major, mut minor) = (0, 0);
    // SAFETY: `dev` came from `device`; valid out-pointers.
    unsafe {
        check(
            "cuDeviceGetAttribute",
            sys::cuDeviceGetAttribute(
                &mut major,
                CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
                dev,
            ),
        )?;
        check(
            "cuDeviceGetAttribute",
            sys::cuDeviceGetAttribute(
                &mut minor,
                CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
                dev,
            ),
        )?;
    }
    Ok((major, minor))
}

/// How long [`when_mps_ready`] tries.
pub const MPS_READY_WAIT: std::time::Duration = std::time::Duration::from_secs(120);

/// `f`, tried again with backoff (50 ms doubling to 2 s) for up to [`MPS_READY_WAIT`] while
/// it fails with `CUDA_ERROR_MPS_SERVER_NOT_READY`: an MPS server takes no new client until
/// every client a fault reached has exited, which a supervisor's restarts bring about soon.
pub fn when_mps_ready<T>(mut f: impl FnMut() -> DriverResult<T>) -> DriverResult<T> {
    let start = std::time::Instant::now();
    let mut pause = std::time::Duration::from_millis(50);
    loop {
        match f() {
            Err(e) if e.mps_not_ready() && start.elapsed() < MPS_READY_WAIT => {
                if pause == std::time::Duration::from_millis(50) {
                    tracing::warn!(
                        call = e.call,
                        "the MPS server is not ready (a faulted client has not exited yet): waiting"
                    );
                }
                std::thread::sleep(pause);
                pause = (pause * 2).min(std::time::Duration::from_secs(2));
            }
            r => {
                if pause > std::time::Duration::from_millis(50) {
                    let waited = start.elapsed().as_secs_f64();
                    match &r {
                        Ok(_) => tracing::info!(waited, "the MPS server took us as a client"),
                        Err(e) => {
                            tracing::warn!(waited, error = %e, "gave up waiting for the MPS server")
                        }
                    }
                }
                return r;
            }
        }
    }
}

/// Retains the device's primary context.
pub fn primary_ctx_retain(dev: CUdevice) -> DriverResult<CUcontext> {
    let mut ctx = std::ptr::null_mut();
    // SAFETY: `dev` came from `device`; valid out-pointer.
    check("cuDevicePrimaryCtxRetain", unsafe { sys::cuDevicePrimaryCtxRetain(&mut ctx, dev) })?;
    Ok(ctx)
}

/// Whether the device's primary context is active (retained by someone in this process:
/// gpuring or another library). Makes no context.
pub fn primary_ctx_active(dev: CUdevice) -> DriverResult<bool> {
    let (mut flags, mut active) = (0, 0);
    // SAFETY: `dev` came from `device`; valid out-pointers.
    check("cuDevicePrimaryCtxGetState", unsafe {
        sys::cuDevicePrimaryCtxGetState(dev, &mut flags, &mut active)
    })?;
    Ok(active != 0)
}

/// Releases a retained primary context.
///
/// # Safety
/// 1. `dev`'s primary context must have been retained by [`primary_ctx_retain`], once per call.
/// 2. Nothing created in it may be used afterwards unless another retain keeps it alive.
pub unsafe fn primary_ctx_release(dev: CUdevice) -> DriverResult<()> {
    // SAFETY: by (1) and (2).
    check("cuDevicePrimaryCtxRelease", unsafe { sys::cuDevicePrimaryCtxRelease_v2(dev) })
}

/// `cuCtxCreate_v2`: a new (non-primary) context of `dev`, current on the calling thread. For
/// tests that stand in for a framework with a context of its own.
///
/// # Safety
/// 1. The caller destroys it with [`ctx_destroy`] once nothing created in it is used any more.
pub unsafe fn ctx_create(dev: CUdevice) -> DriverResult<CUcontext> {
    let mut ctx = std::ptr::null_mut();
    // SAFETY: valid out-pointer; `dev` came from `device`; (1) covers its lifetime.
    check("cuCtxCreate_v2", unsafe { sys::cuCtxCreate_v2(&mut ctx, 0, dev) })?;
    Ok(ctx)
}

/// `cuCtxDestroy_v2`.
///
/// # Safety
/// 1. `ctx` must come from [`ctx_create`], and nothing created in it may be used afterwards.
pub unsafe fn ctx_destroy(ctx: CUcontext) -> DriverResult<()> {
    // SAFETY: by (1).
    check("cuCtxDestroy_v2", unsafe { sys::cuCtxDestroy_v2(ctx) })
}

/// The calling thread's current context (null if none).
pub fn ctx_get_current() -> DriverResult<CUcontext> {
    let mut ctx = std::ptr::null_mut();
    // SAFETY: valid out-pointer; callers reach this only after `available` succeeded.
    check("cuCtxGetCurrent", unsafe { sys::cuCtxGetCurrent(&mut ctx) })?;
    Ok(ctx)
}

/// Makes `ctx` current on the calling thread (null: none).
///
/// # Safety
/// 1. `ctx` must be a live context, or null.
pub unsafe fn ctx_set_current(ctx: CUcontext) -> DriverResult<()> {
    // SAFETY: by (1).
    check("cuCtxSetCurrent", unsafe { sys::cuCtxSetCurrent(ctx) })
}

/// `cuMemAlloc_v2`: a dedicated allocation (never from a stream-ordered pool, which legacy IPC
/// refuses).
///
/// # Safety
/// 1. A context must be current on this thread.
pub unsafe fn mem_alloc(bytes: usize) -> DriverResult<CUdeviceptr> {
    let mut ptr = 0;
    // SAFETY: by (1); valid out-pointer.
    check("cuMemAlloc_v2", unsafe { sys::cuMemAlloc_v2(&mut ptr, bytes) })?;
    Ok(ptr)
}

/// `cuMemFree_v2`.
///
/// # Safety
/// 1. `ptr` must come from [`mem_alloc`] in the current context and not be freed yet.
/// 2. No pending work may still use it.
pub unsafe fn mem_free(ptr: CUdeviceptr) -> DriverResult<()> {
    // SAFETY: by (1) and (2).
    check("cuMemFree_v2", unsafe { sys::cuMemFree_v2(ptr) })
}

/// `cuIpcGetMemHandle`.
///
/// # Safety
/// 1. `ptr` must be the base of a live [`mem_alloc`] allocation in the current context.
pub unsafe fn ipc_get_mem_handle(ptr: CUdeviceptr) -> DriverResult<CUipcMemHandle> {
    let mut h = MaybeUninit::<CUipcMemHandle>::uninit();
    // SAFETY: by (1); valid out-pointer.
    check("cuIpcGetMemHandle", unsafe { sys::cuIpcGetMemHandle(h.as_mut_ptr(), ptr) })?;
    IPC_EXPORTS.fetch_add(1, Ordering::Relaxed);
    // SAFETY: initialised by the successful call.
    Ok(unsafe { h.assume_init() })
}

/// `cuIpcOpenMemHandle_v2` with `CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS`, the flag the driver
/// requires (0 is refused with `CUDA_ERROR_INVALID_VALUE`).
///
/// # Safety
/// 1. A context must be current on this thread.
/// 2. No other thread may open or close an IPC mapping at the same time. The driver counts the
///    opens of one handle in one context (a second open returns the same pointer), but two
///    threads opening one handle at once race in it: one gets `CUDA_ERROR_ALREADY_MAPPED`
///    (seen on an H100, driver 580, two consumers of one ring joining in one process).
///    `cuda::ipc::IpcMapping` serialises them.
pub unsafe fn ipc_open_mem_handle(handle: CUipcMemHandle) -> DriverResult<CUdeviceptr> {
    let flags = sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32;
    let mut ptr = 0;
    // SAFETY: by (1) and (2); valid out-pointer.
    check("cuIpcOpenMemHandle_v2", unsafe { sys::cuIpcOpenMemHandle_v2(&mut ptr, handle, flags) })?;
    IPC_MEM_OPENS.fetch_add(1, Ordering::Relaxed);
    Ok(ptr)
}

/// `cuIpcCloseMemHandle`.
///
/// # Safety
/// 1. `ptr` must come from [`ipc_open_mem_handle`] in the current context, not closed yet
///    (once per open: the driver counts them).
/// 2. No pending work may still use the mapping.
/// 3. No other thread may open or close an IPC mapping at the same time (see
///    [`ipc_open_mem_handle`]).
pub unsafe fn ipc_close_mem_handle(ptr: CUdeviceptr) -> DriverResult<()> {
    IPC_MEM_CLOSES.fetch_add(1, Ordering::Relaxed);
    // SAFETY: by (1), (2) and (3).
    check("cuIpcCloseMemHandle", unsafe { sys::cuIpcCloseMemHandle(ptr) })
}

/// `cuEventCreate` with `CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING`, the flags IPC
/// events require.
///
/// # Safety
/// 1. A context must be current on this thread.
pub unsafe fn event_create_interprocess() -> DriverResult<CUevent> {
    let flags = sys::CUevent_flags::CU_EVENT_INTERPROCESS as u32
        | sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32;
    let mut ev = std::ptr::null_mut();
    // SAFETY: by (1); valid out-pointer.
    check("cuEventCreate", unsafe { sys::cuEventCreate(&mut ev, flags) })?;
    Ok(ev)
}

/// `cuEventCreate` with `CU_EVENT_DISABLE_TIMING`: a plain event for ordering two streams of
/// this process.
///
/// # Safety
/// 1. A context must be current on this thread.
pub unsafe fn event_create() -> DriverResult<CUevent> {
    let flags = sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32;
    let mut ev = std::ptr::null_mut();
    // SAFETY: by (1); valid out-pointer.
    check("cuEventCreate", unsafe { sys::cuEventCreate(&mut ev, flags) })?;
    Ok(ev)
}

/// `cuEventDestroy_v2`.
///
/// # Safety
/// 1. `ev` must be a live event of the current context, not used afterwards.
pub unsafe fn event_destroy(ev: CUevent) -> DriverResult<()> {
    // SAFETY: by (1).
    check("cuEventDestroy_v2", unsafe { sys::cuEventDestroy_v2(ev) })
}

/// `cuIpcGetEventHandle`.
///
/// # Safety
/// 1. `ev` must be a live event created with [`event_create_interprocess`].
pub unsafe fn ipc_get_event_handle(ev: CUevent) -> DriverResult<CUipcEventHandle> {
    let mut h = MaybeUninit::<CUipcEventHandle>::uninit();
    // SAFETY: by (1); valid out-pointer.
    check("cuIpcGetEventHandle", unsafe { sys::cuIpcGetEventHandle(h.as_mut_ptr(), ev) })?;
    IPC_EXPORTS.fetch_add(1, Ordering::Relaxed);
    // SAFETY: initialised by the successful call.
    Ok(unsafe { h.assume_init() })
}

/// `cuIpcOpenEventHandle`.
///
/// # Safety
/// 1. A context must be current on this thread.
pub unsafe fn ipc_open_event_handle(handle: CUipcEventHandle) -> DriverResult<CUevent> {
    let mut ev = std::ptr::null_mut();
    // SAFETY: by (1); valid out-pointer.
    check("cuIpcOpenEventHandle", unsafe { sys::cuIpcOpenEventHandle(&mut ev, handle) })?;
    IPC_EVENT_OPENS.fetch_add(1, Ordering::Relaxed);
    Ok(ev)
}

/// `cuEventRecord`.
///
/// # Safety
/// 1. `ev` and `stream` must be live, and `ev` of the current context (or opened into it).
pub unsafe fn event_record(ev: CUevent, stream: CUstream) -> DriverResult<()> {
    // SAFETY: by (1).
    check("cuEventRecord", unsafe { sys::cuEventRecord(ev, stream) })
}

/// `cuStreamWaitEvent`: work submitted to `stream` later waits for `ev`'s last record.
///
/// # Safety
/// 1. `stream` and `ev` must be live.
pub unsafe fn stream_wait_event(stream: CUstream, ev: CUevent) -> DriverResult<()> {
    GPU_WAITS.fetch_add(1, Ordering::Relaxed);
    // SAFETY: by (1).
    check("cuStreamWaitEvent", unsafe { sys::cuStreamWaitEvent(stream, ev, 0) })
}

/// `cuEventSynchronize`: blocks until `ev`'s last record completed. Teardown only.
///
/// # Safety
/// 1. `ev` must be live, of the current context (or opened into it).
pub unsafe fn event_synchronize(ev: CUevent) -> DriverResult<()> {
    CPU_SYNCS.fetch_add(1, Ordering::Relaxed);
    // SAFETY: by (1).
    check("cuEventSynchronize", unsafe { sys::cuEventSynchronize(ev) })
}

/// `cuLaunchHostFunc`: `f(data)` runs on a driver thread after the work queued on `stream`.
///
/// # Safety
/// 1. `stream` must be live.
/// 2. `f` must be safe to call once with `data` from another thread, and make no CUDA calls.
pub unsafe fn launch_host_fn(
    stream: CUstream,
    f: extern "C" fn(*mut std::ffi::c_void),
    data: *mut std::ffi::c_void,
) -> DriverResult<()> {
    // SAFETY: by (1) and (2).
    check("cuLaunchHostFunc", unsafe { sys::cuLaunchHostFunc(stream, Some(f), data) })
}

/// `cuEventQuery`: whether `ev`'s last record has completed. Never blocks.
///
/// # Safety
/// 1. `ev` must be live, of the current context (or opened into it).
pub unsafe fn event_query(ev: CUevent) -> DriverResult<bool> {
    // SAFETY: by (1).
    match unsafe { sys::cuEventQuery(ev) } {
        sys::CUresult::CUDA_SUCCESS => Ok(true),
        sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
        code => Err(failed("cuEventQuery", code)),
    }
}

/// `cuMemGetAddressRange_v2`: the base and size of the allocation that contains `ptr`.
///
/// # Safety
/// 1. A context must be current on this thread.
pub unsafe fn mem_address_range(ptr: CUdeviceptr) -> DriverResult<(CUdeviceptr, usize)> {
    let (mut base, mut size) = (0, 0);
    // SAFETY: by (1); valid out-pointers; an unknown `ptr` is reported as an error.
    check("cuMemGetAddressRange_v2", unsafe {
        sys::cuMemGetAddressRange_v2(&mut base, &mut size, ptr)
    })?;
    Ok((base, size))
}

/// `cuStreamCreate` with `CU_STREAM_NON_BLOCKING` (no implicit sync with the legacy stream).
///
/// # Safety
/// 1. A context must be current on this thread.
pub unsafe fn stream_create() -> DriverResult<CUstream> {
    let mut s = std::ptr::null_mut();
    let flags = sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32;
    // SAFETY: by (1); valid out-pointer.
    check("cuStreamCreate", unsafe { sys::cuStreamCreate(&mut s, flags) })?;
    Ok(s)
}

/// `cuThreadExchangeStreamCaptureMode`: sets this thread's stream-capture interaction mode
/// to `mode` and returns the previous one. Relaxed, this thread's calls never invalidate a
/// capture that another thread has in progress.
pub fn thread_exchange_capture_mode(
    mode: CUstreamCaptureMode,
) -> DriverResult<CUstreamCaptureMode> {
    let mut m = mode;
    // SAFETY: valid in-out pointer; no context is needed.
    check("cuThreadExchangeStreamCaptureMode", unsafe {
        sys::cuThreadExchangeStreamCaptureMode(&mut m)
    })?;
    Ok(m)
}

/// `cuStreamDestroy_v2`.
///
/// # Safety
/// 1. `s` must be a live stream of the current context, not used afterwards.
pub unsafe fn stream_destroy(s: CUstream) -> DriverResult<()> {
    // SAFETY: by (1).
    check("cuStreamDestroy_v2", unsafe { sys::cuStreamDestroy_v2(s) })
}

/// `cuStreamQuery`: whether all work queued on `s` has completed. Never blocks.
///
/// # Safety
/// 1. `s` must be a live stream.
pub unsafe fn stream_query(s: CUstream) -> DriverResult<bool> {
    // SAFETY: by (1).
    match unsafe { sys::cuStreamQuery(s) } {
        sys::CUresult::CUDA_SUCCESS => Ok(true),
        sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
        code => Err(failed("cuStreamQuery", code)),
    }
}

/// `cuStreamSynchronize`. Never on the steady-state path: setup, teardown and tests only.
///
/// # Safety
/// 1. `s` must be a live stream.
pub unsafe fn stream_synchronize(s: CUstream) -> DriverResult<()> {
    CPU_SYNCS.fetch_add(1, Ordering::Relaxed);
    // SAFETY: by (1).
    check("cuStreamSynchronize", unsafe { sys::cuStreamSynchronize(s) })
}

/// `cuCtxSynchronize`: waits for every stream of the current context. Tests and teardown
/// only.
///
/// # Safety
/// 1. A context must be current on this thread.
pub unsafe fn ctx_synchronize() -> DriverResult<()> {
    CPU_SYNCS.fetch_add(1, Ordering::Relaxed);
    // SAFETY: by (1).
    check("cuCtxSynchronize", unsafe { sys::cuCtxSynchronize() })
}

/// `cuMemcpyDtoH_v2` into `dst`.
///
/// # Safety
/// 1. `src` must point to at least `dst.len()` readable device bytes in the current context.
pub unsafe fn memcpy_dtoh(dst: &mut [u8], src: CUdeviceptr) -> DriverResult<()> {
    // SAFETY: by (1); `dst` is valid for writes of its length.
    check("cuMemcpyDtoH_v2", unsafe {
        sys::cuMemcpyDtoH_v2(dst.as_mut_ptr().cast(), src, dst.len())
    })
}

/// `cuMemcpyHtoDAsync_v2` of `src` into device memory at `dst` on `stream` (the C API's copying
/// send).
///
/// # Safety
/// 1. `dst` must point to at least `src.len()` writable device bytes in the current context,
///    valid until the copy has run; `stream` must be live in the current context.
/// 2. `src` must stay valid and unchanged until the copy has run (pageable memory is staged
///    by the driver, but the caller waits for the stream before reusing it).
pub unsafe fn memcpy_htod_async(
    dst: CUdeviceptr,
    src: &[u8],
    stream: CUstream,
) -> DriverResult<()> {
    // SAFETY: by (1) and (2).
    check("cuMemcpyHtoDAsync_v2", unsafe {
        sys::cuMemcpyHtoDAsync_v2(dst, src.as_ptr().cast(), src.len(), stream)
    })
}

/// `cuMemcpyDtoDAsync_v2` of `len` bytes from `src` to `dst` on `stream` (the bandwidth floor
/// of the GPU bench).
///
/// # Safety
/// 1. `src` and `dst` must each point to at least `len` device bytes (readable, writable), not
///    overlapping, valid until the copy has run; `stream` must be live in the current context.
pub unsafe fn memcpy_dtod_async(
    dst: CUdeviceptr,
    src: CUdeviceptr,
    len: usize,
    stream: CUstream,
) -> DriverResult<()> {
    // SAFETY: by (1).
    check("cuMemcpyDtoDAsync_v2", unsafe { sys::cuMemcpyDtoDAsync_v2(dst, src, len, stream) })
}

/// `cuMemcpyPeerAsync`: `len` bytes from `src` in context `src_ctx` to `dst` in context
/// `dst_ctx` (another device's, or the same), on `stream`. The copy engines' floor for moving
/// a frame between two GPUs.
///
/// # Safety
/// 1. `src` must hold `len` readable bytes of `src_ctx` and `dst` `len` writable bytes of
///    `dst_ctx`, not overlapping, valid until the copy has run; both contexts live.
/// 2. `stream` must be live in the current context.
pub unsafe fn memcpy_peer_async(
    dst: CUdeviceptr,
    dst_ctx: CUcontext,
    src: CUdeviceptr,
    src_ctx: CUcontext,
    len: usize,
    stream: CUstream,
) -> DriverResult<()> {
    // SAFETY: by (1) and (2).
    check("cuMemcpyPeerAsync", unsafe {
        sys::cuMemcpyPeerAsync(dst, dst_ctx, src, src_ctx, len, stream)
    })
}

/// One side of a [`memcpy_2d_peer_async`]: where the first row starts, the bytes from one row's
/// start to the next's, and whose memory it is.
#[derive(Clone, Copy, Debug)]
pub enum Rows {
    /// Device memory of context `ctx` (any context of this process: gpuring's primary one, or
    /// another library's own, such as GStreamer's).
    Device {
        /// The first row.
        ptr: CUdeviceptr,
        /// Bytes between row starts.
        pitch: usize,
        /// The context the memory belongs to.
        ctx: CUcontext,
    },
    /// Host memory (pageable or page-locked).
    Host {
        /// The first row.
        ptr: *mut u8,
        /// Bytes between row starts.
        pitch: usize,
    },
}

/// `cuMemCpy3DPeerAsync` of `height` rows of `width` bytes from `src` to `dst` on `stream`:
/// a plane of an image between two pitches, across contexts (GStreamer's CUDA memory lives in
/// a context of its own) or between device and host memory.
///
/// # Safety
/// 1. Each side must hold `height` rows of at least `width` bytes at its pitch (readable for
///    `src`, writable for `dst`), not overlapping, valid until the copy has run; each device
///    side's context must be live.
/// 2. `stream` must be live in the current context.
pub unsafe fn memcpy_2d_peer_async(
    dst: Rows,
    src: Rows,
    width: usize,
    height: usize,
    stream: CUstream,
) -> DriverResult<()> {
    use sys::CUmemorytype::{CU_MEMORYTYPE_DEVICE as DEVICE, CU_MEMORYTYPE_HOST as HOST};
    let null: *mut c_void = std::ptr::null_mut();
    // (memory type, host pointer, device pointer, context, pitch) of each side; the fields a
    // side does not use stay zero or null, as the driver expects.
    let side = |r: Rows| match r {
        Rows::Device { ptr, pitch, ctx } => (DEVICE, null, ptr, ctx, pitch),
        Rows::Host { ptr, pitch } => (HOST, ptr.cast::<c_void>(), 0, null.cast(), pitch),
    };
    let (src_type, src_host, src_dev, src_ctx, src_pitch) = side(src);
    let (dst_type, dst_host, dst_dev, dst_ctx, dst_pitch) = side(dst);
    let p = sys::CUDA_MEMCPY3D_PEER {
        srcXInBytes: 0,
        srcY: 0,
        srcZ: 0,
        srcLOD: 0,
        srcMemoryType: src_type,
        srcHost: src_host.cast_const(),
        srcDevice: src_dev,
        srcArray: null.cast(),
        srcContext: src_ctx,
        srcPitch: src_pitch,
        srcHeight: height,
        dstXInBytes: 0,
        dstY: 0,
        dstZ: 0,
        dstLOD: 0,
        dstMemoryType: dst_type,
        dstHost: dst_host,
        dstDevice: dst_dev,
        dstArray: null.cast(),
        dstContext: dst_ctx,
        dstPitch: dst_pitch,
        dstHeight: height,
        WidthInBytes: width,
        Height: height,
        Depth: 1,
    };
    // SAFETY: by (1) and (2); `p` describes exactly those two regions.
    check("cuMemcpy3DPeerAsync", unsafe { sys::cuMemcpy3DPeerAsync(&p, stream) })
}

/// `cuStreamWriteValue64_v2`: when `stream` reaches it (after its earlier work, with a memory
/// barrier), writes `value` to the device word at `addr`. The bench's alternative fence.
///
/// # Safety
/// 1. `stream` must be live in the current context; `addr` must be an 8-byte aligned device
///    word writable from it until the write has run.
pub unsafe fn stream_write_value64(
    stream: CUstream,
    addr: CUdeviceptr,
    value: u64,
) -> DriverResult<()> {
    // SAFETY: by (1).
    check("cuStreamWriteValue64_v2", unsafe {
        sys::cuStreamWriteValue64_v2(stream, addr, value, 0)
    })
}

/// `cuStreamBatchMemOp_v2` of 64-bit writes: when `stream` reaches it (after its earlier work,
/// with a memory barrier), writes each `(addr, value)` of `writes`, in one driver call. A
/// fence that must reach both a device word (for GPU waits, which poll it in the GPU's own
/// memory) and a host word (for the CPU) writes both so.
///
/// # Safety
/// 1. `stream` must be live in the current context; every `addr` must be an 8-byte aligned
///    word writable from it (device memory, or host memory registered for the device) until
///    the writes have run.
pub unsafe fn stream_write_values64<const N: usize>(
    stream: CUstream,
    writes: [(CUdeviceptr, u64); N],
) -> DriverResult<()> {
    let mut ops = writes.map(|(address, value)| {
        // SAFETY: a plain-data union, all zeroes is a valid value of it.
        let mut op: sys::CUstreamBatchMemOpParams = unsafe { std::mem::zeroed() };
        op.writeValue.operation = sys::CUstreamBatchMemOpType::CU_STREAM_MEM_OP_WRITE_VALUE_64;
        op.writeValue.address = address;
        op.writeValue.__bindgen_anon_1.value64 = value;
        op.writeValue.flags = 0;
        op
    });
    // SAFETY: by (1); `ops` holds `writes.len()` initialised operations for the call's length.
    check("cuStreamBatchMemOp_v2", unsafe {
        sys::cuStreamBatchMemOp_v2(stream, ops.len() as u32, ops.as_mut_ptr(), 0)
    })
}

/// `cuStreamWaitValue64_v2` with `CU_STREAM_WAIT_VALUE_GEQ`: work queued on `stream` after it
/// waits until the device word at `addr` passes `value` in the driver's cyclic sense,
/// `(int64_t)(*addr - value) >= 0`: a word more than 2^63 above `value` counts as below it
/// (`u64::MAX` is below 1).
///
/// # Safety
/// 1. `stream` must be live in the current context; `addr` must be an 8-byte aligned device
///    word readable from it until the wait has run, and something must eventually write a
///    value that passes `value` as above there, or the stream never proceeds.
pub unsafe fn stream_wait_value64(
    stream: CUstream,
    addr: CUdeviceptr,
    value: u64,
) -> DriverResult<()> {
    GPU_WAITS.fetch_add(1, Ordering::Relaxed);
    // SAFETY: by (1).
    check("cuStreamWaitValue64_v2", unsafe { sys::cuStreamWaitValue64_v2(stream, addr, value, 0) })
}

/// `cuMemHostRegister_v2` with `PORTABLE | DEVICEMAP`: page-locks `len` bytes at `ptr` and
/// maps them for the GPU. Returns the device address of `ptr`
/// (`cuMemHostGetDevicePointer_v2`).
///
/// # Safety
/// 1. `ptr..ptr + len` must be mapped in this process, page-aligned, and stay mapped until
///    [`mem_host_unregister`] is called on `ptr`; a context must be current.
pub unsafe fn mem_host_register(ptr: *mut u8, len: usize) -> DriverResult<CUdeviceptr> {
    let flags = sys::CU_MEMHOSTREGISTER_PORTABLE | sys::CU_MEMHOSTREGISTER_DEVICEMAP;
    // SAFETY: by (1).
    check("cuMemHostRegister_v2", unsafe { sys::cuMemHostRegister_v2(ptr.cast(), len, flags) })?;
    let mut dptr = 0;
    // SAFETY: `ptr` was just registered; valid out-pointer.
    let got = check("cuMemHostGetDevicePointer_v2", unsafe {
        sys::cuMemHostGetDevicePointer_v2(&mut dptr, ptr.cast(), 0)
    });
    if let Err(e) = got {
        // SAFETY: registered above, not used since.
        let _ = unsafe { sys::cuMemHostUnregister(ptr.cast()) };
        return Err(e);
    }
    Ok(dptr)
}

/// `cuMemHostUnregister`.
///
/// # Safety
/// 1. `ptr` must have been registered by [`mem_host_register`] and no GPU work that uses the
///    range may still be pending.
pub unsafe fn mem_host_unregister(ptr: *mut u8) -> DriverResult<()> {
    // SAFETY: by (1).
    check("cuMemHostUnregister", unsafe { sys::cuMemHostUnregister(ptr.cast()) })
}

/// Whether device `dev` supports 64-bit stream memory operations.
pub fn can_use_64_bit_stream_mem_ops(dev: CUdevice) -> DriverResult<bool> {
    let mut v = 0;
    // SAFETY: `dev` came from `device`; valid out-pointer.
    check("cuDeviceGetAttribute", unsafe {
        sys::cuDeviceGetAttribute(
            &mut v,
            sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS,
            dev,
        )
    })?;
    Ok(v != 0)
}

/// `cuMemsetD8Async` of `len` bytes at `dst` on `stream`.
///
/// # Safety
/// 1. `dst` must point to at least `len` writable device bytes; `stream` must be live.
pub unsafe fn memset_async(
    dst: CUdeviceptr,
    value: u8,
    len: usize,
    stream: CUstream,
) -> DriverResult<()> {
    // SAFETY: by (1).
    check("cuMemsetD8Async", unsafe { sys::cuMemsetD8Async(dst, value, len, stream) })
}

// VMM sharing: `cuMemCreate` allocations, mapped with `cuMemMap` and shared as POSIX fds.

/// Whether device `dev` supports virtual memory management (`cuMemCreate`, `cuMemMap`) with
/// allocations shareable as POSIX fds: what VMM sharing needs.
pub fn vmm_supported(dev: CUdevice) -> DriverResult<bool> {
    use sys::CUdevice_attribute::*;
    let (mut vmm, mut fds) = (0, 0);
    // SAFETY: `dev` came from `device`; valid out-pointers.
    unsafe {
        check(
            "cuDeviceGetAttribute",
            sys::cuDeviceGetAttribute(
                &mut vmm,
                CU_DEVICE_ATTRIBUTE_VIRTUAL_ADDRESS_MANAGEMENT_SUPPORTED,
                dev,
            ),
        )?;
        check(
            "cuDeviceGetAttribute",
            sys::cuDeviceGetAttribute(
                &mut fds,
                CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
                dev,
            ),
        )?;
    }
    Ok(vmm != 0 && fds != 0)
}

/// Where device `ordinal`'s memory is, for the VMM calls.
fn device_location(ordinal: i32) -> sys::CUmemLocation {
    sys::CUmemLocation { type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE, id: ordinal }
}

/// The properties of every VMM allocation gpuring makes: pinned memory of device `ordinal`,
/// exportable as a POSIX fd.
fn vmm_prop(ordinal: i32) -> sys::CUmemAllocationProp {
    // SAFETY: all-zero bytes are a valid value of this plain C struct (C code starts from
    // `= {0}`): its fields are integers, enums whose 0 is a variant (`..._INVALID`,
    // `CU_MEM_HANDLE_TYPE_NONE`), a raw pointer (null) and bytes.
    let mut prop: sys::CUmemAllocationProp = unsafe { MaybeUninit::zeroed().assume_init() };
    prop.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.requestedHandleTypes =
        sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    prop.location = device_location(ordinal);
    prop
}

/// The granularity of [`mem_create`]'s allocations on device `ordinal`: the recommended one,
/// never below the minimum (2 MiB on current GPUs). Allocation sizes, reservations and
/// mappings are multiples of it. [`available`] must have returned `Ok` (otherwise this returns
/// the driver's "not initialised" error).
pub fn mem_granularity(ordinal: i32) -> DriverResult<usize> {
    use sys::CUmemAllocationGranularity_flags::*;
    initialised()?;
    let prop = vmm_prop(ordinal);
    let (mut min, mut recommended) = (0, 0);
    // SAFETY: the driver is initialised; `prop` is a valid property struct; valid
    // out-pointers. An unknown ordinal is reported as an error.
    unsafe {
        check(
            "cuMemGetAllocationGranularity",
            sys::cuMemGetAllocationGranularity(&mut min, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
        )?;
        check(
            "cuMemGetAllocationGranularity",
            sys::cuMemGetAllocationGranularity(
                &mut recommended,
                &prop,
                CU_MEM_ALLOC_GRANULARITY_RECOMMENDED,
            ),
        )?;
    }
    if min == 0 {
        return Err(DriverError {
            call: "cuMemGetAllocationGranularity",
            code: sys::CUresult::CUDA_ERROR_INVALID_VALUE,
        });
    }
    // Both are powers of two in practice; a recommendation that is not a multiple of the
    // minimum would give sizes that `cuMemMap` refuses.
    Ok(if recommended >= min && recommended % min == 0 { recommended } else { min })
}

/// `cuMemCreate`: `size` bytes of pinned memory of device `ordinal`, exportable as a POSIX fd
/// ([`mem_export_fd`]), mapped nowhere yet ([`mem_map`]). `size` must be a nonzero multiple of
/// [`mem_granularity`] (the driver refuses others). The caller releases the handle once
/// ([`mem_release`]).
///
/// # Safety
/// 1. A context must be current on this thread.
pub unsafe fn mem_create(size: usize, ordinal: i32) -> DriverResult<CUmemGenericAllocationHandle> {
    let prop = vmm_prop(ordinal);
    let mut h = 0;
    // SAFETY: by (1); `prop` is a valid property struct; valid out-pointer; flags 0.
    check("cuMemCreate", unsafe { sys::cuMemCreate(&mut h, size, &prop, 0) })?;
    Ok(h)
}

/// `cuMemRelease`: drops this reference to the allocation. Its memory is freed once every
/// handle to it (in every process, exported fds included) is released and every mapping of it
/// unmapped, so a mapping may outlive the handle it was made with.
///
/// # Safety
/// 1. `h` must be a live handle from [`mem_create`], [`mem_import_fd`] or
///    [`mem_retain_allocation_handle`], released once per such call and not used afterwards
///    (the driver's behaviour for an invalid handle is undefined).
/// 2. A context must be current on this thread.
pub unsafe fn mem_release(h: CUmemGenericAllocationHandle) -> DriverResult<()> {
    // SAFETY: by (1) and (2).
    check("cuMemRelease", unsafe { sys::cuMemRelease(h) })
}

/// `cuMemAddressReserve`: `size` bytes of this process's device address space, aligned to
/// `align` (a power of two; 0: the driver's choice), backed by nothing until [`mem_map`].
/// `size` must be a multiple of the host page size (the driver refuses others).
///
/// # Safety
/// 1. A context must be current on this thread.
pub unsafe fn mem_address_reserve(size: usize, align: usize) -> DriverResult<CUdeviceptr> {
    let mut ptr = 0;
    // SAFETY: by (1); valid out-pointer; no address hint; flags 0.
    check("cuMemAddressReserve", unsafe { sys::cuMemAddressReserve(&mut ptr, size, align, 0, 0) })?;
    Ok(ptr)
}

/// `cuMemAddressFree`: gives back a reservation.
///
/// # Safety
/// 1. `ptr` and `size` must be exactly a reservation from [`mem_address_reserve`], not freed
///    yet, with nothing mapped in it any more.
/// 2. A context must be current on this thread.
pub unsafe fn mem_address_free(ptr: CUdeviceptr, size: usize) -> DriverResult<()> {
    // SAFETY: by (1) and (2).
    check("cuMemAddressFree", unsafe { sys::cuMemAddressFree(ptr, size) })
}

/// `cuMemMap` of the first `size` bytes of allocation `h` at `ptr` (offset 0, the only one the
/// driver takes; flags 0). The range is not accessible until [`mem_set_access_rw`]. `ptr` and
/// `size` must be multiples of the minimum granularity and `size` at most the allocation's
/// size: the driver refuses others (a size larger than the allocation with
/// `CUDA_ERROR_NOT_SUPPORTED`, seen on an H100, driver 580).
///
/// # Safety
/// 1. `ptr..ptr + size` must lie in a reservation of this process ([`mem_address_reserve`])
///    where nothing is mapped yet.
/// 2. `h` must be a live handle.
/// 3. A context must be current on this thread.
pub unsafe fn mem_map(
    ptr: CUdeviceptr,
    size: usize,
    h: CUmemGenericAllocationHandle,
) -> DriverResult<()> {
    // SAFETY: by (1), (2) and (3).
    check("cuMemMap", unsafe { sys::cuMemMap(ptr, size, 0, h, 0) })
}

/// `cuMemUnmap`: `ptr..ptr + size` becomes a bare reservation again. The driver documents it
/// as synchronous for most uses.
///
/// # Safety
/// 1. `ptr` and `size` must be exactly one whole range mapped by [`mem_map`].
/// 2. No pending GPU work may still use the range, and nothing may use it afterwards.
/// 3. A context must be current on this thread.
pub unsafe fn mem_unmap(ptr: CUdeviceptr, size: usize) -> DriverResult<()> {
    // SAFETY: by (1), (2) and (3).
    check("cuMemUnmap", unsafe { sys::cuMemUnmap(ptr, size) })
}

/// `cuMemSetAccess`: device `ordinal` may read and write `ptr..ptr + size`.
///
/// # Safety
/// 1. `ptr..ptr + size` must be mapped by [`mem_map`] (one or more whole mappings).
/// 2. A context must be current on this thread.
pub unsafe fn mem_set_access_rw(ptr: CUdeviceptr, size: usize, ordinal: i32) -> DriverResult<()> {
    let desc = sys::CUmemAccessDesc {
        location: device_location(ordinal),
        flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
    };
    // SAFETY: by (1) and (2); `desc` is one valid descriptor.
    check("cuMemSetAccess", unsafe { sys::cuMemSetAccess(ptr, size, &desc, 1) })
}

/// `cuMemExportToShareableHandle` as a POSIX fd: a new fd (each call makes one) from which a
/// process that receives it imports the allocation ([`mem_import_fd`]). Fails for an
/// allocation not created with that handle type requested. Counted in [`VMM_EXPORTS`].
///
/// # Safety
/// 1. `h` must be a live handle.
/// 2. A context must be current on this thread.
pub unsafe fn mem_export_fd(h: CUmemGenericAllocationHandle) -> DriverResult<OwnedFd> {
    let handle_type = sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    let mut fd: c_int = -1;
    // SAFETY: by (1) and (2); for POSIX fds the driver writes an `int` through the out-pointer,
    // which points to one.
    check("cuMemExportToShareableHandle", unsafe {
        sys::cuMemExportToShareableHandle((&raw mut fd).cast(), h, handle_type, 0)
    })?;
    if fd < 0 {
        return Err(DriverError {
            call: "cuMemExportToShareableHandle",
            code: sys::CUresult::CUDA_ERROR_UNKNOWN,
        });
    }
    VMM_EXPORTS.fetch_add(1, Ordering::Relaxed);
    // SAFETY: the driver just opened `fd` for us, and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `cuMemImportFromShareableHandle` of a POSIX fd made by [`mem_export_fd`] (in this process or
/// another): a new handle to that allocation, to [`mem_map`] and, once, [`mem_release`]. The
/// driver does not take the fd: the caller still owns it (and may close it right after). An fd
/// that is not such an export is refused by the driver. Counted in [`VMM_IMPORTS`].
///
/// # Safety
/// 1. A context must be current on this thread.
pub unsafe fn mem_import_fd(fd: BorrowedFd<'_>) -> DriverResult<CUmemGenericAllocationHandle> {
    let handle_type = sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    // For POSIX fds the driver takes the fd's value in the pointer argument, not a pointer.
    let os_handle = std::ptr::without_provenance_mut::<c_void>(fd.as_raw_fd() as usize);
    let mut h = 0;
    // SAFETY: by (1); valid out-pointer; `fd` is open for the duration of the call (borrowed).
    check("cuMemImportFromShareableHandle", unsafe {
        sys::cuMemImportFromShareableHandle(&mut h, os_handle, handle_type)
    })?;
    VMM_IMPORTS.fetch_add(1, Ordering::Relaxed);
    Ok(h)
}

/// `cuMemRetainAllocationHandle`: a new reference to the allocation mapped at `ptr` (any
/// address in a [`mem_map`] mapping of this process), to release once with [`mem_release`].
/// Fails for addresses that no `cuMemMap` mapping covers (`cuMemAlloc` memory, for one).
///
/// # Safety
/// 1. A context must be current on this thread.
pub unsafe fn mem_retain_allocation_handle(
    ptr: CUdeviceptr,
) -> DriverResult<CUmemGenericAllocationHandle> {
    let addr = std::ptr::without_provenance_mut::<c_void>(ptr as usize);
    let mut h = 0;
    // SAFETY: by (1); valid out-pointer; `addr` is only looked up, an unmapped one is reported
    // as an error.
    check("cuMemRetainAllocationHandle", unsafe {
        sys::cuMemRetainAllocationHandle(&mut h, addr)
    })?;
    Ok(h)
}

/// The device whose memory allocation `h` is (`cuMemGetAllocationPropertiesFromHandle`):
/// `Some(ordinal)` for device memory, `None` for any other location.
///
/// # Safety
/// 1. `h` must be a live handle.
/// 2. A context must be current on this thread.
pub unsafe fn mem_allocation_device(h: CUmemGenericAllocationHandle) -> DriverResult<Option<i32>> {
    let mut prop = MaybeUninit::<sys::CUmemAllocationProp>::zeroed();
    // SAFETY: by (1) and (2); valid out-pointer.
    check("cuMemGetAllocationPropertiesFromHandle", unsafe {
        sys::cuMemGetAllocationPropertiesFromHandle(prop.as_mut_ptr(), h)
    })?;
    let p = prop.as_ptr();
    // SAFETY: `p` points to initialised bytes (zeroed, then written by the driver). The
    // location's type is read as the `u32` it is in C, not as the Rust enum, whose variants a
    // newer driver may outgrow.
    let (kind, id) =
        unsafe { ((&raw const (*p).location.type_).cast::<u32>().read(), (*p).location.id) };
    let device = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE as u32;
    Ok((kind == device).then_some(id))
}

/// The 64 bytes of an IPC memory handle, as stored in a segment.
pub fn mem_handle_bytes(h: &CUipcMemHandle) -> [u8; 64] {
    h.reserved.map(|c| c as u8)
}

/// An IPC memory handle from its 64 bytes.
pub fn mem_handle_from_bytes(b: &[u8; 64]) -> CUipcMemHandle {
    CUipcMemHandle { reserved: b.map(|c| c as std::ffi::c_char) }
}

/// The 64 bytes of an IPC event handle, as stored in a segment.
pub fn event_handle_bytes(h: &CUipcEventHandle) -> [u8; 64] {
    h.reserved.map(|c| c as u8)
}

/// An IPC event handle from its 64 bytes.
pub fn event_handle_from_bytes(b: &[u8; 64]) -> CUipcEventHandle {
    CUipcEventHandle { reserved: b.map(|c| c as std::ffi::c_char) }
}
