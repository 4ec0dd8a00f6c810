//! The producer handle: create a ring, acquire a slot, fill it (host memory: through its
//! pointer; CUDA: with kernels or copies on its stream), publish it.

use std::ffi::{c_char, c_void};
use std::ptr::NonNull;

use gpuring::any::{AnyProducer, AnyWriteSlot};
use gpuring::cuda::Stream;
use gpuring::{
    AcquireError, AcquireTimeoutError, Fence, MemoryKind, PeerPolicy, Policy, Producer,
    PublishError, Sharing,
};

use crate::gpuring_status::*;
use crate::{
    create_status, cuda_failure, fail, gpuring_fence, gpuring_memory, gpuring_status, guard,
    memory_of, open_args, ring_dir, timeout,
};

/// What the producer does when a consumer falls a ring behind: the delivery mode of consumers
/// that choose none.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum gpuring_policy {
    /// Consumers are lossless: the producer waits for the slowest.
    GPURING_POLICY_BLOCK = 0,
    /// Consumers queue: the producer never waits for a slow reader, which loses messages.
    GPURING_POLICY_OVERWRITE = 1,
}

/// How to create a ring. Start from `gpuring_producer_options_default()`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct gpuring_producer_options {
    /// Ring positions (slots), 1 to 65536. Default 8.
    pub capacity: u32,
    /// Bytes per slot. Default 65536.
    pub slot_size: usize,
    /// Bytes of user header per message (the tensor header takes 8 + 8 per dimension).
    /// Default 64.
    pub header_size: u32,
    /// A `gpuring_memory`: host, CUDA, or CUDA where a GPU is usable. Default AUTO.
    pub memory: u32,
    /// The GPU for CUDA memory. Default 0.
    pub device: i32,
    /// A `gpuring_policy`. Default `GPURING_POLICY_BLOCK`.
    pub policy: u32,
    /// Spare buffers (negative: the library's default).
    pub spares: i32,
    /// The largest number of consumers (0: the library's default).
    pub max_consumers: u32,
    /// Nonzero: share CUDA memory by file descriptor with processes of this uid only (VMM
    /// sharing) instead of legacy IPC handles. Default 0. A `uint32_t`, not a `bool`, so that
    /// any value a caller writes is valid: every nonzero one means yes.
    pub vmm: u32,
    /// The segment's file mode (0: the default, 0600).
    pub file_mode: u32,
    /// The ring directory: where the ring's file and sockets go, a path read during
    /// `gpuring_producer_create` (not kept). NULL or "": the `GPURING_DIR` environment variable
    /// if set, else /dev/shm. Consumers must name the same directory, as they see it. Default
    /// NULL.
    pub dir: *const c_char,
    /// A `gpuring_fence`: how CUDA rings order GPU work across processes. Default AUTO (memory
    /// words where the GPU can use 64-bit stream memory operations, else events). VMM sharing
    /// always fences with memory words, whatever this says. MEMORY is refused for host memory;
    /// host rings ignore AUTO and EVENTS.
    pub fence: u32,
}

/// The defaults: 8 slots of 65536 bytes, 64 bytes of header, auto memory on GPU 0, Block.
#[no_mangle]
pub extern "C" fn gpuring_producer_options_default() -> gpuring_producer_options {
    gpuring_producer_options {
        capacity: 8,
        slot_size: 64 * 1024,
        header_size: 64,
        memory: gpuring_memory::GPURING_MEMORY_AUTO as u32,
        device: 0,
        policy: gpuring_policy::GPURING_POLICY_BLOCK as u32,
        spares: -1,
        max_consumers: 0,
        vmm: 0,
        file_mode: 0,
        dir: std::ptr::null(),
        fence: gpuring_fence::GPURING_FENCE_AUTO as u32,
    }
}

/// A ring's producer. Not thread-safe: use it from one thread at a time.
///
/// Invariants: `tx` (and `stream`, when `Some`) own a leaked `Box`, freed in `Drop`; they are
/// raw pointers, not boxes, because while `slot` is `Some` it borrows `*tx` (and `*stream`)
/// mutably and nothing else may touch them, not even by reborrowing a `Box`. `memory` is the
/// kind of `*tx`, kept apart so that it can be read while a slot is out.
pub struct gpuring_producer {
    /// The claimed slot, borrowing `*tx`.
    slot: Option<AnyWriteSlot<'static>>,
    stream: Option<NonNull<Stream>>,
    tx: NonNull<AnyProducer>,
    memory: gpuring_memory,
}

