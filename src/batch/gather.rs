//! The batch being gathered: the state the camera threads and the batcher's thread share, and
//! the one lock and condition variable they wait on.
//!
//! A camera thread copies a frame into its place only while a batch is *open*, and counts
//! itself in `copying` for the copy; the batcher's thread *closes* the batch and waits for
//! `copying` to reach 0 before it touches the places or publishes them. So no place is
//! written while the batch that holds it is filled in for absent cameras, published, or read
//! by consumers.

use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use super::frame::Layout;
use super::memory::BatchMemory;
use super::table::{CameraEntry, CameraState};

/// Where a batch's places are: the lent buffer's first byte (a host address or a device
/// address, as the producer's `loan_ptr` says), and the bytes of one frame. Camera `k`'s place
/// is `frame` bytes at `base + k * frame`.
#[derive(Clone, Copy, Debug)]
pub(super) struct Places {
    /// Invariant: the start of a loan of at least `K * frame` bytes, kept by the batcher's
    /// producer while the batch it belongs to is open or being closed.
    pub base: u64,
    pub frame: usize,
}

impl Places {
    /// Camera `k`'s place.
    pub(super) fn of(&self, k: usize) -> u64 {
        self.base + (k * self.frame) as u64
    }
}

/// The batch open for frames.
pub(super) struct Open<M: BatchMemory> {
    /// Its number.
    pub number: u64,
    pub places: Places,
    /// What a camera's copy into it waits for first: the batch ring's work before the batch
    /// opened (in CUDA memory, reads of the previous batch's buffer among it).
    pub gate: Arc<M::Gate>,
}

impl<M: BatchMemory> Clone for Open<M> {
    fn clone(&self) -> Self {
        Open { number: self.number, places: self.places, gate: self.gate.clone() }
    }
}

/// What the batcher knows of one camera.
pub(super) struct Camera<M: BatchMemory> {
    /// Its thread has a consumer on a live producer.
    pub live: bool,
    /// Its producer's frames do not match the batch: until its producer changes, none is used.
    pub refused: Option<String>,
    /// The epoch of the producer it last joined (0 if none yet).
    pub epoch: u64,
    /// The batch its place was last written for, with the frame that landed there.
    pub landed: Option<(u64, Landed)>,
    /// The lanes that copied (or tried to) into the place of batch `.0`: the publish is
    /// ordered after every one of them, the lane of a frame that was replaced, or of a copy
    /// that failed, or of an earlier join of the camera's ring, too.
    pub lanes: (u64, Vec<Arc<M::Lane>>),
    /// Frames that no batch carried since the last batch that carried one of its frames.
    pub skipped: u64,
}

/// A frame copied into its place.
#[derive(Clone, Copy, Debug)]
pub(super) struct Landed {
    pub seq: u64,
    pub timestamp_ns: u64,
    /// The epoch of the producer that sent it.
    pub epoch: u64,
}

impl<M: BatchMemory> Camera<M> {
    fn new() -> Camera<M> {
        Camera {
            live: false,
            refused: None,
            epoch: 0,
            landed: None,
            lanes: (u64::MAX, Vec::new()),
            skipped: 0,
        }
    }

    /// Notes that `lane` copies into the place of batch `number`. Returns the other lanes that
    /// did (the camera's lane before it joined its ring again): the copy must follow theirs,
    /// or a frame held back by its old producer's fence could land over the newer one.
    pub(super) fn copies_on(&mut self, number: u64, lane: &Arc<M::Lane>) -> Vec<Arc<M::Lane>> {
        if self.lanes.0 != number {
            self.lanes = (number, Vec::new());
        }
        let earlier = self.lanes.1.iter().filter(|l| !Arc::ptr_eq(l, lane)).cloned().collect();
        if !self.lanes.1.iter().any(|l| Arc::ptr_eq(l, lane)) {
            self.lanes.1.push(lane.clone());
        }
        earlier
    }

    /// The lanes that copied into the place of batch `number`, taken.
    pub(super) fn take_lanes(&mut self, number: u64) -> Vec<Arc<M::Lane>> {
        if self.lanes.0 == number {
            std::mem::take(&mut self.lanes.1)
        } else {
            Vec::new()
        }
    }

    /// Whether its frame of the batch before may stand in for a new one: it lives, is not
    /// refused, and still has the producer that sent that frame (epoch `of`).
    pub(super) fn keeps(&self, of: u64) -> bool {
        self.awaited() && self.epoch == of
    }

    /// Whether the batcher waits for its frames: it lives and is not refused.
    pub(super) fn awaited(&self) -> bool {
        self.live && self.refused.is_none()
    }

