//! The header `gpuringsink` writes in each message's user header, and `gpuringsrc` reads: the
//! tensor header (`gpuring::tensor`) at byte 0, then a GStreamer frame header at byte
//! [`FRAME_AT`]. Pure data, no GStreamer types, so other consumers (Rust, Python, C) can read
//! it; docs/gstreamer.md gives the layout.
//!
//! ```
//! use gstgpuring::header::{FrameHeader, USER_HEADER_SIZE};
//!
//! let mut frame = FrameHeader::new("RGBA", 320, 240);
//! frame.planes = 1;
//! frame.strides[0] = 320 * 4;
//! frame.pts = Some(40_000_000);
//! let mut header = [0u8; USER_HEADER_SIZE];
//! frame.write(&mut header);
//! assert_eq!(FrameHeader::read(&header), Ok(frame));
//! ```

use std::fmt;

/// Bytes of user header a `gpuringsink` ring has: the tensor header's room, then the frame
/// header.
pub const USER_HEADER_SIZE: usize = 256;
/// Where the frame header starts in the user header (the tensor header's room is before it).
pub const FRAME_AT: usize = 64;
/// The frame header's first bytes.
pub const MAGIC: [u8; 4] = *b"GRGS";
/// The layout version this code writes and reads.
pub const VERSION: u16 = 1;
/// Planes a video frame has at most (GStreamer's `GST_VIDEO_MAX_PLANES`).
pub const MAX_PLANES: usize = 4;
/// The encoded length of a frame header.
pub const FRAME_LEN: usize = 192;

/// A video frame's description: what the caps say, where each plane is in the message, and
/// the buffer's timing and flags. Times are nanoseconds, `None` where GStreamer has none.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FrameHeader {
    /// GStreamer's name of the pixel format ("RGBA", "NV12", "I420"...), at most 16 bytes.
    pub format: String,
    /// Pixels.
    pub width: u32,
    /// Pixels.
    pub height: u32,
    /// Frame rate, numerator and denominator (0/1: variable or unknown).
    pub fps: (i32, i32),
    /// Pixel aspect ratio.
    pub par: (i32, i32),
    /// GStreamer's colorimetry string ("bt709", "sRGB"...), at most 32 bytes; empty if unset.
    pub colorimetry: String,
    /// Planes used, 1..=4.
    pub planes: u32,
    /// Byte offset of each plane from the message's start.
    pub offsets: [u64; MAX_PLANES],
    /// Bytes from one row's start to the next, per plane.
    pub strides: [u32; MAX_PLANES],
    /// Presentation time.
    pub pts: Option<u64>,
    /// Decoding time.
    pub dts: Option<u64>,
    /// Duration.
    pub duration: Option<u64>,
    /// The buffer's offset: the frame number, for sources that count frames (`videotestsrc`,
    /// decoders); `None` if unset.
    pub offset: Option<u64>,
    /// `GstBufferFlags` bits (DELTA_UNIT, DISCONT, ...).
    pub flags: u32,
}

/// Why a user header does not hold a frame header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FrameHeaderError {
    /// Shorter than [`FRAME_AT`] + [`FRAME_LEN`].
    TooShort(usize),
    /// No frame header: the ring was not written by `gpuringsink` (or another writer of it).
    NoMagic,
    /// A version this code does not read.
    Version(u16),
    /// A field out of range (the name of the field).
    Invalid(&'static str),
}

impl fmt::Display for FrameHeaderError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FrameHeaderError::TooShort(n) => write!(
                f,
                "the user header is {n} bytes; a frame header needs {}",
                FRAME_AT + FRAME_LEN
            ),
            FrameHeaderError::NoMagic => {
                write!(f, "the message has no GStreamer frame header (not written by gpuringsink)")
            }
            FrameHeaderError::Version(v) => {
                write!(f, "frame header version {v}; this build reads version {VERSION}")
            }
            FrameHeaderError::Invalid(field) => write!(f, "frame header field {field} is invalid"),
        }
    }
}

impl std::error::Error for FrameHeaderError {}

const NONE: u64 = u64::MAX;

