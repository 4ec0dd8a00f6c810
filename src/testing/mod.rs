//! Test and bench support (feature `test-support`, which the `cli` feature turns on for the
//! `gpuring bench` command): not part of the supported API. It is not a default feature, so
//! libraries that depend on gpuring do not get this module.
//!
//! * [`pattern`]: the deterministic payload that tests, examples and benches write and check.
//! * [`kernels`] (feature `cuda`): the same pattern written and checked on the GPU, and the
//!   bench's busy kernels, compiled at run time by NVRTC.
//! * [`payload`]: the pattern written and checked for every memory kind, one trait.
//! * [`fuzzing`]: the entry points of the fuzz targets in `fuzz/`.

#[cfg(not(loom))]
pub mod fuzzing;
#[cfg(all(feature = "cuda", not(loom)))]
pub mod kernels;
pub mod pattern;
#[cfg(not(loom))]
pub mod payload;

/// How this process's async waits (feature `tokio`) that found something ended: woken by a
/// doorbell's knock, or by their timer. With doorbells that work, a stream of messages is
/// delivered by knocks alone; timer wakes that deliver mean knocks did not arrive (a peer that
/// cannot reach the doorbell).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AsyncWakes {
    /// Waits ended by a knock.
    pub doorbell: u64,
    /// Waits with a doorbell ended by their timer.
    pub timer: u64,
}

/// This process's [`AsyncWakes`] so far.
#[cfg(all(feature = "tokio", not(loom)))]
pub fn async_wakes() -> AsyncWakes {
    use std::sync::atomic::Ordering;
    // Relaxed: counters read for a test's assertions, after the waits they count.
    AsyncWakes {
        doorbell: crate::shm::wait_async::DOORBELL_WAKES.load(Ordering::Relaxed),
        timer: crate::shm::wait_async::TIMER_WAKES.load(Ordering::Relaxed),
    }
}
