//! The C API of gpuring: opaque handles over the Rust producer and consumer, both memory kinds
//! behind one handle type each (`gpuring::any`), and a status code from every call with the message of the last
//! failure on this thread ([`gpuring_last_error`]). `include/gpuring.h` is generated from this
//! crate by cbindgen; docs/c.md is the guide.
//!
//! Rules every function keeps: a null pointer where a handle or an out-pointer is required is
//! `GPURING_INVALID_ARGUMENT`; nothing panics across the boundary (a panic inside becomes
//! `GPURING_ERROR`); a handle is freed only by its `_free` (or `_release`) function.
#![allow(non_camel_case_types)]
#![allow(clippy::missing_safety_doc)] // every unsafe fn's contract is in the C header's docs

mod batch;
mod consumer;
mod producer;
mod tensor;

use std::cell::RefCell;
use std::ffi::{c_char, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Duration;

pub use batch::*;
pub use consumer::*;
pub use producer::*;
pub use tensor::*;

/// What a call did. `GPURING_OK` is 0; every other value comes with a message from
/// `gpuring_last_error()`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum gpuring_status {
    /// Done.
    GPURING_OK = 0,
    /// The timeout passed first (no free slot, no message).
    GPURING_TIMEOUT = 1,
    /// The producer closed the ring (or died, or lost its GPU context) and every message was
    /// received.
    GPURING_DISCONNECTED = 2,
    /// No ring has this name (in the ring directory).
    GPURING_NOT_FOUND = 3,
    /// A ring with this name exists and its producer is alive.
    GPURING_ALREADY_EXISTS = 4,
    /// An argument is null, out of range, or not valid UTF-8.
    GPURING_INVALID_ARGUMENT = 5,
    /// The OS or the producer's peer policy refused access.
    GPURING_PERMISSION_DENIED = 6,
    /// The shared memory is damaged (or was written by something else).
    GPURING_CORRUPT = 7,
    /// The memory kind cannot be used here (no CUDA driver or device, /dev/shm full...).
    GPURING_UNAVAILABLE = 8,
    /// A CUDA call failed.
    GPURING_CUDA = 9,
    /// The message carries no tensor header.
    GPURING_NO_TENSOR = 10,
    /// Anything else (see the message).
    GPURING_ERROR = 11,
    /// This process's GPU context is lost, for good: a kernel of it faulted, or, under MPS,
    /// another client of the GPU crashed. Every later call returns it too; no GPU work can run
    /// in the process any more. Free the handles (a producer's free closes its ring, which its
    /// consumers see as cut) and exit with `GPURING_EXIT_CONTEXT_LOST` (75, `EX_TEMPFAIL`) so
    /// that a supervisor restarts the process: under MPS the server takes no new client until
    /// every faulted one has exited.
    GPURING_CONTEXT_LOST = 12,
    /// The message carries no batch table (it is not a batch of `gpuring batch`).
    GPURING_NO_BATCH = 13,
}

/// The exit status for a process whose GPU context is lost (`GPURING_CONTEXT_LOST`):
/// `EX_TEMPFAIL`, "try again later", for a supervisor that restarts it (systemd
/// `Restart=always`, Docker `restart: always`).
pub const GPURING_EXIT_CONTEXT_LOST: i32 = 75;
const _: () = assert!(GPURING_EXIT_CONTEXT_LOST == gpuring::EXIT_CONTEXT_LOST);

use gpuring_status::*;

/// Where a ring's payload lives.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum gpuring_memory {
    /// CUDA memory where a GPU is usable, else host memory (producer); whatever the ring holds
    /// (consumer).
    GPURING_MEMORY_AUTO = 0,
    /// Host memory: the payload lives in the shared segment.
    GPURING_MEMORY_HOST = 1,
    /// CUDA device memory: pointers are device addresses, work is ordered on CUDA streams.
    GPURING_MEMORY_CUDA = 2,
}

/// How a CUDA ring orders GPU work across processes (`gpuring_producer_options.fence`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum gpuring_fence {
    /// Memory words where the producer's GPU can use 64-bit stream memory operations, else
    /// interprocess events.
    GPURING_FENCE_AUTO = 0,
    /// Sequence words in the ring's segment, which every process page-locks: no IPC event is
    /// made, so consumers in containers with their own /dev/shm or pid namespace can read the
    /// ring. Needs 64-bit stream memory operations.
    GPURING_FENCE_MEMORY = 1,
    /// Interprocess CUDA events: every process must see the producer's /dev/shm.
    GPURING_FENCE_EVENTS = 2,
}

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// The message of the last failed call on this thread ("" if none failed yet). Valid until
/// the next gpuring call on this thread.
#[no_mangle]
pub extern "C" fn gpuring_last_error() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}

/// Records `what` as this thread's last error and returns `status`.
fn fail(status: gpuring_status, what: impl std::fmt::Display) -> gpuring_status {
    let text = CString::new(what.to_string().replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = text);
    status
}

/// Records a failed CUDA call: `GPURING_CONTEXT_LOST` with the loss's message if the call
/// lost the context (or it was lost meanwhile, which most likely made the call fail), else
/// `GPURING_CUDA`.
fn cuda_failure(e: gpuring::cuda::CudaError) -> gpuring_status {
    match e {
        gpuring::cuda::CudaError::Driver(d) if d.loses_process_context() => {
            fail(GPURING_CONTEXT_LOST, gpuring::ContextLost::from(d))
        }
        e => match gpuring::context_lost() {
            Some(lost) => fail(GPURING_CONTEXT_LOST, lost),
            None => fail(GPURING_CUDA, e),
        },
    }
}