impl FrameHeader {
    /// A header for a `width` × `height` frame of `format`, with nothing else set.
    ///
    /// ```
    /// let h = gstgpuring::header::FrameHeader::new("NV12", 1920, 1080);
    /// assert_eq!(h.fps, (0, 1));
    /// ```
    pub fn new(format: &str, width: u32, height: u32) -> FrameHeader {
        FrameHeader {
            format: format.to_owned(),
            width,
            height,
            fps: (0, 1),
            par: (1, 1),
            colorimetry: String::new(),
            planes: 1,
            offsets: [0; MAX_PLANES],
            strides: [0; MAX_PLANES],
            pts: None,
            dts: None,
            duration: None,
            offset: None,
            flags: 0,
        }
    }

    /// Writes the frame header at [`FRAME_AT`] of `user_header` (the tensor header's room
    /// before it is left as it is). Names longer than their field are cut.
    ///
    /// # Panics
    /// If `user_header` is shorter than [`USER_HEADER_SIZE`].
    ///
    /// ```
    /// # use gstgpuring::header::{FrameHeader, USER_HEADER_SIZE, FRAME_AT};
    /// let mut buf = [0u8; USER_HEADER_SIZE];
    /// FrameHeader::new("GRAY8", 8, 8).write(&mut buf);
    /// assert_eq!(&buf[FRAME_AT..FRAME_AT + 4], b"GRGS");
    /// ```
    pub fn write(&self, user_header: &mut [u8]) {
        let b = &mut user_header[FRAME_AT..FRAME_AT + FRAME_LEN];
        b.fill(0);
        b[0..4].copy_from_slice(&MAGIC);
        b[4..6].copy_from_slice(&VERSION.to_le_bytes());
        b[6..8].copy_from_slice(&(self.planes as u16).to_le_bytes());
        put_str(&mut b[8..24], &self.format);
        b[24..28].copy_from_slice(&self.width.to_le_bytes());
        b[28..32].copy_from_slice(&self.height.to_le_bytes());
        let ints = [self.fps.0, self.fps.1, self.par.0, self.par.1];
        for (i, v) in ints.iter().enumerate() {
            b[32 + 4 * i..36 + 4 * i].copy_from_slice(&v.to_le_bytes());
        }
        for p in 0..MAX_PLANES {
            b[48 + 8 * p..56 + 8 * p].copy_from_slice(&self.offsets[p].to_le_bytes());
            b[80 + 4 * p..84 + 4 * p].copy_from_slice(&self.strides[p].to_le_bytes());
        }
        let times = [self.pts, self.dts, self.duration, self.offset];
        for (i, t) in times.iter().enumerate() {
            b[96 + 8 * i..104 + 8 * i].copy_from_slice(&t.unwrap_or(NONE).to_le_bytes());
        }
        b[128..132].copy_from_slice(&self.flags.to_le_bytes());
        put_str(&mut b[132..164], &self.colorimetry);
    }

    /// Reads the frame header of a message's user header, checking every field.
    ///
    /// ```
    /// # use gstgpuring::header::{FrameHeader, FrameHeaderError};
    /// assert_eq!(FrameHeader::read(&[0u8; 256]), Err(FrameHeaderError::NoMagic));
    /// ```
    pub fn read(user_header: &[u8]) -> Result<FrameHeader, FrameHeaderError> {
        if user_header.len() < FRAME_AT + FRAME_LEN {
            return Err(FrameHeaderError::TooShort(user_header.len()));
        }
        let b = &user_header[FRAME_AT..FRAME_AT + FRAME_LEN];
        if b[0..4] != MAGIC {
            return Err(FrameHeaderError::NoMagic);
        }
        let version = u16::from_le_bytes([b[4], b[5]]);
        if version != VERSION {
            return Err(FrameHeaderError::Version(version));
        }
        let u32_at = |at: usize| u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"));
        let u64_at = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"));
        let time_at = |at: usize| Some(u64_at(at)).filter(|&t| t != NONE);
        let planes = u32::from(u16::from_le_bytes([b[6], b[7]]));
        if planes == 0 || planes as usize > MAX_PLANES {
            return Err(FrameHeaderError::Invalid("planes"));
        }
        let format = get_str(&b[8..24]).ok_or(FrameHeaderError::Invalid("format"))?;
        let colorimetry = get_str(&b[132..164]).ok_or(FrameHeaderError::Invalid("colorimetry"))?;
        let (width, height) = (u32_at(24), u32_at(28));
        if width == 0 || height == 0 || format.is_empty() {
            return Err(FrameHeaderError::Invalid("size"));
        }
        let int = |at: usize| u32_at(at) as i32;
        Ok(FrameHeader {
            format,
            width,
            height,
            fps: (int(32), int(36)),
            par: (int(40), int(44)),
            colorimetry,
            planes,
            offsets: std::array::from_fn(|p| u64_at(48 + 8 * p)),
            strides: std::array::from_fn(|p| u32_at(80 + 4 * p)),
            pts: time_at(96),
            dts: time_at(104),
            duration: time_at(112),
            offset: time_at(120),
            flags: u32_at(128),
        })
    }
}

