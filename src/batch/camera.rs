//! One camera's thread: joins its input ring (again after every restart of its producer),
//! receives frames and copies each into its place in the open batch, then releases it.

use std::time::Instant;

use super::gather::{Gather, Landed, Open, TICK};
use crate::tensor::TensorHeader;
use crate::{Consumer, ConsumerBuilder, Mode, OpenErrorKind, ReadSlot, RecvTimeoutError};

/// What one camera thread needs.
pub(super) struct Input<'a> {
    /// Its index: its place in every batch.
    pub(super) index: usize,
    pub name: &'a str,
    pub builder: ConsumerBuilder,
    pub mode: Mode,
    pub gather: &'a Gather,
}

impl Input<'_> {
    /// Runs until the batcher stops.
    pub(super) fn run(&self) {
        let mut gone_epoch = None;
        while !self.gather.lock().stop {
            let Some(rx) = self.join(gone_epoch) else { continue };
            let epoch = rx.epoch();
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
            let why = self.receive(&rx);
            self.gather.change(|s| s.cameras[self.index].live = false);
            tracing::info!(camera = self.index, ring = self.name, epoch, why, "camera left");
            gone_epoch = Some(epoch);
        }
    }

    /// Opens the input ring (an instance other than `gone_epoch`), waiting up to a tick.
    fn join(&self, gone_epoch: Option<u64>) -> Option<Consumer> {
        let b = self.builder.clone().mode(self.mode);
        match b.open_when_ready(gone_epoch, TICK) {
            Ok(rx) => Some(rx),
            Err(e) => {
                match e.kind() {
                    OpenErrorKind::NotFound
                    | OpenErrorKind::Disconnected
                    | OpenErrorKind::TimedOut
                    | OpenErrorKind::NotInitialized => {}
                    OpenErrorKind::WrongMemory { found } => {
                        let why = format!("its ring holds {found:?} memory, the batch host memory");
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

    /// Receives until the producer goes away or the batcher stops; says why it returned.
    fn receive(&self, rx: &Consumer) -> &'static str {
        loop {
            if self.gather.lock().stop {
                return "stopped";
            }
            match rx.recv_timeout(TICK) {
                Ok(m) => self.land(m),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => return "its producer is gone",
                Err(e) => {
                    tracing::warn!(camera = self.index, ring = self.name, error = %e, "receive");
                    return "a receive failed";
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
    fn land(&self, m: ReadSlot<'_>) {
        let lag = m.lag();
        let mut s = self.gather.lock();
        if let Err(why) = check_frame(&mut s.layout, m.header(), m.len()) {
            s.cameras[self.index].skipped += 1 + lag;
            drop(s);
            return self.refuse(&why);
        }
        if s.cameras[self.index].refused.is_some() {
            s.cameras[self.index].skipped += 1 + lag;
            return;
        }
        // A batch open for this frame: in `Lossless` mode one this camera has no frame in yet
        // (every frame goes into a batch of its own); otherwise the open one, whose older frame
        // of this camera, if any, the newer one replaces.
        let lossless = self.mode == Mode::Lossless;
        let me = self.index;
        let usable = |s: &super::gather::State| match s.open {
            Some(o) => !(lossless && s.cameras[me].landed_in(o.number)),
            None => false,
        };
        loop {
            s = self.gather.wait_until(s, Instant::now() + TICK, usable);
            if s.stop {
                return;
            }
            if usable(&s) {
                break;
            }
        }
        let open: Open = s.open.expect("usable means open");
        let cam = &mut s.cameras[me];
        if cam.landed_in(open.number) {
            cam.skipped += 1; // the frame it replaces goes into no batch
        }
        cam.skipped += lag;
        s.copying += 1;
        drop(s);
        let frame = open.places.frame;
        // SAFETY: the place is `frame` bytes inside the loan `open.places` names (`Places`'
        // invariant); only this camera's thread writes it, and only while counted in
        // `copying`, which the batcher waits out before it reads, publishes or ends the loan.
        // `m` holds at least `frame` bytes (`check_frame`).
        unsafe {
            let dst = open.places.base.add(frame * me);
            std::ptr::copy_nonoverlapping(m.as_ptr(), dst, frame);
        }
        let landed = Landed { seq: m.seq(), timestamp_ns: m.timestamp_ns() };
        drop(m); // released only after the copy
        let mut s = self.gather.lock();
        s.copying -= 1;
        s.cameras[me].landed = Some((open.number, landed));
        s.first.get_or_insert_with(Instant::now);
        drop(s);
        self.gather.notify();
    }
}

/// Checks a frame against the batch's frame `layout`, which the first frame sets if no one
/// did: its tensor header (if it has one) must say the same element type and shape, and it
/// must be as long as that shape. Says what is wrong, naming both.
fn check_frame(layout: &mut Option<TensorHeader>, header: &[u8], len: usize) -> Result<(), String> {
    let theirs = match TensorHeader::read(header) {
        Ok(t) => t,
        Err(e) => return Err(format!("its tensor header is damaged: {e}")),
    };
    let ours = match (&*layout, theirs) {
        (Some(ours), Some(t)) if *ours != t => {
            return Err(format!("it sends {}, the batch takes {}", describe(&t), describe(ours)));
        }
        (Some(ours), _) => ours,
        (None, Some(t)) => layout.insert(t),
        (None, None) => {
            return Err(
                "its frames carry no tensor header and the batch's frame was not given".to_string()
            )
        }
    };
    let want = ours.nbytes().unwrap_or(u64::MAX);
    if len as u64 != want {
        return Err(format!("it sends {len}-byte frames, {} takes {want}", describe(ours)));
    }
    Ok(())
}

/// `uint8[720, 1280, 3]`.
pub(super) fn describe(t: &TensorHeader) -> String {
    let dims: Vec<String> = t.shape.iter().map(u64::to_string).collect();
    format!("{}[{}]", t.dtype.name(), dims.join(", "))
}
