//! Event fences on the consumer's side: the producer's ready events, opened at join and waited
//! on before our reads, and our own release events, recorded after them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::super::fence::{order_after, Signal};
use super::cuda_err;
use crate::cuda::driver::{self, CUresult, DriverError};
use crate::cuda::{Context, IpcEvent, Stream};
use crate::error::{Fault, OpenErrorKind};
use crate::format::gpu::{ConsumerSlot, GpuSlotLine};
use crate::memory::Quiesced;
use crate::ring::Pinned;
use crate::shm::view::MappedRing;

/// Interprocess event fences.
///
/// Invariants: `ready[i]` is buffer `i`'s ready event, opened from the segment; `release[i]`
/// is our release event for buffer `i`, whose handle is in our release line `i`.
pub(super) struct EventsRx {
    release: Vec<IpcEvent>,
    ready: Vec<IpcEvent>,
}

impl EventsRx {
    /// Creates and publishes our release events in entry `entry`'s lines (generation
    /// `generation`), and opens the buffers' ready events.
    pub(super) fn join(
        ctx: &Arc<Context>,
        map: &MappedRing,
        entry: usize,
        generation: u32,
    ) -> Result<EventsRx, OpenErrorKind> {
        let tables = map.gpu();
        // Our release lines: the producer reads them only once our entry is ACTIVE in this
        // generation, so nobody reads them while we write.
        let mut release = Vec::with_capacity(tables.buffer_count);
        for line in tables.releases_of(entry) {
            let ev = IpcEvent::new(ctx).map_err(cuda_err)?;
            let handle = ev.ipc_handle().map_err(cuda_err)?;
            line.release_event.store(&driver::event_handle_bytes(&handle));
            // Relaxed: published by the Release CAS to ACTIVE when we join.
            line.released.store(0, Ordering::Relaxed);
            // Release: a producer that Acquire-loads this generation sees the handle above.
            line.generation.store(generation, Ordering::Release);
            release.push(ev);
        }
        let ready = tables
            .buffers
            .iter()
            .map(|line| {
                let h = driver::event_handle_from_bytes(&line.ready_event.load());
                IpcEvent::open(ctx, h)
            })
            .collect::<Result<Vec<_>, _>>()
            .map_err(events_err)?;
        Ok(EventsRx { release, ready })
    }

    /// Makes work queued on `stream` from now on run after the producer's writes of `m`:
    /// nothing if its ready event completed (seen within `poll`), else a GPU-side wait on it.
    pub(super) fn order_after_write(
        &self,
        _: &MappedRing,
        m: &Pinned,
        poll: Duration,
        ctx: &Context,
        stream: &Stream,
    ) -> Result<(), Fault> {
        let signal = Signal::Event(&self.ready[m.buffer]);
        // SAFETY: an event signal; only a word's asks anything of us.
        unsafe { order_after(signal, poll, ctx, stream) }?;
        Ok(())
    }

    /// Records our release event for buffer `buffer` on `stream`.
    pub(super) fn record_release(
        &self,
        _: &Context,
        stream: &Stream,
        buffer: usize,
        _: (&AtomicU64, u64),
    ) -> Result<(), DriverError> {
        self.release[buffer].record(stream)
    }

    /// Nothing to write when a release could not be queued: the producer goes on as after a
    /// failed event record.
    pub(super) fn release_by_cpu(&self, _: &AtomicU64, _: u64) {}

    /// Whether a stream whose query failed (its context not lost) counts as idle: yes, as
    /// before (our records complete or fail with the context).
    pub(super) fn idle_if_query_failed(&self) -> bool {
        true
    }

    /// Nothing to write once our context failed: our records complete or fail with it.
    pub(super) fn context_lost(&self, _: &[ConsumerSlot], _: u32) {}

    /// Whether each of our release events completed (a failed query counts as completed).
    pub(super) fn released(&self, _: &[ConsumerSlot], _: u32) -> bool {
        self.release.iter().all(|ev| ev.is_complete().unwrap_or(true))
    }

    /// Nothing to unblock when the producer died: false.
    pub(super) fn unblock(&self, _: &[GpuSlotLine]) -> bool {
        false
    }

    /// Closes the producer's ready events we opened. Our release events stay until the
    /// producer let go of them: the entry retires.
    pub(super) fn quiesce(&mut self) -> Quiesced {
        self.ready.clear();
        Quiesced::Retire
    }

    /// Destroys our release events: the producer let go of them.
    pub(super) fn retired(&mut self) {
        self.release.clear();
    }
}

/// A failure to open the producer's ready events. The driver opens an interprocess event
/// through a file in the producer's /dev/shm: where this process has another /dev/shm (a
/// container's own, Docker's default), it fails with `CUDA_ERROR_MAP_FAILED`. Said so, with
/// what would work, rather than as a bare driver error.
fn events_err(e: DriverError) -> OpenErrorKind {
    if e.code != CUresult::CUDA_ERROR_MAP_FAILED {
        return cuda_err(e);
    }
    OpenErrorKind::MemoryUnavailable {
        reason: format!(
            "this ring's fences are CUDA interprocess events, which this process cannot open \
             ({e}): the driver opens them through the producer's /dev/shm, and this process \
             does not see it (a container's own /dev/shm?). Share the producer's /dev/shm \
             with every process of the ring, or create the ring with memory fences \
             (Fence::Memory, `--fence memory`) or VMM sharing, which need only the ring \
             directory shared (docs/containers.md)"
        ),
    }
}
