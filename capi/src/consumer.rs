//! The consumer handle and the messages it receives.

use std::cell::Cell;
use std::ffi::{c_char, c_void};
use std::ptr::NonNull;

use gpuring::any::{AnyConsumer, AnyReadSlot};
use gpuring::cuda::Stream;
use gpuring::{Consumer, MemoryKind, Mode, RecvTimeoutError, StartAt};

use crate::gpuring_status::*;
use crate::{
    cuda_failure, fail, gpuring_memory, gpuring_status, guard, memory_of, open_args, open_status,
    ring_dir, timeout,
};

/// How a consumer receives.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum gpuring_mode {
    /// The ring's policy's default (Block: lossless, Overwrite: queue).
    GPURING_MODE_DEFAULT = 0,
    /// Every message; the producer waits for this consumer.
    GPURING_MODE_LOSSLESS = 1,
    /// Every message while it keeps up; when lapped it loses the oldest (`lag` says how many).
    GPURING_MODE_QUEUE = 2,
    /// Each receive returns the newest message, skipping older unread ones (counted in `lag`).
    GPURING_MODE_LATEST = 3,
}

/// Where a new consumer starts.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum gpuring_start {
    /// The newest message still in the ring, then everything after.
    GPURING_START_NEWEST = 0,
    /// Only messages published after joining.
    GPURING_START_NEXT = 1,
    /// The oldest message still in the ring.
    GPURING_START_OLDEST = 2,
}

/// How to open a ring. Start from `gpuring_consumer_options_default()`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct gpuring_consumer_options {
    /// A `gpuring_memory`: AUTO (whatever the ring holds), HOST or CUDA (refused if the ring
    /// holds the other).
    pub memory: u32,
    /// A `gpuring_mode`. Default `GPURING_MODE_DEFAULT`.
    pub mode: u32,
    /// A `gpuring_start`. Default `GPURING_START_NEWEST`.
    pub start: u32,
    /// CUDA: the GPU to read on (negative: the ring's). Another GPU than the ring's reads its
    /// memory across the link between the two (peer access); streams passed to
    /// `gpuring_consumer_recv` must then be of this GPU's primary context.
    pub device: i32,
    /// Nonzero: open a ring whose segment another user owns. Default 0. A `uint32_t`, not a
    /// `bool`, so that any value a caller writes is valid: every nonzero one means yes.
    pub allow_foreign_owner: u32,
    /// The ring directory to find the ring in (the producer's, as this process sees it), a
    /// path read during `gpuring_consumer_open` (not kept). NULL or "": the `GPURING_DIR`
    /// environment variable if set, else /dev/shm. Default NULL.
    pub dir: *const c_char,
}

/// The defaults: any memory, the ring's default mode, start at the newest message.
#[no_mangle]
pub extern "C" fn gpuring_consumer_options_default() -> gpuring_consumer_options {
    gpuring_consumer_options {
        memory: gpuring_memory::GPURING_MEMORY_AUTO as u32,
        mode: gpuring_mode::GPURING_MODE_DEFAULT as u32,
        start: gpuring_start::GPURING_START_NEWEST as u32,
        device: -1,
        allow_foreign_owner: 0,
        dir: std::ptr::null(),
    }
}

/// A consumer of a ring. Not thread-safe: use it (and its messages) from one thread at a time.
///
/// Invariants: `rx` owns a leaked `Box` (a raw pointer, because messages borrow `*rx`); `held`
/// counts the messages not yet released; once `freed`, the handle is dropped by the release of
/// the last one (a free with messages out is deferred, not a use-after-free).
pub struct gpuring_consumer {
    rx: NonNull<AnyConsumer>,
    held: Cell<usize>,
    freed: Cell<bool>,
    memory: gpuring_memory,
}

impl Drop for gpuring_consumer {
    fn drop(&mut self) {
        // SAFETY: leaked at open; no message borrows it any more (`held` is 0).
        drop(unsafe { Box::from_raw(self.rx.as_ptr()) });
    }
}

/// A received message: valid (the producer cannot overwrite it) until
/// `gpuring_message_release`.
///
/// Invariant: `slot` borrows `*consumer.rx` and `*stream`, both kept alive until it is gone
/// (the consumer's `held` count, the stream's leaked box freed by the release).
pub struct gpuring_message {
    slot: AnyReadSlot<'static>,
    stream: Option<NonNull<Stream>>,
    consumer: NonNull<gpuring_consumer>,
}

