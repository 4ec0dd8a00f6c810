//! How the consumer maps the producer's pools ([`RxShare`], the segment's `sharing`): a mapped
//! pool, and the two sharing halves behind one set of methods.

use std::sync::Arc;

use super::legacy::LegacyRx;
use super::vmm::VmmRx;
use super::OpenFault;
use crate::cuda::driver::CUdeviceptr;
use crate::cuda::{Context, IpcMapping, VmmMapping};
use crate::error::OpenErrorKind;
use crate::format::gpu::KnownPool;
use crate::shm::view::MappedRing;

/// A pool's memory as this process maps it.
pub(super) enum Mapping {
    /// Legacy: opened from its IPC handle.
    Ipc(IpcMapping),
    /// VMM: imported from the fd the producer sent.
    Vmm(VmmMapping),
}

impl Mapping {
    pub(super) fn ptr(&self) -> CUdeviceptr {
        match self {
            Mapping::Ipc(m) => m.ptr(),
            Mapping::Vmm(m) => m.ptr(),
        }
    }
}

/// A pool this consumer mapped.
pub(super) struct OpenPool {
    pub(super) known: KnownPool,
    pub(super) mapping: Mapping,
}

/// How the consumer maps the producer's pools: the segment's `sharing`. Each half says what
/// keeps it from working here (`refuse`) and maps the pools (`open_pools`).
pub(super) enum RxShare {
    /// Legacy IPC: from the handles in the pool table.
    Legacy(LegacyRx),
    /// VMM: from the fds of the producer's server.
    Vmm(VmmRx),
}

impl RxShare {
    /// "legacy" or "vmm".
    pub(super) fn name(&self) -> &'static str {
        match self {
            RxShare::Legacy(s) => s.name(),
            RxShare::Vmm(s) => s.name(),
        }
    }

    /// Why this process cannot map the ring's memory this way (`words`: its fences are memory
    /// words), if it cannot: said before the driver is asked.
    pub(super) fn refuse(&self, map: &MappedRing, words: bool) -> Result<(), OpenErrorKind> {
        match self {
            RxShare::Legacy(s) => s.refuse(map, words),
            RxShare::Vmm(s) => s.refuse(map, words),
        }
    }

    /// Maps the live pools `wanted` in `pools`, in `ctx`; they must be on `ring_device`.
    pub(super) fn open_pools(
        &self,
        ctx: &Arc<Context>,
        ring_device: i32,
        pools: &mut [Option<OpenPool>],
        map: &MappedRing,
        wanted: impl Fn(&[Option<OpenPool>], usize) -> bool,
    ) -> Result<(), OpenFault> {
        match self {
            RxShare::Legacy(s) => s.open_pools(ctx, ring_device, pools, map, wanted),
            RxShare::Vmm(s) => s.open_pools(ctx, ring_device, pools, map, wanted),
        }
    }
}
