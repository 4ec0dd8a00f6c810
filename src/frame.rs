//! The frame header: a video frame's description (pixel format, size, where each plane is and
//! its stride, timing), in a message's user header after the tensor header. `gpuringsink`
//! writes it and `gpuringsrc` reads it (docs/gstreamer.md gives the layout); the batcher packs
//! the planes it describes ([`FrameHeader::planes`]). Pure data, so any consumer (Rust, Python,
//! C) can read it.
//!
//! ```
//! use gpuring::frame::{FrameHeader, USER_HEADER_SIZE};
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

use crate::tensor::{DType, TensorHeader};

/// Bytes of user header a `gpuringsink` ring has: the tensor header's room, then the frame
/// header.
///
/// ```
/// use gpuring::frame::{FRAME_AT, FRAME_LEN, USER_HEADER_SIZE};
/// assert_eq!(USER_HEADER_SIZE, FRAME_AT + FRAME_LEN);
/// ```
pub const USER_HEADER_SIZE: usize = 256;
/// Where the frame header starts in the user header (the tensor header's room is before it).
///
/// ```
/// use gpuring::frame::{FrameHeader, FRAME_AT, MAGIC, USER_HEADER_SIZE};
/// let mut h = [0u8; USER_HEADER_SIZE];
/// FrameHeader::new("RGB", 4, 4).write(&mut h);
/// assert_eq!(h[FRAME_AT..FRAME_AT + 4], MAGIC);
/// ```
pub const FRAME_AT: usize = 64;
/// The frame header's first bytes.
///
/// ```
/// assert_eq!(&gpuring::frame::MAGIC, b"GRGS");
/// ```
pub const MAGIC: [u8; 4] = *b"GRGS";
/// The layout version this code writes and reads.
///
/// ```
/// assert_eq!(gpuring::frame::VERSION, 1);
/// ```
pub const VERSION: u16 = 1;
/// Planes a video frame has at most (GStreamer's `GST_VIDEO_MAX_PLANES`).
///
/// ```
/// let h = gpuring::frame::FrameHeader::new("I420", 64, 64);
/// assert_eq!(h.offsets.len(), gpuring::frame::MAX_PLANES);
/// ```
pub const MAX_PLANES: usize = 4;
/// The encoded length of a frame header.
///
/// ```
/// assert_eq!(gpuring::frame::FRAME_LEN, 192);
/// ```
pub const FRAME_LEN: usize = 192;

/// A video frame's description: what the caps say, where each plane is in the message, and
/// the buffer's timing and flags. Times are nanoseconds, `None` where GStreamer has none.
///
/// ```
/// use gpuring::frame::{FrameHeader, USER_HEADER_SIZE};
/// let mut nv12 = FrameHeader::new("NV12", 1920, 1080);
/// nv12.planes = 2;
/// nv12.strides = [2048, 2048, 0, 0]; // a decoder's pitch
/// nv12.offsets = [0, 2048 * 1088, 0, 0];
/// let mut header = [0u8; USER_HEADER_SIZE];
/// nv12.write(&mut header);
/// assert_eq!(FrameHeader::read(&header)?.strides[0], 2048);
/// # Ok::<(), gpuring::frame::FrameHeaderError>(())
/// ```
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
///
/// ```
/// use gpuring::frame::{FrameHeader, FrameHeaderError};
/// assert_eq!(FrameHeader::read(&[0u8; 16]), Err(FrameHeaderError::TooShort(16)));
/// ```
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
    /// let h = gpuring::frame::FrameHeader::new("NV12", 1920, 1080);
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
    /// # use gpuring::frame::{FrameHeader, USER_HEADER_SIZE, FRAME_AT};
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
    /// # use gpuring::frame::{FrameHeader, FrameHeaderError};
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

