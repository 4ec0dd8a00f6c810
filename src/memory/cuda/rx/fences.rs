//! How the consumer's GPU work is ordered against the producer's ([`RxFences`], the segment's
//! `fence`): the two fence halves behind one set of methods.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use super::events::EventsRx;
use super::words::WordsRx;
use crate::cuda::driver::DriverError;
use crate::cuda::{Context, Stream};
use crate::error::{Fault, OpenErrorKind};
use crate::format::gpu::{ConsumerSlot, GpuSlotLine};
use crate::memory::{Member, Quiesced};
use crate::ring::Pinned;
use crate::shm::view::MappedRing;

/// How the consumer's GPU work is ordered against the producer's: the segment's `fence`. Each
/// half waits for a buffer's ready fence, queues a release fence (or writes it from the CPU),
/// says whether our release fences are done, and closes what leaving closes.
pub(super) enum RxFences {
    Events(EventsRx),
    Words(WordsRx),
}

impl RxFences {
    /// Words if `words`, else events, for consumer table entry `entry` in `generation`.
    pub(super) fn join(
        ctx: &Arc<Context>,
        map: &MappedRing,
        Member { entry, generation }: Member,
        words: bool,
    ) -> Result<RxFences, OpenErrorKind> {
        Ok(if words {
            RxFences::Words(WordsRx::join(ctx, map, entry, generation)?)
        } else {
            RxFences::Events(EventsRx::join(ctx, map, entry, generation)?)
        })
    }

    /// Makes work queued on `stream` from now on run after the producer's writes of `m`.
    pub(super) fn order_after_write(
        &self,
        map: &MappedRing,
        m: &Pinned,
        poll: Duration,
        ctx: &Context,
        stream: &Stream,
    ) -> Result<(), Fault> {
        match self {
            RxFences::Events(f) => f.order_after_write(map, m, poll, ctx, stream),
            RxFences::Words(f) => f.order_after_write(map, m, poll, ctx, stream),
        }
    }

    /// Queues our release fence for buffer `buffer` on `stream` (`word` and its value: our
    /// release word for it).
    pub(super) fn record_release(
        &self,
        ctx: &Context,
        stream: &Stream,
        buffer: usize,
        word: (&AtomicU64, u64),
    ) -> Result<(), DriverError> {
        match self {
            RxFences::Events(f) => f.record_release(ctx, stream, buffer, word),
            RxFences::Words(f) => f.record_release(ctx, stream, buffer, word),
        }
    }

    /// What the CPU does for a release fence that could not be queued, once our reads ended.
    pub(super) fn release_by_cpu(&self, word: &AtomicU64, value: u64) {
        match self {
            RxFences::Events(f) => f.release_by_cpu(word, value),
            RxFences::Words(f) => f.release_by_cpu(word, value),
        }
    }

    /// Whether a stream whose query failed, its context not lost, counts as idle.
    pub(super) fn idle_if_query_failed(&self) -> bool {
        match self {
            RxFences::Events(f) => f.idle_if_query_failed(),
            RxFences::Words(f) => f.idle_if_query_failed(),
        }
    }

    /// What the CPU does for the release fences our failed context had queued.
    pub(super) fn context_lost(&self, lines: &[ConsumerSlot], generation: u32) {
        match self {
            RxFences::Events(f) => f.context_lost(lines, generation),
            RxFences::Words(f) => f.context_lost(lines, generation),
        }
    }

    /// Whether every release fence we queued (in our `lines`) is done.
    pub(super) fn released(&self, lines: &[ConsumerSlot], generation: u32) -> bool {
        match self {
            RxFences::Events(f) => f.released(lines, generation),
            RxFences::Words(f) => f.released(lines, generation),
        }
    }

    /// Ends our waits on the ready fences of a dead producer, if it is ours to: whether it was.
    pub(super) fn unblock(&self, lines: &[GpuSlotLine]) -> bool {
        match self {
            RxFences::Events(f) => f.unblock(lines),
            RxFences::Words(f) => f.unblock(lines),
        }
    }

    /// Closes what we opened of the producer's fences; says how the entry goes.
    pub(super) fn quiesce(&mut self) -> Quiesced {
        match self {
            RxFences::Events(f) => f.quiesce(),
            RxFences::Words(f) => f.quiesce(),
        }
    }

    /// Destroys what the producer held of ours, now that it let go.
    pub(super) fn retired(&mut self) {
        match self {
            RxFences::Events(f) => f.retired(),
            RxFences::Words(f) => f.retired(),
        }
    }
}
