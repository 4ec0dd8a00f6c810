//! Where a frame's planes are, and copying them between layouts (a pitched CUDA buffer, a
//! packed system buffer, a slot) on the CPU or on a CUDA stream.

use gpuring::cuda::driver::{self, Rows};

use crate::header::{FrameHeader, MAX_PLANES};

/// One plane: its offset from the buffer's start, bytes between rows, its pixels' bytes per
/// row (the rest of a stride is padding) and rows. The frame header's own.
pub use gpuring::frame::Plane;

/// A frame's planes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Invariant: 1..=4 planes.
    pub planes: Vec<Plane>,
}

impl Layout {
    /// The layout of a frame of `info`'s format and size at the given offsets and strides.
    pub fn new(info: &gst_video::VideoInfo, offsets: &[usize], strides: &[i32]) -> Layout {
        let finfo = info.format_info();
        let n = (info.n_planes() as usize).clamp(1, MAX_PLANES);
        let planes = (0..n)
            .map(|p| {
                // The plane's rows are those of a component stored in it.
                let comp = (0..finfo.n_components())
                    .find(|&c| finfo.plane()[c as usize] as usize == p)
                    .unwrap_or(0);
                let stride = strides[p].unsigned_abs() as usize;
                let pixels = finfo.scale_width(comp as u8, info.width()) as usize
                    * finfo.pixel_stride()[comp as usize] as usize;
                // Formats packed below a byte per pixel (pixel stride 0, refused by
                // `of_header`): the whole stride.
                let row_bytes = if pixels == 0 { stride } else { pixels };
                Plane {
                    offset: offsets[p],
                    stride,
                    row_bytes,
                    rows: finfo.scale_height(comp as u8, info.height()) as usize,
                }
            })
            .collect();
        Layout { planes }
    }

    /// `info`'s own (default, packed) layout.
    pub fn of_info(info: &gst_video::VideoInfo) -> Layout {
        Layout::new(info, info.offset(), info.stride())
    }

    /// The layout a frame header (read from shared memory: untrusted) describes for a frame of
    /// `info`, checked against a message of `len` bytes: the format's number of planes, each
    /// stride at least a row of pixels and at most `i32::MAX` (GStreamer's strides are signed),
    /// and every row inside the message, with no arithmetic that can overflow.
    pub fn of_header(
        info: &gst_video::VideoInfo,
        h: &FrameHeader,
        len: usize,
    ) -> Result<Layout, String> {
        let finfo = info.format_info();
        let unsupported = finfo
            .flags()
            .intersects(gst_video::VideoFormatFlags::TILED | gst_video::VideoFormatFlags::PALETTE)
            || (0..finfo.n_components()).any(|c| finfo.pixel_stride()[c as usize] <= 0);
        if unsupported {
            // Tiled, palette and packed-below-a-byte formats: rows are not `stride` apart
            // byte runs, so the checks below could not bound what downstream reads.
            return Err(format!("format {} is not supported by the frame header", info.format()));
        }
        if info.size() > len.saturating_mul(2) {
            return Err(format!(
                "a {} frame needs {} bytes; the message has {len}",
                info.format(),
                info.size()
            ));
        }
        let n = info.n_planes() as usize;
        if h.planes as usize != n {
            return Err(format!(
                "the frame header has {} planes; {} has {n}",
                h.planes,
                info.format()
            ));
        }
        let mut offsets = [0usize; MAX_PLANES];
        let mut strides = [0i32; MAX_PLANES];
        for p in 0..n {
            offsets[p] = usize::try_from(h.offsets[p])
                .map_err(|_| format!("plane {p}: offset out of range"))?;
            strides[p] = i32::try_from(h.strides[p])
                .map_err(|_| format!("plane {p}: stride out of range"))?;
        }
        let layout = Layout::new(info, &offsets[..n], &strides[..n]);
        for (p, plane) in layout.planes.iter().enumerate() {
            if plane.stride < plane.row_bytes || plane.rows == 0 {
                return Err(format!(
                    "plane {p}: stride {} is shorter than a row ({} bytes)",
                    plane.stride, plane.row_bytes
                ));
            }
            let end = plane
                .stride
                .checked_mul(plane.rows - 1)
                .and_then(|b| b.checked_add(plane.row_bytes))
                .and_then(|b| b.checked_add(plane.offset));
            if end.is_none_or(|end| end > len) {
                return Err(format!("plane {p} runs past the message's {len} bytes"));
            }
        }
        Ok(layout)
    }

    /// Bytes from the start to the end of the last row of the last plane (its pixels).
    pub fn extent(&self) -> usize {
        self.planes
            .iter()
            .map(|p| {
                p.offset
                    .saturating_add(p.stride.saturating_mul(p.rows.saturating_sub(1)))
                    .saturating_add(p.row_bytes)
            })
            .max()
            .unwrap_or(0)
    }

    /// Copies every plane of `src` (laid out as `self`) into `dst` (laid out as `to`), on the
    /// CPU: each row's pixels, not its padding. `None` if either
    /// buffer is too short for its layout, or the layouts have different planes.
    pub fn copy_cpu(&self, src: &[u8], to: &Layout, dst: &mut [u8]) -> Option<()> {
        if self.planes.len() != to.planes.len()
            || src.len() < self.extent()
            || dst.len() < to.extent()
        {
            return None;
        }
        for (s, d) in self.planes.iter().zip(&to.planes) {
            let width = s.row_bytes.min(d.row_bytes);
            for row in 0..s.rows.min(d.rows) {
                let (so, dof) = (s.offset + row * s.stride, d.offset + row * d.stride);
                dst[dof..dof + width].copy_from_slice(&src[so..so + width]);
            }
        }
        Some(())
    }

    /// Queues on `stream` copies of every plane of the frame at `src` (laid out as `self`) into
    /// `dst` (laid out as `to`): across CUDA contexts, or between device and host memory.
    ///
    /// # Safety
    /// 1. `src` and `dst` must hold their layouts' [`extent`](Self::extent) bytes, readable
    ///    and writable, until the copies have run; the layouts must have the same planes.
    /// 2. `stream` must be live in the current context.
    pub unsafe fn copy_cuda(
        &self,
        src: Base,
        to: &Layout,
        dst: Base,
        stream: driver::CUstream,
    ) -> Result<(), driver::DriverError> {
        for (s, d) in self.planes.iter().zip(&to.planes) {
            let width = s.row_bytes.min(d.row_bytes);
            let rows = s.rows.min(d.rows);
            // SAFETY: each plane lies within its buffer's extent, by (1); stream by (2).
            unsafe {
                driver::memcpy_2d_peer_async(dst.rows(d), src.rows(s), width, rows, stream)?;
            }
        }
        Ok(())
    }
}

/// The start of a buffer a CUDA copy reads or writes.
#[derive(Clone, Copy, Debug)]
pub enum Base {
    /// Device memory of a context.
    Device(u64, driver::CUcontext),
    /// Host memory.
    Host(*mut u8),
}

impl Base {
    fn rows(self, p: &Plane) -> Rows {
        match self {
            Base::Device(ptr, ctx) => {
                Rows::Device { ptr: ptr + p.offset as u64, pitch: p.stride, ctx }
            }
            // The offset stays inside the buffer (the caller's guarantee).
            Base::Host(ptr) => Rows::Host { ptr: ptr.wrapping_add(p.offset), pitch: p.stride },
        }
    }
}
