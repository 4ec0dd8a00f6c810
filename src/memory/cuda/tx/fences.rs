//! How the producer's buffers are fenced ([`TxFences`], the segment's `fence`): the two fence
//! halves behind one set of methods.

use std::sync::Arc;

use super::events::EventsTx;
use super::words::WordsTx;
use crate::cuda::{Context, CudaError, Stream};
use crate::error::{Fault, PublishError};
use crate::format::gpu::{fence_kind, GpuSlotLine};
use crate::memory::Readers;
use crate::shm::view::MappedRing;

/// How the producer's buffers are fenced: the segment's `fence`. Each half answers the same
/// questions: whether a buffer's last message is written, whether one consumer is done
/// reading one, and whether all are written; and records a buffer's ready fence and forgets a
/// consumer.
pub(super) enum TxFences {
    Events(EventsTx),
    Words(WordsTx),
}

impl TxFences {
    /// Words if `words`, else events (their ready events made by `add_buffer`), for `buffers`
    /// buffers.
    pub(super) fn new(
        ctx: &Arc<Context>,
        map: &MappedRing,
        words: bool,
        buffers: usize,
    ) -> Result<TxFences, CudaError> {
        Ok(if words {
            TxFences::Words(WordsTx::new(ctx, map)?)
        } else {
            TxFences::Events(EventsTx::new(map, buffers))
        })
    }

    /// The segment's `fence`.
    pub(super) fn kind(&self) -> u32 {
        match self {
            TxFences::Events(_) => fence_kind::EVENTS,
            TxFences::Words(_) => fence_kind::MEMORY,
        }
    }

    /// Sets up the next buffer's ready fence in its `line`.
    pub(super) fn add_buffer(
        &mut self,
        ctx: &Arc<Context>,
        line: &GpuSlotLine,
    ) -> Result<(), CudaError> {
        match self {
            TxFences::Events(f) => f.add_buffer(ctx, line),
            TxFences::Words(f) => f.add_buffer(ctx, line),
        }
    }

    /// Whether buffer `slot`'s last message is written (`stream`: our own).
    pub(super) fn written(
        &self,
        map: &MappedRing,
        slot: usize,
        stream: &Stream,
    ) -> Result<bool, Fault> {
        match self {
            TxFences::Events(f) => f.written(map, slot, stream),
            TxFences::Words(f) => f.written(map, slot, stream),
        }
    }

    /// Whether consumer `who` (entry, lease seen ACTIVE), which released message `at.1` in
    /// slot `at.0`, is done reading it; or which consumer to evict (`ring` and `buffers`: to
    /// drop its imports).
    pub(super) fn reader_done(
        &mut self,
        ctx: &Arc<Context>,
        map: &MappedRing,
        who: (usize, u64),
        at: (usize, u64),
        ring: (&str, usize),
    ) -> Result<Readers, Fault> {
        match self {
            TxFences::Events(f) => f.reader_done(ctx, map, who, at, ring),
            TxFences::Words(f) => f.reader_done(ctx, map, who, at, ring),
        }
    }

    /// Queues buffer `at.0`'s ready fence for message `at.1` on `stream`, after its writes.
    pub(super) fn record_ready(
        &mut self,
        ctx: &Context,
        line: &GpuSlotLine,
        at: (usize, u64),
        stream: &Stream,
    ) -> Result<(), PublishError> {
        match self {
            TxFences::Events(f) => f.record_ready(ctx, line, at, stream),
            TxFences::Words(f) => f.record_ready(ctx, line, at, stream),
        }
    }

    /// Drops what we opened of consumer `entry`'s fences.
    pub(super) fn forget(&mut self, ring: &str, entry: usize, generation: u32, buffers: usize) {
        match self {
            TxFences::Events(f) => f.forget(ring, entry, generation, buffers),
            TxFences::Words(f) => f.forget(ring, entry, generation, buffers),
        }
    }

    /// Whether every one of the `buffers` buffers' last write is done.
    pub(super) fn all_written(&self, map: &MappedRing, buffers: usize) -> bool {
        match self {
            TxFences::Events(f) => f.all_written(map, buffers),
            TxFences::Words(f) => f.all_written(map, buffers),
        }
    }
}
