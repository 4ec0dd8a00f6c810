//! What goes wrong inside an operation, before it is told as that operation's own error (one
//! error type per operation, `crate::error`).

use crate::error::{
    AcquireError, AcquireTimeoutError, ContextLost, Corruption, LendError, PublishLoanError,
    RecvError, RecvTimeoutError, SendError, TryAcquireError, TryRecvError,
};

/// A failure inside an operation of either side.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Fault {
    /// Not ready yet (no free slot, no message): the caller waits, or gives up when it may not.
    Blocked,
    /// Consumers only: the producer closed or died, and every message it published was
    /// received.
    Disconnected,
    /// The segment is damaged.
    Corrupt(Corruption),
    /// This process's GPU context is lost.
    ContextLost(ContextLost),
    /// A CUDA call failed.
    #[cfg(feature = "cuda")]
    Cuda(crate::cuda::CudaError),
}

impl From<Corruption> for Fault {
    fn from(c: Corruption) -> Self {
        Fault::Corrupt(c)
    }
}

impl From<ContextLost> for Fault {
    fn from(l: ContextLost) -> Self {
        Fault::ContextLost(l)
    }
}

/// A CUDA error that lost the context is [`Fault::ContextLost`].
#[cfg(feature = "cuda")]
impl From<crate::cuda::CudaError> for Fault {
    fn from(e: crate::cuda::CudaError) -> Self {
        match e {
            crate::cuda::CudaError::Driver(d) if d.loses_process_context() => {
                Fault::ContextLost(d.into())
            }
            e => Fault::Cuda(e),
        }
    }
}

#[cfg(feature = "cuda")]
impl From<crate::cuda::DriverError> for Fault {
    fn from(e: crate::cuda::DriverError) -> Self {
        crate::cuda::CudaError::from(e).into()
    }
}

/// Each operation's error from a [`Fault`]: what the operation calls `Blocked` (`Full`,
/// `Timeout`, `Empty`) and `Disconnected`. An operation that cannot meet one of them says why in
/// place of a variant: a wait without a deadline never gives up (`wait::wait_until` returns only
/// with a result), and only consumers are disconnected.
macro_rules! told_as {
    ($ty:ident, blocked: $blocked:expr, disconnected: $disconnected:expr) => {
        impl From<Fault> for $ty {
            fn from(f: Fault) -> Self {
                match f {
                    Fault::Blocked => $blocked,
                    Fault::Disconnected => $disconnected,
                    Fault::Corrupt(c) => $ty::Corrupt(c),
                    Fault::ContextLost(l) => $ty::ContextLost(l),
                    #[cfg(feature = "cuda")]
                    Fault::Cuda(e) => $ty::Cuda(e),
                }
            }
        }
    };
}

const NO_DEADLINE: &str = "a wait without a deadline does not give up";
const PRODUCER: &str = "a producer is never disconnected";

told_as!(TryAcquireError, blocked: TryAcquireError::Full, disconnected: unreachable!("{PRODUCER}"));
told_as!(
    AcquireTimeoutError,
    blocked: AcquireTimeoutError::Timeout,
    disconnected: unreachable!("{PRODUCER}")
);
told_as!(LendError, blocked: LendError::Timeout, disconnected: unreachable!("{PRODUCER}"));
told_as!(
    PublishLoanError,
    blocked: PublishLoanError::Timeout,
    disconnected: unreachable!("{PRODUCER}")
);
told_as!(AcquireError, blocked: unreachable!("{NO_DEADLINE}"), disconnected: unreachable!("{PRODUCER}"));
told_as!(SendError, blocked: unreachable!("{NO_DEADLINE}"), disconnected: unreachable!("{PRODUCER}"));
told_as!(TryRecvError, blocked: TryRecvError::Empty, disconnected: TryRecvError::Disconnected);
told_as!(
    RecvTimeoutError,
    blocked: RecvTimeoutError::Timeout,
    disconnected: RecvTimeoutError::Disconnected
);
told_as!(RecvError, blocked: unreachable!("{NO_DEADLINE}"), disconnected: RecvError::Disconnected);