impl gpuring_producer {
    /// Ends the slot, if any: CUDA, after the work queued on its stream (a cancelled slot is
    /// handed out again and may be written on another stream), then drops the stream wrapper.
    fn end_slot(&mut self) {
        if let Some(s) = self.slot.as_ref().and_then(|s| s.stream()) {
            let _ = s.synchronize();
        }
        self.slot = None;
        if let Some(stream) = self.stream.take() {
            // SAFETY: leaked by `acquire_cuda`; the slot that borrowed it is gone.
            drop(unsafe { Box::from_raw(stream.as_ptr()) });
        }
    }
}

impl Drop for gpuring_producer {
    fn drop(&mut self) {
        self.end_slot();
        // SAFETY: leaked at create; nothing borrows it any more (the slot is gone).
        drop(unsafe { Box::from_raw(self.tx.as_ptr()) });
    }
}

/// Creates ring `name` with `options` (NULL: the defaults) in the options' ring directory. On
/// success `*out` is the producer; free it with `gpuring_producer_free`, which closes the ring.
#[no_mangle]
pub unsafe extern "C" fn gpuring_producer_create(
    name: *const c_char,
    options: *const gpuring_producer_options,
    out: *mut *mut gpuring_producer,
) -> gpuring_status {
    guard(|| {
        // SAFETY: a C string and an options struct (or nulls) by the caller's contract.
        let (name, o) =
            match unsafe { open_args(name, options, out, gpuring_producer_options_default) } {
                Ok(args) => args,
                Err(s) => return s,
            };
        let policy = match o.policy {
            0 => Policy::Block,
            1 => Policy::Overwrite,
            other => return fail(GPURING_INVALID_ARGUMENT, format!("policy {other}")),
        };
        let mut b = Producer::builder(name)
            .capacity(o.capacity)
            .slot_size(o.slot_size)
            .user_header_size(o.header_size)
            .policy(policy)
            .device(o.device);
        if o.spares >= 0 {
            b = b.spare_buffers(o.spares as u32);
        }
        if o.max_consumers > 0 {
            b = b.max_consumers(o.max_consumers);
        }
        if o.file_mode != 0 {
            b = b.mode(o.file_mode);
        }
        if o.vmm != 0 {
            b = b.sharing(Sharing::Vmm(PeerPolicy::SameUid));
        }
        let fence = match o.fence {
            0 => Fence::Auto,
            1 => Fence::Memory,
            2 => Fence::Events,
            other => return fail(GPURING_INVALID_ARGUMENT, format!("fence {other}")),
        };
        b = b.fence(fence);
        // SAFETY: `dir` is null or a C string, valid for the call, by the caller's contract.
        if let Some(dir) = unsafe { ring_dir(o.dir) } {
            b = b.dir(dir);
        }
        let cuda = match o.memory {
            1 => false,
            2 => true,
            0 => gpuring::cuda::available().is_ok(),
            other => return fail(GPURING_INVALID_ARGUMENT, format!("memory {other}")),
        };
        if !cuda && fence == Fence::Memory {
            return fail(
                GPURING_INVALID_ARGUMENT,
                "GPURING_FENCE_MEMORY orders CUDA work; a host ring has no GPU fences",
            );
        }
        let kind = if cuda { MemoryKind::Cuda } else { MemoryKind::Host };
        match AnyProducer::create(b, kind) {
            Ok(tx) => {
                let memory = memory_of(tx.memory());
                let tx = NonNull::from(Box::leak(Box::new(tx)));
                let p = gpuring_producer { slot: None, stream: None, tx, memory };
                // SAFETY: `out` is non-null and writable by the caller's contract.
                unsafe { *out = Box::into_raw(Box::new(p)) };
                GPURING_OK
            }
            Err(e) => fail(create_status(&e), e.to_string()),
        }
    })
}

/// Closes the ring and frees the producer (a CUDA producer first waits, up to its linger, for
/// consumers to finish reading). A slot still acquired is dropped unpublished. NULL is a no-op.
#[no_mangle]
pub unsafe extern "C" fn gpuring_producer_free(p: *mut gpuring_producer) {
    if !p.is_null() {
        // SAFETY: made by `gpuring_producer_create` and not freed before (the contract).
        let _ = guard(|| {
            drop(unsafe { Box::from_raw(p) });
            GPURING_OK
        });
    }
}

