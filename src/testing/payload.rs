//! The test pattern ([`super::pattern`]) written into slots and checked in messages, for every
//! memory kind: on the CPU in host memory, by kernels on the slot's or message's stream in CUDA
//! memory. What the conformance suite, the `gpuring bench` and `doctor` commands and the soak
//! example share, so that each of them is written once, generic over the memory kind. (The
//! pipeline example has its own copy, examples/common/, so that it needs no feature.)

use crate::consumer::{Consumer, ReadSlot};
use crate::memory::{Host, Memory};
use crate::producer::{Producer, WriteSlot};

/// Why writing or checking a payload failed (a CUDA error; host memory never fails).
pub type PayloadError = Box<dyn std::error::Error + Send + Sync>;

/// How a memory kind's payloads are written and checked.
///
/// ```
/// use gpuring::testing::payload::Payload;
/// use gpuring::{Consumer, Host, Producer};
///
/// let mut tx = Producer::builder("doc-testing-payload").create()?;
/// let rx = Consumer::open("doc-testing-payload")?;
/// let w = Host::writer(&tx)?;
/// let mut slot = tx.acquire()?;
/// Host::fill(&w, &mut slot, 100, 0)?;
/// slot.publish(100, b"")?;
/// let c = Host::checker(&rx)?;
/// Host::check(&c, &rx.recv()?)?;
/// assert_eq!(Host::mismatches(&c, &rx)?, 0);
/// # Ok::<(), Box<dyn std::error::Error + Send + Sync>>(())
/// ```
pub trait Payload: Memory {
    /// What a producer needs to write payloads (CUDA: the fill kernel).
    type Writer;
    /// What a consumer needs to check payloads, and the mismatches counted so far.
    type Checker;

    /// Makes the writer for `tx`'s ring.
    fn writer(tx: &Producer<Self>) -> Result<Self::Writer, PayloadError>;

    /// Writes message `seq`'s pattern into the first `len` bytes of `slot` (CUDA: queued on
    /// the slot's stream, which the publish's ready event follows).
    fn fill(
        w: &Self::Writer,
        slot: &mut WriteSlot<'_, Self>,
        len: usize,
        seq: u64,
    ) -> Result<(), PayloadError>;

    /// Makes the checker for `rx`.
    fn checker(rx: &Consumer<Self>) -> Result<Self::Checker, PayloadError>;

    /// Checks `m`'s payload against its sequence number's pattern (CUDA: queued on its stream,
    /// before its release).
    fn check(c: &Self::Checker, m: &ReadSlot<'_, Self>) -> Result<(), PayloadError>;

    /// Mismatching bytes over every message checked so far (CUDA: waits for the checks).
    fn mismatches(c: &Self::Checker, rx: &Consumer<Self>) -> Result<u64, PayloadError>;
}

impl Payload for Host {
    type Writer = ();
    type Checker = std::cell::Cell<u64>;

    fn writer(_: &Producer) -> Result<(), PayloadError> {
        Ok(())
    }

    fn fill(_: &(), slot: &mut WriteSlot<'_>, len: usize, seq: u64) -> Result<(), PayloadError> {
        super::pattern::fill(&mut slot[..len], seq);
        Ok(())
    }

    fn checker(_: &Consumer) -> Result<std::cell::Cell<u64>, PayloadError> {
        Ok(Default::default())
    }

    fn check(bad: &std::cell::Cell<u64>, m: &ReadSlot<'_>) -> Result<(), PayloadError> {
        bad.set(bad.get() + super::pattern::mismatches(m, m.seq()));
        Ok(())
    }

    fn mismatches(bad: &std::cell::Cell<u64>, _: &Consumer) -> Result<u64, PayloadError> {
        Ok(bad.get())
    }
}

#[cfg(feature = "cuda")]
pub use cuda::CudaChecker;

#[cfg(feature = "cuda")]
mod cuda {
    use std::sync::Arc;

    use super::{Payload, PayloadError};
    use crate::consumer::{Consumer, ReadSlot};
    use crate::memory::Cuda;
    use crate::producer::{Producer, WriteSlot};
    use crate::testing::kernels::{MismatchCounter, PatternKernels};

    /// A CUDA consumer's check kernels and the device counter they add mismatches to.
    pub struct CudaChecker {
        k: Arc<PatternKernels>,
        bad: MismatchCounter,
    }

    impl CudaChecker {
        /// [`Payload::check`], with a kernel that spins `spin_ns` on the GPU before it reads:
        /// work still running when the consumer releases the message, or dies.
        pub fn check_spinning(
            &self,
            m: &ReadSlot<'_, Cuda>,
            spin_ns: u64,
        ) -> Result<(), PayloadError> {
            let (k, bad) = (&self.k, self.bad.ptr());
            // SAFETY: the message's `len` bytes at `ptr` (a descriptor checked when it was
            // received) stay readable on its stream until the release that dropping or
            // releasing `m` records after this kernel; `bad` is a device u64 of this context.
            unsafe { k.check(m.stream(), m.ptr(), m.len() as u64, m.seq(), bad, spin_ns) }?;
            Ok(())
        }
    }

    impl Payload for Cuda {
        type Writer = Arc<PatternKernels>;
        type Checker = CudaChecker;

        fn writer(tx: &Producer<Cuda>) -> Result<Arc<PatternKernels>, PayloadError> {
            Ok(PatternKernels::get(tx.context())?)
        }

        fn fill(
            k: &Arc<PatternKernels>,
            slot: &mut WriteSlot<'_, Cuda>,
            len: usize,
            seq: u64,
        ) -> Result<(), PayloadError> {
            if len > slot.capacity() {
                return Err(format!("{len} bytes do not fit a slot of {}", slot.capacity()).into());
            }
            // SAFETY: the slot holds `capacity() >= len` bytes at a SLOT_ALIGN-aligned address
            // and is ours until published; the fill is queued on the slot's stream, which the
            // publish's ready event follows.
            unsafe { k.fill(slot.stream(), slot.ptr(), len as u64, seq) }?;
            Ok(())
        }

        fn checker(rx: &Consumer<Cuda>) -> Result<CudaChecker, PayloadError> {
            let k = PatternKernels::get(rx.context())?;
            let bad = MismatchCounter::new(rx.stream())?;
            Ok(CudaChecker { k, bad })
        }

        fn check(c: &CudaChecker, m: &ReadSlot<'_, Cuda>) -> Result<(), PayloadError> {
            c.check_spinning(m, 0)
        }

        fn mismatches(c: &CudaChecker, _: &Consumer<Cuda>) -> Result<u64, PayloadError> {
            Ok(c.bad.read()?)
        }
    }
}
