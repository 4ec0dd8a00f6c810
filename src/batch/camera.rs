//! One camera's thread: joins its input ring (again after every restart of its producer),
//! receives frames and copies each into its place in the open batch, then releases it.

use std::sync::Arc;
use std::time::Instant;

use super::frame::check_frame;
use super::gather::{Copying, Gather, Landed, Open, State, TICK};
use super::memory::BatchMemory;
use crate::{Consumer, ConsumerBuilder, Mode, OpenErrorKind, ReadSlot, RecvTimeoutError};

/// What one camera thread needs.
pub(super) struct Input<'a, M: BatchMemory> {
    /// Its index: its place in every batch.
    pub(super) index: usize,
    pub name: &'a str,
    pub builder: ConsumerBuilder,
    pub mode: Mode,
    /// The device it reads on (CUDA), the output ring's.
    pub device: i32,
    pub gather: &'a Gather<M>,
}

impl<M: BatchMemory> Input<'_, M> {
    /// Runs until the batcher stops.
    pub(super) fn run(&self) {
        // However this thread ends (a panic included), the camera is no longer live: the
        // batcher must not wait for its frames.
        let _leaving = Leaving(self.gather, self.index);
        let mut gone_epoch = None;
        while !self.gather.lock().stop {
            let Some(rx) = self.join(gone_epoch) else { continue };
            let epoch = rx.epoch();
            let lane = match M::lane(&rx) {
                Ok(lane) => Arc::new(lane),
                Err(e) => {
                    tracing::warn!(camera = self.index, ring = self.name, error = %e, "no lane");
                    std::thread::sleep(TICK);
                    continue;
                }
            };
            self.gather.change(|s| {
                let c = &mut s.cameras[self.index];
                if c.epoch != epoch {
                    // A new producer: what the last one sent says nothing of this one.
                    c.refused = None;
                }
                c.live = true;
                c.epoch = epoch;
            });
            tracing::info!(camera = self.index, ring = self.name, epoch, "camera joined");
            let (why, gone) = self.receive(&rx, &lane);
            self.gather.change(|s| {
                let c = &mut s.cameras[self.index];
                c.live = false;
                // Its place is absent now, not refused: a refusal was of a producer that left.
                c.refused = None;
            });
            tracing::info!(camera = self.index, ring = self.name, epoch, why, "camera left");
            // Only a producer that is gone is skipped when joining again; after another
            // failure (damage it reported) the same one is joined again, after a pause.
            gone_epoch = gone.then_some(epoch);
            if !gone {
                std::thread::sleep(TICK);
            }
        }
    }

    /// Opens the input ring (an instance other than `gone_epoch`), waiting up to a tick.
    fn join(&self, gone_epoch: Option<u64>) -> Option<Consumer<M>> {
        let b = self.builder.clone().mode(self.mode);
        match M::open(b, self.device, gone_epoch, TICK) {
            Ok(rx) => Some(rx),
            Err(e) => {
                match e.kind() {
                    OpenErrorKind::NotFound | OpenErrorKind::Disconnected => {
                        // No producer: absent, whatever the last one was.
                        self.gather.change(|s| s.cameras[self.index].refused = None);
                    }
                    OpenErrorKind::TimedOut | OpenErrorKind::NotInitialized => {}
                    OpenErrorKind::NoPeerAccess { .. } => {
                        self.refuse(&e.to_string());
                        std::thread::sleep(TICK);
                    }
                    OpenErrorKind::WrongMemory { found } => {
                        let why =
                            format!("its ring holds {found:?} memory, the batch {:?}", M::KIND);
                        self.refuse(&why);
                        std::thread::sleep(TICK);
                    }
                    _ => {
                        tracing::warn!(camera = self.index, ring = self.name, error = %e, "cannot join");
                        std::thread::sleep(TICK);
                    }
                }
                None
            }
        }
    }

    /// Receives until the producer goes away or the batcher stops; says why it returned, and
    /// whether the producer is gone.
    fn receive(&self, rx: &Consumer<M>, lane: &Arc<M::Lane>) -> (&'static str, bool) {
        let epoch = rx.epoch();
        loop {
            if self.gather.lock().stop {
                return ("stopped", false);
            }
            match M::recv(rx, lane, TICK) {
                Ok(m) => {
                    if let Err(e) = self.land(m, lane, epoch) {
                        tracing::warn!(camera = self.index, ring = self.name, error = %e, "copy");
                        return ("a copy failed", false);
                    }
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => return ("its producer is gone", true),
                Err(e) => {
                    tracing::warn!(camera = self.index, ring = self.name, error = %e, "receive");
                    return ("a receive failed", false);
                }
            }
        }
    }

    /// Marks the camera refused, for reason `why`, until its producer changes.
    fn refuse(&self, why: &str) {
        let first = self.gather.change(|s| {
            let c = &mut s.cameras[self.index];
            let first = c.refused.is_none();
            c.refused = Some(why.to_string());
            first
        });
        if first {
            tracing::warn!(camera = self.index, ring = self.name, why, "camera refused");
        }
    }

    /// Copies frame `m` into its place in the open batch (waiting for one to open), then
    /// releases it.
    fn land(
        &self,
        m: ReadSlot<'_, M>,
        lane: &Arc<M::Lane>,
        epoch: u64,
    ) -> Result<(), super::RunError> {
        let lag = m.lag();
        let mut s = self.gather.lock();
        let cameras = s.cameras.len();
        let planes = match check_frame(&mut s.layout, m.header(), m.len(), cameras) {
            Err(why) => {
                s.cameras[self.index].skipped += 1 + lag;
                drop(s);
                self.refuse(&why);
                return Ok(());
            }
            Ok((planes, set)) => {
                if set {
                    // The batch's frame is known now: the publisher makes its ring.
                    self.gather.notify();
                }
                planes
            }
        };
        if s.cameras[self.index].refused.is_some() {
            s.cameras[self.index].skipped += 1 + lag;
            return Ok(());
        }
        // A batch open for this frame: in `Lossless` mode one this camera has no frame in yet
        // (every frame goes into a batch of its own); otherwise the open one, whose older frame
        // of this camera, if any, the newer one replaces.
        let lossless = self.mode == Mode::Lossless;
        let me = self.index;
        let usable = |s: &State<M>| match &s.open {
            Some(o) => !(lossless && s.cameras[me].landed_in(o.number)),
            None => false,
        };
        loop {
            s = self.gather.wait_until(s, Instant::now() + TICK, usable);
            if s.stop {
                return Ok(());
            }
            if usable(&s) {
                break;
            }
            // A `Latest` camera holds no frame for longer than a tick while no batch is open
            // (the batcher waits for a buffer, or for a slow consumer): it releases this one,
            // counted as skipped, and takes the newest once a batch opens. A `Lossless` one
            // keeps it for the next batch.
            if !lossless {
                s.cameras[me].skipped += 1 + lag;
                return Ok(());
            }
        }
        let open: Open<M> = s.open.clone().expect("usable means open");
        let cam = &mut s.cameras[me];
        if cam.landed_in(open.number) {
            cam.skipped += 1; // the frame it replaces goes into no batch
        }
        cam.skipped += lag;
        // Noted before the copy, so that the publish is ordered after it even if it fails.
        let earlier = cam.copies_on(open.number, lane);
        s.copying += 1;
        let copying = Copying(self.gather);
        drop(s);
        // The copy waits for the batch ring's work from before the batch opened: reads of the
        // buffer it writes, by the fill of an earlier batch, are among it.
        let copied = earlier.iter().try_for_each(|e| M::follow(lane, e));
        let copied = copied.and_then(|()| M::pass(lane, &open.gate)).and_then(|()| {
            // SAFETY: the place is `frame` bytes inside the loan `open.places` names (`Places`'
            // invariant), and `planes` pack into exactly that many (`check_frame`: they are
            // the batch's frame); only this camera's thread writes it, and only while counted
            // in `copying`, which the batcher waits out (and then joins this lane) before it
            // reads, publishes or ends the loan. `m` holds every plane (`check_frame`).
            unsafe { M::copy(lane, open.places.of(me), &m, &planes) }
        });
        let landed = Landed { seq: m.seq(), timestamp_ns: m.timestamp_ns(), epoch };
        drop(m); // released after the copy (in CUDA memory, on the lane, after it)
        let mut s = self.gather.lock();
        if copied.is_ok() {
            s.cameras[me].landed = Some((open.number, landed));
            s.first.get_or_insert_with(Instant::now);
        } else if s.cameras[me].landed_in(open.number) {
            // Its place may hold part of this frame over the last one: the batcher fills it.
            s.cameras[me].landed = None;
        }
        drop(s);
        drop(copying); // counts the copy done, and wakes the batcher
        copied
    }
}

/// Marks camera `.1` not live when dropped (its thread ends, a panic included).
struct Leaving<'a, M: BatchMemory>(&'a Gather<M>, usize);

impl<M: BatchMemory> Drop for Leaving<'_, M> {
    fn drop(&mut self) {
        self.0.change(|s| s.cameras[self.1].live = false);
    }
}
