//! The batcher's own thread: makes the output ring once the frame is known, then, batch after
//! batch, lends a buffer, opens it to the cameras, closes it when [`Timing`] says, fills the
//! places of the cameras that sent nothing new, writes the table and publishes it.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::frame::Layout;
use super::gather::{Gather, Open, Places, State, Stopping, TICK};
use super::memory::BatchMemory;
use super::status::{BatchStatus, InputStatus};
use super::table::{BatchTable, CameraEntry, CameraState};
use super::{stopped, BatcherBuilder, Fill, RunError, Timing, Totals};
use crate::tensor::TensorHeader;
use crate::{LendError, Loan, Producer, PublishLoanError};

pub(super) struct Publisher<'a, M: BatchMemory> {
    b: &'a BatcherBuilder,
    gather: &'a Gather<M>,
}

/// The batch before the one being gathered: kept (not ended) so that its frames can be copied
/// into the next one, and its table.
struct Previous {
    loan: Loan,
    cameras: Vec<CameraEntry>,
}

impl<'a, M: BatchMemory> Publisher<'a, M> {
    pub(super) fn new(b: &'a BatcherBuilder, gather: &'a Gather<M>) -> Publisher<'a, M> {
        Publisher { b, gather }
    }

    /// Publishes batches until `stop` is set.
    pub(super) fn run(&self, stop: &std::sync::atomic::AtomicBool) -> Result<Totals, RunError> {
        let k = self.b.inputs.len();
        let mut totals = Totals { batches: 0, cameras: vec![[0; 4]; k] };
        let Some(frame) = self.frame(stop) else { return Ok(totals) };
        // Checked before it was taken (`BatcherBuilder::build`, or `camera::check_frame`).
        let frame_bytes = frame.bytes();
        let mut out = self.create(k * frame_bytes)?;
        // Dropped before `out` (a panic included): no camera copies into its buffers once it
        // is gone.
        let stopping = Stopping(self.gather);
        let mut shape = vec![k as u64];
        shape.extend(&frame.tensor.shape);
        let mut header = vec![0u8; BatchTable::header_size(k)];
        TensorHeader::new(frame.tensor.dtype, &shape).write(&mut header).expect("sized above");
        tracing::info!(ring = %self.b.output, cameras = k, frame = %frame.describe(), "batching");
        let mut previous: Option<Previous> = None;
        let mut next_at = Instant::now();
        let mut number = 0;
        let dir = self.b.dir.clone().unwrap_or_else(crate::shm::default_dir);
        let mut told = None;
        self.tell(&dir, &totals, &vec![CameraEntry::NONE; k], &mut told);
        let result = loop {
            if stopped(stop) {
                break Ok(());
            }
            let mut loan = match out.lend_timeout(TICK) {
                Ok(l) => l,
                Err(LendError::Timeout) => continue,
                Err(e) => break Err(RunError::Lend(e)),
            };
            let places = Places { base: out.loan_ptr(&loan), frame: frame_bytes };
            // The cameras' copies into this buffer wait for the batch ring's work so far.
            let gate = match M::gate(&out) {
                Ok(g) => Arc::new(g),
                Err(e) => {
                    let _ = out.end_loan(loan);
                    break Err(e);
                }
            };
            self.gather.change(|s| {
                s.open = Some(Open { number, places, gate });
                s.first = None;
            });
            if let Timing::Rate { period } = self.b.timing {
                next_at = (next_at + period).max(Instant::now());
            }
            if !self.wait_ready(number, next_at, stop) {
                self.abandon(&mut out, loan, number);
                break Ok(());
            }
            let cameras = match self.close(number, places, &out, previous.as_ref()) {
                Ok(c) => c,
                Err(e) => {
                    self.abandon(&mut out, loan, number);
                    break Err(e);
                }
            };
            let table = BatchTable { batch: number, closed_ns: crate::monotonic_ns(), cameras };
            table.write(&mut header).expect("sized above");
            let published = loop {
                match out.publish_loan_timeout(&mut loan, k * frame_bytes, &header, TICK) {
                    Ok(_) => break Ok(()),
                    Err(PublishLoanError::Timeout) if !stopped(stop) => continue,
                    Err(PublishLoanError::Timeout) => break Err(None),
                    Err(e) => break Err(Some(RunError::Publish(e))),
                }
            };
            if let Err(e) = published {
                self.abandon(&mut out, loan, number);
                break e.map_or(Ok(()), Err);
            }
            for (c, e) in table.cameras.iter().enumerate() {
                totals.cameras[c][Totals::index(e.state)] += 1;
            }
            totals.batches += 1;
            number += 1;
            self.tell(&dir, &totals, &table.cameras, &mut told);
            if let Some(p) = previous.replace(Previous { loan, cameras: table.cameras }) {
                let _ = out.end_loan(p.loan);
            }
        };
        if let Some(p) = previous {
            let _ = out.end_loan(p.loan);
        }
        BatchStatus::remove(&dir, &self.b.output);
        // No camera copies any more; then the batch ring's own work must be done before its
        // buffers go with it (a copy into a freed buffer could write anything).
        drop(stopping);
        // After a failed CUDA call, a camera's copy may be ordered before nothing the batch
        // ring's stream does (a lane whose join failed): the stream's quiet proves nothing.
        #[cfg(feature = "cuda")]
        let unordered = matches!(result, Err(RunError::Cuda(_)));
        #[cfg(not(feature = "cuda"))]
        let unordered = false;
        if unordered || !M::quiesce(&out, Duration::from_secs(5)) {
            tracing::warn!(ring = %self.b.output, unordered, "GPU work may still be queued: the ring's memory is left to the process's exit");
            std::mem::forget(out);
        }
        result.map(|()| totals)
    }

    /// Rewrites the status file for tools (`status`), if the last write is 250 ms old.
    fn tell(&self, dir: &Path, totals: &Totals, last: &[CameraEntry], told: &mut Option<Instant>) {
        if told.is_some_and(|t| t.elapsed() < Duration::from_millis(250)) {
            return;
        }
        *told = Some(Instant::now());
        let inputs = (self.b.inputs.iter().zip(last).zip(&totals.cameras))
            .map(|((ring, e), counts)| InputStatus::new(ring, e, *counts))
            .collect();
        let status =
            BatchStatus { batches: totals.batches, updated_ns: crate::monotonic_ns(), inputs };
        if let Err(e) = status.write(dir, &self.b.output) {
            tracing::warn!(ring = %self.b.output, error = %e, "cannot write the batch status file");
        }
    }

    /// Gives back unpublished batch `number`'s loan after the copies into it: none runs or
    /// starts, and the batch ring's work is ordered after the ones made.
    fn abandon(&self, out: &mut Producer<M>, loan: Loan, number: u64) {
        self.gather.close_and_wait();
        let mut s = self.gather.lock();
        for c in s.cameras.iter_mut() {
            for lane in c.take_lanes(number) {
                let _ = M::join(out, &lane);
            }
        }
        drop(s);
        let _ = out.end_loan(loan);
    }

    /// The frame: the builder's, or the first frame's, once one arrived. `None` if stopped
    /// first.
    fn frame(&self, stop: &std::sync::atomic::AtomicBool) -> Option<Layout> {
        loop {
            let s = self.gather.lock();
            let s = self.gather.wait_until(s, Instant::now() + TICK, |s| s.layout.is_some());
            if let Some(f) = &s.layout {
                return Some(f.clone());
            }
            if stopped(stop) {
                return None;
            }
        }
    }

    /// The output ring, with slots of `bytes`.
    fn create(&self, bytes: usize) -> Result<Producer<M>, RunError> {
        let b = self.b;
        let header = BatchTable::header_size(b.inputs.len()) as u32;
        let mut p = Producer::builder(&b.output)
            .slot_size(bytes)
            .user_header_size(header)
            .capacity(b.capacity)
            .spare_buffers(b.spares);
        if let Some(policy) = b.policy {
            p = p.policy(policy);
        }
        if let Some(d) = &b.dir {
            p = p.dir(d);
        }
        if let Some(l) = b.liveness {
            p = p.liveness_interval(l);
        }
        M::create(p, b.device).map_err(RunError::Create)
    }

    /// Waits until batch `number` may go out (see [`Timing`]): `false` if stopped first.
    fn wait_ready(
        &self,
        number: u64,
        next_at: Instant,
        stop: &std::sync::atomic::AtomicBool,
    ) -> bool {
        loop {
            if stopped(stop) {
                return false;
            }
            let s = self.gather.lock();
            let (ready, until) = self.ready(&s, number, next_at);
            if ready {
                return true;
            }
            let until = until.min(Instant::now() + TICK);
            let s = self.gather.wait_until(s, until, |s| self.ready(s, number, next_at).0);
            if self.ready(&s, number, next_at).0 {
                return true;
            }
        }
    }

    /// Whether batch `number` may go out, and until when to wait if not.
    fn ready(&self, s: &State<M>, number: u64, next_at: Instant) -> (bool, Instant) {
        let now = Instant::now();
        match self.b.timing {
            Timing::Rate { .. } => (now >= next_at, next_at),
            Timing::AllFresh { max_wait } => {
                let mut awaited = s.cameras.iter().filter(|c| c.awaited()).peekable();
                let any = awaited.peek().is_some();
                let all_in = any && awaited.all(|c| c.landed_in(number));
                match s.first {
                    Some(first) => (all_in || now >= first + max_wait, first + max_wait),
                    None => (false, now + TICK),
                }
            }
        }
    }

    /// Closes batch `number`: no camera copies into it any more, and what `out` publishes next
    /// is ordered after the copies. Fills the places of the cameras that sent nothing new
    /// (from `previous`, or zeros) and says what each holds.
    fn close(
        &self,
        number: u64,
        places: Places,
        out: &Producer<M>,
        previous: Option<&Previous>,
    ) -> Result<Vec<CameraEntry>, RunError> {
        self.gather.close_and_wait();
        let prev = previous.map(|p| Places { base: out.loan_ptr(&p.loan), frame: places.frame });
        let mut fills = Vec::new();
        let mut s = self.gather.lock();
        let mut entries = Vec::with_capacity(s.cameras.len());
        let mut joined = Ok(());
        for (k, c) in s.cameras.iter_mut().enumerate() {
            // Every lane is joined, even after one failed: a copy left unjoined could outlive
            // the buffer it writes (the stop waits for the batch ring's stream only).
            for lane in c.take_lanes(number) {
                let j = M::join(out, &lane);
                joined = joined.and(j);
            }
            let entry = match &c.landed {
                Some((n, l)) if *n == number => {
                    let e = CameraEntry {
                        seq: l.seq,
                        timestamp_ns: l.timestamp_ns,
                        skipped: c.skipped,
                        epoch: l.epoch,
                        state: CameraState::Present,
                    };
                    c.skipped = 0;
                    e
                }
                _ => {
                    let before = previous.map_or(CameraEntry::NONE, |p| p.cameras[k]);
                    let keep = self.b.fill == Fill::Previous
                        && before.has_frame()
                        && c.keeps(before.epoch);
                    let from = prev.filter(|_| keep).map(|p| p.of(k));
                    fills.push((k, from));
                    c.idle_entry(&before, from.is_some())
                }
            };
            entries.push(entry);
        }
        // The fills outside the lock: the batch is closed, so no camera writes its places.
        drop(s);
        joined?;
        for (k, from) in fills {
            // SAFETY: batch `number` is closed and no copy into it is under way
            // (`close_and_wait`), so this thread alone writes its places; both loans are this
            // producer's (the previous one published and kept, so nobody writes it) and
            // `K * frame` bytes long; they are different buffers.
            unsafe { M::fill(out, places.of(k), from, places.frame) }?;
        }
        Ok(entries)
    }
}
