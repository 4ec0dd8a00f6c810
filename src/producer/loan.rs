//! Loans: buffers lent out of the ring, several at once, each written at its borrower's pace
//! and published as the next message when its borrower says so. A GStreamer pool offers
//! upstream ring memory this way (`gpuringsink`), so a frame is written in place, not copied.
//!
//! Only spare buffers are lent (no position names them), so a ring that lends needs spares:
//! each loan out takes one, and publishing it gives one back (the buffer it replaces). A
//! published loan stays *kept* until it is ended: the producer does not write that buffer again
//! while its borrower may still read it. See docs/protocol.md, "Loans".

use std::time::Duration;

use super::Producer;
use crate::error::{EndLoanError, LendError, PublishError, PublishLoanError};
use crate::memory::{Host, Memory, ProducerSide};
use crate::ring::producer::Want;
use crate::shm::wait::Deadline;
use crate::shm::waiter::{block_on, Waiter};

/// A buffer lent out of the ring by [`Producer::lend`]. Write it (its address is
/// [`Producer::loan_ptr`]; in a host ring [`Producer::loan_bytes`] gives its bytes), publish
/// it with [`Producer::publish_loan`], which gives it the next sequence number, and end it
/// with [`Producer::end_loan`] once nothing reads it on the borrower's side any more (ending
/// an unpublished loan gives the buffer back unpublished).
///
/// In a CUDA ring, write it on the producer's stream ([`GpuProducer::stream`]), or make that
/// stream wait for the writes before publishing or ending it: the publish's fence is recorded
/// there, and the next write of an ended loan's buffer is ordered after that stream's work.
///
/// While loans are kept, they are buffers the producer cannot use: `acquire` waits for a
/// buffer held by consumers or kept by a loan to come free, and only [`Producer::end_loan`]
/// frees a kept one.
///
/// [`GpuProducer::stream`]: crate::GpuProducer::stream
///
/// ```
/// use gpuring::{Consumer, Producer};
///
/// let mut tx = Producer::builder("doc-loan").spare_buffers(2).create()?;
/// let rx = Consumer::open("doc-loan")?;
/// let (mut a, mut b) = (tx.lend()?, tx.lend()?); // two buffers out at once
/// tx.loan_bytes(&b)[..1].copy_from_slice(b"b");
/// tx.loan_bytes(&a)[..1].copy_from_slice(b"a");
/// assert_eq!(tx.publish_loan(&mut b, 1, b"")?, 0); // published in the order they are
/// assert_eq!(tx.publish_loan(&mut a, 1, b"")?, 1);
/// tx.end_loan(a)?;
/// tx.end_loan(b)?;
/// assert_eq!(&*rx.recv()?, b"b");
/// assert_eq!(&*rx.recv()?, b"a");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[must_use = "a loan keeps its buffer out of the ring until it is ended (Producer::end_loan)"]
#[derive(Debug, PartialEq, Eq)]
pub struct Loan {
    /// The buffer. Invariant: lent by the producer `ring` names while `seq` is `None`, kept by
    /// it after.
    buffer: usize,
    /// Its producer: the address of its mapping and the ring's epoch.
    ring: (usize, u64),
    /// The sequence number it was published as.
    seq: Option<u64>,
}

impl Loan {
    /// The index of the buffer lent (for diagnostics): one of the ring's
    /// `capacity + spare_buffers`. Only spares are lent, so a fresh ring lends its last ones.
    ///
    /// ```
    /// # use gpuring::Producer;
    /// let mut tx = Producer::builder("doc-loan-buffer").capacity(4).spare_buffers(2).create()?;
    /// let loan = tx.lend()?;
    /// assert!(loan.buffer() >= 4);
    /// tx.end_loan(loan)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn buffer(&self) -> usize {
        self.buffer
    }

    /// The sequence number it was published as, once it is.
    ///
    /// ```
    /// # use gpuring::Producer;
    /// let mut tx = Producer::builder("doc-loan-seq").create()?;
    /// let mut loan = tx.lend()?;
    /// assert_eq!(loan.seq(), None);
    /// tx.publish_loan(&mut loan, 0, b"")?;
    /// assert_eq!(loan.seq(), Some(0));
    /// tx.end_loan(loan)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn seq(&self) -> Option<u64> {
        self.seq
    }
}

