//! The errors of loans ([`crate::Producer::lend`] and what follows it).

use std::fmt;

use super::{ContextLost, Corruption, PublishError};

/// Why [`Producer::lend`](crate::Producer::lend) or
/// [`lend_timeout`](crate::Producer::lend_timeout) lent no buffer.
///
/// ```
/// use gpuring::{LendError, Producer};
/// use std::time::Duration;
///
/// let mut tx = Producer::builder("doc-error-lend-error").spare_buffers(0).create()?;
/// assert_eq!(tx.lend_timeout(Duration::ZERO).err(), Some(LendError::NoSpares));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[non_exhaustive]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LendError {
    /// The ring has no spare buffers, and only spares are lent
    /// ([`ProducerBuilder::spare_buffers`](crate::ProducerBuilder::spare_buffers)).
    NoSpares,
    /// Every spare is lent or kept by a loan not yet ended: only ending one (or publishing a
    /// lent one, which makes the buffer it replaces a spare) frees a buffer, so a wait would
    /// last for ever.
    AllLent,
    /// `lend_timeout`: every free spare stayed held by consumers (in a CUDA ring, or read by
    /// their GPUs).
    Timeout,
    /// The segment is damaged.
    Corrupt(Corruption),
    /// This process's GPU context is lost: it must exit and be restarted.
    ContextLost(ContextLost),
    /// A CUDA call failed (CUDA rings).
    #[cfg(all(feature = "cuda", not(loom)))]
    Cuda(crate::cuda::CudaError),
}

/// Why [`Producer::publish_loan`](crate::Producer::publish_loan) or
/// [`publish_loan_timeout`](crate::Producer::publish_loan_timeout) did not publish. The loan
/// stays the borrower's, unpublished (end it, or try again).
///
/// ```
/// use gpuring::{Producer, PublishError, PublishLoanError};
///
/// let mut tx = Producer::builder("doc-error-publish-loan-error").slot_size(16).create()?;
/// let mut loan = tx.lend()?;
/// let err = tx.publish_loan(&mut loan, 17, b"").unwrap_err();
/// assert_eq!(err, PublishLoanError::Publish(PublishError::TooLong { len: 17, slot_size: 16 }));
/// tx.end_loan(loan)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[non_exhaustive]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PublishLoanError {
    /// The loan is another producer's.
    Foreign,
    /// The loan was published already, as message `seq`.
    Published {
        /// Its sequence number.
        seq: u64,
    },
    /// A slot from `acquire` was dropped unpublished, so the next message is claimed: publish
    /// it (acquire returns it again) before a loan.
    SlotClaimed,
    /// `publish_loan_timeout`: a `Lossless` consumer had not yet received the message the
    /// next one overwrites.
    Timeout,
    /// The message or its header does not fit.
    Publish(PublishError),
    /// The segment is damaged.
    Corrupt(Corruption),
    /// This process's GPU context is lost: it must exit and be restarted.
    ContextLost(ContextLost),
    /// A CUDA call failed (CUDA rings).
    #[cfg(all(feature = "cuda", not(loom)))]
    Cuda(crate::cuda::CudaError),
}

/// Why [`Producer::end_loan`](crate::Producer::end_loan) refused a loan.
///
/// ```
/// use gpuring::{EndLoanError, Producer};
///
/// let mut a = Producer::builder("doc-error-end-loan-a").create()?;
/// let mut b = Producer::builder("doc-error-end-loan-b").create()?;
/// let loan = a.lend()?;
/// assert_eq!(b.end_loan(loan), Err(EndLoanError::Foreign));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[non_exhaustive]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EndLoanError {
    /// The loan is another producer's.
    Foreign,
}

/// A publish's error as a loan's: a lost context is its own `ContextLost`, the rest `Publish`.
impl From<PublishError> for PublishLoanError {
    fn from(e: PublishError) -> Self {
        match e {
            PublishError::ContextLost(l) => PublishLoanError::ContextLost(l),
            e => PublishLoanError::Publish(e),
        }
    }
}

display!(LendError {
    LendError::NoSpares => "the ring has no spare buffers to lend";
    LendError::AllLent => "every spare buffer is lent or kept by a loan not yet ended";
    LendError::Timeout => "timed out waiting for a spare buffer to lend";
    LendError::Corrupt(c) => "corrupt segment: {}", c;
});
display!(PublishLoanError {
    PublishLoanError::Foreign => "the loan is another producer's";
    PublishLoanError::Published { seq } => "the loan was published already, as message {}", seq;
    PublishLoanError::SlotClaimed => "a slot from acquire is claimed and unpublished: publish it first";
    PublishLoanError::Timeout => "timed out waiting for lossless consumers";
    PublishLoanError::Publish(e) => "{}", e;
    PublishLoanError::Corrupt(c) => "corrupt segment: {}", c;
});

impl fmt::Display for EndLoanError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EndLoanError::Foreign => f.write_str("the loan is another producer's"),
        }
    }
}

impl std::error::Error for EndLoanError {}
