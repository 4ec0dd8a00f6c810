//! Test and bench support (feature `test-support`, which the `cli` feature turns on for the
//! `gpuring bench` command): not part of the supported API. Libraries that embed gpuring build
//! it with `default-features = false, features = ["cuda"]` and do not get this module.
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