/// What a message is.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct gpuring_message_info {
    /// The payload: a host pointer in this process, or a device pointer (CUDA).
    pub ptr: u64,
    /// Its length in bytes.
    pub len: usize,
    /// Its sequence number (0 for the producer's first).
    pub seq: u64,
    /// When the producer published it (CLOCK_MONOTONIC nanoseconds).
    pub timestamp_ns: u64,
    /// Messages this consumer lost just before this one.
    pub lag: u64,
    /// The user header (host memory, valid until the release).
    pub header: *const u8,
    /// Its length.
    pub header_len: usize,
    /// CUDA: the stream that waits for the message (launch kernels that read it there); the
    /// release is recorded on it. NULL for host memory.
    pub stream: *mut c_void,
}

/// Opens ring `name` of the options' ring directory and joins it with `options` (NULL: the
/// defaults). On success `*out` is the consumer; free it with `gpuring_consumer_free` after
/// releasing its messages.
#[no_mangle]
pub unsafe extern "C" fn gpuring_consumer_open(
    name: *const c_char,
    options: *const gpuring_consumer_options,
    out: *mut *mut gpuring_consumer,
) -> gpuring_status {
    guard(|| {
        // SAFETY: a C string and an options struct (or nulls) by the caller's contract.
        let (name, o) =
            match unsafe { open_args(name, options, out, gpuring_consumer_options_default) } {
                Ok(args) => args,
                Err(s) => return s,
            };
        let start = match o.start {
            0 => StartAt::Newest,
            1 => StartAt::Next,
            2 => StartAt::Oldest,
            other => return fail(GPURING_INVALID_ARGUMENT, format!("start {other}")),
        };
        let mut b =
            Consumer::builder(name).start_at(start).allow_foreign_owner(o.allow_foreign_owner != 0);
        b = match o.mode {
            0 => b,
            1 => b.mode(Mode::Lossless),
            2 => b.mode(Mode::Queue),
            3 => b.mode(Mode::Latest),
            other => return fail(GPURING_INVALID_ARGUMENT, format!("mode {other}")),
        };
        if o.device >= 0 {
            b = b.device(o.device);
        }
        // SAFETY: `dir` is null or a C string, valid for the call, by the caller's contract.
        if let Some(dir) = unsafe { ring_dir(o.dir) } {
            b = b.dir(dir);
        }
        let opened = match o.memory {
            1 => AnyConsumer::open_in(b, MemoryKind::Host),
            2 => AnyConsumer::open_in(b, MemoryKind::Cuda),
            0 => AnyConsumer::open(b),
            other => return fail(GPURING_INVALID_ARGUMENT, format!("memory {other}")),
        };
        match opened {
            Ok(rx) => {
                let memory = memory_of(rx.memory());
                let rx = NonNull::from(Box::leak(Box::new(rx)));
                let c =
                    gpuring_consumer { rx, held: Cell::new(0), freed: Cell::new(false), memory };
                // SAFETY: `out` is non-null and writable by the caller's contract.
                unsafe { *out = Box::into_raw(Box::new(c)) };
                GPURING_OK
            }
            Err(e) => fail(open_status(&e), e.to_string()),
        }
    })
}

/// Leaves the ring and frees the consumer. With messages not yet released it only marks the
/// consumer freed: the release of the last one leaves and frees it. NULL is a no-op.
#[no_mangle]
pub unsafe extern "C" fn gpuring_consumer_free(c: *mut gpuring_consumer) {
    if !c.is_null() {
        let _ = guard(|| {
            // SAFETY: made by `gpuring_consumer_open` and not freed before (the contract).
            let handle = unsafe { &*c };
            if handle.held.get() > 0 {
                handle.freed.set(true);
            } else {
                // SAFETY: as above; no message borrows it.
                drop(unsafe { Box::from_raw(c) });
            }
            GPURING_OK
        });
    }
}

