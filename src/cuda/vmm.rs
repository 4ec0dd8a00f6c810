//! VMM sharing: `cuMemCreate` allocations mapped with `cuMemMap` and shared as POSIX fds
//! ([`VmmPool`], [`VmmMapping`], [`export_raw_fd`]), and host memory page-locked and mapped for
//! the device ([`HostRegistration`], which holds a ring's memory fence words).

use std::fmt;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::Arc;

use super::driver::{self, CUdeviceptr, CUmemGenericAllocationHandle, DriverError};
use super::Context;

/// A VMM allocation handle and, as they are made, a reservation and a mapping of it: what
/// [`VmmPool`] and [`VmmMapping`] own. Dropping it undoes what was made, in reverse order, so
/// that a half-made owner is undone on an error too.
///
/// Invariant: this value holds one reference to the live handle `handle`. If `reserved > 0`,
/// `ptr..ptr + reserved` is a reservation of this process that it owns; if `mapped > 0`,
/// `ptr..ptr + mapped` (`mapped <= reserved`) is one whole mapping of `handle`, which it owns.
/// `ctx`'s device is the one that accesses it (the allocation may be another device's, that
/// `ctx`'s can reach: see [`VmmMapping`]).
struct Vmm {
    ctx: Arc<Context>,
    handle: CUmemGenericAllocationHandle,
    ptr: CUdeviceptr,
    reserved: usize,
    mapped: usize,
}

impl Vmm {
    /// Takes over `handle` (one reference of which the caller passes on).
    fn new(ctx: &Arc<Context>, handle: CUmemGenericAllocationHandle) -> Vmm {
        Vmm { ctx: ctx.clone(), handle, ptr: 0, reserved: 0, mapped: 0 }
    }

    /// Reserves `bytes` of address space aligned to `align`. `ctx` must be current (the
    /// caller holds its `Bound`).
    fn reserve(&mut self, bytes: usize, align: usize) -> Result<(), DriverError> {
        debug_assert_eq!(self.reserved, 0);
        // SAFETY: `ctx` is current.
        self.ptr = unsafe { driver::mem_address_reserve(bytes, align) }?;
        self.reserved = bytes;
        Ok(())
    }

    /// Maps the first `bytes` of the allocation at the start of the reservation. `ctx` must be
    /// current.
    fn map(&mut self, bytes: usize) -> Result<(), DriverError> {
        debug_assert!(self.reserved > 0 && self.mapped == 0);
        // SAFETY: `ptr..ptr + reserved` is our reservation, with nothing mapped in it (by the
        // invariant, `mapped == 0`); the driver refuses `bytes > reserved`; the handle is live;
        // `ctx` is current.
        unsafe { driver::mem_map(self.ptr, bytes, self.handle) }?;
        self.mapped = bytes;
        Ok(())
    }

    /// Lets `ctx`'s device read and write the mapping (over the link between them, if the
    /// allocation is a peer's). `ctx` must be current.
    fn grant(&self) -> Result<(), DriverError> {
        // SAFETY: `ptr..ptr + mapped` is one whole mapping (callers map first); `ctx` is
        // current.
        unsafe { driver::mem_set_access_rw(self.ptr, self.mapped, self.ctx.ordinal()) }
    }
}

impl Drop for Vmm {
    fn drop(&mut self) {
        if let Ok(_bound) = self.ctx.bind() {
            if self.mapped > 0 {
                // SAFETY: one whole mapping of ours by the invariant; owners synchronise their
                // streams before dropping memory that pending work uses.
                let _ = unsafe { driver::mem_unmap(self.ptr, self.mapped) };
            }
            if self.reserved > 0 {
                // SAFETY: our reservation by the invariant, unmapped just above.
                let _ = unsafe { driver::mem_address_free(self.ptr, self.reserved) };
            }
            // SAFETY: our one reference by the invariant, not used after this.
            let _ = unsafe { driver::mem_release(self.handle) };
        }
    }
}