/// One plane of a frame as it lies in a message: where its first row starts, the bytes from
/// one row's start to the next, the bytes of pixels in a row (the rest of a stride is padding)
/// and its rows.
///
/// ```
/// use gpuring::frame::{FrameHeader, Plane};
/// let mut h = FrameHeader::new("GRAY8", 100, 2);
/// h.strides[0] = 128;
/// assert_eq!(h.planes(256)?, vec![Plane { offset: 0, stride: 128, row_bytes: 100, rows: 2 }]);
/// # Ok::<(), gpuring::frame::PlanesError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Plane {
    /// From the message's start.
    pub offset: usize,
    /// Bytes from one row's start to the next; at least `row_bytes`.
    pub stride: usize,
    /// Bytes of pixels in a row.
    pub row_bytes: usize,
    /// Rows; at least 1.
    pub rows: usize,
}

/// Why a frame header's planes cannot be used (see [`FrameHeader::planes`]).
///
/// ```
/// use gpuring::frame::{FrameHeader, PlanesError};
/// let h = FrameHeader::new("UYVP", 64, 64);
/// assert_eq!(h.planes(1 << 20), Err(PlanesError::UnknownFormat("UYVP".into())));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PlanesError {
    /// A pixel format whose planes gpuring does not know (see [`FrameHeader::packed_tensor`]
    /// for those it does).
    UnknownFormat(String),
    /// The header has another number of planes than the format.
    PlaneCount {
        /// In the header.
        header: u32,
        /// The format's.
        format: usize,
    },
    /// A plane's stride is shorter than a row of its pixels.
    Stride {
        /// The plane.
        plane: usize,
        /// Its stride.
        stride: u64,
        /// Bytes of pixels in a row.
        row_bytes: usize,
    },
    /// The frame has no pixels (a width or height of 0).
    Empty,
    /// A plane's last row ends past the message.
    PastEnd {
        /// The plane.
        plane: usize,
        /// The message's length.
        len: usize,
    },
}

impl fmt::Display for PlanesError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PlanesError::UnknownFormat(name) => {
                write!(f, "pixel format {name} is not one gpuring packs")
            }
            PlanesError::PlaneCount { header, format } => {
                write!(f, "the frame header has {header} planes, its format {format}")
            }
            PlanesError::Stride { plane, stride, row_bytes } => {
                write!(
                    f,
                    "plane {plane}: stride {stride} is shorter than a row ({row_bytes} bytes)"
                )
            }
            PlanesError::Empty => f.write_str("the frame has no pixels"),
            PlanesError::PastEnd { plane, len } => {
                write!(f, "plane {plane} runs past the message's {len} bytes")
            }
        }
    }
}

impl std::error::Error for PlanesError {}

/// The formats gpuring packs: each plane's bytes of pixels per row and rows, for a `w` × `h`
/// frame, and the element type of its samples. GStreamer's names; chroma planes of subsampled
/// formats round up, as GStreamer's do.
fn packed_planes(format: &str, w: usize, h: usize) -> Option<(DType, Vec<(usize, usize)>)> {
    let (hw, hh) = (w.div_ceil(2), h.div_ceil(2));
    let u8s = |planes: Vec<(usize, usize)>| Some((DType::U8, planes));
    match format {
        "GRAY8" => u8s(vec![(w, h)]),
        "RGB" | "BGR" => u8s(vec![(3 * w, h)]),
        "RGBA" | "BGRA" | "ARGB" | "ABGR" | "RGBx" | "BGRx" | "xRGB" | "xBGR" => {
            u8s(vec![(4 * w, h)])
        }
        "GRAY16_LE" => Some((DType::U16, vec![(2 * w, h)])),
        // Packed 4:2:2 (a pair of pixels in 4 bytes), packed 4:4:4 with alpha, 16-bit RGB.
        "YUY2" | "UYVY" | "YVYU" => u8s(vec![(4 * hw, h)]),
        "AYUV" | "VUYA" => u8s(vec![(4 * w, h)]),
        "RGB16" | "BGR16" => u8s(vec![(2 * w, h)]),
        "NV12" | "NV21" => u8s(vec![(w, h), (2 * hw, hh)]),
        "NV16" | "NV61" => u8s(vec![(w, h), (2 * hw, h)]),
        "NV24" => u8s(vec![(w, h), (2 * w, h)]),
        "I420" | "YV12" => u8s(vec![(w, h), (hw, hh), (hw, hh)]),
        "Y42B" => u8s(vec![(w, h), (hw, h), (hw, h)]),
        "Y444" | "RGBP" | "BGRP" => u8s(vec![(w, h); 3]),
        "GBR" => u8s(vec![(w, h); 3]),
        "GBRA" => u8s(vec![(w, h); 4]),
        "P010_10LE" | "P012_LE" | "P016_LE" => Some((DType::U16, vec![(2 * w, h), (4 * hw, hh)])),
        _ => None,
    }
}