/// Receives the next message, waiting up to `timeout_ms` (negative: as long as it takes; 0:
/// not at all). On success `*out` is the message and `*info` (may be NULL) what it is.
///
/// CUDA: `stream` is made to wait for the producer's writes, and the release is recorded on it;
/// NULL: the consumer's own. It must be a `CUstream` of the primary context (the one the CUDA
/// runtime uses) of the GPU this consumer reads on: the options' `device` if it was set (a
/// consumer on another GPU than the ring's), else the ring's GPU. It must stay alive until the
/// message is released. Do not pass the per-thread default stream (`CU_STREAM_PER_THREAD`,
/// `cudaStreamPerThread`) if the message may be released on another thread than this one: that
/// handle names another stream on each thread, so the release would be recorded on a stream
/// that does not follow the reads.
#[no_mangle]
pub unsafe extern "C" fn gpuring_consumer_recv(
    c: *mut gpuring_consumer,
    timeout_ms: i64,
    stream: *mut c_void,
    out: *mut *mut gpuring_message,
    info: *mut gpuring_message_info,
) -> gpuring_status {
    guard(|| {
        // SAFETY: by the caller's contract (null or live).
        let Some(handle) = (unsafe { c.as_ref() }) else {
            return fail(GPURING_INVALID_ARGUMENT, "consumer is null");
        };
        if out.is_null() || handle.freed.get() {
            return fail(GPURING_INVALID_ARGUMENT, "out is null, or the consumer was freed");
        }
        // SAFETY: `rx` is a leaked box (stable address), freed only when the handle drops,
        // which waits for every message (`held`); receives take it shared, so several messages
        // may borrow it at once.
        let rx: &'static AnyConsumer = unsafe { handle.rx.as_ref() };
        let mut kept = None;
        let got = match rx.context() {
            _ if stream.is_null() => recv(recv_timeout_or_block(rx, timeout_ms)),
            None => Err(fail(GPURING_INVALID_ARGUMENT, "a host ring takes no stream")),
            Some(ctx) => {
                // SAFETY: the caller passes a live stream of the primary context of the GPU
                // this consumer reads on, which outlives the message and is not the per-thread
                // default stream if the message is released on another thread (the contract
                // in the header).
                let wrapped = NonNull::from(Box::leak(Box::new(unsafe {
                    Stream::from_raw(ctx, stream.cast())
                })));
                // SAFETY: leaked (stable address), freed by the release after the slot.
                let s: &'static Stream = unsafe { wrapped.as_ref() };
                kept = Some(wrapped);
                let r = match timeout(timeout_ms) {
                    None => rx.recv_on(s).map_err(RecvTimeoutError::from_blocking),
                    Some(t) => rx.recv_on_timeout(s, t),
                };
                recv(r)
            }
        };
        let slot = match got {
            Ok(slot) => slot,
            Err(s) => {
                if let Some(stream) = kept {
                    // SAFETY: leaked above; nothing borrows it (the receive failed).
                    drop(unsafe { Box::from_raw(stream.as_ptr()) });
                }
                return s;
            }
        };
        handle.held.set(handle.held.get() + 1);
        let m = Box::new(gpuring_message { slot, stream: kept, consumer: NonNull::from(handle) });
        // SAFETY: `info` is null or writable; `out` is writable (the contract).
        unsafe {
            if let Some(i) = info.as_mut() {
                *i = describe(&m);
            }
            *out = Box::into_raw(m);
        }
        GPURING_OK
    })
}

/// A receive with the C API's timeout convention.
fn recv_timeout_or_block(
    rx: &AnyConsumer,
    timeout_ms: i64,
) -> Result<AnyReadSlot<'_>, RecvTimeoutError> {
    match timeout(timeout_ms) {
        None => rx.recv().map_err(RecvTimeoutError::from_blocking),
        Some(t) => rx.recv_timeout(t),
    }
}

/// The blocking receive's error as the timed one's (it has every case but the timeout).
trait FromBlocking {
    fn from_blocking(e: gpuring::RecvError) -> RecvTimeoutError;
}

impl FromBlocking for RecvTimeoutError {
    fn from_blocking(e: gpuring::RecvError) -> RecvTimeoutError {
        match e {
            gpuring::RecvError::Disconnected => RecvTimeoutError::Disconnected,
            gpuring::RecvError::Corrupt(c) => RecvTimeoutError::Corrupt(c),
            gpuring::RecvError::ContextLost(l) => RecvTimeoutError::ContextLost(l),
            gpuring::RecvError::Cuda(e) => RecvTimeoutError::Cuda(e),
            other => {
                RecvTimeoutError::Cuda(gpuring::cuda::CudaError::Unavailable(other.to_string()))
            }
        }
    }
}