// `Vmm`, and so `VmmPool` and `VmmMapping`, are `Send` and `Sync` by their fields (an
// `Arc<Context>` and integers): their driver calls bind the context first.

/// A `cuMemCreate` allocation that can be shared as a POSIX fd, mapped read-write in `ctx`.
/// Unmapped, its address range freed and its handle released on drop (other processes'
/// imports keep the memory alive).
///
/// ```no_run
/// use gpuring::cuda::{Context, VmmPool};
///
/// let pool = VmmPool::new(&Context::new(0)?, 3 << 20)?;
/// assert_eq!(pool.size(), 4 << 20); // a multiple of the granularity, 2 MiB here
/// let fd = pool.export_fd()?; // send it to the other process (SCM_RIGHTS)
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// Invariant: `vmm.ptr..vmm.ptr + vmm.mapped` is reserved and mapped to `vmm.handle` (a
/// `cuMemCreate` allocation of exactly that size, a multiple of the granularity, exportable as
/// a POSIX fd), read-write for `vmm.ctx`'s device.
pub struct VmmPool {
    vmm: Vmm,
}

impl VmmPool {
    /// Allocates at least `bytes` in `ctx`, rounded up to the device's granularity (2 MiB on
    /// current GPUs), and maps it. Fails with `CUDA_ERROR_NOT_SUPPORTED` where the device
    /// cannot share memory as fds, and otherwise with the driver's error.
    pub fn new(ctx: &Arc<Context>, bytes: usize) -> Result<VmmPool, DriverError> {
        let _bound = ctx.bind()?;
        if !driver::vmm_supported(ctx.dev)? {
            return Err(DriverError {
                call: "cuMemCreate (VMM with POSIX fds unsupported on this device)",
                code: driver::CUresult::CUDA_ERROR_NOT_SUPPORTED,
            });
        }
        let ordinal = ctx.ordinal();
        let granularity = driver::mem_granularity(ordinal)?;
        let size =
            bytes.max(1).div_ceil(granularity).checked_mul(granularity).ok_or(DriverError {
                call: "cuMemCreate",
                code: driver::CUresult::CUDA_ERROR_OUT_OF_MEMORY,
            })?;
        // SAFETY: `ctx` is current.
        let handle = unsafe { driver::mem_create(size, ordinal) }?;
        // Declared after `_bound`, so dropped (on an error, undone) while `ctx` is current.
        let mut vmm = Vmm::new(ctx, handle);
        vmm.reserve(size, granularity)?;
        vmm.map(size)?;
        vmm.grant()?;
        Ok(VmmPool { vmm })
    }

    /// Device address of the first byte.
    pub fn ptr(&self) -> CUdeviceptr {
        self.vmm.ptr
    }

    /// Size in bytes: the allocation's, all of it mapped.
    pub fn size(&self) -> usize {
        self.vmm.mapped
    }

    /// A new fd for the allocation (each call makes one; counted in
    /// [`driver::VMM_EXPORTS`]). Whoever receives it can map the whole allocation
    /// ([`VmmMapping::import`]), read-write: give it only to trusted peers.
    pub fn export_fd(&self) -> Result<OwnedFd, DriverError> {
        let _bound = self.vmm.ctx.bind()?;
        // SAFETY: the handle is live by the invariant; its context is current.
        unsafe { driver::mem_export_fd(self.vmm.handle) }
    }
}

/// Why [`VmmMapping::import`] failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VmmImportError {
    /// A driver call failed: the fd is not a CUDA allocation's, or the device is out of
    /// address space...
    Driver(DriverError),
    /// The allocation is memory of a device that the context's device cannot reach (no peer
    /// access: `Some(its ordinal)`), or not device memory at all (`None`).
    OtherDevice {
        /// Where the allocation lives.
        found: Option<i32>,
    },
    /// The driver refused to map the size asked for: larger than the allocation, or not a
    /// multiple of the granularity. A map that runs out of memory is
    /// [`Driver`](Self::Driver).
    Size(DriverError),
}

