//! The pool `gpuringsink` offers upstream for host rings: each buffer's memory is a ring buffer
//! lent by the producer ([`Producer::lend`](gpuring::Producer::lend)), so upstream writes its
//! frame straight into the ring and the sink publishes it where it is
//! ([`Producer::publish_loan`](gpuring::Producer::publish_loan)), without a copy.
//!
//! A pool buffer is used once: when GStreamer frees it, its loan ends (unpublished, the ring
//! buffer goes back to the spares; published, the producer may write it again once consumers
//! let go). The memory points into the ring's mapping, so it owns a share of the producer
//! ([`Lender`]): the ring closes when the sink and every pool buffer have let go of it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use gpuring::any::AnyProducer;
use gpuring::{LendError, Loan};
use gst::glib;
use gst::prelude::*;
use gst::subclass::prelude::*;

/// How long a lend that found no spare free waits before it looks again (a consumer's release
/// is not announced here; a loan that ends or is published is).
const LEND_SLICE: Duration = Duration::from_millis(1);

/// The producer, shared by the sink and the memory of every pool buffer.
pub struct Lender {
    /// The ring's producer.
    tx: Mutex<AnyProducer>,
    /// The loans whose memory GStreamer holds, by the address of their bytes, with the
    /// `GstMemory` that wraps them: lent, or published and kept until that memory is freed.
    loans: Mutex<HashMap<usize, (Loan, usize)>>,
    /// Loans whose memory was freed while someone held `tx`: ended by the next to lock it.
    ended: Mutex<Vec<Loan>>,
    /// Notified (under `ended`) when a loan ends or is published: a spare may be free.
    changed: Condvar,
}

/// Locks `m`, whatever a panic elsewhere left (these locks guard no invariant a panic breaks
/// half-way, and they are taken in drop paths, where a second panic aborts).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Lender {
    /// Shares `tx`.
    pub fn new(tx: AnyProducer) -> Arc<Lender> {
        Arc::new(Lender {
            tx: Mutex::new(tx),
            loans: Mutex::new(HashMap::new()),
            ended: Mutex::new(Vec::new()),
            changed: Condvar::new(),
        })
    }

    /// Locks the producer, ending first the loans whose memory was freed meanwhile.
    pub fn lock(&self) -> MutexGuard<'_, AnyProducer> {
        let mut tx = lock(&self.tx);
        let ended = std::mem::take(&mut *lock(&self.ended));
        for loan in ended {
            end(&mut tx, loan);
        }
        tx
    }

    /// Takes out the unpublished loan whose bytes are at `addr`, if `memory` (a `GstMemory`)
    /// is the one the pool wrapped them in; `None` for anything else (another pool's buffer, a
    /// share of a pool memory, a loan published already). The caller holds the buffer, so the
    /// memory is not freed meanwhile; it puts the loan back with [`put_back`](Self::put_back).
    pub fn take_unpublished(&self, addr: usize, memory: usize) -> Option<Loan> {
        let mut loans = lock(&self.loans);
        match loans.get(&addr) {
            Some((loan, m)) if *m == memory && loan.seq().is_none() => {
                loans.remove(&addr).map(|(loan, _)| loan)
            }
            _ => None,
        }
    }

    /// Puts back a loan [`take_unpublished`](Self::take_unpublished) took out (published or
    /// not), and tells waiting lends that a spare may be free.
    pub fn put_back(&self, addr: usize, memory: usize, loan: Loan) {
        lock(&self.loans).insert(addr, (loan, memory));
        let _ended = lock(&self.ended);
        self.changed.notify_all();
    }

    /// Lends a ring buffer and wraps `size` bytes of it in a buffer, waiting (with the producer
    /// unlocked) unless `wait` is false, until `flushing`.
    fn lend(
        self: &Arc<Self>,
        size: usize,
        wait: bool,
        flushing: &AtomicBool,
    ) -> Result<gst::Buffer, Lent> {
        loop {
            // Relaxed: a hint polled at every look (set by the pool's flush_start).
            if flushing.load(Ordering::Relaxed) {
                return Err(Lent::Flow(gst::FlowError::Flushing));
            }
            let mut tx = self.lock();
            let host = tx.host_mut().ok_or(Lent::Flow(gst::FlowError::NotSupported))?;
            if size > host.slot_size() {
                return Err(Lent::Flow(gst::FlowError::NotSupported));
            }
            match host.lend_timeout(Duration::ZERO) {
                Ok(loan) => {
                    let addr = host.loan_ptr(&loan) as usize;
                    drop(tx);
                    let bytes = LoanBytes { lender: self.clone(), addr, size };
                    let memory = gst::Memory::from_mut_slice(bytes);
                    lock(&self.loans).insert(addr, (loan, memory.as_ptr() as usize));
                    let mut buffer = gst::Buffer::new();
                    buffer.get_mut().expect("new").append_memory(memory);
                    return Ok(buffer);
                }
                // GStreamer's "no buffer now" of a pool asked not to wait.
                Err(LendError::Timeout | LendError::AllLent) if !wait => {
                    return Err(Lent::Flow(gst::FlowError::Eos))
                }
                // Held by consumers, or kept by buffers still in use: wait unlocked, so that
                // the sink publishes (which frees a spare) and freed buffers end their loans.
                Err(LendError::Timeout | LendError::AllLent) => {
                    drop(tx);
                    let ended = lock(&self.ended);
                    if ended.is_empty() {
                        let _ = self.changed.wait_timeout(ended, LEND_SLICE);
                    }
                }
                Err(e) => return Err(Lent::Failed(e)),
            }
        }
    }

    /// The memory of the loan at `addr` was freed: its loan ends now, or when the producer is
    /// next locked if someone holds it now.
    fn give_back(&self, addr: usize) {
        let Some((loan, _)) = lock(&self.loans).remove(&addr) else { return };
        match self.tx.try_lock() {
            Ok(mut tx) => end(&mut tx, loan),
            Err(_) => lock(&self.ended).push(loan),
        }
        let _ended = lock(&self.ended);
        self.changed.notify_all();
    }
}

