//! Memory word fences on the consumer's side: the buffers' ready words, waited on before our
//! reads, and our own release words, written after them; and, when the producer died, the
//! ready words we raise so that our waits end.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::super::fence::{order_after, Signal};
use super::super::words::SegmentWords;
use super::cuda_err;
use crate::cuda::driver::{self, DriverError};
use crate::cuda::{Context, Stream};
use crate::error::{Fault, OpenErrorKind};
use crate::format::gpu::{release_bank, release_value, released_by, ConsumerSlot, GpuSlotLine};
use crate::memory::Quiesced;
use crate::ring::Pinned;
use crate::shm::view::MappedRing;

/// Memory fences: what a leaving consumer writes into the ready words of a producer that died,
/// so that GPU waits on them end: never a real value (`seq + 1` stays far below it). The
/// memory the waits guard stays mapped: our imports hold it (VMM by design; legacy IPC
/// imports outlive their exporter too, as tests/gpu_peers.rs's kills check).
///
/// 2^62, not `u64::MAX`: `cuStreamWaitValue64`'s GEQ compares cyclically, waiting until
/// `(int64_t)(*word - value) >= 0`, so `u64::MAX` reads as below every value waited for and
/// the waits never ended. 2^62 is at or above any `seq + 1` below 2^62 in that comparison too.
const PRODUCER_DIED: u64 = 1 << 62;

/// Memory word fences: the segment, page-locked for our device, and what we waited for.
///
/// Invariants: `awaited[b]` is the highest `seq + 1` this consumer made a stream wait for (or
/// polled) in buffer `b`'s ready word, 0 for none: the only words a dead producer's waits of
/// ours can hang on.
pub(super) struct WordsRx {
    words: SegmentWords,
    awaited: Vec<AtomicU64>,
}

impl WordsRx {
    /// Page-locks the segment for `ctx`'s device and clears entry `entry`'s release words for
    /// generation `generation`.
    pub(super) fn join(
        ctx: &Arc<Context>,
        map: &MappedRing,
        entry: usize,
        generation: u32,
    ) -> Result<WordsRx, OpenErrorKind> {
        let tables = map.gpu();
        let words = SegmentWords::register(ctx, map).map_err(cuda_err)?;
        for line in tables.releases_of(entry) {
            // Relaxed (both): published by the Release store of the generation below.
            line.release_done[release_bank(generation)].store(0, Ordering::Relaxed);
            line.released.store(0, Ordering::Relaxed);
            // Release: a producer that Acquire-loads this generation sees the words above.
            line.generation.store(generation, Ordering::Release);
        }
        let awaited = (0..tables.buffer_count).map(|_| AtomicU64::new(0)).collect();
        Ok(WordsRx { words, awaited })
    }

    /// Makes work queued on `stream` from now on run after the producer's writes of `m`:
    /// nothing if its buffer's ready word reached `m.seq + 1` (seen within `poll`), else a
    /// GPU-side wait on the word.
    ///
    /// A ready word at [`PRODUCER_DIED`] means the producer died before it wrote the
    /// message (a leaving consumer set it, see `wait_idle`): `Disconnected`, not a frame.
    pub(super) fn order_after_write(
        &self,
        map: &MappedRing,
        m: &Pinned,
        poll: Duration,
        ctx: &Context,
        stream: &Stream,
    ) -> Result<(), Fault> {
        let cpu = &map.gpu().buffers[m.buffer].ready_done;
        // Relaxed: only compared; the set-by-a-leaver value publishes nothing.
        // `>=`: an older build raised such words to u64::MAX.
        if cpu.load(Ordering::Relaxed) >= PRODUCER_DIED {
            return Err(Fault::Disconnected);
        }
        // Relaxed: read by our own leave, after our threads are done with us.
        self.awaited[m.buffer].fetch_max(m.seq + 1, Ordering::Relaxed);
        let signal = Signal::Word { cpu, device: self.words.device(cpu), value: m.seq + 1 };
        // SAFETY: a ready word lies in the segment we page-locked, which stays so while we
        // live, and the producer writes seq + 1 there after message `seq`.
        unsafe { order_after(signal, poll, ctx, stream) }?;
        // A leaver may have set the word between our look and the poll, which then took
        // PRODUCER_DIED for done: not a frame either.
        // Relaxed: only compared.
        let cpu = &map.gpu().buffers[m.buffer].ready_done;
        if cpu.load(Ordering::Relaxed) >= PRODUCER_DIED {
            return Err(Fault::Disconnected);
        }
        Ok(())
    }

