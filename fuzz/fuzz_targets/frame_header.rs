//! Arbitrary bytes as a message's user header read by `gpuringsrc`: the GStreamer frame header
//! (gst/src/header.rs, pure data, compiled here without GStreamer). A header that reads must
//! write back to bytes that read equal, leave the bytes outside the frame header alone, and
//! write the same bytes again.
#![no_main]

#[allow(dead_code)]
#[path = "../../gst/src/header.rs"]
mod header;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    header::fuzz_check(data);
});
