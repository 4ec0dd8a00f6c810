//! Arbitrary bytes as a message's user header read by `gpuringsrc`: the GStreamer frame header
//! (gst/src/header.rs, pure data, compiled here without GStreamer). A header that reads must
//! write back to bytes that read equal, leave the bytes outside the frame header alone, and
//! write the same bytes again.
#![no_main]

#[allow(dead_code)]
#[path = "../../gst/src/header.rs"]
mod header;

use header::{FrameHeader, FRAME_AT, FRAME_LEN};

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Ok(frame) = FrameHeader::read(data) else { return };
    let mut written = data.to_vec();
    frame.write(&mut written);
    assert_eq!(FrameHeader::read(&written).as_ref(), Ok(&frame), "what reads writes back");
    let end = FRAME_AT + FRAME_LEN;
    assert_eq!(written[..FRAME_AT], data[..FRAME_AT], "the tensor header's room is kept");
    assert_eq!(written[end..], data[end..], "bytes after the frame header are kept");
    let mut again = written.clone();
    frame.write(&mut again);
    assert_eq!(again, written, "writing is deterministic");
});
