//! Host-memory messages lent to GStreamer without a copy: a received slot stays held while a
//! `GstMemory` wraps its bytes, and is released when GStreamer frees that memory, on whatever
//! thread that happens.
//!
//! A `Consumer` is `Send` but not `Sync`: one thread at a time. Here every use of it (receive,
//! and the release a slot makes when dropped) happens under [`Shared::reader`]'s mutex. A
//! memory freed while the streaming thread holds that mutex (it is waiting for the next
//! message) leaves its token in [`Shared::released`] instead, and the streaming thread releases
//! it after that wait (within one tick).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, TryLockError};
use std::time::Duration;

use gpuring::{Consumer, Host, ReadSlot, RecvTimeoutError};

/// The consumer, shared by the slots it lends.
struct Rx(Consumer<Host>);

// SAFETY: a `Consumer` is not `Sync` because its receive path has unsynchronised cells. Every
// use of this one (receive, release through a held slot's drop, drop) happens with
// `Shared::reader` locked, so no two threads ever use it at once.
unsafe impl Sync for Rx {}

type Slot<'a> = ReadSlot<'a, Host>;

self_cell::self_cell!(
    /// A received slot and the consumer it borrows. Dropping it releases the slot.
    struct Held {
        owner: Arc<Rx>,
        #[covariant]
        dependent: Slot,
    }
);

// SAFETY: a `ReadSlot` borrows its consumer, so it is `Send` only if the consumer is `Sync`.
// A `Held` is only created, read and dropped with `Shared::reader` locked (see `Rx`).
unsafe impl Send for Held {}

/// The consumer and the slots it has lent.
struct Reader {
    rx: Arc<Rx>,
    /// Slots lent to GStreamer memories, by token.
    held: HashMap<u64, Held>,
    next_token: u64,
}

/// A ring's consumer and what it has lent, shared by the source and its memories.
pub struct Shared {
    reader: Mutex<Reader>,
    /// The ring's spare buffers (what consumers may hold in all without stalling it).
    spares: u32,
    /// Tokens of memories freed while `reader` was locked: released at the next receive.
    released: Mutex<Vec<u64>>,
    epoch: u64,
}

impl Shared {
    /// Shares `rx`.
    pub fn new(rx: Consumer<Host>) -> Arc<Shared> {
        let epoch = rx.epoch();
        let spares = rx.spare_buffers();
        Arc::new(Shared {
            spares,
            reader: Mutex::new(Reader {
                rx: Arc::new(Rx(rx)),
                held: HashMap::new(),
                next_token: 0,
            }),
            released: Mutex::new(Vec::new()),
            epoch,
        })
    }

    /// The ring's spare buffers.
    pub fn spares(&self) -> u32 {
        self.spares
    }

    /// The ring's epoch.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Slots lent now (held for buffers GStreamer has not freed yet).
    pub fn lent(&self) -> usize {
        let mut reader = self.reader.lock().unwrap();
        self.release_freed(&mut reader);
        reader.held.len()
    }

    /// Receives the next message, waiting at most `wait`, and lends it.
    pub fn recv(self: &Arc<Self>, wait: Duration) -> Result<SlotBytes, RecvTimeoutError> {
        let mut reader = self.reader.lock().unwrap();
        self.release_freed(&mut reader);
        let rx = reader.rx.clone();
        let held = Held::try_new(rx, |rx| rx.0.recv_timeout(wait))?;
        // Released only through this memory's drop, after it is no longer read.
        let slot = held.borrow_dependent();
        let (ptr, len) = (slot.as_ptr(), slot.len());
        let (seq, lag, header) = (slot.seq(), slot.lag(), slot.header().to_vec());
        let token = reader.next_token;
        reader.next_token += 1;
        reader.held.insert(token, held);
        drop(reader);
        // A memory freed during the wait is released now, not at the next receive.
        let mut reader = self.reader.lock().unwrap();
        self.release_freed(&mut reader);
        drop(reader);
        Ok(SlotBytes { shared: self.clone(), token, ptr, len, seq, lag, header })
    }

    fn release_freed(&self, reader: &mut Reader) {
        let freed = std::mem::take(&mut *self.released.lock().unwrap());
        for token in freed {
            reader.held.remove(&token);
        }
    }

    fn release(&self, token: u64) {
        match self.reader.try_lock() {
            Ok(mut reader) => {
                reader.held.remove(&token);
            }
            Err(TryLockError::WouldBlock) => self.released.lock().unwrap().push(token),
            // A panic elsewhere poisoned it: still release (the data is a plain map).
            Err(TryLockError::Poisoned(p)) => {
                p.into_inner().held.remove(&token);
            }
        }
    }
}

/// The bytes of a lent slot: what a `GstMemory` wraps. Dropping it releases the slot.
///
/// Invariant: `ptr..ptr + len` is the held slot `token` of `shared`, which stays held (and
/// mapped, its consumer alive) until this value drops.
pub struct SlotBytes {
    shared: Arc<Shared>,
    token: u64,
    ptr: *const u8,
    len: usize,
    seq: u64,
    lag: u64,
    header: Vec<u8>,
}

// SAFETY: the bytes are read-only shared memory held for this value's life; dropping it only
// queues or makes a release under the reader's mutex (`Shared::release`).
unsafe impl Send for SlotBytes {}

impl SlotBytes {
    /// The message's sequence number.
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// Messages lost before this one.
    pub fn lag(&self) -> u64 {
        self.lag
    }

    /// The message's user header.
    pub fn header(&self) -> &[u8] {
        &self.header
    }
}

impl AsRef<[u8]> for SlotBytes {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: by the invariant, the held slot's bytes, unchanged while it is held.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl Drop for SlotBytes {
    fn drop(&mut self) {
        self.shared.release(self.token);
    }
}