impl FrameHeader {
    /// Where each plane of the frame lies in a message of `len` bytes, checked (a header is
    /// read from shared memory: untrusted): the format is one gpuring knows, the header has
    /// its planes, each stride holds a row of pixels, and every row is inside the message, with
    /// no arithmetic that can overflow.
    ///
    /// ```
    /// use gpuring::frame::{FrameHeader, PlanesError};
    /// let mut nv12 = FrameHeader::new("NV12", 64, 32);
    /// nv12.planes = 2;
    /// nv12.strides = [128, 128, 0, 0];
    /// nv12.offsets = [0, 128 * 32, 0, 0];
    /// let planes = nv12.planes(128 * 48)?;
    /// assert_eq!((planes[1].row_bytes, planes[1].rows), (64, 16));
    /// assert_eq!(nv12.planes(128 * 47), Err(PlanesError::PastEnd { plane: 1, len: 128 * 47 }));
    /// # Ok::<(), PlanesError>(())
    /// ```
    pub fn planes(&self, len: usize) -> Result<Vec<Plane>, PlanesError> {
        let (_, sizes) = packed_planes(&self.format, self.width as usize, self.height as usize)
            .ok_or_else(|| PlanesError::UnknownFormat(self.format.clone()))?;
        if self.width == 0 || self.height == 0 {
            return Err(PlanesError::Empty);
        }
        if self.planes as usize != sizes.len() {
            return Err(PlanesError::PlaneCount { header: self.planes, format: sizes.len() });
        }
        let mut planes = Vec::with_capacity(sizes.len());
        for (p, &(row_bytes, rows)) in sizes.iter().enumerate() {
            let past = PlanesError::PastEnd { plane: p, len };
            // A plane of one row has no next row: its stride says nothing, whatever it is.
            let stride = if rows == 1 { row_bytes } else { self.strides[p] as usize };
            if stride < row_bytes {
                let stride = u64::from(self.strides[p]);
                return Err(PlanesError::Stride { plane: p, stride, row_bytes });
            }
            let offset = usize::try_from(self.offsets[p]).map_err(|_| past.clone())?;
            let end = stride
                .checked_mul(rows - 1)
                .and_then(|b| b.checked_add(row_bytes))
                .and_then(|b| b.checked_add(offset));
            if end.is_none_or(|end| end > len) {
                return Err(past);
            }
            planes.push(Plane { offset, stride, row_bytes, rows });
        }
        Ok(planes)
    }