    /// Queues the write of `value` into our release `word` on `stream`.
    pub(super) fn record_release(
        &self,
        ctx: &Context,
        stream: &Stream,
        _: usize,
        (word, value): (&AtomicU64, u64),
    ) -> Result<(), DriverError> {
        let device = self.words.device(word);
        ctx.bind().and_then(|_bound| {
            // SAFETY: the word lies in the segment, page-locked for our device until
            // we leave (after this write is done); the stream is live.
            unsafe { driver::stream_write_value64(stream.raw(), device, value) }
        })
    }

    /// Writes from the CPU the release `word` the GPU could not (Release: after the wait).
    pub(super) fn release_by_cpu(&self, word: &AtomicU64, value: u64) {
        word.store(value, Ordering::Release);
    }

    /// Whether a stream whose query failed (its context not lost) counts as idle: no, look
    /// again.
    pub(super) fn idle_if_query_failed(&self) -> bool {
        false
    }

    /// Writes from the CPU the release words, in our release `lines` of generation
    /// `generation`, that our failed context had queued and will never run.
    pub(super) fn context_lost(&self, lines: &[ConsumerSlot], generation: u32) {
        let bank = release_bank(generation);
        for l in lines {
            // Relaxed: our own store. Release: after our reads, which ended.
            let released = l.released.load(Ordering::Relaxed);
            if released != 0 {
                let value = release_value(generation, released - 1);
                l.release_done[bank].store(value, Ordering::Release);
            }
        }
    }

    /// Whether each of our release `lines` (generation `generation`) has its word at what we
    /// released.
    pub(super) fn released(&self, lines: &[ConsumerSlot], generation: u32) -> bool {
        let bank = release_bank(generation);
        // Acquire: our GPU wrote the word after its reads; the unmapping comes
        // after. Relaxed: `released` is our own store.
        lines.iter().all(|l| {
            let released = l.released.load(Ordering::Relaxed);
            let word = l.release_done[bank].load(Ordering::Acquire);
            released == 0 || released_by(word, generation, released - 1)
        })
    }

    /// Raises the ready words of a dead producer that are still below what we waited for (the
    /// messages it published but died before writing) to [`PRODUCER_DIED`], so that our GPU
    /// waits on them end. Words of messages it finished are left alone: other consumers still
    /// receive those frames. True: there were words to look at.
    pub(super) fn unblock(&self, lines: &[GpuSlotLine]) -> bool {
        for (line, awaited) in lines.iter().zip(&self.awaited) {
            // Relaxed (all): nothing is published with these; GPUs poll the word over PCIe.
            let want = awaited.load(Ordering::Relaxed);
            let seen = line.ready_done.load(Ordering::Relaxed);
            // Above PRODUCER_DIED: an older build's u64::MAX, which no GPU wait takes for done.
            if want != 0 && (seen < want || seen > PRODUCER_DIED) {
                // From the value seen only: a late write of the dying context that completed
                // the message meanwhile wins.
                let _ = line.ready_done.compare_exchange(
                    seen,
                    PRODUCER_DIED,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                );
            }
        }
        true
    }

    /// The producer opened nothing of ours: the entry is freed at once.
    pub(super) fn quiesce(&mut self) -> Quiesced {
        Quiesced::Free
    }

    /// Nothing to destroy: we made no event.
    pub(super) fn retired(&mut self) {}
}
