//! Legacy sharing on the consumer's side: each pool mapped from the IPC handle in its pool
//! table entry, and what keeps legacy IPC from working between us and the producer.

use std::sync::Arc;

use super::share::{Mapping, OpenPool};
use super::{CudaRx, OpenFault};
use crate::cuda::driver;
use crate::cuda::{Context, IpcMapping};
use crate::error::{Corruption, OpenErrorKind};
use crate::format::gpu::MAX_POOLS;
use crate::format::Params;
use crate::shm::view::MappedRing;

/// Legacy CUDA IPC sharing: pools come from the IPC handles in the pool table.
pub(super) struct LegacyRx;

impl LegacyRx {
    pub(super) fn name(&self) -> &'static str {
        "legacy"
    }

    /// Why this process cannot use the ring's legacy IPC (`words`: its fences are memory
    /// words), if it cannot: said at once, before the driver is asked.
    pub(super) fn refuse(&self, map: &MappedRing, words: bool) -> Result<(), OpenErrorKind> {
        if let Some(reason) = legacy_refusal(map.params(), words) {
            return Err(OpenErrorKind::MemoryUnavailable { reason });
        }
        if made_here(map.params()) {
            // The driver would refuse with CUDA_ERROR_INVALID_CONTEXT: say why instead.
            return Err(OpenErrorKind::MemoryUnavailable {
                reason: "CUDA IPC handles cannot be opened in the process that made them: \
                         consume a legacy-sharing CUDA ring from another process than its \
                         producer's, or create it with Sharing::Vmm"
                    .into(),
            });
        }
        Ok(())
    }

    /// Maps each live pool `wanted` in `pools` from its entry's IPC handle, in `ctx`.
    pub(super) fn open_pools(
        &self,
        ctx: &Arc<Context>,
        _: i32,
        pools: &mut [Option<OpenPool>],
        map: &MappedRing,
        wanted: impl Fn(&[Option<OpenPool>], usize) -> bool,
    ) -> Result<(), OpenFault> {
        let bad = |field, value| OpenFault::Corrupt(Corruption::Field { field, value });
        for p in 0..MAX_POOLS {
            if !wanted(pools, p) {
                continue;
            }
            let Some(known) = CudaRx::check_entry(map, p)? else { continue };
            let handle = driver::mem_handle_from_bytes(&map.gpu().pools[p].handle.load());
            let size = known.size as usize;
            let mapping = IpcMapping::open(ctx, handle, size).map_err(OpenFault::cuda)?;
            if mapping.mapped_size().map_err(OpenFault::cuda)? < size {
                return Err(bad("pool.size", known.size));
            }
            pools[p] = Some(OpenPool { known, mapping: Mapping::Ipc(mapping) });
        }
        Ok(())
    }
}

/// Why legacy sharing cannot work between us and the ring's producer, if it cannot: said at
/// once, before the driver is asked. Both limits come from the driver's use of process ids,
/// which mean nothing across pid namespaces (containers):
/// - it refuses a memory handle whose exporter has our pid (it takes it for our own), and a
///   container's first process is pid 1 in every container;
/// - it backs an interprocess event with a file in /dev/shm named after its creator's pid, so
///   processes of equal pids in pid namespaces that share a /dev/shm overwrite each other's
///   events: waits end early and frames are read before they are written. Event fences
///   are therefore refused across pid namespaces.
fn legacy_refusal(params: &Params, words: bool) -> Option<String> {
    use crate::shm::ns::{Kind, Namespaces};
    let theirs = Namespaces::from_words(params.producer_ns);
    if !theirs.differ(&Namespaces::current()).contains(&Kind::Pid) {
        return None;
    }
    let pid = std::process::id();
    if params.producer_pid == pid {
        return Some(format!(
            "the producer runs in another pid namespace with the same pid as this process \
             ({pid}; a container's first process is pid 1 in every container), and the CUDA \
             driver refuses legacy IPC handles of a process with our pid: create the ring with \
             VMM sharing, or start one of the two under another pid (docs/containers.md)"
        ));
    }
    (!words).then(|| {
        "this ring's fences are CUDA interprocess events and its producer runs in another pid \
         namespace: the driver names an event's memory in /dev/shm after its creator's pid, so \
         processes of equal pids in other pid namespaces that share a /dev/shm would overwrite \
         each other's events (frames read before they are written). Create the ring with \
         memory fences (Fence::Memory, `--fence memory`) or VMM sharing, or run the producer \
         and its consumers in one pid namespace (docs/containers.md)"
            .to_owned()
    })
}

/// Whether the ring's producer is this very process (its pid, start time and pid namespace
/// are ours). Its pid alone cannot tell: in another pid namespace (another container) the
/// producer may have our number.
fn made_here(params: &Params) -> bool {
    use crate::shm::ns::{Kind, Namespaces};
    let me = crate::shm::process::ProcessId::current();
    let theirs = Namespaces::from_words(params.producer_ns);
    let other_ns = theirs.differ(&Namespaces::current()).contains(&Kind::Pid);
    params.producer_pid == me.pid && params.producer_start_time == me.start_time && !other_ns
}