/// The producer behind a handle, if no slot borrows it.
///
/// # Safety
/// `p` is null or a live handle, used by this thread only.
unsafe fn idle<'a>(p: *mut gpuring_producer) -> Result<&'a mut gpuring_producer, gpuring_status> {
    // SAFETY: by the caller's contract.
    let Some(p) = (unsafe { p.as_mut() }) else {
        return Err(fail(GPURING_INVALID_ARGUMENT, "producer is null"));
    };
    if p.slot.is_some() {
        return Err(fail(
            GPURING_INVALID_ARGUMENT,
            "a slot is acquired: publish or cancel it first",
        ));
    }
    Ok(p)
}

/// Acquires the next slot, waiting up to `timeout_ms` (negative: as long as it takes; 0: not
/// at all) for consumers to free one. `*ptr` receives its address (host memory: a pointer in
/// this process; CUDA: a device pointer) and `*capacity` its size. CUDA: `stream` (a
/// `CUstream` of the ring's GPU's primary context, or NULL for the producer's own) is the
/// stream to write it on, which already waits for the slot's previous readers; the publish
/// fences the work queued on it. Do not pass the per-thread default stream
/// (`CU_STREAM_PER_THREAD`) if the slot may be published on another thread: the handle names
/// another stream there, and the publish would not fence the writes. Host memory: `stream`
/// must be NULL. One slot at a time.
#[no_mangle]
pub unsafe extern "C" fn gpuring_producer_acquire(
    p: *mut gpuring_producer,
    timeout_ms: i64,
    stream: *mut c_void,
    ptr: *mut u64,
    capacity: *mut usize,
) -> gpuring_status {
    guard(|| {
        // SAFETY: by the caller's contract.
        let p = match unsafe { idle(p) } {
            Ok(p) => p,
            Err(s) => return s,
        };
        // SAFETY: `tx` is a leaked box owned by `p` (its address is stable); the slot that
        // borrows it is kept in `p.slot`, which `Drop` ends first, and no other call uses `tx`
        // while it is there (`idle`).
        let tx: &'static mut AnyProducer = unsafe { &mut *p.tx.as_ptr() };
        let claimed = if stream.is_null() {
            acquire(tx, timeout_ms)
        } else if tx.is_cuda() {
            acquire_on(tx, &mut p.stream, timeout_ms, stream)
        } else {
            Err(fail(GPURING_INVALID_ARGUMENT, "a host ring takes no stream"))
        };
        let slot = match claimed {
            Ok(slot) => slot,
            Err(s) => {
                p.end_slot(); // frees a stream wrapper made for the failed acquire
                return s;
            }
        };
        let (addr, size) = (slot.ptr(), slot.capacity());
        p.slot = Some(slot);
        // SAFETY: out-pointers are null (skipped) or writable (the contract).
        unsafe {
            if let Some(o) = ptr.as_mut() {
                *o = addr;
            }
            if let Some(o) = capacity.as_mut() {
                *o = size;
            }
        }
        GPURING_OK
    })
}

fn acquire(
    tx: &'static mut AnyProducer,
    timeout_ms: i64,
) -> Result<AnyWriteSlot<'static>, gpuring_status> {
    match timeout(timeout_ms) {
        None => tx.acquire().map_err(|e| fail(blocking_status(&e), e)),
        Some(t) => tx.acquire_timeout(t).map_err(|e| fail(acquire_status(&e), e)),
    }
}

fn blocking_status(e: &AcquireError) -> gpuring_status {
    match e {
        AcquireError::Corrupt(_) => GPURING_CORRUPT,
        AcquireError::ContextLost(_) => GPURING_CONTEXT_LOST,
        AcquireError::Cuda(_) => GPURING_CUDA,
        _ => GPURING_ERROR,
    }
}

