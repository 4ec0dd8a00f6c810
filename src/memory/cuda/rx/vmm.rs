//! VMM sharing on the consumer's side: the pools' fds fetched from the producer's fd server,
//! each checked against the pool table and imported on our device.

use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::share::{Mapping, OpenPool};
use super::{producer_gone, CudaRx, OpenFault};
use crate::cuda::{Context, VmmImportError, VmmMapping};
use crate::error::{Corruption, OpenErrorKind};
use crate::format::offer::decode;
use crate::shm::fdpass::{fd_address, fetch_from, FetchError};
use crate::shm::view::MappedRing;

/// VMM: how long a consumer retries an unreachable fd server whose producer still looks alive.
const FETCH_PATIENCE: Duration = Duration::from_secs(2);

/// VMM sharing: pools come as fds from the producer's server.
pub(super) struct VmmRx;

impl VmmRx {
    pub(super) fn name(&self) -> &'static str {
        "vmm"
    }

    /// Nothing to refuse before the driver is asked: fds cross pid namespaces.
    pub(super) fn refuse(&self, _: &MappedRing, _: bool) -> Result<(), OpenErrorKind> {
        Ok(())
    }

    /// Maps each live pool `wanted` in `pools` from the fds of one fetch from the producer's
    /// server, each checked against the pool table and imported in `ctx`, whose pools must be
    /// on device `ring_device` (the ring's).
    pub(super) fn open_pools(
        &self,
        ctx: &Arc<Context>,
        ring_device: i32,
        pools: &mut [Option<OpenPool>],
        map: &MappedRing,
        wanted: impl Fn(&[Option<OpenPool>], usize) -> bool,
    ) -> Result<(), OpenFault> {
        let bad = |field, value| OpenFault::Corrupt(Corruption::Field { field, value });
        let epoch = map.params().epoch;
        let addr = fd_address(map.segment().dir(), map.segment().name().ring(), epoch)
            .map_err(|e| OpenFault::Fetch(e.to_string()))?;
        let owner = map.segment().owner();
        // A killed producer's socket closes before the kernel reports the process gone
        // (while its device files are torn down): look again for a while, so that the
        // open ends as `Disconnected` rather than `MemoryUnavailable`.
        let deadline = Instant::now() + FETCH_PATIENCE;
        let fetched = loop {
            match fetch_from(&addr, owner) {
                Err(FetchError::Unreachable(_))
                    if Instant::now() < deadline && !producer_gone(map) =>
                {
                    std::thread::sleep(Duration::from_millis(10));
                }
                other => break other,
            }
        };
        let (payload, fds) = fetched.map_err(|e| match e {
            FetchError::Refused(why) => OpenFault::Refused(why),
            other => OpenFault::Fetch(other.to_string()),
        })?;
        let offered = decode(&payload, fds.len(), epoch).map_err(|why| {
            OpenFault::Fetch(format!("the producer's fd server sent a bad offer: {why}"))
        })?;
        // Every fd we do not map is closed when `fds` drops.
        for (offer, fd) in offered.iter().zip(&fds) {
            let p = offer.pool as usize;
            if !wanted(pools, p) {
                continue;
            }
            // An offered pool not LIVE yet is mapped when a message first names it.
            let Some(known) = CudaRx::check_entry(map, p)? else { continue };
            if known.generation != offer.generation {
                return Err(bad("offer.generation", offer.generation as u64));
            }
            if known.size != offer.size {
                return Err(bad("offer.size", offer.size));
            }
            let mapping =
                VmmMapping::import(ctx, fd.as_fd(), known.size as usize).map_err(|e| match e {
                    VmmImportError::OtherDevice { found } => {
                        bad("pool.device", found.map_or(u64::MAX, |d| d as u64))
                    }
                    VmmImportError::Size(_) => bad("pool.size", known.size),
                    VmmImportError::Driver(e) => OpenFault::cuda(e),
                })?;
            // Peer access lets us map other GPUs' memory too: the pool must be on the
            // ring's, as its table entry says.
            if mapping.device() != ring_device {
                return Err(bad("pool.device", mapping.device() as u64));
            }
            pools[p] = Some(OpenPool { known, mapping: Mapping::Vmm(mapping) });
        }
        Ok(())
    }
}