/// Why a pool lent no buffer.
enum Lent {
    /// A flow result to return as it is (flushing, or nothing free for a caller that does not
    /// wait).
    Flow(gst::FlowError),
    /// The lend failed: an error to post.
    Failed(LendError),
}

impl Lent {
    /// The flow error it ends the acquire with.
    fn flow(&self) -> gst::FlowError {
        match self {
            Lent::Flow(f) => *f,
            Lent::Failed(_) => gst::FlowError::Error,
        }
    }
}

/// Ends `loan`, which `tx` lent.
fn end(tx: &mut AnyProducer, loan: Loan) {
    if let Some(host) = tx.host_mut() {
        // Only this producer's loans are kept in a lender.
        let _ = host.end_loan(loan);
    }
}

/// The bytes of a lent ring buffer, wrapped by a `GstMemory`; dropping them ends the loan.
struct LoanBytes {
    lender: Arc<Lender>,
    /// Invariant: the address of a loan of `lender`'s producer, which stays in `lender.loans`
    /// (or with the sink, which puts it back) until this is dropped, `size` bytes of it within
    /// the ring's mapping, which `lender` keeps.
    addr: usize,
    size: usize,
}

impl AsRef<[u8]> for LoanBytes {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: the loan keeps `size` bytes at `addr` mapped (see the field); nobody else
        // writes them while it is lent, and after it is published only consumers read them.
        unsafe { std::slice::from_raw_parts(self.addr as *const u8, self.size) }
    }
}

