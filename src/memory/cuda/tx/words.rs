//! Memory word fences on the producer's side: each buffer's ready word in the segment, which
//! our GPU writes after the buffer's writes, and the consumers' release words, read on the CPU.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::super::words::SegmentWords;
use crate::cuda::driver;
use crate::cuda::{Context, CudaError, Stream};
use crate::error::{Fault, PublishError};
use crate::format::gpu::{release_bank, released_by, GpuSlotLine};
use crate::memory::Readers;
use crate::ring::lease;
use crate::shm::view::MappedRing;

/// Sequence words in the segment (VMM sharing, or legacy with `Fence::Memory`): no IPC event,
/// so nothing of another process is opened, and they work wherever the segment's file is
/// shared (containers with a private /dev/shm included).
///
/// Invariants: `published[b]` is `seq + 1` of the last message published in buffer `b` (0:
/// none), what its `ready_done` word reaches once the message's writes are done.
pub(super) struct WordsTx {
    /// The segment, page-locked for our device: where the GPU writes the ready words.
    words: SegmentWords,
    published: Vec<u64>,
}

impl WordsTx {
    /// Page-locks the segment for `ctx`'s device.
    pub(super) fn new(ctx: &Arc<Context>, map: &MappedRing) -> Result<WordsTx, CudaError> {
        let words = SegmentWords::register(ctx, map)?;
        Ok(WordsTx { words, published: vec![0; map.buffer_count()] })
    }

    /// Whether buffer `b`'s last published message is written (its ready word reached).
    fn reached(&self, map: &MappedRing, b: usize) -> bool {
        // Acquire: the GPU wrote the word after the message's writes; reusing the buffer
        // comes after.
        map.gpu().buffers[b].ready_done.load(Ordering::Acquire) >= self.published[b]
    }

    /// Nothing to make: the buffer's ready word is in its line already.
    pub(super) fn add_buffer(
        &mut self,
        _: &Arc<Context>,
        _: &GpuSlotLine,
    ) -> Result<(), CudaError> {
        Ok(())
    }

    /// Whether buffer `slot`'s ready word reached its last message; if not, whether our
    /// context (that of `stream`, our own) failed, which ends the wait.
    pub(super) fn written(
        &self,
        map: &MappedRing,
        slot: usize,
        stream: &Stream,
    ) -> Result<bool, Fault> {
        if self.reached(map, slot) {
            return Ok(true);
        }
        // Not yet: unless our context failed (a kernel fault is sticky), after which
        // its GPU writes no word again. A word is no driver call, so ask the driver
        // here, or this wait would never end; the failure ends it as an event query's
        // would.
        match stream.is_idle() {
            Err(e) if e.context_lost() => Err(e.into()),
            _ => Ok(false),
        }
    }

    /// Whether consumer `entry` (whose lease we saw as `seen`, ACTIVE), which released message
    /// `prev` in `slot`, is done reading it: its release word reached `prev + 1`. Never a
    /// failure: a word is read, nothing opened.
    pub(super) fn reader_done(
        &mut self,
        _: &Arc<Context>,
        map: &MappedRing,
        (entry, seen): (usize, u64),
        (slot, prev): (usize, u64),
        _: (&str, usize),
    ) -> Result<Readers, Fault> {
        let line = &map.gpu().releases_of(entry)[slot];
        // Acquire: the consumer's GPU wrote the word after its reads of `prev`;
        // our rewrite of the buffer comes after.
        let generation = lease::generation(seen);
        let word = line.release_done[release_bank(generation)].load(Ordering::Acquire);
        Ok(if released_by(word, generation, prev) { Readers::Done } else { Readers::Busy })
    }

    /// Queues the write of `seq + 1` into buffer `slot`'s ready word (in its `line`) on
    /// `stream`.
    pub(super) fn record_ready(
        &mut self,
        ctx: &Context,
        line: &GpuSlotLine,
        (slot, seq): (usize, u64),
        stream: &Stream,
    ) -> Result<(), PublishError> {
        let word = self.words.device(&line.ready_done);
        let _bound = ctx.bind()?;
        // SAFETY: the word lies in the segment, page-locked for our device until the
        // producer closes (after its last write is done); the stream is live.
        unsafe { driver::stream_write_value64(stream.raw(), word, seq + 1) }?;
        self.published[slot] = seq + 1;
        Ok(())
    }

    /// Nothing to drop: we opened nothing of the consumer's.
    pub(super) fn forget(&mut self, _: &str, _: usize, _: u32, _: usize) {}

    /// Whether each of the `buffers` buffers' ready word reached its last message.
    pub(super) fn all_written(&self, map: &MappedRing, buffers: usize) -> bool {
        (0..buffers).all(|b| self.reached(map, b))
    }
}
