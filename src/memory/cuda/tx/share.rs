//! How the producer's pools reach its consumers ([`TxShare`], the segment's `sharing`): the
//! memory a pool table entry names, and the two sharing halves behind one set of methods.

use std::sync::Arc;

use super::legacy::LegacyTx;
use super::vmm::VmmTx;
use crate::cuda::driver::{CUdeviceptr, DriverError};
use crate::cuda::{Context, CudaError, DevicePool, VmmPool};
use crate::error::RegisterError;
use crate::format::gpu::PoolEntry;
use crate::memory::TxSettings;
use crate::shm::view::MappedRing;

/// Memory named in the pool table, kept alive as long as the producer.
pub(super) enum PoolMemory {
    /// A legacy pool (`cuMemAlloc`), shared by IPC handle.
    Owned(DevicePool),
    /// A VMM pool (`cuMemCreate`), shared by fd.
    OwnedVmm(VmmPool),
    /// Registered by `register_raw`; its owner keeps it alive (the caller's promise).
    Borrowed { ptr: CUdeviceptr, size: usize },
}

impl PoolMemory {
    pub(super) fn ptr(&self) -> CUdeviceptr {
        match self {
            PoolMemory::Owned(p) => p.ptr(),
            PoolMemory::OwnedVmm(p) => p.ptr(),
            PoolMemory::Borrowed { ptr, .. } => *ptr,
        }
    }

    pub(super) fn size(&self) -> usize {
        match self {
            PoolMemory::Owned(p) => p.size(),
            PoolMemory::OwnedVmm(p) => p.size(),
            PoolMemory::Borrowed { size, .. } => *size,
        }
    }
}

/// How the producer's pools reach its consumers: the segment's `sharing`. Each half says how
/// a pool is allocated, which memory it can share (`accepts`, then `fits`), how it shares a
/// pool (`share`), and what closing does (`close`).
pub(super) enum TxShare {
    /// Legacy IPC: each pool's handle in its pool table entry.
    Legacy(LegacyTx),
    /// VMM: the fd server and what it offers.
    Vmm(VmmTx),
}

impl TxShare {
    /// The settings' way. VMM: starts the fd server.
    pub(super) fn start(map: &MappedRing, settings: &TxSettings) -> Result<TxShare, CudaError> {
        Ok(match &settings.vmm {
            None => TxShare::Legacy(LegacyTx),
            Some(policy) => TxShare::Vmm(VmmTx::start(map, policy.clone())?),
        })
    }

    /// The segment's `sharing`.
    pub(super) fn kind(&self) -> u32 {
        match self {
            TxShare::Legacy(s) => s.kind(),
            TxShare::Vmm(s) => s.kind(),
        }
    }

    /// "legacy" or "vmm".
    pub(super) fn name(&self) -> &'static str {
        match self {
            TxShare::Legacy(s) => s.name(),
            TxShare::Vmm(s) => s.name(),
        }
    }

    /// A new pool of `bytes`, allocated the way this half shares.
    pub(super) fn alloc(
        &self,
        ctx: &Arc<Context>,
        bytes: usize,
    ) -> Result<PoolMemory, DriverError> {
        match self {
            TxShare::Legacy(s) => s.alloc(ctx, bytes),
            TxShare::Vmm(s) => s.alloc(ctx, bytes),
        }
    }

    /// Refuses memory of the other way's making.
    pub(super) fn accepts(&self, mem: &PoolMemory) -> Result<(), RegisterError> {
        match self {
            TxShare::Legacy(s) => s.accepts(mem),
            TxShare::Vmm(s) => s.accepts(mem),
        }
    }

    /// Refuses a size this way cannot share, with `ctx` current.
    pub(super) fn fits(&self, ctx: &Context, mem: &PoolMemory) -> Result<(), RegisterError> {
        match self {
            TxShare::Legacy(s) => s.fits(ctx, mem),
            TxShare::Vmm(s) => s.fits(ctx, mem),
        }
    }

    /// Shares `mem`, pool table `entry` number `at.0` in generation `at.1`, with consumers.
    ///
    /// # Safety
    /// 1. `ctx` is current, and unless `mem` is our own VMM pool, `mem.ptr()` is the base of a
    ///    live allocation in it (the driver said so).
    pub(super) unsafe fn share(
        &mut self,
        mem: &PoolMemory,
        entry: &PoolEntry,
        at: (usize, u32),
        ctx: &Context,
    ) -> Result<(), RegisterError> {
        match self {
            // SAFETY: as ours, (1); `accepts` refused our own VMM pools for a legacy ring, so
            // `mem.ptr()` is the base of a live allocation, as the legacy half asks.
            TxShare::Legacy(s) => unsafe { s.share(mem, entry, at, ctx) },
            // SAFETY: as ours, (1).
            TxShare::Vmm(s) => unsafe { s.share(mem, entry, at, ctx) },
        }
    }

    /// Stops sharing (a closed ring takes no new consumer). Returns whether an import already
    /// made keeps its memory alive without us.
    pub(super) fn close(&mut self) -> bool {
        match self {
            TxShare::Legacy(s) => s.close(),
            TxShare::Vmm(s) => s.close(),
        }
    }
}