/// A CUDA ring's slot, to be written on the caller's `stream` (not null).
fn acquire_on(
    tx: &'static mut AnyProducer,
    kept: &mut Option<NonNull<Stream>>,
    timeout_ms: i64,
    stream: *mut c_void,
) -> Result<AnyWriteSlot<'static>, gpuring_status> {
    let ctx = tx.context().expect("the caller checked: a CUDA ring");
    // SAFETY: the caller passes a live stream of the ring's GPU's primary context that
    // outlives the slot and is not the per-thread default stream if the slot is published on
    // another thread (the contract in the header).
    let wrapped =
        NonNull::from(Box::leak(Box::new(unsafe { Stream::from_raw(ctx, stream.cast()) })));
    // SAFETY: leaked, so its address is stable; freed by `end_slot` after the slot.
    let s: &'static Stream = unsafe { wrapped.as_ref() };
    *kept = Some(wrapped);
    match timeout(timeout_ms) {
        None => tx.acquire_on(s).map_err(|e| fail(blocking_status(&e), e)),
        Some(t) => tx.acquire_on_timeout(s, t).map_err(|e| fail(acquire_status(&e), e)),
    }
}

fn acquire_status(e: &AcquireTimeoutError) -> gpuring_status {
    match e {
        AcquireTimeoutError::Timeout => GPURING_TIMEOUT,
        AcquireTimeoutError::Corrupt(_) => GPURING_CORRUPT,
        AcquireTimeoutError::ContextLost(_) => GPURING_CONTEXT_LOST,
        AcquireTimeoutError::Cuda(_) => GPURING_CUDA,
        _ => GPURING_ERROR,
    }
}

/// CUDA: the stream the acquired slot is written on (the one given to acquire, or the
/// producer's own). NULL for host memory or when no slot is acquired.
#[no_mangle]
pub unsafe extern "C" fn gpuring_producer_slot_stream(p: *const gpuring_producer) -> *mut c_void {
    // SAFETY: by the caller's contract (null or live).
    let slot = unsafe { p.as_ref() }.and_then(|p| p.slot.as_ref());
    slot.and_then(|s| s.stream()).map_or(std::ptr::null_mut(), |s| s.raw().cast())
}

/// Publishes the acquired slot: its first `len` bytes and the `header_len` bytes of user
/// header at `header` (NULL when 0). `*seq` (may be NULL) receives its sequence number. A
/// publish always ends the slot: if it fails, the slot is given back unpublished.
#[no_mangle]
pub unsafe extern "C" fn gpuring_producer_publish(
    p: *mut gpuring_producer,
    len: usize,
    header: *const u8,
    header_len: usize,
    seq: *mut u64,
) -> gpuring_status {
    guard(|| {
        // SAFETY: by the caller's contract.
        let Some(p) = (unsafe { p.as_mut() }) else {
            return fail(GPURING_INVALID_ARGUMENT, "producer is null");
        };
        if p.slot.is_none() {
            return fail(GPURING_INVALID_ARGUMENT, "no slot is acquired");
        }
        // SAFETY: `header` holds `header_len` bytes (the contract).
        let header = match unsafe { bytes(header, header_len) } {
            Ok(h) => h,
            Err(s) => {
                p.end_slot(); // a publish always ends the slot: here, unpublished
                return s;
            }
        };
        let published = p.slot.take().expect("checked above").publish(len, header);
        p.end_slot();
        match published {
            Ok(n) => {
                // SAFETY: null or writable (the contract).
                if let Some(o) = unsafe { seq.as_mut() } {
                    *o = n;
                }
                GPURING_OK
            }
            Err(e) => fail(publish_status(&e), e),
        }
    })
}

fn publish_status(e: &PublishError) -> gpuring_status {
    match e {
        PublishError::ContextLost(_) => GPURING_CONTEXT_LOST,
        PublishError::Cuda(_) => GPURING_CUDA,
        _ => GPURING_INVALID_ARGUMENT,
    }
}

/// `len` bytes at `ptr` (null only when `len` is 0).
///
/// # Safety
/// `ptr` points at `len` readable bytes that stay valid for `'a`.
pub(crate) unsafe fn bytes<'a>(ptr: *const u8, len: usize) -> Result<&'a [u8], gpuring_status> {
    if len == 0 {
        return Ok(&[]);
    }
    if ptr.is_null() {
        return Err(fail(GPURING_INVALID_ARGUMENT, "a null pointer with a nonzero length"));
    }
    // SAFETY: by the contract.
    Ok(unsafe { std::slice::from_raw_parts(ptr, len) })
}