impl fmt::Display for VmmImportError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            VmmImportError::Driver(e) => e.fmt(f),
            VmmImportError::OtherDevice { found: Some(ordinal) } => write!(
                f,
                "the shared allocation is memory of device {ordinal}, which ours has no peer \
                 access to"
            ),
            VmmImportError::OtherDevice { found: None } => {
                write!(f, "the shared allocation is not device memory")
            }
            VmmImportError::Size(e) => write!(f, "the shared allocation cannot be mapped: {e}"),
        }
    }
}

impl std::error::Error for VmmImportError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            VmmImportError::Driver(e) | VmmImportError::Size(e) => Some(e),
            VmmImportError::OtherDevice { .. } => None,
        }
    }
}

impl From<DriverError> for VmmImportError {
    fn from(e: DriverError) -> Self {
        VmmImportError::Driver(e)
    }
}

/// Another process's `cuMemCreate` allocation, imported from its fd and mapped read-write for
/// `ctx`'s device. The allocation may live on another GPU that this one has peer access to:
/// reads and writes then cross the link between them. Unmapped, its address range freed and
/// its handle released on drop.
///
/// Invariant: `vmm.ptr..vmm.ptr + vmm.mapped` is mapped to `vmm.handle`, an allocation of
/// device `owner` (`vmm.ctx`'s device, or a peer of it), read-write for `vmm.ctx`'s device.
pub struct VmmMapping {
    vmm: Vmm,
    owner: i32,
}

impl VmmMapping {
    /// Imports `fd` (counted in [`driver::VMM_IMPORTS`]; the fd stays the caller's, and may be
    /// closed as soon as this returns), checks that the allocation is device memory that
    /// `ctx`'s device can reach (its own, or a peer's: `cuDeviceCanAccessPeer`), reserves
    /// `size` bytes of address space (rounded up to the owner's granularity, aligned to it),
    /// maps `size` bytes of the allocation there and lets `ctx`'s device read and write them
    /// (`cuMemSetAccess`). Undoes all of it on an error. Callers that expect the memory of one
    /// device check [`device`](Self::device).
    pub fn import(
        ctx: &Arc<Context>,
        fd: BorrowedFd<'_>,
        size: usize,
    ) -> Result<VmmMapping, VmmImportError> {
        let _bound = ctx.bind()?;
        // SAFETY: `ctx` is current.
        let handle = unsafe { driver::mem_import_fd(fd) }?;
        // Declared after `_bound`, so dropped (on an error, undone) while `ctx` is current.
        let mut vmm = Vmm::new(ctx, handle);
        // SAFETY: `handle` is live (ours); `ctx` is current.
        let found = unsafe { driver::mem_allocation_device(handle) }?;
        let owner = match found {
            Some(owner) if owner == ctx.ordinal() => owner,
            Some(owner) if driver::can_access_peer(ctx.dev, driver::device(owner)?)? => owner,
            _ => return Err(VmmImportError::OtherDevice { found }),
        };
        let granularity = driver::mem_granularity(owner)?;
        let reserve = size.max(1).div_ceil(granularity).checked_mul(granularity).ok_or(
            VmmImportError::Size(DriverError {
                call: "cuMemAddressReserve",
                code: driver::CUresult::CUDA_ERROR_INVALID_VALUE,
            }),
        )?;
        vmm.reserve(reserve, granularity)?;
        // A size the driver refuses (larger than the allocation: CUDA_ERROR_NOT_SUPPORTED on
        // driver 580, CUDA_ERROR_INVALID_VALUE on others) is the size's fault; running out of
        // memory is not, and is reported as the driver's error it is.
        vmm.map(size).map_err(|e| match e.code {
            driver::CUresult::CUDA_ERROR_OUT_OF_MEMORY => VmmImportError::Driver(e),
            _ => VmmImportError::Size(e),
        })?;
        vmm.grant()?;
        Ok(VmmMapping { vmm, owner })
    }

    /// The device whose memory this is, as this process numbers devices: the context's own,
    /// or a peer of it.
    pub fn device(&self) -> i32 {
        self.owner
    }

