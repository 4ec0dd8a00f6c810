//! The consumer handle and the messages it receives.

use std::ffi::{c_char, c_void};

use gpuring::cuda::Stream;
use gpuring::{
    Consumer, ConsumerBuilder, Cuda, Host, Memory, MemoryKind, Mode, OpenError, ReadSlot,
    RecvTimeoutError, StartAt,
};

use crate::gpuring_status::*;
use crate::{fail, gpuring_memory, gpuring_status, guard, open_status, text, timeout};

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
    /// AUTO (whatever the ring holds), HOST or CUDA (refused if the ring holds the other).
    pub memory: gpuring_memory,
    /// Default `GPURING_MODE_DEFAULT`.
    pub mode: gpuring_mode,
    /// Default `GPURING_START_NEWEST`.
    pub start: gpuring_start,
    /// CUDA: the GPU to read on (negative: the ring's).
    pub device: i32,
    /// Open a ring whose segment another user owns. Default false.
    pub allow_foreign_owner: bool,
}

/// The defaults: any memory, the ring's default mode, start at the newest message.
#[no_mangle]
pub extern "C" fn gpuring_consumer_options_default() -> gpuring_consumer_options {
    gpuring_consumer_options {
        memory: gpuring_memory::GPURING_MEMORY_AUTO,
        mode: gpuring_mode::GPURING_MODE_DEFAULT,
        start: gpuring_start::GPURING_START_NEWEST,
        device: -1,
        allow_foreign_owner: false,
    }
}

/// Either memory kind's consumer (boxed in the handle).
#[allow(clippy::large_enum_variant)]
enum Rx {
    Host(Consumer<Host>),
    Cuda(Consumer<Cuda>),
}

/// A consumer of a ring. Not thread-safe: use it (and its messages) from one thread at a time.
pub struct gpuring_consumer {
    rx: Box<Rx>,
}

/// A received message: valid (the producer cannot overwrite it) until
/// `gpuring_message_release`, which must come before its consumer is freed.
///
/// Invariant: `slot` borrows the consumer it came from and `stream`; field order is drop order.
pub struct gpuring_message {
    slot: Received,
    stream: Option<Box<Stream>>,
}

enum Received {
    Host(ReadSlot<'static, Host>),
    Cuda(ReadSlot<'static, Cuda>),
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

/// Opens ring `name` and joins it with `options` (NULL: the defaults). On success `*out` is the
/// consumer; free it with `gpuring_consumer_free` after releasing its messages.
#[no_mangle]
pub unsafe extern "C" fn gpuring_consumer_open(
    name: *const c_char,
    options: *const gpuring_consumer_options,
    out: *mut *mut gpuring_consumer,
) -> gpuring_status {
    guard(|| {
        // SAFETY: the caller passes a C string (or null, refused).
        let name = match unsafe { text(name, "name") } {
            Ok(n) => n,
            Err(s) => return s,
        };
        if out.is_null() {
            return fail(GPURING_INVALID_ARGUMENT, "out is null");
        }
        let o = if options.is_null() {
            gpuring_consumer_options_default()
        } else {
            // SAFETY: non-null, and a valid options struct by the caller's contract.
            unsafe { *options }
        };
        let mut b = Consumer::builder(name)
            .start_at(match o.start {
                gpuring_start::GPURING_START_NEWEST => StartAt::Newest,
                gpuring_start::GPURING_START_NEXT => StartAt::Next,
                gpuring_start::GPURING_START_OLDEST => StartAt::Oldest,
            })
            .allow_foreign_owner(o.allow_foreign_owner);
        b = match o.mode {
            gpuring_mode::GPURING_MODE_DEFAULT => b,
            gpuring_mode::GPURING_MODE_LOSSLESS => b.mode(Mode::Lossless),
            gpuring_mode::GPURING_MODE_QUEUE => b.mode(Mode::Queue),
            gpuring_mode::GPURING_MODE_LATEST => b.mode(Mode::Latest),
        };
        if o.device >= 0 {
            b = b.device(o.device);
        }
        let opened = match o.memory {
            gpuring_memory::GPURING_MEMORY_HOST => open::<Host>(b).map(Rx::Host),
            gpuring_memory::GPURING_MEMORY_CUDA => open::<Cuda>(b).map(Rx::Cuda),
            gpuring_memory::GPURING_MEMORY_AUTO => match open::<Host>(b.clone()) {
                Err(OpenError::WrongMemory { found: MemoryKind::Cuda }) => {
                    open::<Cuda>(b).map(Rx::Cuda)
                }
                other => other.map(Rx::Host),
            },
        };
        match opened {
            Ok(rx) => {
                let c = gpuring_consumer { rx: Box::new(rx) };
                // SAFETY: `out` is non-null and writable by the caller's contract.
                unsafe { *out = Box::into_raw(Box::new(c)) };
                GPURING_OK
            }
            Err(e) => fail(open_status(&e), format!("cannot open ring {name:?}: {e}")),
        }
    })
}

fn open<M: Memory>(b: ConsumerBuilder) -> Result<Consumer<M>, OpenError> {
    b.open_in::<M>()
}

/// Leaves the ring and frees the consumer. Every message must have been released. NULL is a
/// no-op.
#[no_mangle]
pub unsafe extern "C" fn gpuring_consumer_free(c: *mut gpuring_consumer) {
    if !c.is_null() {
        let _ = guard(|| {
            // SAFETY: made by `gpuring_consumer_open` and not freed before (the contract).
            drop(unsafe { Box::from_raw(c) });
            GPURING_OK
        });
    }
}

/// Receives the next message, waiting up to `timeout_ms` (negative: as long as it takes; 0:
/// not at all). CUDA: `stream` (a `CUstream` of the ring's GPU's primary context, or NULL for
/// the consumer's own) is made to wait for the producer's writes, and the release is recorded
/// on it. On success `*out` is the message and `*info` (may be NULL) what it is.
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
        let Some(c) = (unsafe { c.as_ref() }) else {
            return fail(GPURING_INVALID_ARGUMENT, "consumer is null");
        };
        if out.is_null() {
            return fail(GPURING_INVALID_ARGUMENT, "out is null");
        }
        // SAFETY: `rx` is boxed (its address is stable) and freed only by
        // `gpuring_consumer_free`, which the contract puts after every release; receives take
        // it shared, so several messages may borrow it at once.
        let rx: &'static Rx = unsafe { &*(c.rx.as_ref() as *const Rx) };
        let mut kept = None;
        let got = match rx {
            Rx::Host(_) if !stream.is_null() => {
                Err(fail(GPURING_INVALID_ARGUMENT, "a host ring takes no stream"))
            }
            Rx::Host(rx) => recv(rx.recv_timeout_or_block(timeout_ms)).map(Received::Host),
            Rx::Cuda(rx) if stream.is_null() => {
                recv(rx.recv_timeout_or_block(timeout_ms)).map(Received::Cuda)
            }
            Rx::Cuda(rx) => {
                // SAFETY: the caller passes a live stream of the ring's GPU's primary context
                // that outlives the message (the contract in the header).
                let wrapped = Box::new(unsafe { Stream::from_raw(rx.context(), stream.cast()) });
                // SAFETY: boxed (stable address), kept in the message, dropped after its slot.
                let s: &'static Stream = unsafe { &*(wrapped.as_ref() as *const Stream) };
                kept = Some(wrapped);
                let r = match timeout(timeout_ms) {
                    None => rx.recv_on(s).map_err(RecvTimeoutError::from_blocking),
                    Some(t) => rx.recv_on_timeout(s, t),
                };
                recv(r).map(Received::Cuda)
            }
        };
        let slot = match got {
            Ok(slot) => slot,
            Err(s) => return s,
        };
        let m = Box::new(gpuring_message { slot, stream: kept });
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
trait RecvMs<'a, M: Memory> {
    fn recv_timeout_or_block(
        &'a self,
        timeout_ms: i64,
    ) -> Result<ReadSlot<'a, M>, RecvTimeoutError>;
}

impl<'a, M: Memory> RecvMs<'a, M> for Consumer<M> {
    fn recv_timeout_or_block(
        &'a self,
        timeout_ms: i64,
    ) -> Result<ReadSlot<'a, M>, RecvTimeoutError> {
        match timeout(timeout_ms) {
            None => self.recv().map_err(RecvTimeoutError::from_blocking),
            Some(t) => self.recv_timeout(t),
        }
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
            gpuring::RecvError::Cuda(e) => RecvTimeoutError::Cuda(e),
            _ => RecvTimeoutError::Disconnected,
        }
    }
}

