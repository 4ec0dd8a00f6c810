//! Arbitrary bytes as a received bridge message: bytes 0..4 the payload's length, the rest the
//! attachment, decoded as a message header and as an acknowledgement, then the importer's
//! geometry and allocation checks (`gpuring::testing::fuzzing::bridge_message`). Errors are
//! fine; a crash is a bug.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    gpuring::testing::fuzzing::bridge_message(data);
});