impl<M: Memory> Producer<M> {
    /// Lends out a free spare buffer, waiting as long as it takes for consumers to release one
    /// (`LendError::AllLent` at once if every spare is lent or kept by a loan: only ending or
    /// publishing a loan would free one). In a CUDA ring it also waits, as `acquire` does, for the buffer's
    /// previous readers on their GPUs.
    ///
    /// ```
    /// use gpuring::{LendError, Producer};
    ///
    /// let mut tx = Producer::builder("doc-lend").spare_buffers(1).create()?;
    /// let loan = tx.lend()?;
    /// // The only spare is out, and only ending the loan would free it.
    /// assert_eq!(tx.lend().err(), Some(LendError::AllLent));
    /// tx.end_loan(loan)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn lend(&mut self) -> Result<Loan, LendError> {
        self.lend_until(Deadline::Never)
    }

    /// [`lend`](Self::lend), waiting at most `timeout` (`Duration::ZERO`: only if one is free
    /// now).
    ///
    /// ```
    /// use gpuring::{Consumer, LendError, Producer};
    /// use std::time::Duration;
    ///
    /// let mut tx = Producer::builder("doc-lend-timeout").capacity(1).spare_buffers(1).create()?;
    /// let rx = Consumer::open("doc-lend-timeout")?;
    /// tx.send(b"zero", b"")?;
    /// let held = rx.recv()?;
    /// tx.send(b"one", b"")?; // the held buffer becomes the spare
    /// assert_eq!(tx.lend_timeout(Duration::from_millis(5)).err(), Some(LendError::Timeout));
    /// drop(held);
    /// let loan = tx.lend_timeout(Duration::ZERO)?;
    /// tx.end_loan(loan)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn lend_timeout(&mut self, timeout: Duration) -> Result<Loan, LendError> {
        self.lend_until(Deadline::after(timeout))
    }

    /// The one lend: takes a spare (`ring::producer::ProducerCore::try_lend`), then waits for
    /// what was written to it and its readers, giving it back unwritten if that wait fails.
    fn lend_until(&mut self, deadline: Deadline) -> Result<Loan, LendError> {
        crate::error::check_context()?;
        if self.spare_buffers() == 0 {
            return Err(LendError::NoSpares);
        }
        let how = Waiter::Blocking(deadline);
        let claimed = match self.take_now(Want::Loan) {
            Some(claimed) => claimed?,
            None if !self.ring.may_lend() => return Err(LendError::AllLent),
            None => block_on(self.take_with(how, Want::Loan))?,
        };
        if let Err(e) = block_on(self.settle(how, claimed, None)) {
            self.ring.give_back(claimed.buffer, false);
            return Err(e.into());
        }
        Ok(Loan { buffer: claimed.buffer, ring: self.loan_owner(), seq: None })
    }

    /// Who lends: this producer's mapping and epoch.
    fn loan_owner(&self) -> (usize, u64) {
        (self.ring.map().payload(0) as usize, self.epoch())
    }

    /// Whether `loan` is this producer's.
    fn owns(&self, loan: &Loan) -> bool {
        loan.ring == self.loan_owner()
    }

    /// Where the loan's bytes are: a device address in a CUDA ring, their address in this
    /// process in a host ring. `slot_size` bytes from there are the loan's until it is
    /// published; after that they may be read (while the loan is not ended), not written.
    ///
    /// # Panics
    /// If the loan is another producer's.
    ///
    /// ```
    /// # use gpuring::Producer;
    /// let mut tx = Producer::builder("doc-loan-ptr").create()?;
    /// let loan = tx.lend()?;
    /// let ptr = tx.loan_ptr(&loan);
    /// assert_eq!(ptr, tx.loan_bytes(&loan).as_ptr() as u64);
    /// tx.end_loan(loan)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn loan_ptr(&self, loan: &Loan) -> u64 {
        assert!(self.owns(loan), "a loan of another producer");
        self.mem.buffer_addr(self.ring.map(), loan.buffer)
    }

    /// Publishes the first `len` bytes of `loan` with user header `header` as the next
    /// message, waiting (under `Block`) until every `Lossless` consumer has received the
    /// message it overwrites. Returns its sequence number. The loan stays kept (the buffer is
    /// not written again) until [`end_loan`](Self::end_loan).
    ///
    /// ```
    /// # use gpuring::{Consumer, Producer};
    /// let mut tx = Producer::builder("doc-publish-loan").create()?;
    /// let rx = Consumer::open("doc-publish-loan")?;
    /// let mut loan = tx.lend()?;
    /// tx.loan_bytes(&loan)[..5].copy_from_slice(b"hello");
    /// assert_eq!(tx.publish_loan(&mut loan, 5, b"text")?, 0);
    /// assert_eq!(&*rx.recv()?, b"hello");
    /// tx.end_loan(loan)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn publish_loan(
        &mut self,
        loan: &mut Loan,
        len: usize,
        header: &[u8],
    ) -> Result<u64, PublishLoanError> {
        self.publish_loan_until(loan, len, header, Deadline::Never)
    }

    /// [`publish_loan`](Self::publish_loan), waiting at most `timeout` for `Lossless`
    /// consumers.
    ///
    /// ```
    /// # use gpuring::{Consumer, Producer, PublishLoanError};
    /// # use std::time::Duration;
    /// let mut tx = Producer::builder("doc-publish-loan-timeout").capacity(1).create()?;
    /// let rx = Consumer::open("doc-publish-loan-timeout")?; // Lossless: reads nothing yet
    /// tx.send(b"unread", b"")?;
    /// let mut loan = tx.lend()?;
    /// let r = tx.publish_loan_timeout(&mut loan, 0, b"", Duration::from_millis(5));
    /// assert_eq!(r, Err(PublishLoanError::Timeout));
    /// tx.end_loan(loan)?; // given back unpublished
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn publish_loan_timeout(
        &mut self,
        loan: &mut Loan,
        len: usize,
        header: &[u8],
        timeout: Duration,
    ) -> Result<u64, PublishLoanError> {
        self.publish_loan_until(loan, len, header, Deadline::after(timeout))
    }

    /// The one loan publish: checks, the memory kind's records, the gate and swap
    /// (`ProducerCore::try_adopt`), then the ring's records, as a slot's publish makes them.
    fn publish_loan_until(
        &mut self,
        loan: &mut Loan,
        len: usize,
        header: &[u8],
        deadline: Deadline,
    ) -> Result<u64, PublishLoanError> {
        if !self.owns(loan) {
            return Err(PublishLoanError::Foreign);
        }
        if let Some(seq) = loan.seq {
            return Err(PublishLoanError::Published { seq });
        }
        if !self.ring.is_lent(loan.buffer) {
            // An unpublished loan's buffer is lent (the fields are private): not reached.
            return Err(PublishLoanError::Foreign);
        }
        if self.ring.is_claimed() {
            return Err(PublishLoanError::SlotClaimed);
        }
        let slot_size = self.slot_size();
        if len > slot_size {
            return Err(PublishError::TooLong { len, slot_size }.into());
        }
        let max = self.user_header_size();
        if header.len() > max {
            return Err(PublishError::HeaderTooLong { len: header.len(), max }.into());
        }
        crate::error::check_context()?;
        // The memory kind's records first (its fence and descriptor for `seq`): after the
        // adoption nothing may fail. Records of a publish that then times out are harmless: the
        // buffer stays lent, out of every consumer's reach, and is recorded again when it is
        // published.
        let seq = self.ring.published();
        let Producer { ring, mem } = &mut *self;
        mem.publish(ring.map(), loan.buffer, seq, None, None).map_err(PublishLoanError::from)?;
        let how = Waiter::Blocking(deadline);
        block_on(self.take_with(how, Want::Adopt(loan.buffer))).map_err(PublishLoanError::from)?;
        debug_assert_eq!(self.ring.published(), seq, "nothing publishes while we wait");
        self.ring.publish_claimed(loan.buffer, seq, len as u64, header);
        loan.seq = Some(seq);
        Ok(seq)
    }

    /// Ends `loan`: a published one's buffer may be written again once its readers let go;
    /// an unpublished one goes back to the spares, unpublished.
    ///
    /// ```
    /// # use gpuring::Producer;
    /// let mut tx = Producer::builder("doc-end-loan").spare_buffers(1).create()?;
    /// let loan = tx.lend()?;
    /// let buffer = loan.buffer();
    /// tx.end_loan(loan)?; // unpublished: a spare again
    /// let again = tx.lend()?;
    /// assert_eq!(again.buffer(), buffer);
    /// tx.end_loan(again)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn end_loan(&mut self, loan: Loan) -> Result<(), EndLoanError> {
        if !self.owns(&loan) {
            return Err(EndLoanError::Foreign);
        }
        match loan.seq {
            Some(_) => self.ring.end_kept(loan.buffer),
            None => self.ring.give_back(loan.buffer, true),
        }
        Ok(())
    }
}

impl Producer<Host> {
    /// The bytes of an unpublished loan (`slot_size` of them).
    ///
    /// # Panics
    /// If the loan is another producer's, or published (its bytes are the consumers' now).
    ///
    /// ```
    /// # use gpuring::Producer;
    /// let mut tx = Producer::builder("doc-loan-bytes").slot_size(1024).create()?;
    /// let loan = tx.lend()?;
    /// assert_eq!(tx.loan_bytes(&loan).len(), 1024);
    /// tx.end_loan(loan)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn loan_bytes(&mut self, loan: &Loan) -> &mut [u8] {
        assert!(self.owns(loan), "a loan of another producer");
        assert!(loan.seq.is_none(), "writing a published loan");
        assert!(self.ring.is_lent(loan.buffer), "an unpublished loan's buffer is lent");
        let map = self.ring.map();
        // SAFETY: the buffer is lent to `loan`, so no consumer reads it and the producer
        // writes it only through the loan; `&mut self` makes this the only reference we hand
        // out; it lies in the mapping.
        unsafe { std::slice::from_raw_parts_mut(map.payload(loan.buffer), map.slot_size()) }
    }
}