/// Runs `f`, turning a panic into `GPURING_ERROR`.
fn guard(f: impl FnOnce() -> gpuring_status) -> gpuring_status {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|_| fail(GPURING_ERROR, "gpuring panicked"))
}

/// A C string argument as UTF-8.
///
/// # Safety
/// `s` is null or a NUL-terminated string that stays valid for `'a`.
unsafe fn text<'a>(s: *const c_char, what: &str) -> Result<&'a str, gpuring_status> {
    if s.is_null() {
        return Err(fail(GPURING_INVALID_ARGUMENT, format!("{what} is null")));
    }
    // SAFETY: non-null and NUL-terminated by the caller's contract.
    unsafe { CStr::from_ptr(s) }
        .to_str()
        .map_err(|_| fail(GPURING_INVALID_ARGUMENT, format!("{what} is not UTF-8")))
}

/// The ring directory an options struct names: `None` (the library's default: `GPURING_DIR`
/// if set, else `/dev/shm`) for NULL or "". Any bytes: a path need not be UTF-8.
///
/// # Safety
/// `dir` is null or a NUL-terminated string valid for the call.
unsafe fn ring_dir(dir: *const c_char) -> Option<std::path::PathBuf> {
    use std::os::unix::ffi::OsStrExt;
    if dir.is_null() {
        return None;
    }
    // SAFETY: non-null and NUL-terminated by the caller's contract.
    let bytes = unsafe { CStr::from_ptr(dir) }.to_bytes();
    (!bytes.is_empty()).then(|| std::ffi::OsStr::from_bytes(bytes).into())
}

/// The arguments every create and open takes: the name as UTF-8, the options (`None` for
/// NULL: the caller's defaults), and a non-null out-pointer.
///
/// # Safety
/// `name` is null or a NUL-terminated string, `options` null or a valid `T`, both valid for
/// `'a`.
unsafe fn open_args<'a, T: Copy>(
    name: *const c_char,
    options: *const T,
    out: *mut *mut impl Sized,
    defaults: extern "C" fn() -> T,
) -> Result<(&'a str, T), gpuring_status> {
    // SAFETY: by the contract.
    let name = unsafe { text(name, "name") }?;
    if out.is_null() {
        return Err(fail(GPURING_INVALID_ARGUMENT, "out is null"));
    }
    // SAFETY: non-null, and a valid `T` by the contract.
    let options = if options.is_null() { defaults() } else { unsafe { *options } };
    Ok((name, options))
}

/// A timeout in milliseconds: negative waits for ever, 0 does not wait.
fn timeout(ms: i64) -> Option<Duration> {
    u64::try_from(ms).ok().map(Duration::from_millis)
}

/// A ring's memory kind as the C enum says it.
fn memory_of(kind: gpuring::MemoryKind) -> gpuring_memory {
    match kind {
        gpuring::MemoryKind::Host => gpuring_memory::GPURING_MEMORY_HOST,
        gpuring::MemoryKind::Cuda => gpuring_memory::GPURING_MEMORY_CUDA,
    }
}

/// Status of a failed create.
fn create_status(e: &gpuring::CreateError) -> gpuring_status {
    use gpuring::CreateErrorKind as E;
    match e.kind() {
        E::InvalidName(_) | E::InvalidConfig { .. } => GPURING_INVALID_ARGUMENT,
        E::AlreadyExists { .. } => GPURING_ALREADY_EXISTS,
        E::PermissionDenied => GPURING_PERMISSION_DENIED,
        E::MemoryUnavailable { .. } | E::NoSpace { .. } => GPURING_UNAVAILABLE,
        E::ContextLost(_) => GPURING_CONTEXT_LOST,
        E::Io(_) => GPURING_ERROR,
    }
}

/// Status of a failed open.
fn open_status(e: &gpuring::OpenError) -> gpuring_status {
    use gpuring::OpenErrorKind as E;
    match e.kind() {
        E::InvalidName(_) => GPURING_INVALID_ARGUMENT,
        E::NotFound => GPURING_NOT_FOUND,
        E::PermissionDenied | E::ForeignOwner { .. } | E::PeerRefused { .. } => {
            GPURING_PERMISSION_DENIED
        }
        E::NotASegment | E::BadMagic { .. } | E::Truncated { .. } | E::Corrupt(_) => {
            GPURING_CORRUPT
        }
        // Still being built: like a ring that is not there yet, worth opening again.
        E::NotInitialized => GPURING_NOT_FOUND,
        E::Disconnected => GPURING_DISCONNECTED,
        E::TimedOut => GPURING_TIMEOUT,
        E::MemoryUnavailable { .. }
        | E::NoPeerAccess { .. }
        | E::WrongMemory { .. }
        | E::TooManyConsumers { .. } => GPURING_UNAVAILABLE,
        E::ContextLost(_) => GPURING_CONTEXT_LOST,
        E::VersionMismatch { .. } | E::Io(_) => GPURING_ERROR,
    }
}

/// The C library's version, "MAJOR.MINOR.PATCH" (it is released with gpuring's).
#[no_mangle]
pub extern "C" fn gpuring_version() -> *const c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr().cast()
}
