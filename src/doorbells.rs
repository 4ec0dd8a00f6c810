//! Both sides' doorbell state (see [`crate::shm::doorbell`] and [`crate::ring::park`]).
//!
//! The producer keeps its own doorbell (which parked async producers await) and a knocker for
//! ringing parked consumers; a consumer keeps a knocker for ringing a parked producer and,
//! once it waits asynchronously (tokio, or an outside event loop), its own doorbell.

use std::sync::atomic::{fence, AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::sync::OnceLock;

use rustix::net::SocketAddrUnix;

use crate::ring::{park, Ring};
use crate::shm::doorbell::{consumer_address, new_token, producer_address, Doorbell, Knocker};

/// A consumer doorbell's address, remembered by the producer.
struct Known {
    /// Invariant: the address was made from this token.
    token: u64,
    at: SocketAddrUnix,
}

/// The producer's side.
pub(crate) struct ProducerBells {
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
    /// Binds the doorbell of ring `name`, instance `epoch`, with room for `max_consumers`.
    pub fn bind(name: &str, epoch: u64, max_consumers: u32) -> ProducerBells {
        let own = producer_address(name, epoch).and_then(|at| Doorbell::bind(&at));
        let knocker = Knocker::new();
        if let Some(e) = own.as_ref().err().or(knocker.as_ref().err()) {
            tracing::warn!(ring = %name, error = %e, "no doorbell: async waits will poll on a timer");
        }
        ProducerBells {
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
                *known = consumer_address(&self.name, self.epoch, token)
                    .ok()
                    .map(|at| Known { token, at });
            }
            if let Some(k) = known {
                knocker.knock(&k.at);
            }
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

impl BellCell {
    /// The doorbell of the consumer of ring `name` (instance `epoch`) whose entry's doorbell
    /// token is `token_at`, bound on first use at the address named by a fresh token, which is
    /// then published in `token_at` for the producer to find.
    pub(crate) fn get(&self, name: &str, epoch: u64, token_at: &AtomicU64) -> Option<&Doorbell> {
        self.bell
            .get_or_init(|| {
                let token = new_token().ok()?;
                let at = consumer_address(name, epoch, token).ok()?;
                let bell = match Doorbell::bind(&at) {
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
    /// For ringing the producer, made on first use: `None` if it could not be made.
    knocker: OnceLock<Option<(Knocker, SocketAddrUnix)>>,
}

impl ConsumerBells {
    /// Rings the doorbell of ring `name`'s producer, instance `epoch`.
    pub fn knock_producer(&self, name: &str, epoch: u64) {
        let knocker = self.knocker.get_or_init(|| {
            let at = producer_address(name, epoch).ok()?;
            Some((Knocker::new().ok()?, at))
        });
        if let Some((knocker, at)) = knocker {
            knocker.knock(at);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ring::{ConsumerCore, HeapRing, Mode, Policy, StartAt};
    use crate::shm::doorbell::new_token;

    #[test]
    fn only_parked_consumers_with_a_doorbell_are_rung() {
        let heap = HeapRing::new(2, 0, 4, Policy::Block);
        let ring = heap.ring();
        let epoch = u64::from(std::process::id()) << 8 | 1;
        let bells = ProducerBells::bind("bells-ring", epoch, 4);
        let a = ConsumerCore::join(&ring, StartAt::Next, Mode::Lossless, 1, 1).unwrap();
        let b = ConsumerCore::join(&ring, StartAt::Next, Mode::Lossless, 2, 1).unwrap();
        let doorbell = |core: &ConsumerCore| {
            let token = new_token().unwrap();
            let at = consumer_address("bells-ring", epoch, token).unwrap();
            ring.consumers[core.index()].bell.store(token, Ordering::Relaxed);
            Doorbell::bind(&at).unwrap()
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
}
