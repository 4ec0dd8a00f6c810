//! Both sides' doorbell state (see [`crate::shm::doorbell`] and [`crate::ring::park`]).
//!
//! The producer keeps its own doorbell (which parked async producers await) and a knocker for
//! ringing parked consumers; a consumer keeps a knocker for ringing a parked producer and,
//! once it waits asynchronously (tokio, or an outside event loop), its own doorbell. Every
//! doorbell is a socket file in the ring directory (see [`crate::shm::unixsock`]); the
//! producer removes its instance's files when it drops, and a dead consumer's when it reaps
//! its entry ([`ProducerBells::forget`]).

use std::sync::atomic::{fence, AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::sync::OnceLock;

use rustix::net::SocketAddrUnix;

use crate::ring::{park, Ring};
use crate::shm::dir::RingDir;
use crate::shm::doorbell::{consumer_address, new_token, producer_address, Doorbell, Knocker};
use crate::shm::unixsock::{consumer_file, producer_file, remove_instance, unlink_in};

/// A consumer doorbell's address, remembered by the producer.
struct Known {
    /// Invariant: the address was made from this token.
    token: u64,
    at: SocketAddrUnix,
}

/// The producer's side.
pub(crate) struct ProducerBells {
    /// The ring directory; consumers' doorbell addresses may name it by our descriptor.
    dir: RingDir,
    name: String,
    epoch: u64,
    /// `None` if it could not be bound; a parked async producer then wakes on its timer.
    own: Option<Doorbell>,
    /// `None` if no socket could be made; parked consumers then wake on their timers.
    knocker: Option<Knocker>,
    /// Indexed by consumer table entry. Behind a lock (only ever the producer's, so never
    /// contended) so that ringing takes `&self`: an async producer rings parked consumers (after
    /// a reap) while it awaits its own doorbell, and its future must stay `Send`.
    known: Mutex<Vec<Option<Known>>>,
}

impl ProducerBells {
    /// Binds the doorbell of ring `name`, instance `epoch`, in `dir`, for the users that ring
    /// mode `ring_mode` lets use the ring, with room for `max_consumers`.
    pub fn bind(
        dir: &RingDir,
        name: &str,
        epoch: u64,
        ring_mode: u32,
        max_consumers: u32,
    ) -> ProducerBells {
        let own = Doorbell::bind(dir, &producer_file(name, epoch), ring_mode);
        let knocker = Knocker::new();
        if let Some(e) = own.as_ref().err().or(knocker.as_ref().err()) {
            tracing::warn!(ring = %name, error = %e, "no doorbell: async waits will poll on a timer");
        }
        ProducerBells {
            dir: dir.clone(),
            name: name.to_owned(),
            epoch,
            own: own.ok(),
            knocker: knocker.ok(),
            known: Mutex::new((0..max_consumers).map(|_| None).collect()),
        }
    }

    /// The producer's own doorbell, for an async producer to await.
    #[cfg_attr(not(feature = "tokio"), allow(dead_code))]
    pub fn own(&self) -> Option<&Doorbell> {
        self.own.as_ref()
    }

    /// Rings the doorbell of every parked consumer. Call only after `wants_wake(consumer_wake)`
    /// and `park::has_parked` both said yes.
    pub fn ring_parked(&self, ring: &Ring<'_>) {
        let Some(knocker) = &self.knocker else { return };
        // A poisoned lock only means a panic elsewhere left a half-updated cache: still usable.
        let mut table = self.known.lock().unwrap_or_else(|e| e.into_inner());
        for (i, e) in ring.consumers.iter().enumerate() {
            if !park::is_parked(&e.parked) {
                continue;
            }
            // Relaxed: the owner stored its token before parking, and our caller's SeqCst fence
            // in `wants_wake` orders this load after that park's fence.
            let token = e.bell.load(Ordering::Relaxed);
            if token == 0 {
                continue;
            }
            let known = &mut table[i];
            if known.as_ref().is_none_or(|k| k.token != token) {
                *known = consumer_address(&self.dir, &self.name, self.epoch, token)
                    .ok()
                    .map(|at| Known { token, at });
            }
            if let Some(k) = known {
                knocker.knock(&k.at);
            }
        }
    }

    /// Forgets the doorbell of the consumer that held table entry `entry` with doorbell token
    /// `token` (0: it had none), and removes its socket file: the consumer is dead, so nobody
    /// else removes it. Its file is named by its token alone, which a new occupant of the entry
    /// does not share (it draws its own), so this never removes a live consumer's doorbell. A
    /// file we may not remove (another user's, in a sticky directory) stays until `gpuring rm`
    /// or the producer's drop.
    pub fn forget(&self, entry: usize, token: u64) {
        if token == 0 {
            return;
        }
        {
            let mut table = self.known.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(known) = table.get_mut(entry) {
                if known.as_ref().is_some_and(|k| k.token == token) {
                    *known = None;
                }
            }
        }
        let file = consumer_file(&self.name, self.epoch, token);
        if let Err(e) = unlink_in(&self.dir, &file) {
            tracing::debug!(ring = %self.name, entry, error = %e, "cannot remove a dead consumer's doorbell");
        }
    }
}

impl Drop for ProducerBells {
    /// Removes every socket file of the ring instance: our doorbell (if `own` has not already),
    /// the fd server's if one is left, and the doorbells of consumers, which have nobody to
    /// wake them once the producer is gone.
    fn drop(&mut self) {
        drop(self.own.take());
        if let Err(e) = remove_instance(&self.dir, &self.name, self.epoch) {
            tracing::debug!(ring = %self.name, error = %e, "cannot remove the ring's socket files");
        }
    }
}

/// A consumer's own doorbell, made by its first async wait.
///
/// Several waiters of one consumer (tasks sharing it, an event loop's waits) share the
/// doorbell, so one may empty knocks meant for another, which then sleeps until its liveness
/// tick. To prevent that, a wait that empties knocks sets `owed`, and the next receive that
/// gets something (a message, an error, the end) rings the doorbell once more if a waiter is
/// still parked ([`settle`](Self::settle)); a waiter woken for nothing rings nobody, so two
/// idle waiters cannot wake each other in turn.
#[derive(Default)]
pub(crate) struct BellCell {
    /// `None` if no doorbell could be bound: waits then fall back to a timer.
    bell: OnceLock<Option<Doorbell>>,
    /// Knocks were emptied since the last relay. Relaxed (every access): a hint whose swap
    /// hands one relay to one receiver; `settle` fences before it looks for waiters.
    owed: AtomicBool,
}

/// The mode of a consumer's doorbell file (see [`BellCell::get`]).
const KNOCK_MODE: u32 = 0o666;

impl BellCell {
    /// The doorbell of the consumer of ring `name` (instance `epoch`, in `dir`) whose entry's
    /// doorbell token is `token_at`, bound on first use at the file named by a fresh token,
    /// which is then published in `token_at` for the producer to find.
    ///
    /// Its file is writable by everyone (mode 0666): the producer may run as another user than
    /// the consumer (a ring shared with a group), and a knock carries nothing, so the worst a
    /// stranger who can reach the directory does with it is a spurious wake-up.
    pub(crate) fn get(
        &self,
        dir: &RingDir,
        name: &str,
        epoch: u64,
        token_at: &AtomicU64,
    ) -> Option<&Doorbell> {
        self.bell
            .get_or_init(|| {
                let token = new_token().ok()?;
                let file = consumer_file(name, epoch, token);
                let bell = match Doorbell::bind(dir, &file, KNOCK_MODE) {
                    Ok(bell) => bell,
                    Err(e) => {
                        tracing::warn!(ring = %name, error = %e, "no doorbell: async receive polls on a timer");
                        return None;
                    }
                };
                // Relaxed: the producer reads it only after seeing us parked, and `park`'s
                // SeqCst fence comes after this store.
                token_at.store(token, Ordering::Relaxed);
                Some(bell)
            })
            .as_ref()
    }

    /// The doorbell, if one was bound.
    pub(crate) fn bound(&self) -> Option<&Doorbell> {
        self.bell.get().and_then(Option::as_ref)
    }

    /// Empties the doorbell (after a wait), noting whether it held knocks.
    pub(crate) fn quiet(&self) {
        if self.bound().is_some_and(|b| b.quiet() > 0) {
            self.owed.store(true, Ordering::Relaxed);
        }
    }

    /// The flag [`quiet`](Self::quiet) sets, for a wait that empties the doorbell itself.
    #[cfg(feature = "tokio")]
    pub(crate) fn owed(&self) -> &AtomicBool {
        &self.owed
    }

    /// After a receive got something: if knocks were emptied since the last relay and
    /// `parked()` says a waiter of this consumer is still parked, rings the doorbell once, so
    /// that it looks again.
    pub(crate) fn settle(&self, parked: impl FnOnce() -> bool) {
        if !self.owed.load(Ordering::Relaxed) || !self.owed.swap(false, Ordering::Relaxed) {
            return;
        }
        // SeqCst fence: orders our receive before the look at the park counts, as a
        // producer's fence orders its publish before its look (ring/park.rs): a waiter that
        // parks after this look re-checks and finds what we left.
        fence(Ordering::SeqCst);
        if parked() {
            if let Some(bell) = self.bound() {
                bell.ring();
            }
        }
    }
}

/// A consumer's side.
#[derive(Default)]
pub(crate) struct ConsumerBells {
    /// For ringing the producer, made on first use: `None` if it could not be made. The
    /// directory is kept open: the address may name it by our descriptor.
    knocker: OnceLock<Option<(Knocker, SocketAddrUnix, RingDir)>>,
}

impl ConsumerBells {
    /// Rings the doorbell of ring `name`'s producer, instance `epoch`, in `dir`.
    pub fn knock_producer(&self, dir: &RingDir, name: &str, epoch: u64) {
        let knocker = self.knocker.get_or_init(|| {
            let at = producer_address(dir, name, epoch).ok()?;
            Some((Knocker::new().ok()?, at, dir.clone()))
        });
        if let Some((knocker, at, _)) = knocker {
            knocker.knock(at);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ring::{ConsumerCore, HeapRing, Mode, Policy, StartAt};
    use crate::shm::doorbell::new_token;

    fn temp() -> RingDir {
        RingDir::open(std::env::temp_dir()).unwrap()
    }

    #[test]
    fn only_parked_consumers_with_a_doorbell_are_rung() {
        let heap = HeapRing::new(2, 0, 4, Policy::Block);
        let ring = heap.ring();
        let epoch = u64::from(std::process::id()) << 8 | 1;
        let dir = temp();
        let bells = ProducerBells::bind(&dir, "bells-ring", epoch, 0o600, 4);
        let a = ConsumerCore::join(&ring, StartAt::Next, Mode::Lossless, 1, 1).unwrap();
        let b = ConsumerCore::join(&ring, StartAt::Next, Mode::Lossless, 2, 1).unwrap();
        let doorbell = |core: &ConsumerCore| {
            let token = new_token().unwrap();
            ring.consumers[core.index()].bell.store(token, Ordering::Relaxed);
            Doorbell::bind(&dir, &consumer_file("bells-ring", epoch, token), 0o600).unwrap()
        };
        let (bell_a, bell_b) = (doorbell(&a), doorbell(&b));
        let parked_a = &ring.consumers[a.index()].parked;
        park::park(ring.consumer_wake, Some(parked_a));
        bells.ring_parked(&ring);
        assert_eq!((bell_a.quiet(), bell_b.quiet()), (1, 0), "only the parked one");
        // A second wait on the same consumer, then the first ends: still parked, still rung.
        park::park(ring.consumer_wake, Some(parked_a));
        park::unpark(ring.consumer_wake, Some(parked_a));
        bells.ring_parked(&ring);
        assert_eq!(bell_a.quiet(), 1, "one of two waits ended; the other is still rung");
        park::unpark(ring.consumer_wake, Some(parked_a));
        bells.ring_parked(&ring);
        assert_eq!(bell_a.quiet(), 0);
        // A new token (a new occupant of the entry): the producer follows it.
        let bell_a2 = doorbell(&a);
        park::park(ring.consumer_wake, Some(parked_a));
        bells.ring_parked(&ring);
        assert_eq!((bell_a.quiet(), bell_a2.quiet()), (0, 1));
    }

    #[test]
    fn a_consumers_doorbell_is_bound_once_and_its_token_published() {
        let (dir, epoch) = (temp(), u64::from(std::process::id()) << 8 | 2);
        let (cell, token_at) = (BellCell::default(), AtomicU64::new(0));
        assert!(cell.bound().is_none());
        let bell = cell.get(&dir, "bells-cell", epoch, &token_at).unwrap();
        let token = token_at.load(Ordering::Relaxed);
        assert_ne!(token, 0);
        assert_eq!(bell.file(), consumer_file("bells-cell", epoch, token));
        let again = cell.get(&dir, "bells-cell", epoch, &token_at).unwrap();
        assert!(std::ptr::eq(bell, again), "bound once");
        Knocker::new().unwrap().knock(&consumer_address(&dir, "bells-cell", epoch, token).unwrap());
        assert_eq!(bell.quiet(), 1);
    }

    #[test]
    fn the_producer_knocks_on_the_consumers_and_removes_their_files() {
        let (dir, epoch) = (temp(), u64::from(std::process::id()) << 8 | 3);
        let bells = ProducerBells::bind(&dir, "bells-files", epoch, 0o600, 2);
        let own = producer_file("bells-files", epoch);
        assert!(dir.display(&own).exists());
        // A consumer knocks on the producer.
        ConsumerBells::default().knock_producer(&dir, "bells-files", epoch);
        assert_eq!(bells.own().unwrap().quiet(), 1);
        // A dead consumer's doorbell: the bound socket stays (its process would have closed
        // it), and forgetting its entry removes the file. A wrong token removes nothing.
        let (dead, live) = (new_token().unwrap(), new_token().unwrap());
        let _dead =
            Doorbell::bind(&dir, &consumer_file("bells-files", epoch, dead), 0o600).unwrap();
        let _live =
            Doorbell::bind(&dir, &consumer_file("bells-files", epoch, live), 0o600).unwrap();
        bells.forget(0, dead);
        bells.forget(1, 0);
        assert!(!dir.display(&consumer_file("bells-files", epoch, dead)).exists());
        assert!(dir.display(&consumer_file("bells-files", epoch, live)).exists());
        // The producer's drop removes the rest of the instance's files.
        drop(bells);
        assert!(!dir.display(&own).exists());
        assert!(!dir.display(&consumer_file("bells-files", epoch, live)).exists());
    }
}
