//! Arbitrary bytes as a VMM offer: byte 0 the number of fds received, bytes 1..9 the ring's
//! epoch, the rest the payload (`gpuring::testing::fuzzing::vmm_offer`, which checks what an
//! accepted offer must be and that it encodes back to its bytes).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    gpuring::testing::fuzzing::vmm_offer(data);
});
