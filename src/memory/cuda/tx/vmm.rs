//! VMM sharing on the producer's side: `cuMemCreate` pools, each handed out as a file
//! descriptor by the producer's fd server, to the peers its policy admits.

use std::os::fd::OwnedFd;

use super::share::PoolMemory;
use crate::cuda::driver::{self, DriverError};
use crate::cuda::{export_raw_fd, Context, CudaError, VmmPool};
use crate::error::RegisterError;
use crate::format::gpu::{sharing_kind, PoolEntry};
use crate::format::offer::{encode, OfferedPool};
use crate::shm::fdpass::{FdServer, PeerPolicy};
use crate::shm::unixsock::fd_file;
use crate::shm::view::MappedRing;

/// VMM sharing: pools handed out by fd.
///
/// Invariants: `offered[i]` describes `fds[i]`, one per pool table entry we filled, and the
/// server offers exactly these.
pub(super) struct VmmTx {
    /// The fd server; `None` once the producer closed (a closed ring takes no new consumer).
    server: Option<FdServer>,
    fds: Vec<OwnedFd>,
    offered: Vec<OfferedPool>,
    epoch: u64,
}

impl VmmTx {
    /// Starts serving ring instance `map`'s pools (none yet) to the peers `policy` admits.
    /// Runs before the segment is published, so every consumer that sees it finds the server
    /// listening.
    pub(super) fn start(map: &MappedRing, policy: PeerPolicy) -> Result<VmmTx, CudaError> {
        let epoch = map.params().epoch;
        let name = map.segment().name().ring();
        let (dir, mode) = (map.segment().dir(), map.segment().mode());
        let payload = encode(epoch, &[]);
        let served = FdServer::start(dir, &fd_file(name, epoch), mode, Vec::new(), payload, policy);
        let server = served.map_err(|e| {
            CudaError::Unavailable(format!("cannot serve the ring's memory by fd: {e}"))
        })?;
        Ok(VmmTx { server: Some(server), fds: Vec::new(), offered: Vec::new(), epoch })
    }

    /// Adds pool `pool` (its fd, entry, generation and size) to what the server offers.
    fn offer(&mut self, fd: OwnedFd, pool: OfferedPool) -> Result<(), CudaError> {
        let failed = |e: std::io::Error| CudaError::Unavailable(format!("offering a pool: {e}"));
        let mut fds = Vec::with_capacity(self.fds.len() + 1);
        for f in self.fds.iter().chain(std::iter::once(&fd)) {
            fds.push(f.try_clone().map_err(failed)?);
        }
        let mut offered = self.offered.clone();
        offered.push(pool);
        let Some(server) = &self.server else {
            return Err(CudaError::Unavailable("the producer is closed".into()));
        };
        server.set_offer(fds, encode(self.epoch, &offered)).map_err(failed)?;
        self.fds.push(fd);
        self.offered = offered;
        Ok(())
    }

    /// The segment's `sharing`.
    pub(super) fn kind(&self) -> u32 {
        sharing_kind::VMM
    }

    pub(super) fn name(&self) -> &'static str {
        "vmm"
    }

    /// A `cuMemCreate` allocation of `bytes`, exportable as an fd.
    pub(super) fn alloc(
        &self,
        ctx: &std::sync::Arc<Context>,
        bytes: usize,
    ) -> Result<PoolMemory, DriverError> {
        Ok(PoolMemory::OwnedVmm(VmmPool::new(ctx, bytes)?))
    }

    /// Refuses our own legacy pools (`cuMemAlloc` memory): it cannot be exported as an fd.
    pub(super) fn accepts(&self, mem: &PoolMemory) -> Result<(), RegisterError> {
        if let PoolMemory::Owned(_) = mem {
            return Err(RegisterError::WrongSharing { ring: "vmm" });
        }
        Ok(())
    }

    /// Refuses memory registered by `register_raw` whose size is not whole granules of
    /// `ctx`'s device.
    pub(super) fn fits(&self, ctx: &Context, mem: &PoolMemory) -> Result<(), RegisterError> {
        let cuda = |e: DriverError| RegisterError::from(e);
        if let PoolMemory::Borrowed { size, .. } = mem {
            // Consumers map the pool's size from offset 0, which the driver allows only in
            // whole granules (ours: the recommended one, a multiple of the minimum).
            let granule = driver::mem_granularity(ctx.ordinal()).map_err(cuda)?;
            if size % granule != 0 {
                return Err(RegisterError::Cuda(CudaError::Unavailable(format!(
                    "a VMM pool's size must be a multiple of the device's allocation \
                     granularity ({granule} bytes), not {size}"
                ))));
            }
        }
        Ok(())
    }

    /// Adds `mem`'s fd, as pool table entry `index` in generation `generation`, to the
    /// server's offer.
    ///
    /// # Safety
    /// 1. Unless `mem` is our own VMM pool, `mem.ptr()` is a live mapping of `ctx` (the driver
    ///    said so).
    pub(super) unsafe fn share(
        &mut self,
        mem: &PoolMemory,
        _: &PoolEntry,
        (index, generation): (usize, u32),
        ctx: &Context,
    ) -> Result<(), RegisterError> {
        let cuda = |e: DriverError| RegisterError::from(e);
        let fd = match mem {
            PoolMemory::OwnedVmm(pool) => pool.export_fd().map_err(cuda)?,
            // SAFETY: `mem.ptr()` is a live mapping of this context (checked before, (1));
            // the export fails for memory that is not a POSIX-fd `cuMemCreate`
            // allocation.
            _ => unsafe { export_raw_fd(ctx, mem.ptr()) }
                .map_err(|_| RegisterError::WrongSharing { ring: "vmm" })?,
        };
        let size = mem.size() as u64;
        self.offer(fd, OfferedPool { pool: index as u32, generation, size })?;
        Ok(())
    }

    /// Stops serving fds: a closed ring takes no new consumer. True: an import already made
    /// keeps its memory alive without us.
    pub(super) fn close(&mut self) -> bool {
        self.server = None;
        true
    }
}
