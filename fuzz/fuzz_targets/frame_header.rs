//! Arbitrary bytes as a message's user header read by `gpuringsrc`: the GStreamer frame header
//! (gpuring::frame, pure data). A header that reads must
//! write back to bytes that read equal, leave the bytes outside the frame header alone, and
//! write the same bytes again.
#![no_main]

use gpuring::frame as header;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    header::fuzz_check(data);
});