fn recv<T>(r: Result<T, RecvTimeoutError>) -> Result<T, gpuring_status> {
    r.map_err(|e| {
        let status = match &e {
            RecvTimeoutError::Timeout => GPURING_TIMEOUT,
            RecvTimeoutError::Disconnected => GPURING_DISCONNECTED,
            RecvTimeoutError::Corrupt(_) => GPURING_CORRUPT,
            RecvTimeoutError::ContextLost(_) => GPURING_CONTEXT_LOST,
            RecvTimeoutError::Cuda(_) => GPURING_CUDA,
            _ => GPURING_ERROR,
        };
        fail(status, e)
    })
}

fn describe(m: &gpuring_message) -> gpuring_message_info {
    let s = &m.slot;
    gpuring_message_info {
        ptr: s.ptr(),
        len: s.len(),
        seq: s.seq(),
        timestamp_ns: s.timestamp_ns(),
        lag: s.lag(),
        header: s.header().as_ptr(),
        header_len: s.header().len(),
        stream: s.stream().map_or(std::ptr::null_mut(), |s| s.raw().cast()),
    }
}

/// What message `m` is (also given by the receive). Returns GPURING_INVALID_ARGUMENT for nulls.
#[no_mangle]
pub unsafe extern "C" fn gpuring_message_describe(
    m: *const gpuring_message,
    info: *mut gpuring_message_info,
) -> gpuring_status {
    // SAFETY: by the caller's contract (null or live / writable).
    match unsafe { (m.as_ref(), info.as_mut()) } {
        (Some(m), Some(i)) => {
            *i = describe(m);
            GPURING_OK
        }
        _ => fail(GPURING_INVALID_ARGUMENT, "message or info is null"),
    }
}

/// Releases message `m` (CUDA: after the work queued on its stream so far), so the producer
/// may reuse its buffer, and frees the handle, even when it reports an error (do not release
/// it again). NULL is a no-op.
///
/// CUDA: the release is recorded on the stream the message was received on, as this thread
/// names it. If that was the per-thread default stream (`CU_STREAM_PER_THREAD`), release on the
/// thread that received it: on another thread the handle names another stream, and the
/// producer could overwrite the buffer while the reads queued on the first are still running.
#[no_mangle]
pub unsafe extern "C" fn gpuring_message_release(m: *mut gpuring_message) -> gpuring_status {
    if m.is_null() {
        return GPURING_OK;
    }
    guard(|| {
        // SAFETY: made by `gpuring_consumer_recv` and not released before (the contract).
        let m = unsafe { Box::from_raw(m) };
        let gpuring_message { slot, stream, consumer } = *m;
        let released = slot.release();
        if let Some(stream) = stream {
            // SAFETY: leaked by the receive; its slot is gone.
            drop(unsafe { Box::from_raw(stream.as_ptr()) });
        }
        // SAFETY: the consumer outlives its messages (`held`).
        let handle = unsafe { consumer.as_ref() };
        handle.held.set(handle.held.get() - 1);
        if handle.freed.get() && handle.held.get() == 0 {
            // SAFETY: freed by the user, and this was its last message.
            drop(unsafe { Box::from_raw(consumer.as_ptr()) });
        }
        match released {
            Ok(()) => GPURING_OK,
            Err(gpuring::ReleaseError::ContextLost(lost)) => fail(GPURING_CONTEXT_LOST, lost),
            Err(gpuring::ReleaseError::Cuda(e)) => cuda_failure(e),
            Err(e) => fail(GPURING_ERROR, e),
        }
    })
}

/// The memory kind of the consumer's ring (never AUTO).
#[no_mangle]
pub unsafe extern "C" fn gpuring_consumer_memory(c: *const gpuring_consumer) -> gpuring_memory {
    // SAFETY: by the caller's contract (null or live).
    unsafe { c.as_ref() }.map_or(gpuring_memory::GPURING_MEMORY_HOST, |c| c.memory)
}
