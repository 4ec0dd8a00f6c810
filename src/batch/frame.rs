//! What frames the batch takes, and where each frame's bytes are: a frame is a tensor (its
//! tensor header says its element type and shape, its bytes are packed) or a video frame (a
//! frame header, [`crate::frame`], says its pixel format, size and planes, which may have
//! padded rows and lie anywhere in the message). Either way its place in the batch holds it
//! packed: the planes one after another, rows without padding.

use crate::frame::{FrameHeader, FrameHeaderError, Plane, PlanesError};
use crate::tensor::TensorHeader;

/// The frame every camera must send.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Layout {
    /// The frame packed: what each place of a batch holds. Invariant: a batch of them fits a
    /// tensor header and a ring ([`super::check_frame_fits`]).
    pub tensor: TensorHeader,
    /// The pixel format, width and height of the video frames cameras send, once one sent one.
    pub video: Option<(String, u32, u32)>,
}

impl Layout {
    /// The bytes of one frame packed, its place's size.
    pub(super) fn bytes(&self) -> usize {
        self.tensor.nbytes().expect("a checked frame") as usize
    }

    /// `uint8[720, 1280, 3]`, or `NV12 1920×1080 (uint8[1620, 1920])`.
    pub(super) fn describe(&self) -> String {
        match &self.video {
            Some(v) => format!("{} ({})", video(v), describe(&self.tensor)),
            None => describe(&self.tensor),
        }
    }
}

/// Checks a frame of `len` bytes with user header `header` against the batch's `layout`, which
/// the first good frame sets if nobody did; a first frame must also make a batch of `cameras`
/// ([`super::check_frame_fits`]). A video frame must have the layout's format and size, with
/// every plane inside the message; a tensor frame the layout's element type and shape, and
/// their length. Returns the frame's planes and whether it set the layout, or says what is
/// wrong, naming both.
pub(super) fn check_frame(
    layout: &mut Option<Layout>,
    header: &[u8],
    len: usize,
    cameras: usize,
) -> Result<(Vec<Plane>, bool), String> {
    let video_frame = match FrameHeader::read(header) {
        Ok(h) => match h.planes(len) {
            // A format gpuring does not pack: its bytes, as its tensor header says.
            Err(PlanesError::UnknownFormat(_)) => None,
            Err(e) => {
                return Err(format!("it sends {}: {e}", video(&(h.format, h.width, h.height))))
            }
            Ok(planes) => {
                let t = h.packed_tensor().expect("a format `planes` knows packs");
                Some((Layout { tensor: t, video: Some((h.format, h.width, h.height)) }, planes))
            }
        },
        Err(FrameHeaderError::NoMagic | FrameHeaderError::TooShort(_)) => None,
        Err(e) => return Err(format!("its frame header is damaged: {e}")),
    };
    let (theirs, planes) = match video_frame {
        Some(v) => v,
        None => {
            let t = match TensorHeader::read(header) {
                Ok(Some(t)) => t,
                Ok(None) => match &*layout {
                    // A frame with no header: read as the batch's frame.
                    Some(ours) => ours.tensor.clone(),
                    None => {
                        return Err("its frames carry no tensor header and the batch's frame \
                                    was not given"
                            .to_string())
                    }
                },
                Err(e) => return Err(format!("its tensor header is damaged: {e}")),
            };
            let want = t.nbytes().unwrap_or(u64::MAX);
            if len as u64 != want {
                return Err(format!("it sends {len}-byte frames, {} takes {want}", describe(&t)));
            }
            let plane = Plane { offset: 0, stride: len, row_bytes: len, rows: 1 };
            (Layout { tensor: t, video: None }, vec![plane])
        }
    };
    let Some(ours) = layout else {
        if let Err(e) = super::check_frame_fits(&theirs.tensor, cameras) {
            return Err(format!("it sends {}: {e}", theirs.describe()));
        }
        *layout = Some(theirs);
        return Ok((planes, true));
    };
    let other_video = matches!((&ours.video, &theirs.video), (Some(a), Some(b)) if a != b);
    if ours.tensor != theirs.tensor || other_video {
        return Err(format!("it sends {}, the batch takes {}", theirs.describe(), ours.describe()));
    }
    if ours.video.is_none() {
        // The first video frame names the format the others must send.
        ours.video = theirs.video;
    }
    Ok((planes, false))
}

