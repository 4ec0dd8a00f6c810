//! The batcher's errors, one enum per operation: settings ([`BuildError`]) and a run
//! ([`RunError`]).

use std::fmt;

use super::table::BatchTable;
use crate::tensor::TensorHeader;
use crate::{CreateError, LendError, PublishLoanError};

/// Why [`BatcherBuilder::build`](super::BatcherBuilder::build) refused the settings.
///
/// ```
/// use gpuring::batch::{Batcher, BuildError};
/// let e = Batcher::builder("cams", &["cam0"]).spare_buffers(1).build().unwrap_err();
/// assert!(matches!(e, BuildError::TooFewSpares(1)));
/// println!("{e}"); // 1 spare buffers; a batcher needs 2 (...)
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum BuildError {
    /// No input ring was named.
    NoInputs,
    /// More inputs than a batch table holds.
    TooManyCameras(usize),
    /// An input ring named twice.
    DuplicateInput(String),
    /// Fewer than 2 spare buffers.
    TooFewSpares(u32),
    /// A capacity of 0.
    Capacity,
    /// A `Rate` period of 0, or a time (period or `max_wait`) over an hour.
    Timing,
    /// The frame has more dimensions than a batch's tensor header leaves it (one is K).
    FrameDims(usize),
    /// K frames of this shape are 0 bytes, or more than the address space.
    FrameSize,
}

impl fmt::Display for BuildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BuildError::NoInputs => write!(f, "a batcher needs at least one input ring"),
            BuildError::TooManyCameras(k) => {
                write!(f, "{k} inputs; a batch holds at most {}", BatchTable::MAX_CAMERAS)
            }
            BuildError::DuplicateInput(name) => write!(f, "input ring {name} is named twice"),
            BuildError::TooFewSpares(n) => write!(
                f,
                "{n} spare buffers; a batcher needs 2 (the batch it gathers and the one before)"
            ),
            BuildError::Capacity => write!(f, "a batch ring needs a capacity of at least 1"),
            BuildError::Timing => {
                write!(f, "a rate's period must be above 0, and no time over an hour")
            }
            BuildError::FrameDims(n) => write!(
                f,
                "the frame has {n} dimensions; with the batch's it may have at most {}",
                TensorHeader::MAX_DIMS - 1
            ),
            BuildError::FrameSize => write!(f, "a batch of these frames is 0 bytes or too large"),
        }
    }
}

impl std::error::Error for BuildError {}

/// Why [`Batcher::run`](super::Batcher::run) stopped before it was told to. A camera's
/// trouble is never one: its place says so ([`CameraState`](super::CameraState)).
///
/// ```no_run
/// use std::sync::atomic::AtomicBool;
/// use gpuring::batch::{Batcher, RunError};
/// let stop = AtomicBool::new(false);
/// match Batcher::builder("cams", &["cam0"]).build()?.run(&stop) {
///     Err(RunError::Create(e)) => eprintln!("another batcher runs? {e}"),
///     other => println!("{other:?}"),
/// }
/// # Ok::<(), gpuring::batch::BuildError>(())
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub enum RunError {
    /// The output ring could not be made.
    Create(CreateError),
    /// A batch buffer could not be lent.
    Lend(LendError),
    /// A batch could not be published.
    Publish(PublishLoanError),
    /// A thread could not be started.
    Thread(std::io::Error),
    /// A CUDA call failed: a copy, a fill, or ordering the publish after the copies.
    #[cfg(feature = "cuda")]
    Cuda(crate::cuda::CudaError),
}

impl fmt::Display for RunError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RunError::Create(e) => write!(f, "making the batch ring: {e}"),
            RunError::Lend(e) => write!(f, "lending a batch buffer: {e}"),
            RunError::Publish(e) => write!(f, "publishing a batch: {e}"),
            RunError::Thread(e) => write!(f, "starting a camera thread: {e}"),
            #[cfg(feature = "cuda")]
            RunError::Cuda(e) => write!(f, "batching in CUDA memory: {e}"),
        }
    }
}

impl std::error::Error for RunError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            RunError::Create(e) => Some(e),
            RunError::Lend(e) => Some(e),
            RunError::Publish(e) => Some(e),
            RunError::Thread(e) => Some(e),
            #[cfg(feature = "cuda")]
            RunError::Cuda(e) => Some(e),
        }
    }
}
