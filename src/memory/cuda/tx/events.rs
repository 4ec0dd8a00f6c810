//! Event fences on the producer's side: each buffer's interprocess ready event, recorded after
//! its writes, and the consumers' release events, opened once per occupant of their entry.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::cuda::driver::{self, DriverError};
use crate::cuda::{Context, CudaError, IpcEvent, Stream};
use crate::error::{Fault, PublishError};
use crate::format::gpu::GpuSlotLine;
use crate::memory::Readers;
use crate::ring::lease::{self, evict_reason};
use crate::shm::view::MappedRing;

/// A consumer's release event for one slot, opened in our context.
struct ReaderEvent {
    /// The consumer table entry's generation when it was opened: which occupant exported it.
    generation: u32,
    event: IpcEvent,
}

/// Interprocess events (legacy sharing with `Fence::Events`).
///
/// Invariants: `ready[i]` is buffer `i`'s ready event, whose handle is in the buffer's line.
pub(super) struct EventsTx {
    ready: Vec<IpcEvent>,
    /// Per consumer table entry and buffer, the release event we opened (`buffers` per entry).
    /// Dropped before the entry is freed (`forget_reader`): a consumer destroys the events it
    /// exported only once its entry is freed, or never (see docs/gpu.md, "Leaving").
    readers: Vec<Option<ReaderEvent>>,
}

impl EventsTx {
    /// No ready event yet ([`add_buffer`](Self::add_buffer) makes them), no reader's opened,
    /// for `buffers` buffers and `map`'s consumer table.
    pub(super) fn new(map: &MappedRing, buffers: usize) -> EventsTx {
        let readers = map.params().max_consumers as usize * buffers;
        let ready = Vec::with_capacity(buffers);
        EventsTx { ready, readers: (0..readers).map(|_| None).collect() }
    }

    /// Makes the next buffer's ready event and puts its handle in the buffer's `line`.
    pub(super) fn add_buffer(
        &mut self,
        ctx: &Arc<Context>,
        line: &GpuSlotLine,
    ) -> Result<(), CudaError> {
        let ev = IpcEvent::new(ctx)?;
        line.ready_event.store(&driver::event_handle_bytes(&ev.ipc_handle()?));
        self.ready.push(ev);
        Ok(())
    }

    /// Whether buffer `slot`'s ready event completed.
    pub(super) fn written(&self, _: &MappedRing, slot: usize, _: &Stream) -> Result<bool, Fault> {
        Ok(self.ready[slot].is_complete()?)
    }

    /// Whether consumer `entry` (whose lease we saw as `seen`, ACTIVE), which released message
    /// `prev` in `slot`, is done reading it: its release event for the slot completed. A
    /// release event that cannot be opened or queried names the consumer for eviction, its
    /// imports dropped (`ring` and `buffers` for that), unless our own context fails too.
    pub(super) fn reader_done(
        &mut self,
        ctx: &Arc<Context>,
        map: &MappedRing,
        (entry, seen): (usize, u64),
        (slot, _prev): (usize, u64),
        (ring, buffers): (&str, usize),
    ) -> Result<Readers, Fault> {
        let looked = match self.reader_event(ctx, map, (entry, seen), (slot, buffers)) {
            Ok(event) => event.is_complete().map_err(EventFault::of),
            Err(why) => Err(why),
        };
        match looked {
            Ok(true) | Err(EventFault::Moved) => Ok(Readers::Done),
            Ok(false) => Ok(Readers::Busy),
            // Whose failure? If our own context answers a query of our own event, the
            // consumer's handle (or line) is to blame and that consumer goes; if it does
            // not (a sticky error, out of memory), the failure is ours and ends this
            // acquire rather than evict anyone.
            Err(EventFault::Failed(why)) if self.ready[slot].is_complete().is_err() => {
                Err(why.into())
            }
            Err(EventFault::Failed(why)) => {
                let generation = lease::generation(seen);
                tracing::warn!(target: "gpuring::memory::cuda::tx", entry, generation, %why, "a consumer's release event failed");
                self.forget(ring, entry, generation, buffers);
                let reason = evict_reason::RELEASE_EVENT;
                Ok(Readers::Evict { entry, seen, reason })
            }
        }
    }

    /// Records buffer `slot`'s ready event on `stream`.
    pub(super) fn record_ready(
        &mut self,
        _: &Context,
        _: &GpuSlotLine,
        (slot, _seq): (usize, u64),
        stream: &Stream,
    ) -> Result<(), PublishError> {
        self.ready[slot].record(stream)?;
        Ok(())
    }

    /// Drops our imports of entry `entry`'s release events (`buffers` per entry), and says so
    /// if there were any.
    pub(super) fn forget(&mut self, ring: &str, entry: usize, generation: u32, buffers: usize) {
        let n = buffers;
        let mine = &mut self.readers[entry * n..(entry + 1) * n];
        if mine.iter().any(Option::is_some) {
            mine.iter_mut().for_each(|r| *r = None);
            tracing::debug!(target: "gpuring::lifecycle", ring = %ring, entry, generation, "producer imports dropped");
        }
    }

    /// Whether every ready event completed (a failed query counts as completed).
    pub(super) fn all_written(&self, _: &MappedRing, _: usize) -> bool {
        self.ready.iter().all(|ev| ev.is_complete().unwrap_or(true))
    }

    /// The release event of consumer `entry` (whose lease we saw as `seen`, ACTIVE) for
    /// `slot`, opened once per occupant.
    fn reader_event(
        &mut self,
        ctx: &Arc<Context>,
        map: &MappedRing,
        (entry, seen): (usize, u64),
        (slot, buffers): (usize, usize),
    ) -> Result<&IpcEvent, EventFault> {
        let generation = lease::generation(seen);
        let cached = &mut self.readers[entry * buffers + slot];
        if cached.as_ref().is_none_or(|r| r.generation != generation) {
            *cached = None; // a former occupant's import, dropped before the new open
            let line = &map.gpu().releases_of(entry)[slot];
            // Acquire: pairs with the consumer's Release store after it wrote the handle,
            // while it was JOINING. An ACTIVE entry's lines all carry its generation; another
            // value is a damaged line.
            if line.generation.load(Ordering::Acquire) != generation {
                let why = "its release line carries another generation than its lease";
                return Err(EventFault::Failed(CudaError::Unavailable(why.into())));
            }
            let handle = driver::event_handle_from_bytes(&line.release_event.load());
            // Acquire: the handle was read while the entry still had the lease we saw (it
            // cannot have been rewritten by a new occupant: that needs the entry freed, which
            // only we do, or given up by a retiring owner long after).
            if map.ring().consumers[entry].lease.load(Ordering::Acquire) != seen {
                return Err(EventFault::Moved);
            }
            let event = IpcEvent::open(ctx, handle).map_err(EventFault::of)?;
            *cached = Some(ReaderEvent { generation, event });
        }
        Ok(&cached.as_ref().expect("opened above").event)
    }
}

/// Why a consumer's release event could not be looked at.
enum EventFault {
    /// The entry moved on while we read its line: skip it.
    Moved,
    /// Opening or querying it failed: the consumer's handle, or our own context (the caller
    /// tells which by probing its own context).
    Failed(CudaError),
}

impl EventFault {
    fn of(e: DriverError) -> EventFault {
        EventFault::Failed(e.into())
    }
}