/// `uint8[720, 1280, 3]`.
pub(super) fn describe(t: &TensorHeader) -> String {
    let dims: Vec<String> = t.shape.iter().map(u64::to_string).collect();
    format!("{}[{}]", t.dtype.name(), dims.join(", "))
}

/// `NV12 1920×1080`.
fn video((format, w, h): &(String, u32, u32)) -> String {
    format!("{format} {w}×{h}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::USER_HEADER_SIZE;
    use crate::tensor::DType;

    fn nv12(pitch: u32, w: u32, h: u32) -> (Vec<u8>, usize) {
        let mut f = FrameHeader::new("NV12", w, h);
        f.planes = 2;
        f.strides = [pitch, pitch, 0, 0];
        f.offsets = [0, u64::from(pitch * h), 0, 0];
        let mut b = vec![0u8; USER_HEADER_SIZE];
        f.write(&mut b);
        (b, (pitch * h * 3 / 2) as usize)
    }

    #[test]
    fn video_frames_of_any_pitch_pack_to_one_layout() {
        let mut layout = None;
        let (h, len) = nv12(64, 48, 8);
        let (planes, set) = check_frame(&mut layout, &h, len, 4).unwrap();
        assert!(set);
        assert_eq!(planes[1], Plane { offset: 512, stride: 64, row_bytes: 48, rows: 4 });
        let l = layout.clone().unwrap();
        assert_eq!(l.tensor, TensorHeader::new(DType::U8, &[12, 48]));
        assert_eq!(l.bytes(), 48 * 12);
        // Another pitch, the same frame: taken, each with its own planes.
        let (h, len) = nv12(96, 48, 8);
        let (planes, set) = check_frame(&mut layout, &h, len, 4).unwrap();
        assert!(!set);
        assert_eq!(planes[0].stride, 96);
        // Another size: refused, naming both.
        let (h, len) = nv12(64, 32, 8);
        let e = check_frame(&mut layout, &h, len, 4).unwrap_err();
        assert!(e.contains("NV12 32×8") && e.contains("NV12 48×8"), "{e}");
        // The last row's padding may be missing; a byte of its pixels may not.
        let (h, _) = nv12(64, 48, 8);
        let end = 512 + 64 * 3 + 48;
        assert!(check_frame(&mut layout, &h, end, 4).is_ok());
        assert!(check_frame(&mut layout, &h, end - 1, 4).unwrap_err().contains("runs past"));
    }

    #[test]
    fn tensor_and_video_frames_of_one_shape_mix() {
        let rgb = TensorHeader::new(DType::U8, &[8, 48, 3]);
        let mut layout = Some(Layout { tensor: rgb.clone(), video: None });
        let mut t = vec![0u8; 64];
        rgb.write(&mut t).unwrap();
        assert_eq!(check_frame(&mut layout, &t, 8 * 48 * 3, 2).unwrap().0.len(), 1);
        assert!(check_frame(&mut layout, &t, 8 * 48 * 3 + 1, 2).is_err());
        let mut f = FrameHeader::new("RGB", 48, 8);
        f.strides[0] = 160;
        let mut b = vec![0u8; USER_HEADER_SIZE];
        f.write(&mut b);
        assert!(check_frame(&mut layout, &b, 160 * 8, 2).is_ok());
        assert_eq!(layout.as_ref().unwrap().video, Some(("RGB".into(), 48, 8)));
        // Now BGR of the same shape is another format.
        let mut f = FrameHeader::new("BGR", 48, 8);
        f.strides[0] = 144;
        f.write(&mut b);
        assert!(check_frame(&mut layout, &b, 144 * 8, 2).unwrap_err().contains("BGR 48×8"));
        // A format gpuring does not pack (v210, say): its bytes, as its tensor header says.
        let mut layout = None;
        let mut v210 = vec![0u8; USER_HEADER_SIZE];
        TensorHeader::new(DType::U8, &[4096]).write(&mut v210).unwrap();
        FrameHeader::new("v210", 48, 8).write(&mut v210);
        let (planes, _) = check_frame(&mut layout, &v210, 4096, 2).unwrap();
        assert_eq!(planes, [Plane { offset: 0, stride: 4096, row_bytes: 4096, rows: 1 }]);
        assert!(check_frame(&mut layout, &v210, 4000, 2).is_err());
    }
}
