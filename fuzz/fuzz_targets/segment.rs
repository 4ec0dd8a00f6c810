//! Arbitrary bytes as a ring segment: open it, receive, release, reclaim, claim, check CUDA
//! descriptors (`gpuring::testing::fuzzing::segment`). Errors are fine; a crash is a bug.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    gpuring::testing::fuzzing::segment(data);
});