fn recv<T>(r: Result<T, RecvTimeoutError>) -> Result<T, gpuring_status> {
    r.map_err(|e| {
        let status = match &e {
            RecvTimeoutError::Timeout => GPURING_TIMEOUT,
            RecvTimeoutError::Disconnected => GPURING_DISCONNECTED,
            RecvTimeoutError::Corrupt(_) => GPURING_CORRUPT,
            RecvTimeoutError::Cuda(_) => GPURING_CUDA,
            _ => GPURING_ERROR,
        };
        fail(status, e)
    })
}

fn describe(m: &gpuring_message) -> gpuring_message_info {
    let (ptr, len, seq, ts, lag, header, stream) = match &m.slot {
        Received::Host(s) => {
            (s.ptr(), s.len(), s.seq(), s.timestamp_ns(), s.lag(), s.header(), std::ptr::null_mut())
        }
        Received::Cuda(s) => {
            let stream: *mut c_void = s.stream().raw().cast();
            (s.ptr(), s.len(), s.seq(), s.timestamp_ns(), s.lag(), s.header(), stream)
        }
    };
    gpuring_message_info {
        ptr,
        len,
        seq,
        timestamp_ns: ts,
        lag,
        header: header.as_ptr(),
        header_len: header.len(),
        stream,
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
/// may reuse its buffer, and frees the handle. NULL is a no-op.
#[no_mangle]
pub unsafe extern "C" fn gpuring_message_release(m: *mut gpuring_message) -> gpuring_status {
    if m.is_null() {
        return GPURING_OK;
    }
    guard(|| {
        // SAFETY: made by `gpuring_consumer_recv` and not released before (the contract).
        let m = unsafe { Box::from_raw(m) };
        let gpuring_message { slot, stream } = *m;
        let released = match slot {
            Received::Host(s) => {
                drop(s);
                Ok(())
            }
            Received::Cuda(s) => s.release(),
        };
        drop(stream);
        match released {
            Ok(()) => GPURING_OK,
            Err(e) => fail(GPURING_CUDA, e),
        }
    })
}

/// The memory kind of the consumer's ring (never AUTO).
#[no_mangle]
pub unsafe extern "C" fn gpuring_consumer_memory(c: *const gpuring_consumer) -> gpuring_memory {
    // SAFETY: by the caller's contract (null or live).
    match unsafe { c.as_ref() }.map(|c| c.rx.as_ref()) {
        Some(Rx::Cuda(_)) => gpuring_memory::GPURING_MEMORY_CUDA,
        _ => gpuring_memory::GPURING_MEMORY_HOST,
    }
}
