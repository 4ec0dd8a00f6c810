//! The header `gpuringsink` writes in each message's user header, and `gpuringsrc` reads: the
//! tensor header (`gpuring::tensor`) at byte 0, then the frame header at byte [`FRAME_AT`].
//! It is gpuring's own [`gpuring::frame`], pure data, so that other consumers (Rust, Python, C,
//! the batcher) read it without GStreamer; docs/gstreamer.md gives the layout.
//!
//! ```
//! use gstgpuring::header::{FrameHeader, USER_HEADER_SIZE};
//!
//! let mut frame = FrameHeader::new("RGBA", 320, 240);
//! frame.strides[0] = 320 * 4;
//! let mut header = [0u8; USER_HEADER_SIZE];
//! frame.write(&mut header);
//! assert_eq!(FrameHeader::read(&header), Ok(frame));
//! ```

pub use gpuring::frame::*;