/// `s`, NUL-padded (and cut) to the field's length.
fn put_str(field: &mut [u8], s: &str) {
    let n = s.len().min(field.len());
    field[..n].copy_from_slice(&s.as_bytes()[..n]);
}

/// The NUL-padded ASCII string in `field`, or None if it is not printable ASCII.
fn get_str(field: &[u8]) -> Option<String> {
    let end = field.iter().position(|&c| c == 0).unwrap_or(field.len());
    let s = &field[..end];
    s.iter().all(|c| c.is_ascii_graphic()).then(|| String::from_utf8_lossy(s).into_owned())
}

/// The `frame_header` fuzz target's checks of arbitrary bytes `data` (fuzz/, and its replay in
/// gst/tests/frame_header_replay.rs): a header that reads writes back to bytes that read equal,
/// leaves the bytes outside the frame header alone, and writes the same bytes again. Returns
/// whether `data` read as a header.
#[doc(hidden)]
pub fn fuzz_check(data: &[u8]) -> bool {
    let Ok(frame) = FrameHeader::read(data) else { return false };
    let mut written = data.to_vec();
    frame.write(&mut written);
    assert_eq!(FrameHeader::read(&written).as_ref(), Ok(&frame), "what reads writes back");
    let end = FRAME_AT + FRAME_LEN;
    assert_eq!(written[..FRAME_AT], data[..FRAME_AT], "the tensor header's room is kept");
    assert_eq!(written[end..], data[end..], "bytes after the frame header are kept");
    let mut again = written.clone();
    frame.write(&mut again);
    assert_eq!(again, written, "writing is deterministic");
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_every_field() {
        let mut h = FrameHeader::new("NV12", 1920, 1080);
        h.fps = (30000, 1001);
        h.par = (4, 3);
        h.colorimetry = "bt709".into();
        h.planes = 2;
        h.offsets = [0, 2_088_960, 0, 0];
        h.strides = [2048, 2048, 0, 0];
        h.pts = Some(1);
        h.dts = Some(0);
        h.duration = Some(33_366_666);
        h.offset = Some(7);
        h.flags = 0x2000;
        let mut buf = [0xAAu8; USER_HEADER_SIZE];
        h.write(&mut buf);
        assert_eq!(FrameHeader::read(&buf), Ok(h));
        assert_eq!(buf[0], 0xAA, "the tensor header's room is left alone");
    }

    #[test]
    fn refuses_what_it_cannot_read() {
        let mut buf = [0u8; USER_HEADER_SIZE];
        FrameHeader::new("RGBA", 4, 4).write(&mut buf);
        assert_eq!(FrameHeader::read(&buf[..100]), Err(FrameHeaderError::TooShort(100)));
        let mut v2 = buf;
        v2[FRAME_AT + 4] = 2;
        assert_eq!(FrameHeader::read(&v2), Err(FrameHeaderError::Version(2)));
        let mut planes = buf;
        planes[FRAME_AT + 6] = 5;
        assert_eq!(FrameHeader::read(&planes), Err(FrameHeaderError::Invalid("planes")));
        let mut name = buf;
        name[FRAME_AT + 9] = 0x07;
        assert_eq!(FrameHeader::read(&name), Err(FrameHeaderError::Invalid("format")));
        let mut zero = buf;
        zero[FRAME_AT + 24..FRAME_AT + 28].fill(0);
        assert_eq!(FrameHeader::read(&zero), Err(FrameHeaderError::Invalid("size")));
    }
}