    /// Whether a frame of it is in the place of batch `number`.
    pub(super) fn landed_in(&self, number: u64) -> bool {
        matches!(self.landed, Some((n, _)) if n == number)
    }

    /// Its entry in a batch whose place did not get a new frame, `previous` being its entry in
    /// the batch before (whose frame, and epoch, the place holds if `kept`: the batcher copied
    /// it over).
    pub(super) fn idle_entry(&self, previous: &CameraEntry, kept: bool) -> CameraEntry {
        let state = if self.refused.is_some() {
            CameraState::Refused
        } else if self.live {
            CameraState::Stale
        } else {
            CameraState::Absent
        };
        let (seq, timestamp_ns) = if kept { (previous.seq, previous.timestamp_ns) } else { (0, 0) };
        CameraEntry { seq, timestamp_ns, skipped: self.skipped, epoch: self.epoch, state }
    }
}

/// Everything the threads share.
pub(super) struct State<M: BatchMemory> {
    /// The frame every camera must send, once known: the builder's, or the first frame's.
    pub layout: Option<Layout>,
    /// The batch open for frames, if any.
    pub open: Option<Open<M>>,
    /// Copies into the open batch's places under way.
    pub copying: usize,
    /// When the first frame landed in the open batch.
    pub first: Option<Instant>,
    pub cameras: Vec<Camera<M>>,
    /// Set once: every thread ends.
    pub stop: bool,
}

/// The shared state and its condition variable, notified at every change a waiter may wait for.
pub(super) struct Gather<M: BatchMemory> {
    state: Mutex<State<M>>,
    changed: Condvar,
}

impl<M: BatchMemory> Gather<M> {
    pub(super) fn new(cameras: usize, layout: Option<Layout>) -> Gather<M> {
        let state = State {
            layout,
            open: None,
            copying: 0,
            first: None,
            cameras: (0..cameras).map(|_| Camera::new()).collect(),
            stop: false,
        };
        Gather { state: Mutex::new(state), changed: Condvar::new() }
    }

    /// The state, locked. A thread that panicked with it held left it consistent (every
    /// change is made whole under the lock), so a poisoned lock is taken as it is.
    pub(super) fn lock(&self) -> MutexGuard<'_, State<M>> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Changes the state and wakes every waiter.
    pub(super) fn change<R>(&self, f: impl FnOnce(&mut State<M>) -> R) -> R {
        let r = f(&mut self.lock());
        self.changed.notify_all();
        r
    }

    /// Waits until `done` holds, `stop` is set or `until` passes; returns the guard.
    pub(super) fn wait_until<'a>(
        &'a self,
        mut s: MutexGuard<'a, State<M>>,
        until: Instant,
        mut done: impl FnMut(&State<M>) -> bool,
    ) -> MutexGuard<'a, State<M>> {
        while !s.stop && !done(&s) {
            let now = Instant::now();
            if now >= until {
                break;
            }
            s = self.changed.wait_timeout(s, until - now).unwrap_or_else(PoisonError::into_inner).0;
        }
        s
    }

    /// Wakes every waiter (after a change made through [`lock`](Self::lock)).
    pub(super) fn notify(&self) {
        self.changed.notify_all();
    }

    /// Closes the open batch, if any, and waits until no copy into it runs: then no camera
    /// writes a batch buffer until one is opened again.
    pub(super) fn close_and_wait(&self) {
        let mut s = self.lock();
        s.open = None;
        self.changed.notify_all();
        while s.copying > 0 {
            s = self.changed.wait_timeout(s, TICK).unwrap_or_else(PoisonError::into_inner).0;
        }
    }
}

/// Stops the batcher when dropped, however its thread ends (a panic included): closes the open
/// batch, waits out the copies into it, and tells the camera threads to stop. The publisher
/// makes one right after its output ring, so that it is dropped before the ring: no camera
/// copies into a buffer of a ring that is gone.
pub(super) struct Stopping<'a, M: BatchMemory>(pub &'a Gather<M>);

impl<M: BatchMemory> Drop for Stopping<'_, M> {
    fn drop(&mut self) {
        self.0.close_and_wait();
        self.0.change(|s| s.stop = true);
    }
}

/// How long a thread waits at most before it looks at `stop` again.
pub(super) const TICK: Duration = Duration::from_millis(50);

/// A copy into an open batch, counted in `copying` from its making to its drop (a panic in
/// the copy included), so that the batcher's wait for the copies always ends.
pub(super) struct Copying<'a, M: BatchMemory>(pub &'a Gather<M>);

impl<M: BatchMemory> Drop for Copying<'_, M> {
    fn drop(&mut self) {
        self.0.change(|s| s.copying -= 1);
    }
}