/// Gives the acquired slot back unpublished (the next acquire returns it again). CUDA: waits
/// for the work queued on the slot's stream first, so that none of it lands after the slot is
/// handed out again.
#[no_mangle]
pub unsafe extern "C" fn gpuring_producer_cancel(p: *mut gpuring_producer) -> gpuring_status {
    guard(|| {
        // SAFETY: by the caller's contract.
        let Some(p) = (unsafe { p.as_mut() }) else {
            return fail(GPURING_INVALID_ARGUMENT, "producer is null");
        };
        p.end_slot();
        GPURING_OK
    })
}

/// Copies `len` bytes from `data` (host memory, in this process) into the next slot and
/// publishes them with the user header, waiting up to `timeout_ms` for a slot. For CUDA rings
/// the copy goes host-to-device on the producer's stream.
#[no_mangle]
pub unsafe extern "C" fn gpuring_producer_send(
    p: *mut gpuring_producer,
    data: *const u8,
    len: usize,
    header: *const u8,
    header_len: usize,
    timeout_ms: i64,
    seq: *mut u64,
) -> gpuring_status {
    guard(|| {
        // SAFETY: by the caller's contract.
        let data = match unsafe { bytes(data, len) } {
            Ok(d) => d,
            Err(s) => return s,
        };
        // SAFETY: by the caller's contract (checked here, before a slot is taken).
        if let Err(s) = unsafe { bytes(header, header_len) } {
            return s;
        }
        let mut ptr = 0u64;
        let mut capacity = 0usize;
        // SAFETY: `p` by the contract; the out-pointers are locals.
        let s = unsafe {
            gpuring_producer_acquire(p, timeout_ms, std::ptr::null_mut(), &mut ptr, &mut capacity)
        };
        if s != GPURING_OK {
            return s;
        }
        if len > capacity {
            // SAFETY: `p` is live (acquire succeeded).
            unsafe { gpuring_producer_cancel(p) };
            return fail(
                GPURING_INVALID_ARGUMENT,
                format!("{len} bytes exceed the slot's {capacity}"),
            );
        }
        // SAFETY: acquire succeeded, so `p` is live and holds the slot; no other reference to
        // the handle is alive here.
        let slot = unsafe { &mut *p }.slot.as_mut().expect("acquired above");
        let copied = match slot.bytes_mut() {
            Some(bytes) => {
                bytes[..len].copy_from_slice(data);
                Ok(())
            }
            None => copy_to_device(slot, data),
        };
        if let Err(e) = copied {
            // SAFETY: as above.
            unsafe { gpuring_producer_cancel(p) };
            return cuda_failure(e);
        }
        // SAFETY: as above; `header` by the contract.
        unsafe { gpuring_producer_publish(p, len, header, header_len, seq) }
    })
}

/// Copies `data` into a CUDA slot on its stream, waiting for the copy (the host buffer is the
/// caller's, free again when `send` returns).
fn copy_to_device(s: &AnyWriteSlot<'static>, data: &[u8]) -> Result<(), gpuring::cuda::CudaError> {
    let stream = s.stream().expect("a slot without host bytes is a CUDA slot");
    let _bound = stream.context().bind()?;
    // SAFETY: the slot holds at least `data.len()` bytes (checked by the caller) and is ours
    // until publish; the stream is live; the copy is waited for below, before `data` can go.
    unsafe { gpuring::cuda::driver::memcpy_htod_async(s.ptr(), data, stream.raw()) }?;
    stream.synchronize()?;
    Ok(())
}

/// Consumers joined now, or -1 if `p` is null or a slot is acquired.
#[no_mangle]
pub unsafe extern "C" fn gpuring_producer_consumer_count(p: *mut gpuring_producer) -> i64 {
    // SAFETY: by the caller's contract.
    match unsafe { idle(p) } {
        // SAFETY: no slot borrows `tx` (`idle`); it lives as long as the handle.
        Ok(p) => unsafe { p.tx.as_ref() }.consumer_count() as i64,
        Err(_) => -1,
    }
}

/// The memory kind of the producer's ring (never AUTO).
#[no_mangle]
pub unsafe extern "C" fn gpuring_producer_memory(p: *const gpuring_producer) -> gpuring_memory {
    // SAFETY: by the caller's contract (null or live). Reads only `memory`, never `tx`.
    unsafe { p.as_ref() }.map_or(gpuring_memory::GPURING_MEMORY_HOST, |p| p.memory)
}
