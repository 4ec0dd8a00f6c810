//! Both sides' doorbell state (see [`crate::shm::doorbell`] and [`crate::ring::park`]).
//!
//! The producer keeps its inbox and the bells that parked consumers registered; a consumer keeps
//! a socket to knock on the producer's inbox with, and (feature `tokio`) its own bell.

use std::cell::OnceCell;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::Ordering;

use crate::ring::layout::entry_state;
use crate::ring::{park, Ring};
use crate::shm::doorbell::{self, inbox_address, Inbox, Letter, Outbox};

/// A bell registered by the owner of a consumer table entry.
struct Registered {
    /// The entry's generation and owner pid when it registered. Invariant: the bell is rung
    /// only while the entry still shows both, so a reused entry never rings a stale fd.
    generation: u32,
    pid: u32,
    bell: OwnedFd,
}

/// The producer's side.
pub(crate) struct ProducerBells {
    /// `None` if it could not be bound; parked consumers then wake on their timer.
    inbox: Option<Inbox>,
    /// Indexed by consumer table entry.
    bells: Vec<Option<Registered>>,
}

impl ProducerBells {
    /// Binds the inbox of ring `name`, instance `epoch`, with room for `max_consumers` bells.
    pub fn bind(name: &str, epoch: u64, max_consumers: u32) -> ProducerBells {
        let inbox = inbox_address(name, epoch).and_then(|at| Inbox::bind(&at));
        let inbox = match inbox {
            Ok(inbox) => Some(inbox),
            Err(e) => {
                tracing::warn!(ring = %name, error = %e, "no doorbell inbox: async consumers will poll on a timer");
                None
            }
        };
        ProducerBells { inbox, bells: (0..max_consumers).map(|_| None).collect() }
    }

    /// The inbox, for an async producer to await.
    #[cfg_attr(not(feature = "tokio"), allow(dead_code))]
    pub fn inbox(&self) -> Option<&Inbox> {
        self.inbox.as_ref()
    }

    /// Reads every letter waiting in the inbox, keeping the registrations that match their
    /// entry. Returns whether any letter came.
    pub fn read_inbox(&mut self, ring: &Ring<'_>) -> bool {
        let Some(inbox) = &self.inbox else { return false };
        let mut any = false;
        while let Ok(Some(letter)) = inbox.next() {
            any = true;
            let Letter::Register { entry, generation, pid, bell } = letter else { continue };
            let Some(e) = ring.consumers.get(entry as usize) else { continue };
            // Acquire: pairs with the owner's Release store of ACTIVE, after its pid and
            // generation.
            let active = e.state.load(Ordering::Acquire) == entry_state::ACTIVE;
            // Relaxed: ordered by the Acquire above.
            let owner = (e.generation.load(Ordering::Relaxed), e.pid.load(Ordering::Relaxed));
            if active && owner == (generation, pid) {
                self.bells[entry as usize] = Some(Registered { generation, pid, bell });
            } else {
                tracing::debug!(entry, pid, "doorbell registration refused: not the entry's owner");
            }
        }
        any
    }

    /// Rings the bell of every parked consumer. Call only after `wants_wake(consumer_wake)` and
    /// `park::has_parked` both said yes.
    pub fn ring_parked(&mut self, ring: &Ring<'_>) {
        let mut read = false;
        for (i, e) in ring.consumers.iter().enumerate() {
            if !park::is_parked(&e.parked) {
                continue;
            }
            // Relaxed: the owner wrote both before parking; a stale pair fails the match.
            let owner = (e.generation.load(Ordering::Relaxed), e.pid.load(Ordering::Relaxed));
            let matches = |bells: &[Option<Registered>]| {
                bells[i].as_ref().filter(|r| (r.generation, r.pid) == owner).is_some()
            };
            if !matches(&self.bells) && !read {
                // Its registration was sent before it parked: it is in the inbox by now.
                read = true;
                self.read_inbox(ring);
            }
            if let Some(r) = self.bells[i].as_ref().filter(|_| matches(&self.bells)) {
                doorbell::ring(r.bell.as_fd());
            }
        }
    }
}

/// A consumer's side.
#[derive(Default)]
pub(crate) struct ConsumerBells {
    /// Made on first use: `None` if no socket could be made.
    outbox: OnceCell<Option<Outbox>>,
}

impl ConsumerBells {
    /// The socket to the inbox of ring `name`, instance `epoch`.
    pub fn outbox(&self, name: &str, epoch: u64) -> Option<&Outbox> {
        self.outbox.get_or_init(|| inbox_address(name, epoch).and_then(Outbox::new).ok()).as_ref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ring::{ConsumerCore, HeapRing, Policy, StartAt};
    use crate::shm::doorbell::Bell;

    /// A ring with one consumer joined as this process, its bell, and the producer's side.
    fn setup(tag: &str) -> (HeapRing, ProducerBells, Outbox, Bell) {
        let heap = HeapRing::new(2, 4, Policy::Block);
        let epoch = u64::from(std::process::id()) << 20 | tag.len() as u64;
        let bells = ProducerBells::bind(tag, epoch, 4);
        let outbox = Outbox::new(inbox_address(tag, epoch).unwrap()).unwrap();
        (heap, bells, outbox, Bell::new().unwrap())
    }

    #[test]
    fn a_parked_consumer_with_a_matching_registration_is_rung() {
        let (heap, mut bells, outbox, bell) = setup("bells-match");
        let ring = heap.ring();
        let core = ConsumerCore::join(&ring, StartAt::Next, std::process::id(), 1).unwrap();
        let entry = &ring.consumers[core.index()];
        let generation = entry.generation.load(Ordering::Relaxed);
        outbox.register(core.index() as u32, generation, bell.as_fd()).unwrap();
        park::park(ring.consumer_wake, Some(&entry.parked));
        bells.ring_parked(&ring);
        assert!(bell.take(), "the registration is read from the inbox and the bell rung");
        park::unpark(ring.consumer_wake, Some(&entry.parked));
        bells.ring_parked(&ring);
        assert!(!bell.take(), "an unparked consumer is not rung");
    }

    #[test]
    fn registrations_that_do_not_match_their_entry_are_refused() {
        let (heap, mut bells, outbox, bell) = setup("bells-refuse");
        let ring = heap.ring();
        let core = ConsumerCore::join(&ring, StartAt::Next, std::process::id(), 1).unwrap();
        let index = core.index() as u32;
        let entry = &ring.consumers[core.index()];
        let generation = entry.generation.load(Ordering::Relaxed);
        // An old generation, an entry nobody owns, an entry out of range.
        outbox.register(index, generation.wrapping_sub(1), bell.as_fd()).unwrap();
        outbox.register(index + 1, 0, bell.as_fd()).unwrap();
        outbox.register(99, generation, bell.as_fd()).unwrap();
        // Owned by another pid than the sender's.
        entry.pid.store(std::process::id() + 1, Ordering::Relaxed);
        outbox.register(index, generation, bell.as_fd()).unwrap();
        assert!(bells.read_inbox(&ring));
        assert!(bells.bells.iter().all(Option::is_none));
        park::park(ring.consumer_wake, Some(&entry.parked));
        bells.ring_parked(&ring);
        assert!(!bell.take());
    }
}