impl AsMut<[u8]> for LoanBytes {
    fn as_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_ref`; GStreamer maps a memory for writing only through its one
        // writable reference (upstream filling the frame, before the sink publishes it; the
        // sink publishes in place only a memory nothing else references, `sole_holder`).
        unsafe { std::slice::from_raw_parts_mut(self.addr as *mut u8, self.size) }
    }
}

impl Drop for LoanBytes {
    fn drop(&mut self) {
        self.lender.give_back(self.addr);
    }
}

glib::wrapper! {
    /// A pool of single-use buffers over ring buffers lent by the sink's producer.
    pub struct LoanPool(ObjectSubclass<imp::LoanPool>) @extends gst::BufferPool, gst::Object;
}

/// Makes (or finds) the ring a pool lends from, when its first buffer (of the given size) is
/// asked for.
pub type MakeLender = Box<dyn Fn(usize) -> Result<Arc<Lender>, gst::FlowError> + Send + Sync>;

impl LoanPool {
    /// A pool lending from the ring `make` gives on the first acquire, for `sink`, which posts
    /// the errors of its lends.
    /// At most `limit` buffers are out at once (the ring's spares).
    pub fn new(make: MakeLender, sink: &gst::Element, limit: u32) -> LoanPool {
        let pool: LoanPool = glib::Object::new();
        *lock(&pool.imp().make) = Some(make);
        pool.imp().limit.store(limit as usize, Ordering::Relaxed);
        *lock(&pool.imp().sink) = sink.downgrade();
        pool
    }
}

mod imp {
    use super::*;

    #[derive(Default)]
    pub struct LoanPool {
        pub(super) lender: Mutex<Option<Arc<Lender>>>,
        /// Makes `lender` on the first acquire (the ring is created then, not when the pool is
        /// offered: an upstream that takes another pool sizes the ring by its first frame).
        pub(super) make: Mutex<Option<MakeLender>>,
        /// The sink, which posts what goes wrong (a lost GPU context as such).
        pub(super) sink: Mutex<glib::WeakRef<gst::Element>>,
        /// The configured buffer size. Relaxed: set before the pool is active.
        size: AtomicUsize,
        /// The most buffers that can be out at once. Relaxed: set when the pool is made.
        pub(super) limit: AtomicUsize,
        /// Between flush_start and flush_stop: a waiting acquire gives up.
        flushing: AtomicBool,
    }

    #[glib::object_subclass]
    impl ObjectSubclass for LoanPool {
        const NAME: &'static str = "GpuringLoanPool";
        type Type = super::LoanPool;
        type ParentType = gst::BufferPool;
    }

    impl ObjectImpl for LoanPool {}
    impl GstObjectImpl for LoanPool {}

    impl BufferPoolImpl for LoanPool {
        fn set_config(&self, config: &mut gst::BufferPoolConfigRef) -> bool {
            let Some((caps, size, min, max)) = config.params() else { return false };
            self.size.store(size as usize, Ordering::Relaxed);
            let limit = self.limit.load(Ordering::Relaxed) as u32;
            // Buffers are made on demand, one loan each: none ahead of time, and never more
            // than the spares. An upstream that must keep more out is told so (false, with
            // what the pool can do), and uses a pool of its own.
            let fits = min <= limit && (max == 0 || max <= limit);
            config.set_params(
                caps.as_ref(),
                size,
                0,
                if max == 0 { limit } else { max.min(limit) },
            );
            self.parent_set_config(config) && fits
        }

        fn acquire_buffer(
            &self,
            params: Option<&gst::BufferPoolAcquireParams>,
        ) -> Result<gst::Buffer, gst::FlowError> {
            let lender = {
                let mut lender = lock(&self.lender);
                if lender.is_none() {
                    let make = lock(&self.make);
                    let make = make.as_ref().ok_or(gst::FlowError::Flushing)?;
                    *lender = Some(make(self.size.load(Ordering::Relaxed))?);
                }
                lender.clone().expect("made above")
            };
            let wait =
                !params.is_some_and(|p| p.flags().contains(gst::BufferPoolAcquireFlags::DONTWAIT));
            let sink = lock(&self.sink).upgrade();
            lender.lend(self.size.load(Ordering::Relaxed), wait, &self.flushing).map_err(|e| {
                let (Lent::Failed(e), Some(sink)) = (&e, sink) else { return e.flow() };
                if let Some(lost) = crate::lost::post_if_lost(&sink, e) {
                    return lost;
                }
                gst::element_error!(
                    sink,
                    gst::ResourceError::Write,
                    ["cannot lend a ring buffer: {e}"]
                );
                gst::FlowError::Error
            })
        }

        fn release_buffer(&self, buffer: gst::Buffer) {
            // Single use: freeing it ends its loan.
            drop(buffer);
        }

        fn stop(&self) -> bool {
            // A stopped pool lends no more: the ring is let go of once the sink and the
            // buffers still out are.
            // (`make` stays: a pool started again lends from the sink's ring of then.)
            *lock(&self.lender) = None;
            self.parent_stop()
        }

        fn flush_start(&self) {
            self.flushing.store(true, Ordering::Relaxed);
        }

        fn flush_stop(&self) {
            self.flushing.store(false, Ordering::Relaxed);
        }
    }
}