    /// The tensor of the frame with its planes packed one after another, rows without padding:
    /// `[height, width, channels]` for a frame of one plane (RGB: 3 channels, RGBA: 4, GRAY8:
    /// 1, YUY2 of an even width: 2), `[rows, width]` for planar formats whose packed bytes make whole rows of the frame's width
    /// (NV12 and I420 of even sizes: `[height * 3 / 2, width]`; Y444: `[3 * height, width]`),
    /// otherwise the packed bytes (`[n]`). 16-bit formats (GRAY16_LE, P010_10LE, P012_LE,
    /// P016_LE) are `uint16`, the others `uint8`. `None` for a format gpuring does not know.
    ///
    /// Known: GRAY8, GRAY16_LE, RGB, BGR, RGBA, BGRA, ARGB, ABGR, RGBx, BGRx, xRGB, xBGR, RGB16,
    /// BGR16, YUY2, UYVY, YVYU, AYUV, VUYA, NV12,
    /// NV21, NV16, NV61, NV24, I420, YV12, Y42B, Y444, RGBP, BGRP, GBR, GBRA, P010_10LE,
    /// P012_LE, P016_LE.
    ///
    /// ```
    /// use gpuring::frame::FrameHeader;
    /// use gpuring::tensor::{DType, TensorHeader};
    /// let nv12 = FrameHeader::new("NV12", 1920, 1080);
    /// assert_eq!(nv12.packed_tensor(), Some(TensorHeader::new(DType::U8, &[1620, 1920])));
    /// let rgb = FrameHeader::new("RGB", 1280, 720);
    /// assert_eq!(rgb.packed_tensor(), Some(TensorHeader::new(DType::U8, &[720, 1280, 3])));
    /// ```
    pub fn packed_tensor(&self) -> Option<TensorHeader> {
        let (w, h) = (self.width as usize, self.height as usize);
        let (dtype, sizes) = packed_planes(&self.format, w, h)?;
        if w == 0 || h == 0 {
            return None;
        }
        let es = dtype.size();
        let total = sizes
            .iter()
            .try_fold(0usize, |t, (row, rows)| t.checked_add(row.checked_mul(*rows)?))?;
        let shape: Vec<u64> = if sizes.len() == 1 && sizes[0].0 % (w * es) == 0 {
            vec![h as u64, w as u64, (sizes[0].0 / (w * es)) as u64]
        } else if sizes.len() > 1 && total % (w * es) == 0 {
            vec![(total / (w * es)) as u64, w as u64]
        } else {
            vec![(total / es) as u64]
        };
        Some(TensorHeader::new(dtype, &shape))
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
///
/// ```
/// assert!(!gpuring::frame::fuzz_check(&[0u8; 256])); // no frame header: nothing to check
/// ```
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

    #[test]
    fn planes_and_packed_shapes_of_hostile_and_odd_frames() {
        // A plane of one row: its stride says nothing (a hostile one is not copied with).
        let mut h = FrameHeader::new("NV12", 8, 2);
        h.planes = 2;
        h.strides = [8, 0, 0, 0];
        assert_eq!(h.planes(24).unwrap()[1].stride, 8, "a stride of 0 on one row is no fault");
        h.strides = [8, u32::MAX, 0, 0];
        h.offsets = [0, 16, 0, 0];
        let planes = h.planes(24).unwrap();
        assert_eq!(planes[1], Plane { offset: 16, stride: 8, row_bytes: 8, rows: 1 });
        // No pixels.
        let mut empty = FrameHeader::new("RGB", 0, 4);
        empty.strides[0] = 16;
        assert_eq!(empty.planes(64), Err(PlanesError::Empty));
        assert_eq!(empty.packed_tensor(), None);
        // Sizes whose bytes overflow: no tensor, no panic.
        let huge = FrameHeader::new("RGBA", u32::MAX, u32::MAX);
        assert_eq!(huge.packed_tensor(), None);
        // Packed 4:2:2: two bytes a pixel for even widths, the bytes for odd ones.
        let yuy2 = FrameHeader::new("YUY2", 640, 480);
        assert_eq!(yuy2.packed_tensor(), Some(TensorHeader::new(DType::U8, &[480, 640, 2])));
        let odd = FrameHeader::new("YUY2", 5, 2);
        assert_eq!(odd.packed_tensor(), Some(TensorHeader::new(DType::U8, &[24])));
        // Every known format: the packed tensor holds exactly the planes' bytes.
        for f in [
            "GRAY8",
            "RGB",
            "RGBA",
            "GRAY16_LE",
            "NV12",
            "I420",
            "Y42B",
            "NV16",
            "NV24",
            "Y444",
            "GBRA",
            "P010_10LE",
            "YUY2",
            "AYUV",
            "RGB16",
        ] {
            for (w, hgt) in [(1, 1), (5, 3), (64, 36), (1920, 1080)] {
                let h = FrameHeader::new(f, w, hgt);
                let (_, sizes) = packed_planes(f, w as usize, hgt as usize).unwrap();
                let bytes: usize = sizes.iter().map(|(r, n)| r * n).sum();
                let t = h.packed_tensor().unwrap();
                assert_eq!(t.nbytes(), Some(bytes as u64), "{f} {w}×{hgt}");
            }
        }
    }
}