    /// Device address of the first byte.
    pub fn ptr(&self) -> CUdeviceptr {
        self.vmm.ptr
    }

    /// Size in bytes, as asked for and mapped.
    pub fn size(&self) -> usize {
        self.vmm.mapped
    }
}

/// Exports the allocation mapped at `ptr` (a VMM mapping of this process, of an allocation made
/// with the POSIX-fd handle type) as a new fd: retains its handle, exports it (counted in
/// [`driver::VMM_EXPORTS`]) and releases the retained handle. Fails for memory that no
/// `cuMemMap` mapping covers (`cuMemAlloc` memory) and for allocations not exportable as fds.
///
/// # Safety
/// 1. `ptr` must lie in a live `cuMemMap` mapping in `ctx`, not unmapped while this runs.
pub unsafe fn export_raw_fd(ctx: &Context, ptr: CUdeviceptr) -> Result<OwnedFd, DriverError> {
    let _bound = ctx.bind()?;
    // SAFETY: `ctx` is current; by (1) the address is mapped.
    let handle = unsafe { driver::mem_retain_allocation_handle(ptr) }?;
    // SAFETY: `handle` was retained just above; `ctx` is current.
    let exported = unsafe { driver::mem_export_fd(handle) };
    // SAFETY: retained once above, not used after this.
    let released = unsafe { driver::mem_release(handle) };
    let fd = exported?;
    released?;
    Ok(fd)
}

/// Host memory page-locked and mapped into the device's address space (`cuMemHostRegister`
/// with `PORTABLE | DEVICEMAP`), so that the GPU can write and wait on words the CPU reads and
/// writes. Unregistered on drop.
///
/// Invariant: `ptr..ptr + len` is registered by this value (once), and stays mapped while it
/// lives; `device` is the device address of `ptr`.
pub struct HostRegistration {
    ctx: Arc<Context>,
    ptr: *mut u8,
    len: usize,
    device: CUdeviceptr,
}

// SAFETY: `ptr` is only an address, never dereferenced here; the registration is the
// process's, not the thread's; the driver calls bind the context first.
unsafe impl Send for HostRegistration {}
// SAFETY: as above; &self methods make no driver call.
unsafe impl Sync for HostRegistration {}

impl HostRegistration {
    /// Page-locks the `len` bytes at `ptr` and maps them for `ctx`'s device.
    ///
    /// # Safety
    /// 1. `ptr` must be page-aligned (as `mmap` returns it), and `ptr..ptr + len` mapped in
    ///    this process until this is dropped. If it is forgotten instead, the mapping must be
    ///    leaked with it: the driver keeps the range registered, and a later `mmap` reusing it
    ///    could never be registered again. The driver locks whole pages, so the rest of the
    ///    last page is registered too.
    /// 2. No other registration of this process may overlap these pages (the driver refuses
    ///    one that does, but the two would share their pinning).
    pub unsafe fn new(
        ctx: &Arc<Context>,
        ptr: *mut u8,
        len: usize,
    ) -> Result<HostRegistration, DriverError> {
        debug_assert_eq!(ptr as usize % 4096, 0, "a host registration starts on a page");
        let _bound = ctx.bind()?;
        // SAFETY: by (1) and (2); `ctx` is current.
        let device = unsafe { driver::mem_host_register(ptr, len) }?;
        Ok(HostRegistration { ctx: ctx.clone(), ptr, len, device })
    }

    /// The device address of host address `ptr + offset`.
    ///
    /// # Panics
    /// If `offset` is not less than the registered length.
    pub fn device_ptr(&self, offset: usize) -> CUdeviceptr {
        assert!(offset < self.len, "offset {offset} outside a registration of {}", self.len);
        self.device + offset as CUdeviceptr
    }
}

impl Drop for HostRegistration {
    fn drop(&mut self) {
        if let Ok(_bound) = self.ctx.bind() {
            // SAFETY: registered once by `new` (the invariant); owners synchronise the streams
            // that write or wait on it before dropping it.
            let _ = unsafe { driver::mem_host_unregister(self.ptr) };
        }
    }
}
